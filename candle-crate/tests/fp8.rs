//! The FP8 (e4m3) calls on the CPU: `flash_attn_fp8` / `FlashAttnFp8` and
//! `flash_attn_with_kvcache_fp8` / `FlashAttnKvCache::forward_fp8` against
//! candle's own attention over the dequantized inputs (candle's
//! `to_dtype(F32)` of the F8E4M3 tensors times the scales, then matmul and
//! softmax in f32), and the appended cache bytes against candle's own
//! round-to-nearest-even, saturating e4m3 conversion of the new rows.
//! Bad input: candle errors naming the argument, caches untouched.

mod common;

use candle_core::{DType, Device, IndexOp, Result, Tensor};
use common::*;
use flash_attn_candle::{self as fa, FlashAttnFp8, FlashAttnKvCache, Fp8Descales, KvCacheArgs};

type Window = (Option<usize>, Option<usize>);

/// candle's attention in f32 over already dequantized f32 tensors `(b, s,
/// h, d)`: GQA by repeating k/v heads, window bottom-right aligned; O `(b,
/// sq, h, d)` and the logsumexp `(b, h, sq)`.
fn attention(q: &Tensor, k: &Tensor, v: &Tensor, scale: f64, window: Window) -> Result<(Tensor, Tensor)> {
    let (_, sq, h, _) = q.dims4()?;
    let (_, sk, _, _) = k.dims4()?;
    let rep = |x: &Tensor| -> Result<Tensor> {
        let x = x.transpose(1, 2)?.contiguous()?;
        let (b, hk, s, d) = x.dims4()?;
        // Head h reads KV head h / (h / hk): each KV head repeated in place.
        x.unsqueeze(2)?.broadcast_as((b, hk, h / hk, s, d))?.contiguous()?.reshape((b, h, s, d))
    };
    let (k, v) = (rep(k)?, rep(v)?);
    let q = q.transpose(1, 2)?.contiguous()?;
    let att = (q.matmul(&k.t()?)? * scale)?;
    let shift = sk as i64 - sq as i64;
    let mask: Vec<u8> = (0..sq)
        .flat_map(|i| {
            (0..sk).map(move |j| {
                let (c, j) = (i as i64 + shift, j as i64);
                u8::from(window.0.is_some_and(|l| j < c - l as i64) || window.1.is_some_and(|r| j > c + r as i64))
            })
        })
        .collect();
    let mask = Tensor::from_slice(&mask, (sq, sk), q.device())?.broadcast_as(att.shape())?;
    let ninf = Tensor::new(f32::NEG_INFINITY, q.device())?.broadcast_as(att.shape())?;
    let (p, lse) = softmax(&mask.where_cond(&ninf, &att)?)?;
    Ok((p.matmul(&v)?.transpose(1, 2)?, lse))
}

/// Codes of `x / scale` (candle's F8E4M3 conversion: nearest even, saturating).
fn quantize(x: &Tensor, scale: f32) -> Result<Tensor> {
    (x / scale as f64)?.to_dtype(DType::F8E4M3)
}

/// An F8E4M3 tensor's values in f32 times a descale of shape `()`/`(1)`
/// (one value) or `(batch, nheads_k)` (per head: `group` query heads per
/// KV head).
fn dequantize(x8: &Tensor, descale: Option<&Tensor>, group: usize) -> Result<Tensor> {
    let x = x8.to_dtype(DType::F32)?;
    let Some(s) = descale else { return Ok(x) };
    let (b, _, h, _) = x.dims4()?;
    let s = if s.elem_count() == 1 {
        s.flatten_all()?.reshape((1, 1, 1, 1))?
    } else {
        // (b, hk) → (b, 1, h, 1): head i reads KV head i / group.
        let hk = s.dim(1)?;
        s.unsqueeze(2)?.broadcast_as((b, hk, group))?.contiguous()?.reshape((b, 1, h, 1))?
    };
    x.broadcast_mul(&s)
}

/// Elementwise `|got − want| ≤ rel · |want| + abs` (equal values pass: −inf LSEs).
fn check_close(got: &Tensor, want: &Tensor, rel: f32, abs: f32, what: &str) -> Result<()> {
    let g = got.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?;
    let w = want.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?;
    assert_eq!(g.len(), w.len(), "{what}: lengths");
    for (i, (x, y)) in g.iter().zip(&w).enumerate() {
        let ok = x == y || (x - y).abs() <= rel * y.abs() + abs;
        assert!(ok, "{what}: element {i}: got {x}, want {y}");
    }
    Ok(())
}

