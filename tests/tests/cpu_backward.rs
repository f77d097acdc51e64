//! The backward pass of the CPU reference (`flash_attn::reference::backward`,
//! `../shared/BACKWARD.md`):
//!
//! * the definition's gradients (f64) = central finite differences of the
//!   f64 forward `attention`, loss `Σ dO ∘ O`, with causal / window /
//!   softcap / ALiBi / GQA / sq ≠ sk drawn at random;
//! * FA2's Algorithm 2 (from the LSE) and FA1's Algorithm 4 (from base-2 l,
//!   m) with random block sizes = the definition, f64 (1e-10) and f32
//!   (against the f64 definition on the same f32-rounded inputs);
//! * a row that sees no key: dQ = 0 exactly, never NaN, and its keys get
//!   nothing from it;
//! * varlen = each sequence alone through the dense definition;
//! * typed errors for dout / out / lse / l / m shapes and blocks.

mod cpu_support;
#[path = "cpu_support/infer.rs"]
mod infer;

use cpu_support::Rng;
use flash_attn::reference::backward::{Grads, attention_backward, fa1_backward, fa2_backward, varlen_attention_backward};
use flash_attn::reference::{attention, fa1_forward, fa2_forward_ext};
use flash_attn::{FlashAttnError, ForwardParams};
use infer::{Dense, dense, feat, host_alibi, prefix_sums, seq_slopes, slopes};
use ndarray::{Array3, Array4, ArrayView4, Axis, s};
use proptest::prelude::*;

const LOG2_E: f64 = std::f64::consts::LOG2_E;

/// `max |got − want| ≤ tol · (1 + max |want|)` for each of dq, dk, dv; no NaN.
fn check_grads(what: &str, got: &Grads<f64>, want: &Grads<f64>, tol: f64) -> Result<(), TestCaseError> {
    for (name, g, w) in [("dq", &got.dq, &want.dq), ("dk", &got.dk, &want.dk), ("dv", &got.dv, &want.dv)] {
        prop_assert_eq!(g.shape(), w.shape(), "{} {}: shape", what, name);
        prop_assert!(!g.iter().any(|x| x.is_nan()), "{what} {name}: NaN");
        let scale = 1.0 + w.iter().fold(0.0f64, |a, &x| a.max(x.abs()));
        let err = cpu_support::max_abs_diff(g.view(), w.view());
        prop_assert!(err <= tol * scale, "{what} {name}: max |Δ| = {err:e} > {tol:e} · {scale}");
    }
    Ok(())
}

fn grads_f64(g: &Grads<f32>) -> Grads<f64> {
    Grads { dq: g.dq.mapv(f64::from), dk: g.dk.mapv(f64::from), dv: g.dv.mapv(f64::from) }
}

fn to_f32(x: &Array4<f64>) -> Array4<f32> {
    x.mapv(|v| v as f32)
}

fn round_f32(x: &Array4<f64>) -> Array4<f64> {
    x.mapv(|v| v as f32 as f64)
}

/// FA1's `(l, m)` for rows of logsumexp `lse`: any split `m₂ = lse·log2e − δ`,
/// `l = 2^δ` is a valid final state (`RowState { m, l }.lse() = lse`); `δ`
/// from the seed so that the backward must use both. Rows that see no key:
/// `m = -inf`, `l = 0` as FA1 leaves them.
fn fa1_stats(lse: &Array3<f64>, seed: u64) -> (Array3<f64>, Array3<f64>) {
    let mut rng = Rng::new(seed ^ 0x5eed);
    let delta = lse.mapv(|_| 3.0 * rng.unit());
    let m = ndarray::Zip::from(lse).and(&delta).map_collect(|&x, &dl| if x == f64::NEG_INFINITY { x } else { x * LOG2_E - dl });
    let l = ndarray::Zip::from(lse).and(&delta).map_collect(|&x, &dl| if x == f64::NEG_INFINITY { 0.0 } else { dl.exp2() });
    (l, m)
}

