//! flash-attn-candle against candle's own attention (the ops
//! candle-transformers' Llama runs without flash-attn: f32 matmul, mask,
//! `softmax_last_dim`), on the CPU always and on the GPU with the `cuda`
//! feature when `FA_REQUIRE_GPU=1` (set by `cargo xtask candle --cuda` on a
//! GPU machine; without it the GPU cases are skipped with a printed reason,
//! so no CUDA call is made on a machine without a driver).

mod common;

use candle_core::{DType, Device, IndexOp, Result, Tensor};
use common::*;
use flash_attn_candle as fa;

#[test]
fn matches_candle_attention_in_every_dtype() -> Result<()> {
    for dev in devices() {
        let mut dtypes = vec![DType::F32, DType::F16, DType::BF16];
        if dev.is_cpu() {
            dtypes.push(DType::F64);
        }
        for dt in dtypes {
            // Cross-attention (sq != sk: the causal mask is bottom-right
            // aligned), d = 64 and 128, causal or not.
            for (sq, sk, d, causal) in [(37, 37, 64, true), (19, 70, 128, true), (70, 19, 64, false), (1, 50, 128, false)] {
                let q = randn((2, sq, 4, d), &dev)?.to_dtype(dt)?;
                let k = randn((2, sk, 4, d), &dev)?.to_dtype(dt)?;
                let v = randn((2, sk, 4, d), &dev)?.to_dtype(dt)?;
                let scale = 1.0 / (d as f64).sqrt();
                let (want, want_lse) = candle_attention(&q, &k, &v, scale, causal)?;
                let o = fa::flash_attn(&q, &k, &v, scale as f32, causal)?;
                assert_eq!(o.dims(), q.dims());
                assert_eq!(o.dtype(), dt);
                let e = max_diff(&o, &want)?;
                assert!(e <= tol(dt), "{dev:?} {dt:?} sq={sq} sk={sk} d={d} causal={causal}: max diff {e}");
                let (o2, lse) = fa::flash_attn_with_lse(&q, &k, &v, scale as f32, causal)?;
                assert_eq!(max_diff(&o, &o2)?, 0.0);
                assert_eq!(lse.dims(), &[2, 4, sq]);
                let e = max_diff(&lse, &want_lse)?;
                assert!(e <= 1e-3, "{dev:?} {dt:?} lse max diff {e}");
            }
        }
    }
    Ok(())
}

/// Strided inputs go in as they are: q as llama.rs passes it (a transposed
/// view of `(b, h, s, d)`), a narrowed view with a start offset, and k/v
/// read from a bigger cache tensor.
#[test]
fn strided_views_and_offsets() -> Result<()> {
    for dev in devices() {
        for dt in [DType::F32, DType::BF16] {
            let (b, h, s, d) = (2, 4, 33, 64);
            let q_bhsd = Tensor::randn(0f32, 1., (b, h, s, d), &dev)?.to_dtype(dt)?;
            let q = q_bhsd.transpose(1, 2)?; // (b, s, h, d), not contiguous
            assert!(!q.is_contiguous());
            // k, v: a window of a longer cache (start offset, seq stride kept).
            let cache = Tensor::randn(0f32, 1., (b, 80, h, d), &dev)?.to_dtype(dt)?;
            let k = cache.narrow(1, 8, 40)?;
            let v = cache.narrow(1, 16, 40)?;
            let want = fa::flash_attn(&q.contiguous()?, &k.contiguous()?, &v.contiguous()?, 0.125, true)?;
            let got = fa::flash_attn(&q, &k, &v, 0.125, true)?;
            assert_eq!(max_diff(&got, &want)?, 0.0, "{dev:?} {dt:?}");
            let (r, _) = candle_attention(&q, &k, &v, 0.125, true)?;
            assert!(max_diff(&got, &r)? <= tol(dt));
        }
    }
    Ok(())
}

