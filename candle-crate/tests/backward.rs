//! `loss.backward()` through the adapter (`CustomOp3::bwd` of the dense and
//! varlen ops) against the same loss through candle's own attention
//! (matmul, mask, softmax, matmul: candle's autograd of every step): dq, dk,
//! dv equal within f32 rounding, on the CPU (the reference's backward) and,
//! with `FA_REQUIRE_GPU=1` and the `cuda` feature, on the GPU.

mod common;

use candle_core::{D, DType, Device, Result, Tensor, Var};
use common::devices;

/// candle's attention with GQA (k/v heads broadcast over their group) and
/// the causal mask bottom-right aligned; the row maximum detached (it only
/// stabilizes the softmax).
fn candle_attn(q: &Tensor, k: &Tensor, v: &Tensor, scale: f64, causal: bool) -> Result<Tensor> {
    let (b, sk, hk, d) = k.dims4()?;
    let h = q.dim(2)?;
    let expand = |x: &Tensor| x.unsqueeze(3)?.broadcast_as((b, sk, hk, h / hk, d))?.reshape((b, sk, h, d));
    let (k, v) = (expand(k)?, expand(v)?);
    let (q, k, v) = (q.transpose(1, 2)?.contiguous()?, k.transpose(1, 2)?.contiguous()?, v.transpose(1, 2)?.contiguous()?);
    let att = (q.matmul(&k.t()?)? * scale)?;
    let sq = q.dim(2)?;
    let att = if causal {
        let mask: Vec<u8> = (0..sq).flat_map(|i| (0..sk).map(move |j| u8::from(j + sq > i + sk))).collect();
        let mask = Tensor::from_slice(&mask, (sq, sk), q.device())?.broadcast_as(att.shape())?;
        let ninf = Tensor::new(f32::NEG_INFINITY, q.device())?.to_dtype(att.dtype())?.broadcast_as(att.shape())?;
        mask.where_cond(&ninf, &att)?
    } else {
        att
    };
    let m = att.max_keepdim(D::Minus1)?.detach();
    let e = att.broadcast_sub(&m)?.exp()?;
    let p = e.broadcast_div(&e.sum_keepdim(D::Minus1)?)?;
    p.matmul(&v)?.transpose(1, 2)
}

/// `max |a − b| ≤ tol · (1 + max |b|)`.
fn close(what: &str, a: &Tensor, b: &Tensor, tol: f64) -> Result<()> {
    assert_eq!(a.dims(), b.dims(), "{what}: shape");
    let (a, b) = (a.to_dtype(DType::F64)?, b.to_dtype(DType::F64)?);
    let err = (&a - &b)?.abs()?.flatten_all()?.max(0)?.to_scalar::<f64>()?;
    let scale = 1.0 + b.abs()?.flatten_all()?.max(0)?.to_scalar::<f64>()?;
    assert!(err.is_finite() && err <= tol * scale, "{what}: max |Δ| = {err:e} > {tol:e} · {scale}");
    Ok(())
}

type Grads = [Tensor; 3];

/// Gradients of `Σ w ∘ attn(q, k, v)` w.r.t. q, k, v.
fn grads_of(dev: &Device, qkv: &[Tensor; 3], w: &Tensor, attn: impl Fn(&Tensor, &Tensor, &Tensor) -> Result<Tensor>) -> Result<Grads> {
    let vars = qkv.iter().map(|t| Var::from_tensor(&t.to_device(dev)?)).collect::<Result<Vec<_>>>()?;
    let out = attn(vars[0].as_tensor(), vars[1].as_tensor(), vars[2].as_tensor())?;
    let loss = (out.to_dtype(DType::F32)? * w.to_device(dev)?)?.sum_all()?;
    let g = loss.backward()?;
    let get = |i: usize| g.get(vars[i].as_tensor()).cloned().ok_or_else(|| candle_core::Error::Msg(format!("no gradient for input {i}")));
    Ok([get(0)?, get(1)?, get(2)?])
}

fn random(shape: (usize, usize, usize, usize), dtype: DType) -> Result<Tensor> {
    Tensor::randn(0f32, 1., shape, &Device::Cpu)?.to_dtype(dtype)
}

