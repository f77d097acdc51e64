//! End-to-end: FP8 (e4m3) attention forward on Hopper
//! (`FlashAttention::forward_fp8{,_into}`, `forward_fp8_varlen_into`) over
//! head dims, causal, sliding windows, GQA/MQA, varlen, `seqlen_q ≠
//! seqlen_k`, scales per tensor and per (sequence, KV head), O in bf16 and
//! f16.
//!
//! The rule (FA2's, with FP8's yardstick): against the f64 attention of the
//! **dequantized** inputs, each output row's largest error is at most twice
//! that of plain FP8 attention over the same codes — S in f32, the softmax
//! in f32, the probabilities rounded to e4m3 for `P·V` (as the FP8 tensor
//! cores need them), `P·V` in f32, O rounded to the output type — plus
//! what the tensor cores' shorter accumulation of S can move the row
//! ([`ACC_BOUND`]: score `j` off by `δ_j` moves O by `Σ p_j δ_j (|v_j| +
//! |O|)` to first order) and 1e-5·max|O|; the logsumexp within
//! 1e-4·max(1, |ref|) + 1.5·`Σ p_j δ_j`. Also printed: how far
//! FP8 attention is from the same inputs in bf16 (the cost of the FP8
//! probabilities, not the kernel's). On devices without the sm_90a FP8
//! kernels the calls must refuse with `DeviceLacks`.

use cudarc::driver::CudaSlice;
use flash_attn::reference::fp8::{e4m3_from_f32, e4m3_to_f32};
use flash_attn::{AttnElem, FlashAttnError, ForwardParams, Fp8Descales, Tensor, TensorLayout, TensorMut, Varlen};
use flash_attn_tests::{Gpu, Rng, gpu};
use half::{bf16, f16};

/// The bound assumed for the tensor cores' accumulation of e4m3 products
/// into S: an error of at most 2⁻⁸ of `scale·Σ|q·k|` (Hopper's FP8 `wgmma`
/// keeps about 14 bits while it accumulates, not f32's 24 — DeepSeek-V3
/// §3.3.2 measured it, and FlashAttention-3's FP8 path shares it; measured
/// here up to 2⁻⁹ at d = 128 and 256).
const ACC_BOUND: f64 = 1.0 / 256.0;

#[derive(Clone, Debug)]
struct Case {
    /// (seqlen_q, seqlen_k) per sequence; `varlen` packs them.
    seqs: Vec<(usize, usize)>,
    varlen: bool,
    h: usize,
    hk: usize,
    d: usize,
    causal: bool,
    window: Option<(Option<usize>, Option<usize>)>,
    /// 0: no scales, 1: one per tensor, 2: per (sequence, KV head).
    scales: u8,
}

/// Codes of values over the range e4m3 represents (most |x| ≤ 4, some
/// large, some tiny, some zero).
fn codes(rng: &mut Rng, n: usize) -> Vec<u8> {
    (0..n)
        .map(|_| {
            let r = rng.below(256);
            let x = rng.nonzero(1.0) * if r == 0 { 200.0 } else if r < 9 { 0.01 } else { 3.0 };
            if (9..17).contains(&r) { 0 } else { e4m3_from_f32(x) }
        })
        .collect()
}

struct Ref {
    /// f64 attention of the dequantized inputs: O and LSE.
    o: Vec<f64>,
    lse: Vec<f64>,
    /// The logsumexp's tolerance per row: 1e-4·max(1, |ref|), plus 2⁻¹⁰ of
    /// the largest `scale·Σ|q·k|` (the tensor cores accumulate e4m3
    /// products with fewer bits than f32: the error of S scales with the
    /// sum of the magnitudes of its terms, not with S).
    lse_tol: Vec<f64>,
    /// Per row: how far O may move when each score moves by its
    /// accumulation bound (first order, ×1.5).
    o_tol: Vec<f64>,
    /// Plain FP8 attention (the yardstick), O rounded to the output type.
    o_plain: Vec<f64>,
}