/// Output rounding of a dtype (half an ulp, relative), with a margin.
fn out_rel(dt: DType) -> f32 {
    if dt == DType::BF16 { 2f32.powi(-8) } else { 2f32.powi(-10) }
}

#[test]
fn prefill_matches_candle_over_dequantized_inputs() -> Result<()> {
    let dev = Device::Cpu;
    let (b, h, hk, d) = (2, 4, 2, 32);
    let cases: [(usize, usize, bool, &str, DType); 5] = [
        (17, 17, true, "none", DType::BF16),
        (9, 23, true, "scalar", DType::F16),
        (16, 16, false, "one", DType::BF16),
        (5, 31, true, "per-head", DType::BF16),
        (12, 20, false, "per-head", DType::F16),
    ];
    for (sq, sk, causal, form, out) in cases {
        let q = randn((b, sq, h, d), &dev)?;
        let k = (randn((b, sk, hk, d), &dev)? * 2.0)?;
        let v = randn((b, sk, hk, d), &dev)?;
        let (q8, k8, v8) = (quantize(&q, 0.01)?, quantize(&k, 0.02)?, quantize(&v, 0.015)?);
        let desc = |per_tensor: f32, per_head: &[f32]| -> Result<Option<Tensor>> {
            Ok(match form {
                "none" => None,
                "scalar" => Some(Tensor::new(per_tensor, &dev)?),
                "one" => Some(Tensor::new(&[per_tensor], &dev)?),
                _ => Some(Tensor::from_slice(per_head, (b, hk), &dev)?),
            })
        };
        let qs = desc(0.01, &[0.01, 0.02, 0.005, 0.011])?;
        let ks = desc(0.02, &[0.02, 0.03, 0.01, 0.021])?;
        let vs = desc(0.015, &[0.015, 0.01, 0.02, 0.012])?;
        let ds = Fp8Descales { q_descale: qs.as_ref(), k_descale: ks.as_ref(), v_descale: vs.as_ref() };
        let scale = 1.0 / (d as f32).sqrt();
        let o = fa::flash_attn_fp8(&q8, &k8, &v8, scale, causal, ds, out)?;
        assert_eq!((o.dims4()?, o.dtype()), ((b, sq, h, d), out));
        let group = h / hk;
        let (qd, kd, vd) = (dequantize(&q8, qs.as_ref(), group)?, dequantize(&k8, ks.as_ref(), 1)?, dequantize(&v8, vs.as_ref(), 1)?);
        let window = if causal { (None, Some(0)) } else { (None, None) };
        let (want, want_lse) = attention(&qd, &kd, &vd, scale as f64, window)?;
        check_close(&o, &want, out_rel(out), 1e-5, &format!("sq {sq} sk {sk} causal {causal} {form} {out:?}"))?;
        let op = FlashAttnFp8 {
            softmax_scale: scale,
            window_size_left: window.0,
            window_size_right: window.1,
            q_descale: qs.clone(),
            k_descale: ks.clone(),
            v_descale: vs.clone(),
            out_dtype: out,
        };
        let (o2, lse) = op.forward_with_lse(&q8, &k8, &v8)?;
        assert_eq!(max_diff(&o, &o2)?, 0.0);
        assert_eq!(lse.dims3()?, (b, h, sq));
        check_close(&lse, &want_lse, 1e-5, 1e-5, "lse")?;
    }
    Ok(())
}

#[test]
fn prefill_windows_and_strided_views() -> Result<()> {
    let dev = Device::Cpu;
    let (b, sq, sk, h, hk, d) = (1, 20, 28, 6, 3, 64);
    // q as a (b, h, s, d) tensor transposed: strided (b, s, h, d) view.
    let q8 = quantize(&Tensor::randn(0f32, 1., (b, h, sq, d), &dev)?, 0.01)?.transpose(1, 2)?;
    assert!(!q8.is_contiguous());
    let k8 = quantize(&randn((b, sk, hk, d), &dev)?, 0.01)?;
    let v8 = quantize(&randn((b, sk, hk, d), &dev)?, 0.01)?;
    let s = Tensor::new(&[0.01f32], &dev)?;
    let ds = Fp8Descales { q_descale: Some(&s), k_descale: Some(&s), v_descale: Some(&s) };
    let (qd, kd, vd) = (dequantize(&q8, Some(&s), 1)?, dequantize(&k8, Some(&s), 1)?, dequantize(&v8, Some(&s), 1)?);
    for window in [(Some(4), Some(0)), (Some(3), Some(5)), (None, Some(2))] {
        let o = fa::flash_attn_fp8_windowed(&q8, &k8, &v8, 0.2, window.0, window.1, ds, DType::BF16)?;
        let (want, _) = attention(&qd, &kd, &vd, 0.2, window)?;
        check_close(&o, &want, out_rel(DType::BF16), 1e-5, &format!("window {window:?}"))?;
    }
    Ok(())
}