#[test]
fn dense_gradients_match_candle_autograd() -> Result<()> {
    for dev in devices() {
        // f64 runs on the CPU only; candle's own attention runs in the same dtype.
        let dtypes: &[DType] = if dev.is_cpu() { &[DType::F32, DType::F64] } else { &[DType::F32] };
        for &dtype in dtypes {
            for (b, sq, sk, h, hk, d) in [(2, 7, 7, 4, 4, 16), (1, 5, 9, 4, 2, 32), (2, 9, 4, 2, 1, 64), (1, 1, 6, 2, 2, 8)] {
                for causal in [false, true] {
                    if causal && sq > sk {
                        continue; // rows that see no key: NaN in candle's attention (ours: 0, tested in the core)
                    }
                    let qkv = [random((b, sq, h, d), dtype)?, random((b, sk, hk, d), dtype)?, random((b, sk, hk, d), dtype)?];
                    let w = random((b, sq, h, d), DType::F32)?;
                    let scale = 1.0 / (d as f64).sqrt();
                    let ours = grads_of(&dev, &qkv, &w, |q, k, v| flash_attn_candle::flash_attn(q, k, v, scale as f32, causal))?;
                    let theirs = grads_of(&dev, &qkv, &w, |q, k, v| candle_attn(q, k, v, scale, causal))?;
                    let case = format!("{dev:?} {dtype:?} {:?} causal {causal}", (b, sq, sk, h, hk, d));
                    for (name, x, y) in [("dq", &ours[0], &theirs[0]), ("dk", &ours[1], &theirs[1]), ("dv", &ours[2], &theirs[2])] {
                        close(&format!("{case} {name}"), x, y, 1e-4)?;
                    }
                }
            }
        }
    }
    Ok(())
}

/// q as a transposed view (llama's call), and a bare `FlashAttn` applied by
/// the caller (the logsumexp recomputed in `bwd`): the same gradients.
#[test]
fn strided_views_and_the_bare_op() -> Result<()> {
    for dev in devices() {
        let qkv = [random((1, 4, 6, 16), DType::F32)?, random((1, 6, 4, 16), DType::F32)?, random((1, 6, 4, 16), DType::F32)?];
        let w = random((1, 6, 4, 16), DType::F32)?;
        let viewed = |q: &Tensor, k: &Tensor, v: &Tensor| flash_attn_candle::flash_attn(&q.transpose(1, 2)?, k, v, 0.25, true);
        let ours = grads_of(&dev, &qkv, &w, viewed)?;
        let bare = |q: &Tensor, k: &Tensor, v: &Tensor| {
            let op = flash_attn_candle::FlashAttn { softmax_scale: 0.25, alibi_slopes: None, window_size_left: None, window_size_right: Some(0), softcap: None };
            q.transpose(1, 2)?.apply_op3(k, v, op)
        };
        let recomputed = grads_of(&dev, &qkv, &w, bare)?;
        let theirs = grads_of(&dev, &qkv, &w, |q, k, v| candle_attn(&q.transpose(1, 2)?, k, v, 0.25, true))?;
        for i in 0..3 {
            close(&format!("{dev:?} viewed grad {i}"), &ours[i], &theirs[i], 1e-4)?;
            close(&format!("{dev:?} bare-op grad {i}"), &recomputed[i], &theirs[i], 1e-4)?;
        }
    }
    Ok(())
}

/// Varlen: the packed call's gradients = each sequence's through candle's attention.
#[test]
fn varlen_gradients_match_each_sequence() -> Result<()> {
    for dev in devices() {
        let (lq, lk) = ([3usize, 1, 5], [4usize, 2, 6]);
        let (tq, tk, h, hk, d) = (9, 12, 4, 2, 16);
        let cum = |l: &[usize]| std::iter::once(0u32).chain(l.iter().scan(0u32, |a, &x| { *a += x as u32; Some(*a) })).collect::<Vec<u32>>();
        let (cq, ck) = (cum(&lq), cum(&lk));
        let q = random((1, tq, h, d), DType::F32)?.squeeze(0)?;
        let k = random((1, tk, hk, d), DType::F32)?.squeeze(0)?;
        let v = random((1, tk, hk, d), DType::F32)?.squeeze(0)?;
        let w = random((1, tq, h, d), DType::F32)?.squeeze(0)?;
        let seqlens = |c: &[u32]| Tensor::new(c, &dev);
        let (sq, sk) = (seqlens(&cq)?, seqlens(&ck)?);
        for causal in [false, true] {
            let ours = grads_of(&dev, &[q.clone(), k.clone(), v.clone()], &w, |q, k, v| {
                flash_attn_candle::flash_attn_varlen(q, k, v, &sq, &sk, 5, 6, 0.25, causal)
            })?;
            // candle's attention on each sequence, the outputs concatenated.
            let theirs = grads_of(&dev, &[q.clone(), k.clone(), v.clone()], &w, |q, k, v| {
                let outs = (0..3)
                    .map(|b| {
                        let (r, s) = (cq[b] as usize, ck[b] as usize);
                        let one = |x: &Tensor, at: usize, n: usize| x.narrow(0, at, n)?.unsqueeze(0);
                        candle_attn(&one(q, r, lq[b])?, &one(k, s, lk[b])?, &one(v, s, lk[b])?, 0.25, causal)?.squeeze(0)
                    })
                    .collect::<Result<Vec<_>>>()?;
                Tensor::cat(&outs, 0)
            })?;
            for i in 0..3 {
                close(&format!("{dev:?} varlen causal {causal} grad {i}"), &ours[i], &theirs[i], 1e-4)?;
            }
        }
    }
    Ok(())
}
