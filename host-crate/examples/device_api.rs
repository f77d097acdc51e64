//! The device front end: `FlashAttention::forward` on cudarc buffers, on a
//! stream of the caller's. The call only enqueues work on that stream (no
//! hidden synchronization); the caller copies the result back when it wants.
//!
//! ```sh
//! cargo run -p flash-attn --example device_api
//! ```
//!
//! Without a GPU (sm_80 or newer) it prints why and exits successfully:
//! device buffers need a device (`ndarray_prefill` shows the CPU path).

use flash_attn::{Backend, ForwardParams, Tensor, TensorLayout, default_backend};
use half::bf16;
use ndarray::{Array4, s};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let fa = match default_backend() {
        Backend::Gpu(fa) => fa,
        Backend::Cpu { reason } => {
            println!("backend: none (skipped: this example needs a GPU; {reason})");
            return Ok(());
        }
    };
    let (major, minor) = fa.compute_capability();
    let family = if fa.has_hopper_kernels() { "sm_90a kernels" } else { "mma.sync kernels" };
    println!("backend: GPU ({}, sm_{major}{minor}, {family})", fa.device_name());

    // Llama-3-8B's attention shape: 32 query heads over 8 KV heads, d = 128.
    let (batch, seqlen, nheads, nheads_k, d) = (2, 1024, 32, 8, 128);
    let host = |heads: usize, salt: f32| -> Vec<bf16> {
        (0..batch * seqlen * heads * d).map(|i| bf16::from_f32((i as f32 * 0.013 + salt).sin())).collect()
    };

    // cudarc buffers on our own stream of the library's context.
    let stream = fa.context().new_stream()?;
    let q = stream.clone_htod(&host(nheads, 0.1))?;
    let k = stream.clone_htod(&host(nheads_k, 0.2))?;
    let v = stream.clone_htod(&host(nheads_k, 0.3))?;
    let lq = TensorLayout::contiguous([batch, seqlen, nheads, d]);
    let lk = TensorLayout::contiguous([batch, seqlen, nheads_k, d]);

    let params = ForwardParams { causal: true, ..Default::default() };
    let out = fa.forward::<bf16, _, _, _>(&stream, Tensor::new(&q, lq), Tensor::new(&k, lk), Tensor::new(&v, lk), &params)?;
    let lse = out.lse().ok_or("FA2 returns a logsumexp")?;

    // Copy back (this synchronizes the stream) and check against the CPU
    // reference in f64: sequence 0, query heads 0..4 (they share KV head 0),
    // the last 64 query rows (causal aligns bottom-right, so 64 queries
    // against all keys are exactly those rows).
    let o: Vec<bf16> = stream.clone_dtoh(&out.o)?;
    let lse: Vec<f32> = stream.clone_dtoh(lse)?;
    println!("o: {} bf16 values, layout {:?}; lse: {} f32", o.len(), out.o_layout.shape, lse.len());

    let part = |v: Vec<bf16>, heads: usize, rows: usize, keep: usize| -> Result<Array4<f64>, ndarray::ShapeError> {
        let a = Array4::from_shape_vec((batch, seqlen, heads, d), v.into_iter().map(|x| x.to_f64()).collect())?;
        Ok(a.slice(s![0..1, seqlen - rows.., 0..keep, ..]).to_owned())
    };
    let q64 = part(host(nheads, 0.1), nheads, 64, 4)?;
    let (k64, v64) = (part(host(nheads_k, 0.2), nheads_k, seqlen, 1)?, part(host(nheads_k, 0.3), nheads_k, seqlen, 1)?);
    let want = flash_attn::reference::attention(q64.view(), k64.view(), v64.view(), &params, None)?;
    let got = part(o, nheads, 64, 4)?;
    let max_err = got.iter().zip(want.o.iter()).map(|(a, b)| (a - b).abs()).fold(0.0f64, f64::max);
    println!("max |error| against the f64 reference (sequence 0, heads 0..4, last 64 rows): {max_err:.2e}");
    if max_err > 2e-2 {
        return Err(format!("max |error| {max_err} is above the bf16 tolerance 2e-2").into());
    }
    println!("ok");
    Ok(())
}
