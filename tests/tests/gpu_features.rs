//! End-to-end: the inference features (GQA/MQA, every head dim, varlen,
//! sliding window, softcap, ALiBi) on every GPU path, against the f64
//! reference written out from the definitions ([`flash_attn_tests::features`]).
//!
//! # The accuracy rule (FlashAttention-2's, INFERENCE.md)
//! f16/bf16: `max|out − ref| ≤ 2 · max|naive − ref| + 1e-5`, `naive` being
//! attention computed in the same dtype ([`features::naive`]); the
//! logsumexp (f32 in every kernel, from exact products of the 16-bit inputs)
//! within `1e-4 · max(1, |ref|)`, and rows that see no key at −inf exactly.
//! f32: relative error below 1e-4. Outputs are poisoned with NaN first
//! (every element must be written); fresh random inputs every run.
//!
//! The sweep is FlashAttention-2's test matrix: dtype × MHA/GQA/MQA (6 query
//! heads over 6, 2, 1 KV heads) × causal × window × ALiBi × softcap {0, 50},
//! each of the 96 combinations on one of the head dims
//! {32, 40, 64, 80, 96, 128, 160, 192, 224, 256} and one of the (sq, sk)
//! pairs, round robin, so every dim and every pair meets many combinations.

use cudarc::driver::CudaSlice;
use flash_attn::{
    AlibiShape, AlibiSlopes, AttnElem, Extras, FlashAttnError, ForwardParams, LoopOrder, StatsMut, Tensor, TensorLayout,
    TensorMut, Varlen,
};
use flash_attn_tests::features::{self, Spec};
use flash_attn_tests::{Gpu, Rng, gpu};
use ndarray::{Array3, Array4, Axis, s};

const DIMS: [usize; 10] = [32, 40, 64, 80, 96, 128, 160, 192, 224, 256];
const SHAPES: [(usize, usize); 8] = [(1, 147), (113, 203), (108, 256), (512, 256), (127, 513), (1023, 1024), (1024, 1023), (2048, 2048)];

fn random<T: AttnElem>(rng: &mut Rng, shape: (usize, usize, usize, usize)) -> Array4<T> {
    Array4::from_shape_simple_fn(shape, || T::from_f32(rng.nonzero(1.0)))
}

/// A random window side: `None`, or up to a bit past `sk`.
fn side(rng: &mut Rng, sk: usize) -> Option<usize> {
    if rng.below(4) == 0 { None } else { Some(rng.below(sk + 8)) }
}

/// One dense call through `forward_into_ext` (outputs poisoned first);
/// returns O and the logsumexp `(batch, nheads, sq)`.
fn run_dense<T: AttnElem>(
    g: &Gpu,
    q: &Array4<T>,
    k: &Array4<T>,
    v: &Array4<T>,
    spec: &Spec,
) -> Result<(Array4<T>, Array3<f32>), FlashAttnError> {
    let s = &g.stream;
    let (b, sq, h, d) = q.dim();
    let qd = s.clone_htod(q.as_slice().unwrap())?;
    let kd = s.clone_htod(k.as_slice().unwrap())?;
    let vd = s.clone_htod(v.as_slice().unwrap())?;
    let mut od: CudaSlice<T> = s.clone_htod(&vec![T::from_f32(f32::NAN); q.len()])?;
    let mut lse: CudaSlice<f32> = s.clone_htod(&vec![f32::NAN; b * h * sq])?;
    let mut m: CudaSlice<f32> = s.clone_htod(&vec![f32::NAN; b * h * sq])?;
    let slopes = spec.alibi.as_ref().map(|(v, _)| s.clone_htod(v)).transpose()?;
    let ext = Extras { alibi_slopes: slopes.as_ref().zip(spec.alibi.as_ref()).map(|(d, (_, sh))| AlibiSlopes::new(d, *sh)) };
    let dim4 = |a: &Array4<T>| {
        let (a0, a1, a2, a3) = a.dim();
        TensorLayout::contiguous([a0, a1, a2, a3])
    };
    let fa1 = spec.params.loop_order == LoopOrder::Fa1;
    let stats = if fa1 {
        StatsMut::Fa1 { l: lse.as_view_mut(), m: m.as_view_mut() }
    } else {
        StatsMut::LogSumExp(lse.as_view_mut())
    };
    g.fa.forward_into_ext(
        s,
        Tensor::new(&qd, dim4(q)),
        Tensor::new(&kd, dim4(k)),
        Tensor::new(&vd, dim4(v)),
        TensorMut::new(&mut od, dim4(q)),
        stats,
        &spec.params,
        &ext,
    )?;
    s.synchronize()?;
    let o = Array4::from_shape_vec((b, sq, h, d), s.clone_dtoh(&od)?).unwrap();
    let mut l = Array3::from_shape_vec((b, h, sq), s.clone_dtoh(&lse)?).unwrap();
    if fa1 {
        // FA1 leaves l and m (base 2): the logsumexp is RowState::lse().
        let m = s.clone_dtoh(&m)?;
        for (x, &m) in l.iter_mut().zip(&m) {
            *x = flash_attn::RowState { m, l: *x }.lse();
        }
    }
    Ok((o, l))
}