/// Codes of a tensor (bit patterns).
fn bits(t: &Tensor) -> Result<Vec<u8>> {
    Ok(t.flatten_all()?.to_vec1::<float8::F8E4M3>()?.iter().map(|x| x.to_bits()).collect())
}

/// `x / scale` per KV head (`scales` of length 1 or hk) as codes through
/// candle's conversion (nearest even, saturating to ±448).
fn expected_codes(x: &Tensor, scales: &[f32]) -> Result<Vec<u8>> {
    let hk = x.dim(2)?;
    let s = if scales.len() == 1 { vec![scales[0]; hk] } else { scales.to_vec() };
    let s = Tensor::from_slice(&s, (1, 1, hk, 1), x.device())?;
    bits(&x.to_dtype(DType::F32)?.broadcast_div(&s)?.to_dtype(DType::F8E4M3)?)
}

/// The cache's first `len` keys of sequence `row` dequantized: `(1, len, hk, d)` f32.
fn dequant_rows(cache: &Tensor, row: usize, len: usize, scales: &[f32]) -> Result<Tensor> {
    let x = cache.i((row..row + 1, 0..len))?.to_dtype(DType::F32)?;
    let hk = x.dim(2)?;
    let s = if scales.len() == 1 { vec![scales[0]; hk] } else { scales.to_vec() };
    x.broadcast_mul(&Tensor::from_slice(&s, (1, 1, hk, 1), x.device())?)
}

#[test]
fn kvcache_append_quantizes_and_attends() -> Result<()> {
    let dev = Device::Cpu;
    let (batch, cap, h, hk, d) = (2, 40, 8, 2, 32);
    for (scales, s_new, out, causal) in [(vec![0.01f32], 1usize, DType::BF16, true), (vec![0.02f32, 0.005], 3, DType::F16, true), (vec![0.01f32, 0.03], 2, DType::BF16, false)] {
        let k_cache = quantize(&randn((batch, cap, hk, d), &dev)?, 0.05)?;
        let v_cache = quantize(&randn((batch, cap, hk, d), &dev)?, 0.05)?;
        let (k_before, v_before) = (bits(&k_cache)?, bits(&v_cache)?);
        let ksc = Tensor::from_slice(&scales, scales.len(), &dev)?;
        let vsc = ksc.clone();
        let lens = [11u32, 23];
        let cache_seqlens = Tensor::new(&lens, &dev)?;
        let q = randn((batch, s_new, h, d), &dev)?.to_dtype(out)?;
        // Some new values far beyond 448 · scale: they saturate.
        let k_new = (randn((batch, s_new, hk, d), &dev)? * 3.0)?;
        let big = Tensor::full(1000f32, (batch, s_new, hk, 1), &dev)?;
        let k_new = Tensor::cat(&[&big, &k_new.narrow(3, 1, d - 1)?], 3)?.to_dtype(out)?;
        let v_new = randn((batch, s_new, hk, d), &dev)?.to_dtype(out)?;
        let scale = 0.3f32;
        let o = fa::flash_attn_with_kvcache_fp8(&q, &k_cache, &v_cache, &ksc, &vsc, Some(&k_new), Some(&v_new), Some(&cache_seqlens), None, scale, causal)?;
        assert_eq!((o.dims4()?, o.dtype()), ((batch, s_new, h, d), out));
        for (b, &len) in lens.iter().enumerate() {
            let len = len as usize;
            // The appended rows: exactly candle's e4m3 of x / scale (saturated).
            let got_k = bits(&k_cache.i((b, len..len + s_new))?)?;
            assert_eq!(got_k, expected_codes(&k_new.i(b..b + 1)?, &scales)?, "k rows of sequence {b}");
            assert!(got_k.iter().any(|&c| c & 0x7F == 0x7E), "a saturated code (±448)");
            assert_eq!(bits(&v_cache.i((b, len..len + s_new))?)?, expected_codes(&v_new.i(b..b + 1)?, &scales)?, "v rows of sequence {b}");
            // Every other row untouched.
            let row = cap * hk * d;
            for (before, after) in [(&k_before, bits(&k_cache)?), (&v_before, bits(&v_cache)?)] {
                let (lo, hi) = (b * row + len * hk * d, b * row + (len + s_new) * hk * d);
                assert_eq!(&before[b * row..lo], &after[b * row..lo]);
                assert_eq!(&before[hi..(b + 1) * row], &after[hi..(b + 1) * row]);
            }
            // Attention over the dequantized cache after the append.
            let (kd, vd) = (dequant_rows(&k_cache, b, len + s_new, &scales)?, dequant_rows(&v_cache, b, len + s_new, &scales)?);
            let qb = q.i(b..b + 1)?.to_dtype(DType::F32)?;
            let window = if causal { (None, Some(0)) } else { (None, None) };
            let (want, _) = attention(&qb, &kd, &vd, scale as f64, window)?;
            check_close(&o.i(b..b + 1)?, &want, out_rel(out), 2e-3, &format!("sequence {b}, scales {scales:?}"))?;
        }
    }
    Ok(())
}