/// Loss `Σ dO ∘ O` of the f64 forward.
fn loss(x: &Dense, q: &Array4<f64>, k: &Array4<f64>, v: &Array4<f64>, dout: &Array4<f64>, sl: &[f32]) -> f64 {
    let o = attention(q.view(), k.view(), v.view(), &x.f.params(), host_alibi(x.f.alibi, sl)).unwrap().o;
    (&o * dout).sum()
}

/// Central differences of [`loss`] in every element of `which` (0: q, 1: k, 2: v).
fn finite_diff(x: &Dense, t: [&Array4<f64>; 3], dout: &Array4<f64>, sl: &[f32], which: usize, h: f64) -> Array4<f64> {
    let mut g = Array4::zeros(t[which].dim());
    for (idx, _) in t[which].indexed_iter() {
        let at = |delta: f64| {
            let mut ts = [t[0].clone(), t[1].clone(), t[2].clone()];
            ts[which][idx] += delta;
            loss(x, &ts[0], &ts[1], &ts[2], dout, sl)
        };
        g[idx] = (at(h) - at(-h)) / (2.0 * h);
    }
    g
}

fn small_seqlen() -> impl Strategy<Value = usize> {
    prop_oneof![1 => Just(0usize), 8 => 1usize..=7]
}

#[derive(Clone, Debug)]
struct Case {
    x: Dense,
    br: usize,
    bc: usize,
}

fn case() -> impl Strategy<Value = Case> {
    let seqlen = || prop_oneof![1 => Just(0usize), 6 => 1usize..=20, 2 => 21usize..=45];
    (dense(1..=2, seqlen(), seqlen(), (1..=2, 1..=3, 1..=16)), 1usize..=24, 1usize..=24)
        .prop_map(|(x, br, bc)| Case { x, br, bc })
}