/// Reference of one (sequence, query head): `q` rows `(sq, d)`, `k`/`v`
/// rows `(sk, d)`, dequantized; visible keys by the window rule.
#[allow(clippy::too_many_arguments)]
fn reference_head<T: AttnElem>(q: &[f64], k: &[f64], v: &[f64], sq: usize, sk: usize, d: usize, scale: f64, win: (i64, i64), out: &mut Ref) {
    let (left, right) = win;
    for i in 0..sq {
        let diag = i as i64 + sk as i64 - sq as i64;
        let lo = if left < 0 { 0 } else { (diag - left).max(0) };
        let hi = if right < 0 { sk as i64 - 1 } else { (diag + right).min(sk as i64 - 1) };
        let keys: Vec<usize> = if lo > hi { vec![] } else { (lo as usize..=hi as usize).collect() };
        let s: Vec<f64> = keys.iter().map(|&j| scale * (0..d).map(|c| q[i * d + c] * k[j * d + c]).sum::<f64>()).collect();
        if keys.is_empty() {
            out.o.extend(std::iter::repeat_n(0.0, d));
            out.o_plain.extend(std::iter::repeat_n(0.0, d));
            out.lse.push(f64::NEG_INFINITY);
            out.lse_tol.push(0.0);
            out.o_tol.push(0.0);
            continue;
        }
        let m = s.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let p: Vec<f64> = s.iter().map(|x| (x - m).exp()).collect();
        let l: f64 = p.iter().sum();
        out.lse.push(m + l.ln());
        // S's accumulation: score j off by at most δ_j = ACC_BOUND·scale·Σ|q·k_j|
        // moves the LSE by Σ p_j δ_j and O by Σ p_j δ_j (|v_j| + |O|) (to
        // first order; ×1.5 for the second).
        let delta: Vec<f64> = keys.iter().map(|&j| ACC_BOUND * scale * (0..d).map(|c| (q[i * d + c] * k[j * d + c]).abs()).sum::<f64>()).collect();
        let o_abs = (0..d).map(|c| (keys.iter().zip(&p).map(|(&j, pj)| pj * v[j * d + c]).sum::<f64>() / l).abs()).fold(0.0, f64::max);
        let (mut t_lse, mut t_o) = (0.0, 0.0);
        for ((&j, pj), dj) in keys.iter().zip(&p).zip(&delta) {
            let vj = (0..d).map(|c| v[j * d + c].abs()).fold(0.0, f64::max);
            t_lse += pj / l * dj;
            t_o += pj / l * dj * (vj + o_abs);
        }
        out.lse_tol.push(1e-4 * (m + l.ln()).abs().max(1.0) + 1.5 * t_lse);
        out.o_tol.push(1.5 * t_o);
        // Plain FP8: S in f32, P in f32 rounded to e4m3 for P·V, l the f32 sum.
        let s32: Vec<f32> = s.iter().map(|&x| x as f32).collect();
        let m32 = s32.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let p32: Vec<f32> = s32.iter().map(|x| (x - m32).exp()).collect();
        let l32: f32 = p32.iter().sum();
        let p8: Vec<f32> = p32.iter().map(|&x| e4m3_to_f32(e4m3_from_f32(x))).collect();
        for c in 0..d {
            out.o.push(keys.iter().zip(&p).map(|(&j, pj)| pj * v[j * d + c]).sum::<f64>() / l);
            let acc: f32 = keys.iter().zip(&p8).map(|(&j, pj)| pj * v[j * d + c] as f32).sum();
            out.o_plain.push(T::from_f32(acc / l32).to_f32() as f64);
        }
    }
}

