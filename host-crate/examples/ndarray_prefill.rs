//! Prefill through the ndarray front end: `flash_attn_func` on bf16 arrays
//! `(batch, seqlen, nheads, headdim)`, causal, with grouped-query attention
//! (8 query heads sharing 2 key/value heads), checked against a plain
//! attention written out below.
//!
//! ```sh
//! cargo run -p flash-attn --example ndarray_prefill
//! ```
//!
//! On a GPU (sm_80 or newer) the call runs the tensor-core kernels (the
//! sm_90a kernels on an H100); without one it runs the CPU reference. It
//! prints which backend ran. Self-contained (flash_attn, ndarray, half, std):
//! CI builds this file as the `main.rs` of a crate on stable Rust.

use flash_attn::{Backend, ForwardParams, default_backend, flash_attn_func};
use half::bf16;
use ndarray::Array4;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (batch, seqlen, nheads, nheads_k, headdim) = (2, 128, 8, 2, 64);

    // Deterministic inputs, rounded to bf16.
    let fill = |heads: usize, salt: f32| {
        Array4::from_shape_fn((batch, seqlen, heads, headdim), |(b, i, h, c)| {
            bf16::from_f32((0.37 * i as f32 + 1.3 * h as f32 + 0.11 * c as f32 + salt * (b as f32 + 1.0)).sin())
        })
    };
    let (q, k, v) = (fill(nheads, 0.5), fill(nheads_k, 1.7), fill(nheads_k, 2.9));

    match default_backend() {
        Backend::Gpu(fa) => println!("backend: GPU ({}, sm_{}{})", fa.device_name(), fa.compute_capability().0, fa.compute_capability().1),
        Backend::Cpu { reason } => println!("backend: CPU reference ({reason})"),
    }

    let params = ForwardParams { causal: true, ..Default::default() };
    let start = std::time::Instant::now();
    let (o, lse) = flash_attn_func(q.view(), k.view(), v.view(), &params)?;
    println!("o: {:?}, lse: {:?} in {:.1} ms", o.dim(), lse.dim(), start.elapsed().as_secs_f64() * 1e3);

    // The same attention, written out: softmax(q·kᵀ/√d, causal)·v in f32,
    // on every third query row (and the last). Rows of `headdim` values:
    let rows = |a: &Array4<bf16>| a.iter().map(|x| x.to_f32()).collect::<Vec<f32>>();
    let (qf, kf, vf) = (rows(&q), rows(&k), rows(&v));
    let row = |x: &[f32], heads: usize, b: usize, i: usize, h: usize| {
        let at = ((b * seqlen + i) * heads + h) * headdim;
        x[at..at + headdim].to_vec()
    };
    let dot = |x: &[f32], y: &[f32]| x.iter().zip(y).map(|(a, b)| a * b).sum::<f32>();
    let scale = 1.0 / (headdim as f32).sqrt();
    let group = nheads / nheads_k;
    let mut max_err = 0.0f32;
    for b in 0..batch {
        for h in 0..nheads {
            for i in (0..seqlen).filter(|i| i % 3 == 0 || i + 1 == seqlen) {
                let qi = row(&qf, nheads, b, i, h);
                let s: Vec<f32> = (0..=i).map(|j| dot(&qi, &row(&kf, nheads_k, b, j, h / group)) * scale).collect();
                let m = s.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let p: Vec<f32> = s.iter().map(|x| (x - m).exp()).collect();
                let l: f32 = p.iter().sum();
                max_err = max_err.max((lse[[b, h, i]] - (m + l.ln())).abs());
                let mut want = vec![0.0f32; headdim];
                for (j, pj) in p.iter().enumerate() {
                    for (w, vj) in want.iter_mut().zip(row(&vf, nheads_k, b, j, h / group)) {
                        *w += pj / l * vj;
                    }
                }
                for (c, w) in want.iter().enumerate() {
                    max_err = max_err.max((o[[b, i, h, c]].to_f32() - w).abs());
                }
            }
        }
    }
    println!("max |error| against plain attention: {max_err:.2e}");
    if max_err > 2e-2 {
        return Err(format!("max |error| {max_err} is above the bf16 tolerance 2e-2").into());
    }
    println!("ok");
    Ok(())
}