fn max_abs_diff(a: impl IntoIterator<Item = f64>, b: impl IntoIterator<Item = f64>) -> f64 {
    a.into_iter().zip(b).map(|(x, y)| if x.is_nan() { f64::INFINITY } else { (x - y).abs() }).fold(0.0, f64::max)
}

/// Checks the logsumexp against the reference: finite rows within
/// `1e-4·max(1, |ref|)`, −inf rows exactly.
fn check_lse(label: &str, got: impl IntoIterator<Item = f32>, want: impl IntoIterator<Item = f64>) {
    for (i, (g, w)) in got.into_iter().zip(want).enumerate() {
        let g = g as f64;
        if w == f64::NEG_INFINITY {
            assert_eq!(g, w, "{label}: lse[{i}] of a row that sees no key");
        } else {
            assert!((g - w).abs() <= 1e-4 * w.abs().max(1.0), "{label}: lse[{i}] = {g}, reference {w}");
        }
    }
}

/// The 2×-naive rule on O, the LSE rule, for one 16-bit dense case.
fn check_half<T: AttnElem>(label: &str, q: &Array4<T>, k: &Array4<T>, v: &Array4<T>, spec: &Spec, o: &Array4<T>, lse: &Array3<f32>) {
    let r = features::reference(q.view(), k.view(), v.view(), spec);
    let n = features::naive(q.view(), k.view(), v.view(), spec);
    let err = max_abs_diff(o.iter().map(|x| x.to_f32() as f64), r.o.iter().copied());
    let naive_err = max_abs_diff(n.o.iter().map(|x| x.to_f32() as f64), r.o.iter().copied());
    assert!(err <= 2.0 * naive_err + 1e-5, "{label}: max error {err:.3e} > 2 × naive {naive_err:.3e} + 1e-5");
    check_lse(label, lse.iter().copied(), r.lse.iter().copied());
}

