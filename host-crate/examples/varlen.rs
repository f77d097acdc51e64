//! A packed batch (`flash_attn_varlen_func`): sequences of different lengths
//! concatenated along one token axis, `(total, nheads, headdim)`, described
//! by prefix sums `cu_seqlens` — no padding. Each sequence's output is then
//! compared with a dense `flash_attn_func` call on that sequence alone.
//!
//! ```sh
//! cargo run -p flash-attn --example varlen
//! ```
//!
//! Runs on the GPU when there is one (FA2 kernels; on an H100 the sm_90a
//! kernels), else on the CPU reference; it prints which.

use flash_attn::{Backend, ForwardParams, default_backend, flash_attn_func, flash_attn_varlen_func};
use half::bf16;
use ndarray::{Array3, Axis, s};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (nheads, nheads_k, d) = (8, 2, 64);
    let lens = [100usize, 37, 260, 1];

    // cu_seqlens: 0, 100, 137, 397, 398 (i32, as FlashAttention-2 takes them).
    let mut cu_seqlens = vec![0i32];
    for l in lens {
        cu_seqlens.push(cu_seqlens.last().copied().unwrap_or(0) + l as i32);
    }
    let total = *cu_seqlens.last().unwrap_or(&0) as usize;
    let max_seqlen = lens.iter().copied().max().unwrap_or(0);

    let packed = |heads: usize, salt: f32| {
        Array3::from_shape_fn((total, heads, d), |(t, h, c)| bf16::from_f32((0.21 * t as f32 + 0.7 * h as f32 + 0.05 * c as f32 + salt).cos()))
    };
    let (q, k, v) = (packed(nheads, 0.0), packed(nheads_k, 1.0), packed(nheads_k, 2.0));

    match default_backend() {
        Backend::Gpu(fa) => println!("backend: GPU ({})", fa.device_name()),
        Backend::Cpu { reason } => println!("backend: CPU reference ({reason})"),
    }

    let params = ForwardParams { causal: true, ..Default::default() };
    // Self-attention: the same prefix sums for queries and keys.
    let (o, lse) = flash_attn_varlen_func(q.view(), k.view(), v.view(), &cu_seqlens, &cu_seqlens, None, (max_seqlen, max_seqlen), &params, None)?;
    println!("{} sequences, {total} tokens: o {:?}, lse {:?}", lens.len(), o.dim(), lse.dim());

    // Each sequence alone, as a dense batch of one.
    let mut max_err = 0.0f32;
    for (b, w) in cu_seqlens.windows(2).enumerate() {
        let (a, e) = (w[0] as usize, w[1] as usize);
        let one = |x: &Array3<bf16>| x.slice(s![a..e, .., ..]).to_owned().insert_axis(Axis(0));
        let (o1, lse1) = flash_attn_func(one(&q).view(), one(&k).view(), one(&v).view(), &params)?;
        let diff_o = o1.index_axis(Axis(0), 0).iter().zip(o.slice(s![a..e, .., ..]).iter()).map(|(x, y)| (x.to_f32() - y.to_f32()).abs()).fold(0.0f32, f32::max);
        // lse: (1, nheads, len) dense, (nheads, total) packed.
        let diff_lse = lse1.index_axis(Axis(0), 0).iter().zip(lse.slice(s![.., a..e]).iter()).map(|(x, y)| (x - y).abs()).fold(0.0f32, f32::max);
        println!("  sequence {b}: {} tokens, max |Δo| {diff_o:.1e}, max |Δlse| {diff_lse:.1e}", e - a);
        max_err = max_err.max(diff_o).max(diff_lse);
    }
    if max_err > 2e-2 {
        return Err(format!("packed and dense calls differ by {max_err}").into());
    }
    println!("ok");
    Ok(())
}