/// What candle-transformers' Llama does with `use_flash_attn`, step by
/// step: GQA heads repeated by `repeat_kv`, q/k/v transposed views, a KV
/// cache grown by concatenation, `causal = seq_len > 1`; prefill then 32
/// decode steps, each against candle's attention on the same tensors.
#[test]
fn llama_call_sequence_prefill_and_decode() -> Result<()> {
    for dev in devices() {
        for dt in [DType::F32, DType::BF16] {
            let (heads, kv_heads, d, prompt) = (8, 2, 128, 24);
            let n_rep = heads / kv_heads;
            let repeat_kv = |x: &Tensor| -> Result<Tensor> {
                let (b, h, s, d) = x.dims4()?;
                Tensor::cat(&vec![x; n_rep], 2)?.reshape((b, h * n_rep, s, d))
            };
            let mut cache: Option<(Tensor, Tensor)> = None;
            let mut worst = 0f32;
            for step in 0..=32 {
                let seq_len = if step == 0 { prompt } else { 1 };
                let q = Tensor::randn(0f32, 1., (1, heads, seq_len, d), &dev)?.to_dtype(dt)?;
                let mut k = Tensor::randn(0f32, 1., (1, kv_heads, seq_len, d), &dev)?.to_dtype(dt)?;
                let mut v = Tensor::randn(0f32, 1., (1, kv_heads, seq_len, d), &dev)?.to_dtype(dt)?;
                if let Some((ck, cv)) = &cache {
                    k = Tensor::cat(&[ck, &k], 2)?.contiguous()?;
                    v = Tensor::cat(&[cv, &v], 2)?.contiguous()?;
                }
                cache = Some((k.clone(), v.clone()));
                let (k, v) = (repeat_kv(&k)?, repeat_kv(&v)?);
                let scale = 1f32 / (d as f32).sqrt();
                let (q, k, v) = (q.transpose(1, 2)?, k.transpose(1, 2)?, v.transpose(1, 2)?);
                let ours = fa::flash_attn(&q, &k, &v, scale, seq_len > 1)?;
                let (want, _) = candle_attention(&q, &k, &v, scale as f64, seq_len > 1)?;
                worst = worst.max(max_diff(&ours, &want)?);
                assert_eq!(ours.i((.., .., .., 0))?.dims(), &[1, seq_len, heads]);
            }
            assert!(worst <= tol(dt), "{dev:?} {dt:?}: worst max diff {worst}");
            // The KV-cache call runs the same thing for a full cache.
            let (ck, cv) = cache.unwrap();
            let q = Tensor::randn(0f32, 1., (1, 1, heads, d), &dev)?.to_dtype(dt)?;
            let (k, v) = (repeat_kv(&ck)?.transpose(1, 2)?, repeat_kv(&cv)?.transpose(1, 2)?);
            let a = fa::flash_attn_with_kvcache(&q, &k, &v, None, None, None, None, 0.1, true)?;
            let b = fa::flash_attn(&q, &k, &v, 0.1, true)?;
            assert_eq!(max_diff(&a, &b)?, 0.0);
        }
    }
    Ok(())
}

/// GQA (k/v with fewer heads, no repeat), sliding windows, softcap and
/// ALiBi, each against candle's attention with the same option.
#[test]
fn inference_options_match_candle() -> Result<()> {
    for dev in devices() {
        for dt in [DType::F32, DType::BF16] {
            let (b, sq, sk, h, hk, d) = (2, 45, 61, 8, 2, 64);
            let q = randn((b, sq, h, d), &dev)?.to_dtype(dt)?;
            let k = randn((b, sk, hk, d), &dev)?.to_dtype(dt)?;
            let v = randn((b, sk, hk, d), &dev)?.to_dtype(dt)?;
            let scale = 0.125f32;
            let slopes: Vec<f32> = (0..h).map(|i| 0.5f32.powi(i as i32 + 1)).collect();
            let slopes_t = Tensor::from_slice(&slopes, h, &dev)?;
            let check = |got: Tensor, want: Tensor, what: &str| -> Result<()> {
                let e = max_diff(&got, &want)?;
                assert!(e <= tol(dt), "{dev:?} {dt:?} {what}: max diff {e}");
                Ok(())
            };
            let s = scale as f64;
            check(fa::flash_attn(&q, &k, &v, scale, true)?, candle_attention_ext(&q, &k, &v, s, (None, Some(0)), None, None)?, "GQA causal")?;
            check(
                fa::flash_attn_windowed(&q, &k, &v, scale, Some(7), Some(3))?,
                candle_attention_ext(&q, &k, &v, s, (Some(7), Some(3)), None, None)?,
                "window (7, 3)",
            )?;
            check(
                fa::flash_attn_windowed(&q, &k, &v, scale, Some(10), Some(0))?,
                candle_attention_ext(&q, &k, &v, s, (Some(10), Some(0)), None, None)?,
                "sliding window (10, 0)",
            )?;
            check(
                fa::flash_attn_alibi(&q, &k, &v, &slopes_t, scale, true)?,
                candle_attention_ext(&q, &k, &v, s, (None, Some(0)), None, Some(&slopes))?,
                "ALiBi causal",
            )?;
            check(
                fa::flash_attn_alibi_windowed_softcap(&q, &k, &v, Some(&slopes_t), scale, Some(20), Some(0), 5.0)?,
                candle_attention_ext(&q, &k, &v, s, (Some(20), Some(0)), Some(5.0), Some(&slopes))?,
                "ALiBi + window + softcap",
            )?;
            check(
                fa::flash_attn_alibi_windowed_softcap(&q, &k, &v, None, scale, None, None, 2.0)?,
                candle_attention_ext(&q, &k, &v, s, (None, None), Some(2.0), None)?,
                "softcap",
            )?;
        }
    }
    Ok(())
}