fn sweep<T: AttnElem>(g: &Gpu, rng: &mut Rng, dtype: &str) {
    let mut i = 0usize;
    let mut worst = 0f64;
    for (h, hk) in [(6, 6), (6, 2), (6, 1)] {
        for causal in [false, true] {
            for windowed in [false, true] {
                for alibi in [false, true] {
                    for softcap in [0.0f32, 50.0] {
                        let mut d = DIMS[i % DIMS.len()];
                        let (sq, sk) = SHAPES[(i * 3 + i / DIMS.len()) % SHAPES.len()];
                        if sq * sk > 1 << 20 {
                            d = d.min(128); // keeps the CPU references quick
                        }
                        i += 1;
                        let batch = if sq * sk > 1 << 17 { 1 } else { 2 };
                        let (wl, wr) = if windowed { (side(rng, sk), if causal { None } else { side(rng, sk) }) } else { (None, None) };
                        let params = ForwardParams {
                            causal,
                            window_left: wl,
                            window_right: wr,
                            softcap: (softcap > 0.0).then_some(softcap),
                            ..Default::default()
                        };
                        let alibi = alibi.then(|| ((0..batch * h).map(|_| rng.unit() as f32 * 0.3).collect(), AlibiShape::PerBatchHead));
                        let spec = Spec { params, alibi, norm_seqlen_k: None };
                        let (q, k, v) = (random::<T>(rng, (batch, sq, h, d)), random::<T>(rng, (batch, sk, hk, d)), random::<T>(rng, (batch, sk, hk, d)));
                        let label = format!("{dtype} b{batch} sq{sq} sk{sk} h{h}/{hk} d{d} causal {causal} window {wl:?},{wr:?} alibi {} softcap {softcap}", spec.alibi.is_some());
                        let (o, lse) = run_dense(g, &q, &k, &v, &spec).unwrap_or_else(|e| panic!("{label}: {e}"));
                        check_half(&label, &q, &k, &v, &spec, &o, &lse);
                        let r = features::reference(q.view(), k.view(), v.view(), &spec);
                        worst = worst.max(max_abs_diff(o.iter().map(|x| x.to_f32() as f64), r.o.iter().copied()));
                    }
                }
            }
        }
    }
    println!("{dtype}: {i} feature combinations passed (worst max error {worst:.2e})");
}

#[test]
fn gpu_features_sweep_f16() {
    let Some(g) = gpu("gpu_features_sweep_f16") else { return };
    sweep::<half::f16>(g, &mut Rng::fresh("gpu_features_sweep_f16"), "f16");
}

#[test]
fn gpu_features_sweep_bf16() {
    let Some(g) = gpu("gpu_features_sweep_bf16") else { return };
    sweep::<half::bf16>(g, &mut Rng::fresh("gpu_features_sweep_bf16"), "bf16");
}

/// Every head dim 8..=256 in steps of 8 (rounded up to the compiled tiles,
/// zero-padded), both dtypes, GQA, causal.
#[test]
fn gpu_every_head_dim() {
    let Some(g) = gpu("gpu_every_head_dim") else { return };
    let mut rng = Rng::fresh("gpu_every_head_dim");
    for d in (8..=256).step_by(8) {
        let spec = Spec { params: ForwardParams { causal: d % 16 == 0, ..Default::default() }, alibi: None, norm_seqlen_k: None };
        let (q, k, v) = (random::<half::bf16>(&mut rng, (1, 77, 4, d)), random::<half::bf16>(&mut rng, (1, 90, 2, d)), random::<half::bf16>(&mut rng, (1, 90, 2, d)));
        let (o, lse) = run_dense(g, &q, &k, &v, &spec).unwrap();
        check_half(&format!("bf16 d{d}"), &q, &k, &v, &spec, &o, &lse);
        let (q, k, v) = (q.mapv(|x| half::f16::from_f32(x.to_f32())), k.mapv(|x| half::f16::from_f32(x.to_f32())), v.mapv(|x| half::f16::from_f32(x.to_f32())));
        let (o, lse) = run_dense(g, &q, &k, &v, &spec).unwrap();
        check_half(&format!("f16 d{d}"), &q, &k, &v, &spec, &o, &lse);
    }
}

