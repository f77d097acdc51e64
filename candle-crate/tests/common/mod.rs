//! Helpers shared by the integration tests: the devices to run on and
//! candle's own attention (the naive computation the adapter must match).
#![allow(dead_code)]

use candle_core::{D, DType, Device, Result, Tensor};

/// The devices to test on: the CPU, and the GPU when asked for.
pub fn devices() -> Vec<Device> {
    let mut devs = vec![Device::Cpu];
    if std::env::var("FA_REQUIRE_GPU").is_ok_and(|v| v == "1") {
        if !cfg!(feature = "cuda") {
            panic!("FA_REQUIRE_GPU=1 needs the `cuda` feature");
        }
        devs.push(Device::new_cuda(0).expect("FA_REQUIRE_GPU=1 but no CUDA device"));
    } else {
        eprintln!("GPU cases skipped: set FA_REQUIRE_GPU=1 (with --features cuda) to run them");
    }
    devs
}

/// The GPU when the tests are asked to use one (`FA_REQUIRE_GPU=1`), else
/// `None`, saying that the GPU cases are skipped.
pub fn requested_gpu() -> Option<Device> {
    let gpu = devices().into_iter().find(Device::is_cuda);
    if gpu.is_none() {
        eprintln!("skipped: no GPU requested (FA_REQUIRE_GPU=1)");
    }
    gpu
}

/// candle's attention on `(b, s, h, d)` tensors, in f32, causal mask
/// bottom-right aligned; returns `(b, sq, h, d)` f32 and the logsumexp
/// `(b, h, sq)`.
pub fn candle_attention(q: &Tensor, k: &Tensor, v: &Tensor, scale: f64, causal: bool) -> Result<(Tensor, Tensor)> {
    let (q, k, v) = (q.to_dtype(DType::F32)?, k.to_dtype(DType::F32)?, v.to_dtype(DType::F32)?);
    let (q, k, v) = (q.transpose(1, 2)?.contiguous()?, k.transpose(1, 2)?.contiguous()?, v.transpose(1, 2)?.contiguous()?);
    let att = (q.matmul(&k.t()?)? * scale)?;
    let (sq, sk) = (q.dim(2)?, k.dim(2)?);
    let att = if causal {
        let mask: Vec<u8> = (0..sq).flat_map(|i| (0..sk).map(move |j| u8::from(j + sq > i + sk))).collect();
        let mask = Tensor::from_slice(&mask, (sq, sk), q.device())?.broadcast_as(att.shape())?;
        let ninf = Tensor::new(f32::NEG_INFINITY, q.device())?.broadcast_as(att.shape())?;
        mask.where_cond(&ninf, &att)?
    } else {
        att
    };
    let (p, lse) = softmax(&att)?;
    Ok((p.matmul(&v)?.transpose(1, 2)?, lse))
}

/// Safe softmax over the last axis (what `candle_nn::ops::softmax_last_dim`
/// computes, written with candle-core ops so it runs on every backend) and
/// the logsumexp.
pub fn softmax(att: &Tensor) -> Result<(Tensor, Tensor)> {
    let m = att.max_keepdim(D::Minus1)?;
    let e = att.broadcast_sub(&m)?.exp()?;
    let sum = e.sum_keepdim(D::Minus1)?;
    let lse = (sum.log()? + m)?.squeeze(D::Minus1)?;
    Ok((e.broadcast_div(&sum)?, lse))
}

/// candle's attention with every option, in f32 on `(b, s, h, d)`: GQA by
/// repeating k/v heads (head `h` reads k/v head `h / (nheads / nheads_k)`),
/// softcap `cap·tanh(s/cap)`, ALiBi `−slope·|i + sk − sq − j|`, window
/// `i + sk − sq − left ≤ j ≤ i + sk − sq + right` (bottom-right aligned).
pub fn candle_attention_ext(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    scale: f64,
    window: (Option<usize>, Option<usize>),
    softcap: Option<f64>,
    alibi: Option<&[f32]>,
) -> Result<Tensor> {
    let (b, sq, h, _) = q.dims4()?;
    let (_, sk, _, _) = k.dims4()?;
    let rep = |x: &Tensor| -> Result<Tensor> {
        let x = x.to_dtype(DType::F32)?.transpose(1, 2)?.contiguous()?; // (b, hk, s, d)
        let (b, hk, s, d) = x.dims4()?;
        Tensor::cat(&vec![&x; h / hk], 2)?.reshape((b, h, s, d))
    };
    let (k, v) = (rep(k)?, rep(v)?);
    let q = q.to_dtype(DType::F32)?.transpose(1, 2)?.contiguous()?;
    let mut att = (q.matmul(&k.t()?)? * scale)?;
    if let Some(cap) = softcap {
        att = ((att / cap)?.tanh()? * cap)?;
    }
    let shift = sk as i64 - sq as i64;
    if let Some(slopes) = alibi {
        let dist: Vec<f32> = (0..sq).flat_map(|i| (0..sk).map(move |j| (i as i64 + shift - j as i64).abs() as f32)).collect();
        let dist = Tensor::from_slice(&dist, (1, 1, sq, sk), q.device())?;
        let slopes = Tensor::from_slice(slopes, (1, h, 1, 1), q.device())?;
        att = (att - dist.broadcast_mul(&slopes)?.broadcast_as((b, h, sq, sk))?)?;
    }
    let mask: Vec<u8> = (0..sq)
        .flat_map(|i| {
            (0..sk).map(move |j| {
                let c = i as i64 + shift;
                let j = j as i64;
                u8::from(window.0.is_some_and(|l| j < c - l as i64) || window.1.is_some_and(|r| j > c + r as i64))
            })
        })
        .collect();
    let mask = Tensor::from_slice(&mask, (sq, sk), q.device())?.broadcast_as(att.shape())?;
    let ninf = Tensor::new(f32::NEG_INFINITY, q.device())?.broadcast_as(att.shape())?;
    let att = mask.where_cond(&ninf, &att)?;
    let (p, _) = softmax(&att)?;
    p.matmul(&v)?.transpose(1, 2)
}

pub fn max_diff(a: &Tensor, b: &Tensor) -> Result<f32> {
    (a.to_dtype(DType::F32)? - b.to_dtype(DType::F32)?)?.abs()?.flatten_all()?.max(0)?.to_scalar::<f32>()
}

pub fn randn(shape: (usize, usize, usize, usize), dev: &Device) -> Result<Tensor> {
    Tensor::randn(0f32, 1f32, shape, dev)
}

/// Tolerance of a dtype against candle's f32 attention.
pub fn tol(dt: DType) -> f32 {
    match dt {
        DType::F64 | DType::F32 => 2e-5,
        DType::F16 => 4e-3,
        _ => 3e-2,
    }
}