/// `dout` of a case: uniform in `[-1, 1)`, from the case's seed.
fn dout_of(x: &Dense) -> Array4<f64> {
    Rng::new(x.seed.wrapping_add(17)).tensor((x.batch, x.sq, x.nheads(), x.d), 1.0)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// The definition = central finite differences of the f64 forward.
    #[test]
    fn definition_equals_finite_differences(
        x in dense(1..=2, small_seqlen(), small_seqlen(), (1..=2, 1..=2, 1..=4)),
    ) {
        let (q, k, v, sl) = x.inputs();
        let dout = dout_of(&x);
        let got = attention_backward(q.view(), k.view(), v.view(), dout.view(), &x.f.params(), host_alibi(x.f.alibi, &sl)).unwrap();
        let h = 1e-5;
        let fd = Grads {
            dq: finite_diff(&x, [&q, &k, &v], &dout, &sl, 0, h),
            dk: finite_diff(&x, [&q, &k, &v], &dout, &sl, 1, h),
            dv: finite_diff(&x, [&q, &k, &v], &dout, &sl, 2, h),
        };
        // Truncation O(h²·f''') plus rounding O(ε/h): ~1e-9 here.
        check_grads("definition vs finite differences", &got, &fd, 1e-7)?;
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// FA2 (Algorithm 2, from the forward's O and LSE) = the definition, f64.
    #[test]
    fn fa2_equals_definition_f64(c in case()) {
        let (q, k, v, sl) = c.x.inputs();
        let dout = dout_of(&c.x);
        let (p, al) = (c.x.f.params(), || host_alibi(c.x.f.alibi, &sl));
        let want = attention_backward(q.view(), k.view(), v.view(), dout.view(), &p, al()).unwrap();
        let fwd = fa2_forward_ext(q.view(), k.view(), v.view(), &p, al(), c.br, c.bc).unwrap();
        let got = fa2_backward(q.view(), k.view(), v.view(), fwd.o.view(), dout.view(), fwd.lse.view(), &p, al(), c.br, c.bc).unwrap();
        check_grads("fa2_backward vs definition", &got, &want, 1e-10)?;
    }

    /// FA1 (Algorithm 4, from base-2 l, m) = the definition, f64: with the
    /// CPU FA1 forward's own l, m where it applies (no window, softcap,
    /// ALiBi, GQA), else with a random valid split of the LSE.
    #[test]
    fn fa1_equals_definition_f64(c in case()) {
        let (q, k, v, sl) = c.x.inputs();
        let dout = dout_of(&c.x);
        let (p, al) = (c.x.f.params(), || host_alibi(c.x.f.alibi, &sl));
        let want = attention_backward(q.view(), k.view(), v.view(), dout.view(), &p, al()).unwrap();
        let plain = !p.has_window_or_softcap() && c.x.f.alibi.is_none() && c.x.group == 1 && c.x.sq > 0 && c.x.sk > 0;
        let (o, l, m) = if plain {
            // The library's scale (1/√d rounded to f32 by default), not fa1_forward's f64 default.
            let f = fa1_forward(q.view(), k.view(), v.view(), p.causal, Some(c.x.f.scale_f64(c.x.d)), c.br, c.bc).unwrap();
            (f.o, f.l, f.m.mapv(|m| m * LOG2_E))
        } else {
            let f = attention(q.view(), k.view(), v.view(), &p, al()).unwrap();
            let (l, m) = fa1_stats(&f.lse, c.x.seed);
            (f.o, l, m)
        };
        let got = fa1_backward(q.view(), k.view(), v.view(), o.view(), dout.view(), l.view(), m.view(), &p, al(), c.br, c.bc).unwrap();
        check_grads("fa1_backward vs definition", &got, &want, 1e-10)?;
    }

    /// FA2 and FA1 in f32 (f32 forward, f32 backward) = the f64 definition
    /// on the same f32 inputs, within f32 rounding.
    #[test]
    fn blocked_f32_equals_definition_f64(c in case()) {
        let (q, k, v, sl) = c.x.inputs();
        let (q, k, v, dout) = (round_f32(&q), round_f32(&k), round_f32(&v), round_f32(&dout_of(&c.x)));
        let (p, al) = (c.x.f.params(), || host_alibi(c.x.f.alibi, &sl));
        let want = attention_backward(q.view(), k.view(), v.view(), dout.view(), &p, al()).unwrap();
        let (qf, kf, vf, df) = (to_f32(&q), to_f32(&k), to_f32(&v), to_f32(&dout));
        let fwd = fa2_forward_ext(qf.view(), kf.view(), vf.view(), &p, al(), c.br, c.bc).unwrap();
        let got = fa2_backward(qf.view(), kf.view(), vf.view(), fwd.o.view(), df.view(), fwd.lse.view(), &p, al(), c.br, c.bc).unwrap();
        check_grads("fa2_backward f32 vs f64 definition", &grads_f64(&got), &want, 2e-4)?;
        let (l, m) = fa1_stats(&fwd.lse.mapv(f64::from), c.x.seed);
        let (l, m) = (l.mapv(|x| x as f32), m.mapv(|x| x as f32));
        let got = fa1_backward(qf.view(), kf.view(), vf.view(), fwd.o.view(), df.view(), l.view(), m.view(), &p, al(), c.br, c.bc).unwrap();
        check_grads("fa1_backward f32 vs f64 definition", &grads_f64(&got), &want, 2e-4)?;
    }

    /// Rows that see no key (causal with sq > sk: the first sq − sk rows):
    /// dQ = 0 exactly in every formulation, no NaN, and dK/dV equal those of
    /// the same call without those rows (whatever their dO).
    #[test]
    fn rows_without_keys(
        (sk, extra, h, d, seed, br, bc, softcap) in (1usize..=8, 1usize..=6, 1usize..=2, 1usize..=8, any::<u64>(), 1usize..=9, 1usize..=9,
            prop_oneof![Just(None), (0.5f32..20.0).prop_map(Some)]),
    ) {
        let sq = sk + extra;
        let mut rng = Rng::new(seed);
        let q = rng.tensor((1, sq, h, d), 2.0);
        let k = rng.tensor((1, sk, h, d), 2.0);
        let v = rng.tensor((1, sk, h, d), 1.0);
        let dout = rng.tensor((1, sq, h, d), 5.0);
        let p = ForwardParams { causal: true, softcap, ..Default::default() };
        let fwd = attention(q.view(), k.view(), v.view(), &p, None).unwrap();
        let (l, m) = fa1_stats(&fwd.lse, seed);
        let all = [
            ("definition", attention_backward(q.view(), k.view(), v.view(), dout.view(), &p, None).unwrap()),
            ("fa2", fa2_backward(q.view(), k.view(), v.view(), fwd.o.view(), dout.view(), fwd.lse.view(), &p, None, br, bc).unwrap()),
            ("fa1", fa1_backward(q.view(), k.view(), v.view(), fwd.o.view(), dout.view(), l.view(), m.view(), &p, None, br, bc).unwrap()),
        ];
        // Without the empty rows: row i' = i − extra sits at the same key position.
        let rows = s![.., extra.., .., ..];
        let (q2, d2) = (q.slice(rows), dout.slice(rows));
        let want = attention_backward(q2, k.view(), v.view(), d2, &p, None).unwrap();
        for (name, g) in &all {
            prop_assert!(g.dq.slice(s![.., ..extra, .., ..]).iter().all(|&x| x == 0.0), "{name}: dQ of a row without keys");
            let g2 = Grads { dq: g.dq.slice(rows).to_owned(), dk: g.dk.clone(), dv: g.dv.clone() };
            check_grads(name, &g2, &want, 1e-12)?;
        }
    }
}

// ---------------------------------------------------------------------------
// Varlen.
// ---------------------------------------------------------------------------

#[derive(Clone, Debug)]
struct VCase {
    lens: Vec<(usize, usize, f64)>,
    use_seqused: bool,
    pad_q: usize,
    nheads_k: usize,
    group: usize,
    d: usize,
    f: infer::Feat,
    seed: u64,
}

fn vcase() -> impl Strategy<Value = VCase> {
    let seq = (0usize..=12, 0usize..=12, 0.0f64..=1.0);
    (prop::collection::vec(seq, 1..=4), any::<bool>(), 0usize..=3, 1usize..=2, 1usize..=2, 1usize..=8, any::<u64>())
        .prop_flat_map(|(lens, use_seqused, pad_q, nheads_k, group, d, seed)| {
            let max_k = lens.iter().map(|l| l.1).max().unwrap_or(0);
            feat(max_k + 2).prop_map(move |f| VCase { lens: lens.clone(), use_seqused, pad_q, nheads_k, group, d, f, seed })
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    /// Varlen = each sequence alone through the dense definition; rows past
    /// the last sequence and keys past `seqused_k` get zero gradients.
    #[test]
    fn varlen_equals_each_sequence_alone(c in vcase()) {
        let nheads = c.nheads_k * c.group;
        let used: Vec<usize> = c.lens.iter().map(|&(_, sk, fr)| if c.use_seqused { (sk as f64 * fr) as usize } else { sk }).collect();
        let (max_q, max_k) = (c.lens.iter().map(|l| l.0).max().unwrap(), c.lens.iter().map(|l| l.1).max().unwrap());
        // Sequences a dense call of one cannot express (see cpu_varlen.rs) are not drawn.
        for (b, &(sq, _, _)) in c.lens.iter().enumerate() {
            prop_assume!(c.f.alone(max_k, sq, used[b]).is_some());
        }
        let cu_q = prefix_sums(c.lens.iter().map(|l| l.0));
        let cu_k = prefix_sums(c.lens.iter().map(|l| l.1));
        let (tq, tk) = (*cu_q.last().unwrap() as usize + c.pad_q, *cu_k.last().unwrap() as usize);
        let mut rng = Rng::new(c.seed);
        let q = rng.tensor((1, tq, nheads, c.d), 2.0).index_axis_move(Axis(0), 0);
        let k = rng.tensor((1, tk, c.nheads_k, c.d), 2.0).index_axis_move(Axis(0), 0);
        let v = rng.tensor((1, tk, c.nheads_k, c.d), 1.0).index_axis_move(Axis(0), 0);
        let dout = rng.tensor((1, tq, nheads, c.d), 1.0).index_axis_move(Axis(0), 0);
        let sl = slopes(&mut rng, c.f.alibi, c.lens.len(), nheads);
        let seqused: Vec<i32> = used.iter().map(|&u| u as i32).collect();
        let got = varlen_attention_backward(
            q.view(), k.view(), v.view(), dout.view(), &cu_q, &cu_k, c.use_seqused.then_some(&seqused[..]),
            max_q, max_k, &c.f.params(), host_alibi(c.f.alibi, &sl),
        ).unwrap();
        let mut want = Grads { dq: Array4::zeros((1, tq, nheads, c.d)), dk: Array4::zeros((1, tk, c.nheads_k, c.d)), dv: Array4::zeros((1, tk, c.nheads_k, c.d)) };
        for (b, &(sq, _, _)) in c.lens.iter().enumerate() {
            let (q0, k0) = (cu_q[b] as usize, cu_k[b] as usize);
            let (rq, rk) = (s![q0..q0 + sq, .., ..], s![k0..k0 + used[b], .., ..]);
            let one = |x: ndarray::ArrayView3<f64>| x.insert_axis(Axis(0)).to_owned();
            let fb = infer::Feat { alibi: c.f.alibi.map(|_| flash_attn::AlibiShape::PerHead), ..c.f.clone() };
            let sb = seq_slopes(&c.f, &sl, b, nheads);
            let p = c.f.alone(max_k, sq, used[b]).unwrap();
            let (qb, kb, vb, db) = (one(q.slice(rq)), one(k.slice(rk)), one(v.slice(rk)), one(dout.slice(rq)));
            let hq = attention_backward(qb.view(), kb.view(), vb.view(), db.view(), &p, host_alibi(fb.alibi, &sb)).unwrap();
            want.dq.slice_mut(s![0, q0..q0 + sq, .., ..]).assign(&hq.dq.index_axis(Axis(0), 0));
            want.dk.slice_mut(s![0, k0..k0 + used[b], .., ..]).assign(&hq.dk.index_axis(Axis(0), 0));
            want.dv.slice_mut(s![0, k0..k0 + used[b], .., ..]).assign(&hq.dv.index_axis(Axis(0), 0));
        }
        let got = Grads { dq: got.dq.insert_axis(Axis(0)), dk: got.dk.insert_axis(Axis(0)), dv: got.dv.insert_axis(Axis(0)) };
        check_grads("varlen vs each sequence alone", &got, &want, 1e-12)?;
    }
}

// ---------------------------------------------------------------------------
// Errors.
// ---------------------------------------------------------------------------

fn assert_shape_err<T: std::fmt::Debug>(r: flash_attn::Result<T>, argument: &str, axis: &str) {
    match r {
        Err(FlashAttnError::ShapeMismatch { argument: a, axis: x, .. }) => {
            assert_eq!((a, x), (argument, axis), "wrong argument/axis");
        }
        other => panic!("expected ShapeMismatch {{ {argument}, {axis} }}, got {other:?}"),
    }
}

#[test]
fn mismatched_shapes_are_typed_errors() {
    let mut rng = Rng::new(7);
    let (b, sq, sk, h, d) = (2, 5, 4, 2, 3);
    let q = rng.tensor((b, sq, h, d), 1.0);
    let k = rng.tensor((b, sk, h, d), 1.0);
    let v = rng.tensor((b, sk, h, d), 1.0);
    let dout = rng.tensor((b, sq, h, d), 1.0);
    let p = ForwardParams::default();
    let fwd = attention(q.view(), k.view(), v.view(), &p, None).unwrap();
    let bad_o = rng.tensor((b, sq, h, d + 1), 1.0);
    let bad_do = rng.tensor((b, sq + 1, h, d), 1.0);
    let bad_lse = Array3::<f64>::zeros((b, h, sq + 1));
    let bad_lse_h = Array3::<f64>::zeros((b, h + 1, sq));
    let (qv, kv, vv): (ArrayView4<f64>, _, _) = (q.view(), k.view(), v.view());

    assert_shape_err(attention_backward(qv, kv, vv, bad_do.view(), &p, None), "dout", "seqlen");
    assert_shape_err(fa2_backward(qv, kv, vv, bad_o.view(), dout.view(), fwd.lse.view(), &p, None, 4, 4), "out", "headdim");
    assert_shape_err(fa2_backward(qv, kv, vv, fwd.o.view(), bad_do.view(), fwd.lse.view(), &p, None, 4, 4), "dout", "seqlen");
    assert_shape_err(fa2_backward(qv, kv, vv, fwd.o.view(), dout.view(), bad_lse.view(), &p, None, 4, 4), "softmax_lse", "seqlen_q");
    assert_shape_err(fa2_backward(qv, kv, vv, fwd.o.view(), dout.view(), bad_lse_h.view(), &p, None, 4, 4), "softmax_lse", "nheads");
    let (l, m) = fa1_stats(&fwd.lse, 1);
    assert_shape_err(fa1_backward(qv, kv, vv, fwd.o.view(), dout.view(), bad_lse.view(), m.view(), &p, None, 4, 4), "l", "seqlen_q");
    assert_shape_err(fa1_backward(qv, kv, vv, fwd.o.view(), dout.view(), l.view(), bad_lse_h.view(), &p, None, 4, 4), "m", "nheads");
    assert_shape_err(fa1_backward(qv, kv, vv, bad_o.view(), dout.view(), l.view(), m.view(), &p, None, 4, 4), "out", "headdim");
    assert!(matches!(
        fa2_backward(qv, kv, vv, fwd.o.view(), dout.view(), fwd.lse.view(), &p, None, 0, 4),
        Err(FlashAttnError::InvalidBlock { br: 0, .. })
    ));
    assert!(matches!(
        fa1_backward(qv, kv, vv, fwd.o.view(), dout.view(), l.view(), m.view(), &p, None, 4, 0),
        Err(FlashAttnError::InvalidBlock { bc: 0, .. })
    ));
    // The forward's own checks still apply (k shaped unlike q).
    let bad_k = rng.tensor((b, sk, h, d + 1), 1.0);
    assert_shape_err(attention_backward(qv, bad_k.view(), vv, dout.view(), &p, None), "k", "headdim");

    // Varlen: dout of another total.
    let q3 = q.index_axis(Axis(0), 0);
    let k3 = k.index_axis(Axis(0), 0);
    let d3 = rng.tensor((1, sq + 1, h, d), 1.0).index_axis_move(Axis(0), 0);
    assert_shape_err(
        varlen_attention_backward(q3, k3, k3, d3.view(), &[0, sq as i32], &[0, sk as i32], None, sq, sk, &p, None),
        "dout",
        "total",
    );
    let _ = feat; // (shared helper module)
}

/// A worked example: one query, two keys, d = 1, no scale tricks.
/// s = (q·k₀, q·k₁) = (0, 1)·scale 1 → P = (1, e)/(1+e); with dO = 1, V = (0, 1):
/// O = e/(1+e), dV = P, dP = V, D = O, dS = P∘(V − O), dQ = Σ dS_j k_j = dS₁.
#[test]
fn worked_example() {
    let q = Array4::from_elem((1, 1, 1, 1), 1.0f64);
    let k = Array4::from_shape_vec((1, 2, 1, 1), vec![0.0, 1.0]).unwrap();
    let v = Array4::from_shape_vec((1, 2, 1, 1), vec![0.0, 1.0]).unwrap();
    let dout = Array4::from_elem((1, 1, 1, 1), 1.0f64);
    let p = ForwardParams { softmax_scale: Some(1.0), ..Default::default() };
    let g = attention_backward(q.view(), k.view(), v.view(), dout.view(), &p, None).unwrap();
    let e = std::f64::consts::E;
    let (p0, p1) = (1.0 / (1.0 + e), e / (1.0 + e));
    let o = p1;
    let (ds0, ds1) = (p0 * (0.0 - o), p1 * (1.0 - o));
    assert!((g.dq[[0, 0, 0, 0]] - ds1).abs() < 1e-15, "dq {}", g.dq[[0, 0, 0, 0]]);
    assert!((g.dk[[0, 0, 0, 0]] - ds0).abs() < 1e-15 && (g.dk[[0, 1, 0, 0]] - ds1).abs() < 1e-15, "dk {:?}", g.dk);
    assert!((g.dv[[0, 0, 0, 0]] - p0).abs() < 1e-15 && (g.dv[[0, 1, 0, 0]] - p1).abs() < 1e-15, "dv {:?}", g.dv);
}