/// The f32 kernels: FA2 takes every feature; FA1 and Standard take GQA,
/// windows, softcap and ALiBi too. Relative error below 1e-4.
#[test]
fn gpu_f32_paths_take_the_features() {
    let Some(g) = gpu("gpu_f32_paths_take_the_features") else { return };
    let mut rng = Rng::fresh("gpu_f32_paths_take_the_features");
    for (i, lo) in [LoopOrder::Fa2, LoopOrder::Fa1, LoopOrder::Standard].into_iter().enumerate() {
        for (h, hk, d, sq, sk) in [(4, 2, 40, 65, 130), (3, 1, 128, 130, 70), (2, 2, 17, 33, 33)] {
            let params = ForwardParams {
                causal: i % 2 == 0,
                window_left: Some(rng.below(sk)),
                softcap: Some(30.0),
                loop_order: lo,
                ..Default::default()
            };
            let spec = Spec { params, alibi: Some(((0..h).map(|_| rng.unit() as f32 * 0.3).collect(), AlibiShape::PerHead)), norm_seqlen_k: None };
            let (q, k, v) = (random::<f32>(&mut rng, (2, sq, h, d)), random::<f32>(&mut rng, (2, sk, hk, d)), random::<f32>(&mut rng, (2, sk, hk, d)));
            let (o, lse) = run_dense(g, &q, &k, &v, &spec).unwrap();
            let r = features::reference(q.view(), k.view(), v.view(), &spec);
            let err = flash_attn_tests::rel_err(o.iter().map(|&x| x as f64), r.o.iter().copied());
            assert!(err < 1e-4, "{lo:?} h{h}/{hk} d{d} {sq}x{sk}: rel error {err:.2e}");
            check_lse(&format!("{lo:?} f32"), lse.iter().copied(), r.lse.iter().copied());
        }
    }
}

/// Tensor-core FA1 takes GQA and windows; softcap/ALiBi/varlen on FA1 are
/// typed errors (never a silent fallback).
#[test]
fn gpu_tc_fa1_gqa_window_and_typed_errors() {
    let Some(g) = gpu("gpu_tc_fa1_gqa_window_and_typed_errors") else { return };
    let mut rng = Rng::fresh("gpu_tc_fa1_gqa_window_and_typed_errors");
    let s = &g.stream;
    for d in [64, 80, 128] {
        let params = ForwardParams { causal: true, window_left: Some(37), loop_order: LoopOrder::Fa1, ..Default::default() };
        let (q, k, v) = (random::<half::f16>(&mut rng, (2, 150, 4, d)), random::<half::f16>(&mut rng, (2, 170, 2, d)), random::<half::f16>(&mut rng, (2, 170, 2, d)));
        let spec = Spec { params, alibi: None, norm_seqlen_k: None };
        let qd = s.clone_htod(q.as_slice().unwrap()).unwrap();
        let kd = s.clone_htod(k.as_slice().unwrap()).unwrap();
        let vd = s.clone_htod(v.as_slice().unwrap()).unwrap();
        let out = g
            .fa
            .forward::<half::f16, _, _, _>(
                s,
                Tensor::new(&qd, TensorLayout::contiguous([2, 150, 4, d])),
                Tensor::new(&kd, TensorLayout::contiguous([2, 170, 2, d])),
                Tensor::new(&vd, TensorLayout::contiguous([2, 170, 2, d])),
                &spec.params,
            )
            .unwrap();
        let o = Array4::from_shape_vec((2, 150, 4, d), s.clone_dtoh(&out.o).unwrap()).unwrap();
        let r = features::reference(q.view(), k.view(), v.view(), &spec);
        let n = features::naive(q.view(), k.view(), v.view(), &spec);
        let err = max_abs_diff(o.iter().map(|x| x.to_f32() as f64), r.o.iter().copied());
        let naive_err = max_abs_diff(n.o.iter().map(|x| x.to_f32() as f64), r.o.iter().copied());
        assert!(err <= 2.0 * naive_err + 1e-5, "TC FA1 d{d}: {err:.3e} vs naive {naive_err:.3e}");
        let bad = ForwardParams { softcap: Some(10.0), ..spec.params };
        let e = run_dense(g, &q, &k, &v, &Spec { params: bad, alibi: None, norm_seqlen_k: None }).unwrap_err();
        assert!(matches!(e, FlashAttnError::Unsupported { argument: "params.loop_order", .. }), "{e}");
    }
}

fn segment<T: AttnElem>(a: &Array3<T>, cu: &[i32], b: usize) -> Array4<T> {
    a.slice(s![cu[b] as usize..cu[b + 1] as usize, .., ..]).to_owned().insert_axis(Axis(0))
}