#[test]
fn kvcache_paged_and_without_lengths() -> Result<()> {
    let dev = Device::Cpu;
    let (h, hk, d, page) = (4, 2, 16, 8);
    // Two sequences over pages (5 pages, table in a shuffled order).
    let table = [[3u32, 0, 4], [1, 2, 0]];
    let k_pages = quantize(&randn((5, page, hk, d), &dev)?, 0.02)?;
    let v_pages = quantize(&randn((5, page, hk, d), &dev)?, 0.02)?;
    let bt = Tensor::new(&table, &dev)?;
    let lens = [12u32, 7];
    let scales = [0.02f32];
    let sc = Tensor::new(&scales, &dev)?;
    let q = randn((2, 1, h, d), &dev)?.to_dtype(DType::BF16)?;
    let k_new = randn((2, 1, hk, d), &dev)?.to_dtype(DType::BF16)?;
    let v_new = randn((2, 1, hk, d), &dev)?.to_dtype(DType::BF16)?;
    let op = FlashAttnKvCache { softmax_scale: 0.25, alibi_slopes: None, window_size_left: None, window_size_right: Some(0), softcap: None, num_splits: None };
    let cache_seqlens = Tensor::new(&lens, &dev)?;
    let args = KvCacheArgs { k_new: Some(&k_new), v_new: Some(&v_new), cache_seqlens: &cache_seqlens, cache_batch_idx: None, block_table: Some(&bt) };
    let (o, lse) = op.forward_fp8(&q, &k_pages, &v_pages, &sc, &sc, args)?;
    assert_eq!(lse.dims3()?, (2, h, 1));
    for (b, &len) in lens.iter().enumerate() {
        let len = len as usize;
        let (pg, row) = (table[b][len / page] as usize, len % page);
        assert_eq!(bits(&k_pages.i((pg, row))?)?, expected_codes(&k_new.i(b..b + 1)?, &scales)?);
        assert_eq!(bits(&v_pages.i((pg, row))?)?, expected_codes(&v_new.i(b..b + 1)?, &scales)?);
        // The sequence's keys gathered from its pages, dequantized.
        let gather = |pages: &Tensor| -> Result<Tensor> {
            let rows: Vec<Tensor> = (0..=len).map(|t| pages.i((table[b][t / page] as usize, t % page)).unwrap()).collect();
            Tensor::stack(&rows, 0)?.unsqueeze(0)?.to_dtype(DType::F32)? * scales[0] as f64
        };
        let (want, want_lse) = attention(&q.i(b..b + 1)?.to_dtype(DType::F32)?, &gather(&k_pages)?, &gather(&v_pages)?, 0.25, (None, Some(0)))?;
        check_close(&o.i(b..b + 1)?, &want, out_rel(DType::BF16), 1e-5, &format!("paged sequence {b}"))?;
        check_close(&lse.i(b..b + 1)?, &want_lse, 1e-5, 1e-5, "paged lse")?;
    }
    // cache_seqlens None: every sequence fills the whole (contiguous) cache.
    let k_cache = quantize(&randn((2, 24, hk, d), &dev)?, 0.02)?;
    let v_cache = quantize(&randn((2, 24, hk, d), &dev)?, 0.02)?;
    let o = fa::flash_attn_with_kvcache_fp8(&q, &k_cache, &v_cache, &sc, &sc, None, None, None, None, 0.25, false)?;
    let want = attention(&q.to_dtype(DType::F32)?, &(k_cache.to_dtype(DType::F32)? * 0.02)?, &(v_cache.to_dtype(DType::F32)? * 0.02)?, 0.25, (None, None))?.0;
    check_close(&o, &want, out_rel(DType::BF16), 1e-5, "full cache")?;
    Ok(())
}