/// Runs one case with output type `T`; returns (kernel error, plain error).
fn run<T: AttnElem>(g: &Gpu, rng: &mut Rng, c: &Case) -> Result<(f64, f64), FlashAttnError> {
    let st = &g.stream;
    let Case { h, hk, d, .. } = *c;
    let nseq = c.seqs.len();
    let (tq, tk): (usize, usize) = (c.seqs.iter().map(|s| s.0).sum(), c.seqs.iter().map(|s| s.1).sum());
    // Dense calls need equal lengths: (batch, sq, ·) over all sequences.
    assert!(c.varlen || c.seqs.iter().all(|&s| s == c.seqs[0]));
    let q8 = codes(rng, tq * h * d);
    let k8 = codes(rng, tk * hk * d);
    let v8 = codes(rng, tk * hk * d);
    let nsc = match c.scales {
        0 => 0,
        1 => 1,
        _ => nseq * hk,
    };
    let pick = |rng: &mut Rng| (0.02 + 0.4 * rng.unit()) as f32;
    let (qs, ks, vs): (Vec<f32>, Vec<f32>, Vec<f32>) = ((0..nsc).map(|_| pick(rng)).collect(), (0..nsc).map(|_| pick(rng)).collect(), (0..nsc).map(|_| 4.0 * pick(rng)).collect());
    let sc = |s: &[f32], b: usize, kh: usize| -> f64 {
        match s.len() {
            0 => 1.0,
            1 => s[0] as f64,
            _ => s[b * hk + kh] as f64,
        }
    };
    let params = ForwardParams { causal: c.causal, window_left: c.window.and_then(|w| w.0), window_right: c.window.and_then(|w| w.1), ..Default::default() };
    let scale = 1.0 / (d as f64).sqrt();
    let mut reference = Ref { o: vec![], lse: vec![], lse_tol: vec![], o_tol: vec![], o_plain: vec![] };
    // Reference, laid out as the kernel's outputs: O (tq, h, d) row-major
    // per sequence (the rows of sequence s follow those of s − 1); the
    // LSE as (h, total_q) varlen, (batch, h, sq) dense.
    let mut o_ref = vec![0.0; tq * h * d];
    let mut o_plain = vec![0.0; tq * h * d];
    let mut lse_ref = vec![0.0; tq * h];
    let mut lse_tol = vec![0.0; tq * h];
    let mut o_tol = vec![0.0; tq * h];
    let (mut q0, mut k0) = (0, 0);
    for (b, &(sq, sk)) in c.seqs.iter().enumerate() {
        let max_k = if c.varlen { c.seqs.iter().map(|s| s.1).max().unwrap() } else { sk };
        let res = params.resolve(d, max_k).unwrap();
        let win = (res.window_left as i64, res.window_right as i64);
        for hh in 0..h {
            let kh = hh / (h / hk);
            let qd: Vec<f64> = (0..sq).flat_map(|i| (0..d).map(move |cc| (i, cc))).map(|(i, cc)| e4m3_to_f32(q8[((q0 + i) * h + hh) * d + cc]) as f64 * sc(&qs, b, kh)).collect();
            let kd: Vec<f64> = (0..sk).flat_map(|j| (0..d).map(move |cc| (j, cc))).map(|(j, cc)| e4m3_to_f32(k8[((k0 + j) * hk + kh) * d + cc]) as f64 * sc(&ks, b, kh)).collect();
            let vd: Vec<f64> = (0..sk).flat_map(|j| (0..d).map(move |cc| (j, cc))).map(|(j, cc)| e4m3_to_f32(v8[((k0 + j) * hk + kh) * d + cc]) as f64 * sc(&vs, b, kh)).collect();
            let mut r = Ref { o: vec![], lse: vec![], lse_tol: vec![], o_tol: vec![], o_plain: vec![] };
            reference_head::<T>(&qd, &kd, &vd, sq, sk, d, scale, win, &mut r);
            for i in 0..sq {
                for cc in 0..d {
                    o_ref[((q0 + i) * h + hh) * d + cc] = r.o[i * d + cc];
                    o_plain[((q0 + i) * h + hh) * d + cc] = r.o_plain[i * d + cc];
                }
                let li = if c.varlen { hh * tq + q0 + i } else { (b * h + hh) * sq + i };
                lse_ref[li] = r.lse[i];
                lse_tol[li] = r.lse_tol[i];
                o_tol[(q0 + i) * h + hh] = r.o_tol[i];
            }
        }
        q0 += sq;
        k0 += sk;
    }
    reference.o = o_ref;
    reference.o_plain = o_plain;
    reference.lse = lse_ref;
    reference.lse_tol = lse_tol;
    reference.o_tol = o_tol;

    // The GPU.
    let q_dev: CudaSlice<u8> = st.clone_htod(&q8)?;
    let k_dev: CudaSlice<u8> = st.clone_htod(&k8)?;
    let v_dev: CudaSlice<u8> = st.clone_htod(&v8)?;
    let upload = |s: &Vec<f32>| -> Result<Option<CudaSlice<f32>>, FlashAttnError> { if s.is_empty() { Ok(None) } else { Ok(Some(st.clone_htod(s)?)) } };
    let (qs_d, ks_d, vs_d) = (upload(&qs)?, upload(&ks)?, upload(&vs)?);
    let descales = Fp8Descales {
        q_descale: qs_d.as_ref().map(|s| s as _),
        k_descale: ks_d.as_ref().map(|s| s as _),
        v_descale: vs_d.as_ref().map(|s| s as _),
    };
    let mut o_dev = st.alloc_zeros::<T>(tq * h * d)?;
    let mut lse_dev = st.alloc_zeros::<f32>(tq * h)?;
    if c.varlen {
        let cu = |f: fn(&(usize, usize)) -> usize| -> Vec<i32> { std::iter::once(0).chain(c.seqs.iter().scan(0, |a, s| { *a += f(s); Some(*a as i32) })).collect() };
        let (cq, ck) = (st.clone_htod(&cu(|s| s.0))?, st.clone_htod(&cu(|s| s.1))?);
        let varlen = Varlen { cu_seqlens_q: &cq, cu_seqlens_k: &ck, max_seqlen_q: c.seqs.iter().map(|s| s.0).max().unwrap(), max_seqlen_k: c.seqs.iter().map(|s| s.1).max().unwrap(), seqused_k: None };
        let (lq, lk) = (TensorLayout::contiguous([1, tq, h, d]), TensorLayout::contiguous([1, tk, hk, d]));
        g.fa.forward_fp8_varlen_into::<T, _, _, _, _>(st, Tensor::new(&q_dev, lq), Tensor::new(&k_dev, lk), Tensor::new(&v_dev, lk), &descales, TensorMut::new(&mut o_dev, lq), &mut lse_dev, &varlen, &params)?;
    } else {
        let (sq, sk) = c.seqs[0];
        let (lq, lk) = (TensorLayout::contiguous([nseq, sq, h, d]), TensorLayout::contiguous([nseq, sk, hk, d]));
        g.fa.forward_fp8_into::<T, _, _, _, _>(st, Tensor::new(&q_dev, lq), Tensor::new(&k_dev, lk), Tensor::new(&v_dev, lk), &descales, TensorMut::new(&mut o_dev, lq), &mut lse_dev, &params)?;
    }
    let o: Vec<f64> = st.clone_dtoh(&o_dev)?.into_iter().map(|x| x.to_f32() as f64).collect();
    let lse = st.clone_dtoh(&lse_dev)?;
    // Per row (packed row × head): the kernel's largest error against
    // twice plain FP8's, plus what S's accumulation may move (`o_tol`).
    let row_err = |a: &[f64], r: usize| (0..d).map(|cc| if a[r * d + cc].is_nan() { f64::INFINITY } else { (a[r * d + cc] - reference.o[r * d + cc]).abs() }).fold(0.0, f64::max);
    let amax = reference.o.iter().fold(0.0f64, |a, x| a.max(x.abs()));
    let (mut e_kernel, mut e_plain) = (0f64, 0f64);
    let mut bad = Vec::new();
    for r in 0..tq * h {
        let (e, ep) = (row_err(&o, r), row_err(&reference.o_plain, r));
        e_kernel = e_kernel.max(e);
        e_plain = e_plain.max(ep);
        if e > 2.0 * ep + reference.o_tol[r] + 1e-5 * amax.max(1.0) {
            bad.push(format!("(row {}, head {}): {e:.2e} (plain {ep:.2e}, accumulation {:.2e})", r / h, r % h, reference.o_tol[r]));
        }
    }
    assert!(bad.is_empty(), "{c:?}: {} of {} rows past 2 × plain FP8's error: {:?}", bad.len(), tq * h, &bad[..bad.len().min(8)]);
    for (i, ((&x, &r), &tol)) in lse.iter().zip(&reference.lse).zip(&reference.lse_tol).enumerate() {
        let ok = if r == f64::NEG_INFINITY { x == f32::NEG_INFINITY } else { (x as f64 - r).abs() <= tol };
        assert!(ok, "{c:?}: lse[{i}] = {x}, reference {r} (tolerance {tol:.2e})");
    }
    Ok((e_kernel, e_plain))
}