/// Varlen = each sequence run alone (dense), with GQA, window, softcap,
/// ALiBi `(batch, nheads)` and `seqused_k`; LSE unpadded `(nheads, total_q)`.
fn varlen_case<T: AttnElem>(g: &Gpu, rng: &mut Rng, d: usize, max: usize, params: ForwardParams, with_alibi: bool, used: bool) {
    let s = &g.stream;
    let (h, hk, batch) = (6, 2, 4);
    let lens_q: Vec<usize> = (0..batch).map(|_| max - rng.below(21.min(max))).collect();
    let lens_k: Vec<usize> = (0..batch).map(|_| max - rng.below(21.min(max))).collect();
    let (q, cu_q) = features::pack::<T>(rng, &lens_q, h, d);
    let (k, cu_k) = features::pack::<T>(rng, &lens_k, hk, d);
    let (v, _) = features::pack::<T>(rng, &lens_k, hk, d);
    let seqused: Vec<i32> = lens_k.iter().map(|&l| if used { rng.below(l + 1) as i32 } else { l as i32 }).collect();
    let alibi = with_alibi.then(|| ((0..batch * h).map(|_| rng.unit() as f32 * 0.3).collect::<Vec<f32>>(), AlibiShape::PerBatchHead));
    let (tq, tk) = (q.dim().0, k.dim().0);
    let (qd, kd, vd) = (s.clone_htod(q.as_slice().unwrap()).unwrap(), s.clone_htod(k.as_slice().unwrap()).unwrap(), s.clone_htod(v.as_slice().unwrap()).unwrap());
    let (cqd, ckd, sud) = (s.clone_htod(&cu_q).unwrap(), s.clone_htod(&cu_k).unwrap(), s.clone_htod(&seqused).unwrap());
    let slopes = alibi.as_ref().map(|(v, _)| s.clone_htod(v).unwrap());
    let ext = Extras { alibi_slopes: slopes.as_ref().map(|d| AlibiSlopes::new(d, AlibiShape::PerBatchHead)) };
    let varlen = Varlen { cu_seqlens_q: &cqd, cu_seqlens_k: &ckd, max_seqlen_q: max, max_seqlen_k: max, seqused_k: used.then_some(&sud as _) };
    let mut od: CudaSlice<T> = s.clone_htod(&vec![T::from_f32(f32::NAN); q.len()]).unwrap();
    let mut lse: CudaSlice<f32> = s.clone_htod(&vec![f32::NAN; h * tq]).unwrap();
    g.fa
        .forward_varlen_into(
            s,
            Tensor::new(&qd, TensorLayout::varlen(tq, h, d)),
            Tensor::new(&kd, TensorLayout::varlen(tk, hk, d)),
            Tensor::new(&vd, TensorLayout::varlen(tk, hk, d)),
            TensorMut::new(&mut od, TensorLayout::varlen(tq, h, d)),
            &mut lse,
            &varlen,
            &params,
            &ext,
        )
        .unwrap();
    s.synchronize().unwrap();
    let o = Array3::from_shape_vec((tq, h, d), s.clone_dtoh(&od).unwrap()).unwrap();
    let lse = ndarray::Array2::from_shape_vec((h, tq), s.clone_dtoh(&lse).unwrap()).unwrap();
    for b in 0..batch {
        let (qb, mut kb, mut vb) = (segment(&q, &cu_q, b), segment(&k, &cu_k, b), segment(&v, &cu_k, b));
        let u = seqused[b] as usize;
        kb = kb.slice(s![.., ..u, .., ..]).to_owned();
        vb = vb.slice(s![.., ..u, .., ..]).to_owned();
        let slopes = alibi.as_ref().map(|(sl, _)| (sl[b * h..(b + 1) * h].to_vec(), AlibiShape::PerHead));
        // Window sides are normalized against max_seqlen_k for varlen (as FA2's API).
        let spec = Spec { params, alibi: slopes, norm_seqlen_k: Some(max) };
        let ob = segment(&o, &cu_q, b);
        let lseb: Vec<f32> = (0..h).flat_map(|hh| (cu_q[b]..cu_q[b + 1]).map(move |i| (hh, i as usize))).map(|(hh, i)| lse[[hh, i]]).collect();
        let label = format!("varlen {} seq {b} ({} q, {u} of {} k) d{d} {params:?}", std::any::type_name::<T>(), lens_q[b], lens_k[b]);
        if u == 0 {
            assert!(ob.iter().all(|x| x.to_f32() == 0.0), "{label}: no key → O = 0");
            assert!(lseb.iter().all(|&x| x == f32::NEG_INFINITY), "{label}: no key → lse = −inf");
            continue;
        }
        let lse3 = Array3::from_shape_vec((1, h, lens_q[b]), lseb).unwrap();
        check_half_or_f32(&label, &qb, &kb, &vb, &spec, &ob, &lse3);
    }
}