fn expect_err<T: std::fmt::Debug>(r: Result<T>, needles: &[&str]) {
    let e = r.expect_err("expected an error").to_string();
    for n in needles {
        assert!(e.contains(n), "error {e:?} should mention {n:?}");
    }
}

#[test]
fn prefill_errors_name_the_argument() -> Result<()> {
    let dev = Device::Cpu;
    let z8 = |s: &[usize]| Tensor::zeros(s, DType::F8E4M3, &dev).unwrap();
    let q8 = z8(&[2, 8, 4, 32]);
    let k8 = z8(&[2, 8, 2, 32]);
    let none = Fp8Descales::default();
    let bf = q8.to_dtype(DType::BF16)?;
    expect_err(fa::flash_attn_fp8(&bf, &k8, &k8, 0.1, true, none, DType::BF16), &["dtype mismatch", "`q` is BF16", "F8E4M3"]);
    expect_err(fa::flash_attn_fp8(&q8, &k8, &k8.to_dtype(DType::F32)?, 0.1, true, none, DType::BF16), &["`v` is F32"]);
    expect_err(fa::flash_attn_fp8(&q8, &k8, &k8, 0.1, true, none, DType::F32), &["`out_dtype`", "F32"]);
    expect_err(fa::flash_attn_fp8(&q8, &z8(&[2, 8, 3, 32]), &z8(&[2, 8, 3, 32]), 0.1, true, none, DType::BF16), &["k/v heads 3"]);
    expect_err(fa::flash_attn_fp8(&q8, &k8, &z8(&[2, 9, 2, 32]), 0.1, true, none, DType::BF16), &["shape mismatch", "`v`"]);
    expect_err(fa::flash_attn_fp8(&z8(&[8, 4, 32]), &k8, &k8, 0.1, true, none, DType::BF16), &["`q` must have rank 4"]);
    let d40 = z8(&[1, 8, 2, 40]);
    expect_err(fa::flash_attn_fp8(&d40, &d40, &d40, 0.1, true, none, DType::BF16), &["`q`", "headdim 40", "multiples of 16"]);
    // Descale factors: dtype, shape, one shape for all, values (CPU).
    let f16s = Tensor::new(&[1f32], &dev)?.to_dtype(DType::F16)?;
    expect_err(fa::flash_attn_fp8(&q8, &k8, &k8, 0.1, true, Fp8Descales { k_descale: Some(&f16s), ..none }, DType::BF16), &["`k_descale`", "F32"]);
    let three = Tensor::ones(3, DType::F32, &dev)?;
    expect_err(fa::flash_attn_fp8(&q8, &k8, &k8, 0.1, true, Fp8Descales { q_descale: Some(&three), ..none }, DType::BF16), &["`q_descale`", "shape mismatch", "(2, 2)"]);
    let per_q_heads = Tensor::ones((2, 4), DType::F32, &dev)?;
    expect_err(fa::flash_attn_fp8(&q8, &k8, &k8, 0.1, true, Fp8Descales { v_descale: Some(&per_q_heads), ..none }, DType::BF16), &["`v_descale`", "(2, 2)"]);
    let one = Tensor::new(&[0.5f32], &dev)?;
    let per_head = Tensor::ones((2, 2), DType::F32, &dev)?;
    expect_err(
        fa::flash_attn_fp8(&q8, &k8, &k8, 0.1, true, Fp8Descales { q_descale: Some(&one), k_descale: Some(&per_head), v_descale: None }, DType::BF16),
        &["`k_descale`", "`q_descale`", "same shape"],
    );
    let wide = Tensor::ones((2, 4), DType::F32, &dev)?.narrow(1, 0, 2)?;
    expect_err(fa::flash_attn_fp8(&q8, &k8, &k8, 0.1, true, Fp8Descales { q_descale: Some(&wide), ..none }, DType::BF16), &["`q_descale` must be contiguous"]);
    let neg = Tensor::new(&[-1f32], &dev)?;
    assert!(fa::flash_attn_fp8(&q8, &k8, &k8, 0.1, true, Fp8Descales { q_descale: Some(&neg), ..none }, DType::BF16).is_err());
    expect_err(fa::flash_attn_fp8(&q8, &k8, &k8, f32::NAN, true, none, DType::BF16), &["softmax_scale"]);
    Ok(())
}