fn hopper_fp8(g: &Gpu) -> bool {
    g.fa.has_hopper_kernels() && g.fa.compute_capability() == (9, 0)
}

#[test]
fn gpu_fp8_prefill_matrix() {
    let Some(g) = gpu("gpu_fp8_prefill_matrix") else { return };
    let mut rng = Rng::fresh("gpu_fp8_prefill_matrix");
    if !hopper_fp8(g) {
        let c = Case { seqs: vec![(64, 64)], varlen: false, h: 2, hk: 2, d: 128, causal: false, window: None, scales: 0 };
        match run::<bf16>(g, &mut rng, &c) {
            Err(FlashAttnError::DeviceLacks { .. }) => println!("{}: FP8 attention refused as expected", g.fa.device_name()),
            other => panic!("expected DeviceLacks on {}, got {:?}", g.fa.device_name(), other.map(|_| ())),
        }
        return;
    }
    let mut n = 0;
    for (i, d) in [64, 128, 256, 48, 96, 160].into_iter().enumerate() {
        for (j, (h, hk)) in [(4, 4), (8, 2), (6, 1)].into_iter().enumerate() {
            let k = i * 3 + j;
            let (sq, sk) = [(300, 300), (128, 1000), (513, 257), (1, 700), (1000, 1000)][k % 5];
            let causal = k % 2 == 0;
            let window = match k % 7 {
                3 => Some((Some(100), if causal { None } else { Some(20) })),
                5 => Some((Some(37), if causal { Some(0) } else { None })),
                _ => None,
            };
            let c = Case { seqs: vec![(sq, sk); 1 + k % 2], varlen: false, h, hk, d, causal, window, scales: (k % 3) as u8 };
            let (e, p) = if k % 2 == 0 { run::<bf16>(g, &mut rng, &c) } else { run::<f16>(g, &mut rng, &c) }.unwrap_or_else(|e| panic!("{c:?}: {e}"));
            println!("d {d} h {h}/{hk} {sq}×{sk} causal {causal} window {window:?}: O error {e:.2e} (plain FP8 {p:.2e})");
            n += 1;
        }
    }
    println!("{n} cases");
}