fn check_half_or_f32<T: AttnElem>(label: &str, q: &Array4<T>, k: &Array4<T>, v: &Array4<T>, spec: &Spec, o: &Array4<T>, lse: &Array3<f32>) {
    if T::DTYPE == flash_attn::DType::F32 {
        let r = features::reference(q.view(), k.view(), v.view(), spec);
        let err = flash_attn_tests::rel_err(o.iter().map(|x| x.to_f32() as f64), r.o.iter().copied());
        assert!(err < 1e-4, "{label}: rel error {err:.2e}");
        check_lse(label, lse.iter().copied(), r.lse.iter().copied());
    } else {
        check_half(label, q, k, v, spec, o, lse);
    }
}

#[test]
fn gpu_varlen_matches_each_sequence_alone() {
    let Some(g) = gpu("gpu_varlen_matches_each_sequence_alone") else { return };
    let mut rng = Rng::fresh("gpu_varlen_matches_each_sequence_alone");
    for (i, d) in [32, 64, 80, 128, 256].into_iter().enumerate() {
        let max = if i % 2 == 0 { 300 } else { 64 };
        let plain = ForwardParams { causal: i % 2 == 0, ..Default::default() };
        varlen_case::<half::bf16>(g, &mut rng, d, max, plain, false, i == 1);
        let windowed = ForwardParams { causal: true, window_left: Some(rng.below(max)), ..Default::default() };
        varlen_case::<half::f16>(g, &mut rng, d, max, windowed, false, false);
        let mods = ForwardParams { softcap: Some(50.0), window_left: Some(40), window_right: Some(9), ..Default::default() };
        varlen_case::<half::bf16>(g, &mut rng, d, max, mods, true, true);
    }
    varlen_case::<f32>(g, &mut rng, 72, 100, ForwardParams { causal: true, softcap: Some(20.0), ..Default::default() }, true, true);
}

/// A small varlen + GQA + window case for compute-sanitizer (memcheck,
/// racecheck): segments of 0 rows, one past the 16-row tiles, seqused_k.
#[test]
fn gpu_features_small_for_sanitizers() {
    let Some(g) = gpu("gpu_features_small_for_sanitizers") else { return };
    let mut rng = Rng::fresh("gpu_features_small_for_sanitizers");
    let p = ForwardParams { causal: true, window_left: Some(5), ..Default::default() };
    varlen_case::<half::f16>(g, &mut rng, 64, 21, p, false, true);
    varlen_case::<half::bf16>(g, &mut rng, 40, 21, ForwardParams { softcap: Some(5.0), ..Default::default() }, true, false);
}