#[test]
fn kvcache_errors_leave_the_caches_untouched() -> Result<()> {
    let dev = Device::Cpu;
    let (hk, d) = (2, 32);
    let kc = quantize(&randn((1, 16, hk, d), &dev)?, 0.02)?;
    let vc = quantize(&randn((1, 16, hk, d), &dev)?, 0.02)?;
    let (kb, vb) = (bits(&kc)?, bits(&vc)?);
    let sc = Tensor::new(&[0.02f32], &dev)?;
    let q = Tensor::zeros((1, 1, 4, d), DType::BF16, &dev)?;
    let kn = Tensor::ones((1, 1, hk, d), DType::BF16, &dev)?;
    let lens = Tensor::new(&[5u32], &dev)?;
    let call = |q: &Tensor, kc: &Tensor, vc: &Tensor, ks: &Tensor, vs: &Tensor, kn: &Tensor, lens: &Tensor| {
        fa::flash_attn_with_kvcache_fp8(q, kc, vc, ks, vs, Some(kn), Some(kn), Some(lens), None, 0.1, true)
    };
    expect_err(call(&q.to_dtype(DType::F32)?, &kc, &vc, &sc, &sc, &kn, &lens), &["`q`", "F32", "FP8 KV cache"]);
    expect_err(call(&q, &kc.to_dtype(DType::BF16)?, &vc, &sc, &sc, &kn, &lens), &["`k_cache` is BF16", "F8E4M3"]);
    expect_err(call(&q, &kc, &vc, &sc, &sc, &kn.to_dtype(DType::F16)?, &lens), &["`k_new` is F16"]);
    expect_err(call(&q, &kc, &vc, &sc.to_dtype(DType::F16)?, &sc, &kn, &lens), &["`k_scale`", "F32"]);
    expect_err(call(&q, &kc, &vc, &sc, &Tensor::ones(3, DType::F32, &dev)?, &kn, &lens), &["`v_scale`", "(2)"]);
    expect_err(call(&q, &kc, &vc, &Tensor::ones(2, DType::F32, &dev)?, &sc, &kn, &lens), &["`v_scale` holds 1", "`k_scale` 2"]);
    expect_err(call(&q, &kc, &vc, &Tensor::new(&[0f32], &dev)?, &sc, &kn, &lens), &["`k_scale`", "finite positive"]);
    // Past the cache's capacity: the reference's check, before any write.
    expect_err(call(&q, &kc, &vc, &sc, &sc, &kn, &Tensor::new(&[16u32], &dev)?), &["cache_seqlens"]);
    expect_err(call(&q, &kc, &vc, &sc, &sc, &kn, &Tensor::new(&[1u32, 2], &dev)?), &["`cache_seqlens`", "shape mismatch"]);
    let k40 = Tensor::zeros((1, 16, hk, 40), DType::F8E4M3, &dev)?;
    let q40 = Tensor::zeros((1, 1, 4, 40), DType::BF16, &dev)?;
    expect_err(call(&q40, &k40, &k40.copy()?, &sc, &sc, &Tensor::zeros((1, 1, hk, 40), DType::BF16, &dev)?, &lens), &["`k_cache`", "headdim 40"]);
    // One KV tensor seen as both caches: an error naming both.
    expect_err(call(&q, &kc, &kc, &sc, &sc, &kn, &lens), &["shares storage", "`k_cache`"]);
    assert_eq!((bits(&kc)?, bits(&vc)?), (kb, vb), "a failed call left the caches as they were");
    Ok(())
}

