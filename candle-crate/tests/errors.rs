//! Bad input is a candle error naming the argument; nothing panics (the
//! KV-cache calls' errors: `tests/kvcache.rs`).

use candle_core::{DType, Device, Result, Tensor};
use flash_attn_candle as fa;

fn t(shape: &[usize], dt: DType) -> Tensor {
    Tensor::zeros(shape, dt, &Device::Cpu).unwrap()
}

fn expect_err(r: Result<Tensor>, needles: &[&str]) {
    let e = r.expect_err("expected an error").to_string();
    for n in needles {
        assert!(e.contains(n), "error {e:?} should mention {n:?}");
    }
}

#[test]
fn rank_dtype_stride_and_shape_errors_name_the_argument() {
    let q = t(&[1, 8, 2, 64], DType::F32);
    expect_err(fa::flash_attn(&t(&[8, 2, 64], DType::F32), &q, &q, 0.1, true), &["`q` must have rank 4"]);
    expect_err(fa::flash_attn(&q, &t(&[1, 8, 2, 64, 1], DType::F32), &q, 0.1, true), &["`k` must have rank 4"]);
    expect_err(fa::flash_attn(&q, &q, &q.to_dtype(DType::F16).unwrap(), 0.1, true), &["dtype mismatch", "`v` is F16", "`q` is F32"]);
    expect_err(fa::flash_attn(&q.to_dtype(DType::U32).unwrap(), &q, &q, 0.1, true), &["dtype mismatch", "`k` is F32"]);
    let u = t(&[1, 8, 2, 64], DType::U32);
    expect_err(fa::flash_attn(&u, &u, &u, 0.1, true), &["`q`: dtype U32 is not supported"]);
    // Last stride ≠ 1: a transposed (…, d, h) view.
    let kt = t(&[1, 8, 64, 2], DType::F32).transpose(2, 3).unwrap();
    expect_err(fa::flash_attn(&q, &kt, &q, 0.1, true), &["`k`: the last (headdim) dimension must be contiguous"]);
    expect_err(fa::flash_attn(&q, &t(&[2, 8, 2, 64], DType::F32), &q, 0.1, true), &["shape mismatch", "`k`"]);
    expect_err(fa::flash_attn(&q, &q, &t(&[1, 9, 2, 64], DType::F32), 0.1, true), &["shape mismatch", "`v`"]);
    expect_err(fa::flash_attn(&q, &t(&[1, 8, 3, 64], DType::F32), &t(&[1, 8, 3, 64], DType::F32), 0.1, true), &["`k`", "k/v heads 3"]);
    // Head dim out of range (the core's limit, 256).
    let big = t(&[1, 4, 1, 264], DType::F32);
    expect_err(fa::flash_attn(&big, &big, &big, 0.1, true), &["`q`", "headdim 264 is out of range"]);
    expect_err(fa::flash_attn(&q, &q, &q, f32::NAN, true), &["softmax_scale"]);
    let z = t(&[1, 0, 2, 64], DType::F32);
    expect_err(fa::flash_attn(&z, &q, &q, 0.1, true), &["`q`", "zero-sized"]);
}

#[test]
fn option_errors_name_the_argument() {
    let q = t(&[1, 8, 4, 64], DType::F32);
    let s3 = Tensor::ones(3, DType::F32, &Device::Cpu).unwrap();
    expect_err(fa::flash_attn_alibi(&q, &q, &q, &s3, 0.1, true), &["`alibi_slopes`", "shape mismatch"]);
    let s4 = Tensor::ones(4, DType::F16, &Device::Cpu).unwrap();
    expect_err(fa::flash_attn_alibi(&q, &q, &q, &s4, 0.1, true), &["`alibi_slopes`", "F32"]);
    expect_err(fa::flash_attn_alibi_windowed_softcap(&q, &q, &q, None, 0.1, None, None, -1.0), &["softcap"]);
    expect_err(fa::flash_attn_alibi_windowed_softcap(&q, &q, &q, None, 0.1, None, None, f32::NAN), &["softcap"]);
    // Sequences past the packed tensors: the core's prefix-sum checks.
    let p = t(&[16, 4, 64], DType::F32);
    let bad = Tensor::new(&[0u32, 8, 20], &Device::Cpu).unwrap();
    let cu = Tensor::new(&[0u32, 8, 16], &Device::Cpu).unwrap();
    expect_err(fa::flash_attn_varlen(&p, &p, &p, &bad, &cu, 12, 8, 0.1, true), &["cu_seqlens_q"]);
}

#[test]
fn varlen_argument_errors() {
    let p = t(&[16, 4, 64], DType::F32);
    let cu = Tensor::new(&[0u32, 8, 16], &Device::Cpu).unwrap();
    let q4 = t(&[1, 16, 4, 64], DType::F32);
    expect_err(fa::flash_attn_varlen(&q4, &p, &p, &cu, &cu, 8, 8, 0.1, true), &["`q` must have rank 3"]);
    let cf = cu.to_dtype(DType::F32).unwrap();
    expect_err(fa::flash_attn_varlen(&p, &p, &p, &cf, &cu, 8, 8, 0.1, true), &["`seqlens_q`", "U32"]);
    let one = Tensor::new(&[0u32], &Device::Cpu).unwrap();
    expect_err(fa::flash_attn_varlen(&p, &p, &p, &cu, &one, 8, 8, 0.1, true), &["`seqlens_k`", "cumulative"]);
}

#[cfg(feature = "cuda")]
#[test]
fn device_mismatch_names_the_argument() {
    if std::env::var("FA_REQUIRE_GPU").ok().as_deref() != Some("1") {
        eprintln!("skipped: set FA_REQUIRE_GPU=1 on a GPU machine");
        return;
    }
    let gpu = Device::new_cuda(0).unwrap();
    let q = Tensor::zeros((1, 8, 2, 64), DType::BF16, &gpu).unwrap();
    let k = Tensor::zeros((1, 8, 2, 64), DType::BF16, &Device::Cpu).unwrap();
    expect_err(fa::flash_attn(&q, &k, &q, 0.1, true), &["device mismatch", "`k`"]);
    // f64 has no kernel: a named dtype error, not a panic.
    let d = Tensor::zeros((1, 8, 2, 64), DType::F64, &gpu).unwrap();
    expect_err(fa::flash_attn(&d, &d, &d, 0.1, true), &["`q`: dtype F64 is not supported on the GPU"]);
    // Head dim out of range on the GPU path too (the core's typed error).
    let h = Tensor::zeros((1, 8, 2, 264), DType::BF16, &gpu).unwrap();
    expect_err(fa::flash_attn(&h, &h, &h, 0.1, true), &["`q`", "headdim 264 is out of range"]);
}