/// Device-side prefix sums the host cannot see are clamped in the kernel:
/// garbage (negative, decreasing, past the buffer) never reads or writes
/// out of bounds (run under compute-sanitizer memcheck by the stage script),
/// and the launch still succeeds.
#[test]
fn gpu_varlen_garbage_prefix_sums_stay_in_bounds() {
    let Some(g) = gpu("gpu_varlen_garbage_prefix_sums_stay_in_bounds") else { return };
    let s = &g.stream;
    let (tq, tk, h, d) = (40, 50, 2, 64);
    let q = s.clone_htod(&vec![half::f16::from_f32(0.5); tq * h * d]).unwrap();
    let k = s.clone_htod(&vec![half::f16::from_f32(0.25); tk * h * d]).unwrap();
    let cu_q = s.clone_htod(&[0i32, 30, -7, 1 << 30]).unwrap();
    let cu_k = s.clone_htod(&[5i32, 2, 1 << 30, -1]).unwrap();
    let used = s.clone_htod(&[1000i32, -3, 7]).unwrap();
    let varlen = Varlen { cu_seqlens_q: &cu_q, cu_seqlens_k: &cu_k, max_seqlen_q: 64, max_seqlen_k: 64, seqused_k: Some(&used) };
    let out = g
        .fa
        .forward_varlen::<half::f16, _, _, _>(
            s,
            Tensor::new(&q, TensorLayout::varlen(tq, h, d)),
            Tensor::new(&k, TensorLayout::varlen(tk, h, d)),
            Tensor::new(&k, TensorLayout::varlen(tk, h, d)),
            &varlen,
            &ForwardParams { causal: true, ..Default::default() },
            &Extras::default(),
        )
        .unwrap();
    s.synchronize().unwrap();
    let o: Vec<half::f16> = s.clone_dtoh(&out.o).unwrap();
    assert!(o.iter().all(|x| x.to_f32().is_finite()));
}

/// Host-visible bad input: typed errors naming the argument.
#[test]
fn gpu_feature_typed_errors() {
    let Some(g) = gpu("gpu_feature_typed_errors") else { return };
    let s = &g.stream;
    let q = s.clone_htod(&vec![half::bf16::from_f32(0.5); 2 * 8 * 6 * 64]).unwrap();
    let k = s.clone_htod(&vec![half::bf16::from_f32(0.5); 2 * 8 * 4 * 64]).unwrap();
    let lq = TensorLayout::contiguous([2, 8, 6, 64]);
    let lk = TensorLayout::contiguous([2, 8, 4, 64]);
    let e = g.fa.forward::<half::bf16, _, _, _>(s, Tensor::new(&q, lq), Tensor::new(&k, lk), Tensor::new(&k, lk), &ForwardParams::default()).unwrap_err();
    assert!(matches!(e, FlashAttnError::InvalidArgument { argument: "nheads_k", .. }), "{e}");
    let lk = TensorLayout::contiguous([2, 8, 3, 64]);
    let bad = ForwardParams { softcap: Some(-1.0), ..Default::default() };
    let e = g.fa.forward::<half::bf16, _, _, _>(s, Tensor::new(&q, lq), Tensor::new(&k, lk), Tensor::new(&k, lk), &bad).unwrap_err();
    assert!(matches!(e, FlashAttnError::InvalidArgument { argument: "softcap", .. }), "{e}");
    let slopes = s.clone_htod(&[0.1f32; 5]).unwrap();
    let ext = Extras { alibi_slopes: Some(AlibiSlopes::new(&slopes, AlibiShape::PerHead)) };
    let e = g
        .fa
        .forward_ext::<half::bf16, _, _, _>(s, Tensor::new(&q, lq), Tensor::new(&k, lk), Tensor::new(&k, lk), &ForwardParams::default(), &ext)
        .unwrap_err();
    assert!(matches!(e, FlashAttnError::InvalidArgument { argument: "alibi_slopes", .. }), "{e}");
    let cu = s.clone_htod(&[0i32, 8]).unwrap();
    let cu3 = s.clone_htod(&[0i32, 8, 16]).unwrap();
    let varlen = Varlen { cu_seqlens_q: &cu, cu_seqlens_k: &cu3, max_seqlen_q: 8, max_seqlen_k: 8, seqused_k: None };
    let lvq = TensorLayout::varlen(16, 6, 64);
    let lvk = TensorLayout::varlen(16, 3, 64);
    let e = g
        .fa
        .forward_varlen::<half::bf16, _, _, _>(s, Tensor::new(&q, lvq), Tensor::new(&k, lvk), Tensor::new(&k, lvk), &varlen, &ForwardParams::default(), &Extras::default())
        .unwrap_err();
    assert!(matches!(e, FlashAttnError::InvalidArgument { argument: "cu_seqlens_k", .. }), "{e}");
}