#[test]
fn varlen_matches_candle_per_sequence() -> Result<()> {
    let dev = Device::Cpu;
    let (h, hk, d) = (4, 2, 32);
    let (lq, lk) = ([5usize, 1, 9], [12usize, 30, 9]);
    let cu = |l: &[usize]| -> Vec<u32> { std::iter::once(0).chain(l.iter().scan(0u32, |a, &x| { *a += x as u32; Some(*a) })).collect() };
    let (cq, ck) = (cu(&lq), cu(&lk));
    let (cq_t, ck_t) = (Tensor::new(cq.as_slice(), &dev)?, Tensor::new(ck.as_slice(), &dev)?);
    let q8 = quantize(&Tensor::randn(0f32, 1., (cq[3] as usize, h, d), &dev)?, 0.01)?;
    let k8 = quantize(&Tensor::randn(0f32, 1., (ck[3] as usize, hk, d), &dev)?, 0.01)?;
    let v8 = quantize(&Tensor::randn(0f32, 1., (ck[3] as usize, hk, d), &dev)?, 0.01)?;
    // Per (sequence, KV head) descales: varied for k, 0.01 for q and v
    // (the ones given share one shape).
    let per: Vec<f32> = (0..3 * hk).map(|i| 0.005 + 0.003 * i as f32).collect();
    let ks = Tensor::from_slice(&per, (3, hk), &dev)?;
    let one = Tensor::full(0.01f32, (3, hk), &dev)?;
    let ds = Fp8Descales { q_descale: Some(&one), k_descale: Some(&ks), v_descale: Some(&one) };
    for (causal, window) in [(true, (None, Some(0))), (false, (None, None))] {
        let o = fa::flash_attn_fp8_varlen(&q8, &k8, &v8, &cq_t, &ck_t, 9, 30, 0.2, causal, ds, DType::F16)?;
        assert_eq!((o.dims3()?, o.dtype()), ((cq[3] as usize, h, d), DType::F16));
        for b in 0..3 {
            let seq = |x: &Tensor, c: &[u32]| x.narrow(0, c[b] as usize, (c[b + 1] - c[b]) as usize)?.unsqueeze(0);
            let qd = (seq(&q8, &cq)?.to_dtype(DType::F32)? * 0.01)?;
            let kd = dequantize(&seq(&k8, &ck)?, Some(&ks.narrow(0, b, 1)?), 1)?;
            let vd = (seq(&v8, &ck)?.to_dtype(DType::F32)? * 0.01)?;
            let (want, _) = attention(&qd, &kd, &vd, 0.2, window)?;
            check_close(&seq(&o, &cq)?, &want, out_rel(DType::F16), 1e-5, &format!("sequence {b} causal {causal}"))?;
        }
    }
    let w = fa::flash_attn_fp8_varlen_windowed(&q8, &k8, &v8, &cq_t, &ck_t, 9, 30, 0.2, Some(3), Some(0), ds, DType::BF16)?;
    assert_eq!(w.dims3()?, (cq[3] as usize, h, d));
    // Errors: rank, descale shape against the sequences, prefix sums.
    expect_err(fa::flash_attn_fp8_varlen(&q8.unsqueeze(0)?, &k8, &v8, &cq_t, &ck_t, 9, 30, 0.2, true, ds, DType::BF16), &["`q` must have rank 3"]);
    let bad = Fp8Descales { k_descale: Some(&Tensor::ones((2, hk), DType::F32, &dev)?), ..ds };
    expect_err(fa::flash_attn_fp8_varlen(&q8, &k8, &v8, &cq_t, &ck_t, 9, 30, 0.2, true, bad, DType::BF16), &["`k_descale`", "(3, 2)"]);
    let past = Tensor::new(&[0u32, 5, 6, 40], &dev)?;
    expect_err(fa::flash_attn_fp8_varlen(&q8, &k8, &v8, &past, &ck_t, 9, 30, 0.2, true, ds, DType::BF16), &["cu_seqlens_q"]);
    Ok(())
}