#[test]
fn gpu_fp8_prefill_varlen() {
    let Some(g) = gpu("gpu_fp8_prefill_varlen") else { return };
    if !hopper_fp8(g) {
        return;
    }
    let mut rng = Rng::fresh("gpu_fp8_prefill_varlen");
    for (d, causal, window, scales) in [(128, true, None, 2u8), (64, false, None, 1), (256, true, Some((Some(64), Some(0))), 2), (128, false, Some((Some(50), Some(50))), 0)] {
        let seqs = vec![(300, 300), (1, 77), (129, 1000), (0, 20), (700, 130), (64, 64)];
        let c = Case { seqs, varlen: true, h: 8, hk: 2, d, causal, window, scales };
        let (e, p) = run::<bf16>(g, &mut rng, &c).unwrap_or_else(|e| panic!("{c:?}: {e}"));
        println!("varlen d {d} causal {causal} window {window:?}: O error {e:.2e} (plain FP8 {p:.2e})");
    }
}

#[test]
fn gpu_fp8_prefill_long_and_errors() {
    let Some(g) = gpu("gpu_fp8_prefill_long_and_errors") else { return };
    if !hopper_fp8(g) {
        return;
    }
    let mut rng = Rng::fresh("gpu_fp8_prefill_long_and_errors");
    let c = Case { seqs: vec![(2048, 4096)], varlen: false, h: 4, hk: 1, d: 128, causal: true, window: None, scales: 2 };
    let (e, p) = run::<bf16>(g, &mut rng, &c).unwrap();
    println!("2048×4096 MQA causal: O error {e:.2e} (plain FP8 {p:.2e})");
    // Typed errors, nothing launched.
    let st = &g.stream;
    let l = TensorLayout::contiguous([1, 64, 2, 128]);
    let buf: CudaSlice<u8> = st.alloc_zeros(64 * 2 * 128).unwrap();
    let short: CudaSlice<f32> = st.alloc_zeros(3).unwrap();
    let mut o = st.alloc_zeros::<bf16>(64 * 2 * 128).unwrap();
    let mut lse = st.alloc_zeros::<f32>(128).unwrap();
    let bad = Fp8Descales { q_descale: Some(&short), ..Default::default() };
    let r = g.fa.forward_fp8_into::<bf16, _, _, _, _>(st, Tensor::new(&buf, l), Tensor::new(&buf, l), Tensor::new(&buf, l), &bad, TensorMut::new(&mut o, l), &mut lse, &ForwardParams::default());
    assert!(matches!(r, Err(FlashAttnError::InvalidArgument { argument: "q_descale", .. })), "{r:?}");
    let mut short_lse = st.alloc_zeros::<f32>(10).unwrap();
    let r = g.fa.forward_fp8_into::<bf16, _, _, _, _>(st, Tensor::new(&buf, l), Tensor::new(&buf, l), Tensor::new(&buf, l), &Fp8Descales::default(), TensorMut::new(&mut o, l), &mut short_lse, &ForwardParams::default());
    assert!(matches!(r, Err(FlashAttnError::StatsTooShort { .. })), "{r:?}");
    let sc = ForwardParams { softcap: Some(20.0), ..Default::default() };
    let r = g.fa.forward_fp8_into::<bf16, _, _, _, _>(st, Tensor::new(&buf, l), Tensor::new(&buf, l), Tensor::new(&buf, l), &Fp8Descales::default(), TensorMut::new(&mut o, l), &mut lse, &sc);
    assert!(matches!(r, Err(FlashAttnError::Unsupported { .. })), "{r:?}");
}