/// Varlen: packed sequences of different lengths, each equal to a
/// fixed-length call on its own rows (and to candle's attention).
#[test]
fn varlen_matches_each_sequence_alone() -> Result<()> {
    for dev in devices() {
        for dt in [DType::F32, DType::F16] {
            let (h, hk, d) = (4, 2, 64);
            let (lq, lk) = ([5usize, 17, 1], [9usize, 17, 30]);
            let cu = |l: &[usize]| -> Vec<u32> { std::iter::once(0).chain(l.iter().scan(0, |a, &x| { *a += x; Some(*a as u32) })).collect() };
            let (cq, ck) = (cu(&lq), cu(&lk));
            let (tq, tk) = (*cq.last().unwrap() as usize, *ck.last().unwrap() as usize);
            let q = Tensor::randn(0f32, 1., (tq, h, d), &dev)?.to_dtype(dt)?;
            let k = Tensor::randn(0f32, 1., (tk, hk, d), &dev)?.to_dtype(dt)?;
            let v = Tensor::randn(0f32, 1., (tk, hk, d), &dev)?.to_dtype(dt)?;
            let (cq_t, ck_t) = (Tensor::new(cq.as_slice(), &dev)?, Tensor::new(ck.as_slice(), &dev)?);
            for causal in [false, true] {
                let o = fa::flash_attn_varlen(&q, &k, &v, &cq_t, &ck_t, 17, 30, 0.125, causal)?;
                assert_eq!(o.dims(), &[tq, h, d]);
                for i in 0..lq.len() {
                    let (q0, k0) = (cq[i] as usize, ck[i] as usize);
                    let qi = q.narrow(0, q0, lq[i])?.unsqueeze(0)?;
                    let ki = k.narrow(0, k0, lk[i])?.unsqueeze(0)?;
                    let vi = v.narrow(0, k0, lk[i])?.unsqueeze(0)?;
                    let alone = fa::flash_attn(&qi, &ki, &vi, 0.125, causal)?.squeeze(0)?;
                    let got = o.narrow(0, q0, lq[i])?;
                    let e = max_diff(&got, &alone)?;
                    assert!(e <= tol(dt), "{dev:?} {dt:?} causal={causal} seq {i}: {e}");
                    let w = if causal { (None, Some(0)) } else { (None, None) };
                    let want = candle_attention_ext(&qi, &ki, &vi, 0.125, w, None, None)?.squeeze(0)?;
                    assert!(max_diff(&got, &want)? <= tol(dt));
                }
            }
        }
    }
    Ok(())
}

/// The window and softcap spellings that mean plain causal / non-causal run.
#[test]
fn windows_that_mean_causal_run() -> Result<()> {
    let dev = Device::Cpu;
    let q = randn((1, 9, 2, 32), &dev)?;
    let causal = fa::flash_attn(&q, &q, &q, 0.2, true)?;
    let full = fa::flash_attn(&q, &q, &q, 0.2, false)?;
    let w = fa::flash_attn_windowed(&q, &q, &q, 0.2, None, Some(0))?;
    assert_eq!(max_diff(&w, &causal)?, 0.0);
    // A window side ≥ seqlen_k is unbounded (FlashAttention-2's rule).
    let w = fa::flash_attn_windowed(&q, &q, &q, 0.2, Some(9), Some(0))?;
    assert_eq!(max_diff(&w, &causal)?, 0.0);
    let w = fa::flash_attn_windowed(&q, &q, &q, 0.2, None, Some(100))?;
    assert_eq!(max_diff(&w, &full)?, 0.0);
    let w = fa::flash_attn_alibi_windowed_softcap(&q, &q, &q, None, 0.2, None, Some(0), 0.0)?;
    assert_eq!(max_diff(&w, &causal)?, 0.0);
    Ok(())
}

/// The op through candle's own `apply_op3`, as candle-flash-attn users
/// build it.
#[test]
fn custom_op_struct() -> Result<()> {
    let q = randn((1, 5, 2, 16), &Device::Cpu)?;
    let op = fa::FlashAttn { softmax_scale: 0.25, alibi_slopes: None, window_size_left: None, window_size_right: None, softcap: None };
    let o = q.apply_op3(&q, &q, op)?;
    assert_eq!(max_diff(&o, &fa::flash_attn(&q, &q, &q, 0.25, false)?)?, 0.0);
    Ok(())
}