/// On the GPU (`FA_REQUIRE_GPU=1`, feature `cuda`, an H100/H200): the
/// adapter's wiring (offsets, strides, descale forms, GQA, output dtype)
/// against the CPU path on the same tensors. The kernel rounds the
/// probabilities to e4m3 for `P·V` (FlashAttention-3's FP8), so O agrees to
/// a few percent of its range, not to the output's rounding; the KV-cache
/// call converts the codes exactly, so it agrees to the output's rounding
/// and appends the same bytes.
#[test]
fn gpu_matches_cpu() -> Result<()> {
    let Some(gpu) = requested_gpu() else { return Ok(()) };
    let cpu = Device::Cpu;
    let (b, sq, sk, h, hk, d) = (2, 100, 140, 8, 2, 128);
    let q8 = quantize(&Tensor::randn(0f32, 1., (b, h, sq, d), &cpu)?, 0.01)?.transpose(1, 2)?;
    let k8 = quantize(&randn((b, sk, hk, d), &cpu)?, 0.01)?;
    let v8 = quantize(&randn((b, sk, hk, d), &cpu)?, 0.01)?;
    let per = Tensor::from_slice(&[0.01f32, 0.012, 0.008, 0.01], (b, hk), &cpu)?;
    let one = Tensor::new(&[0.01f32], &cpu)?;
    for (descale, out, causal) in [(&per, DType::BF16, true), (&one, DType::F16, false)] {
        let ds = Fp8Descales { q_descale: Some(descale), k_descale: Some(descale), v_descale: Some(descale) };
        let (gq, gk, gv, gs) = (q8.to_device(&gpu)?, k8.to_device(&gpu)?, v8.to_device(&gpu)?, descale.to_device(&gpu)?);
        let gds = Fp8Descales { q_descale: Some(&gs), k_descale: Some(&gs), v_descale: Some(&gs) };
        let want = fa::flash_attn_fp8(&q8, &k8, &v8, 0.09, causal, ds, out)?;
        let got = fa::flash_attn_fp8(&gq, &gk, &gv, 0.09, causal, gds, out)?;
        assert_eq!(got.dtype(), out);
        let amax = want.to_dtype(DType::F32)?.abs()?.flatten_all()?.max(0)?.to_scalar::<f32>()?;
        let e = max_diff(&got.to_device(&cpu)?, &want)?;
        assert!(e <= 0.06 * amax, "FP8 prefill on the GPU vs the CPU: max |Δ| {e} (max |o| {amax})");
    }
    // The FP8 KV cache: same appended bytes, same O to bf16 rounding.
    let (batch, cap) = (2, 256);
    let kc = quantize(&randn((batch, cap, hk, d), &cpu)?, 0.05)?;
    let vc = quantize(&randn((batch, cap, hk, d), &cpu)?, 0.05)?;
    let (gkc, gvc) = (kc.to_device(&gpu)?, vc.to_device(&gpu)?);
    let sc = Tensor::from_slice(&[0.05f32, 0.04], hk, &cpu)?;
    let lens = Tensor::new(&[100u32, 201], &cpu)?;
    let q = randn((batch, 1, h, d), &cpu)?.to_dtype(DType::BF16)?;
    let kn = (randn((batch, 1, hk, d), &cpu)? * 4.0)?.to_dtype(DType::BF16)?;
    let vn = randn((batch, 1, hk, d), &cpu)?.to_dtype(DType::BF16)?;
    let want = fa::flash_attn_with_kvcache_fp8(&q, &kc, &vc, &sc, &sc, Some(&kn), Some(&vn), Some(&lens), None, 0.09, true)?;
    let g = |t: &Tensor| t.to_device(&gpu);
    let got = fa::flash_attn_with_kvcache_fp8(&g(&q)?, &gkc, &gvc, &g(&sc)?, &g(&sc)?, Some(&g(&kn)?), Some(&g(&vn)?), Some(&g(&lens)?), None, 0.09, true)?;
    check_close(&got.to_device(&cpu)?, &want, 2.0 * out_rel(DType::BF16), 2e-3, "FP8 KV cache on the GPU vs the CPU")?;
    assert_eq!(bits(&gkc.to_device(&cpu)?)?, bits(&kc)?, "k_cache bytes after the append");
    assert_eq!(bits(&gvc.to_device(&cpu)?)?, bits(&vc)?, "v_cache bytes after the append");
    // A tensor on the wrong device: an error naming it.
    expect_err(fa::flash_attn_fp8(&q8.to_device(&gpu)?, &k8, &v8, 0.1, true, Fp8Descales::default(), DType::BF16), &["device mismatch", "`k`"]);
    let ds_cpu = Fp8Descales { k_descale: Some(&one), ..Default::default() };
    expect_err(fa::flash_attn_fp8(&g(&q8)?, &g(&k8)?, &g(&v8)?, 0.1, true, ds_cpu, DType::BF16), &["device mismatch", "`k_descale`"]);
    Ok(())
}
