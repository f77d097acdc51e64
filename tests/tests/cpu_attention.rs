//! FA1-tiled = FA2-tiled = standard attention (the CPU reference of
//! `flash_attn::reference`), as properties over random shapes, block sizes,
//! masks and scales; the f32 paths against the f64 reference; and the seed's
//! worked example (seed 000: N = 4, d = 2, Br = Bc = 2) step by step.
//!
//! Shapes: batch, nheads, N_q, N_k, d each in 1..=256, with the total work
//! `batch·nheads·N_q·N_k·d` capped at 2^20 multiply-adds (the largest axis is
//! halved until it fits), so that 256+ cases run in seconds.
//!
//! Tolerances:
//! * f64, FA1 and FA2 vs standard: `‖ΔO‖/‖O‖ ≤ 1e-12`, `|ΔO| ≤ 1e-12` elementwise
//!   (outputs are averages of values in [-1, 1]), `|Δlse| ≤ 1e-12·(1 + |lse|)`.
//!   The online paths differ from the standard one only by rounding (base-2
//!   exponent `s·log2 e`, rescaling order): a few hundred ε at most.
//! * f32 (inputs rounded to f32, reference in f64 on the same rounded inputs):
//!   `‖ΔO‖/‖O‖ ≤ 2e-5` and `|Δlse| ≤ 2e-5·(1 + |lse|)`; GPU-NOTES expects
//!   f32 paths "far under 1e-4". Scores stay moderate (|s| ≲ 20) there.
//! * Exact: a fully masked row has O = 0 and lse = -inf (FA1: l = 0, m = -inf)
//!   in every path and type; no NaN anywhere.

mod cpu_support;

use cpu_support::{Rng, any_nan, max_abs_diff, rel_err};
use flash_attn::reference::{
    AttnOutput, Fa1Output, RefError, default_softmax_scale, fa1_forward, fa1_forward_steps, fa2_forward,
    standard_attention,
};
use ndarray::{Array3, Array4, Axis, array, s};
use proptest::prelude::*;

const WORK_BUDGET: usize = 1 << 20;

#[derive(Clone, Debug)]
struct Case {
    batch: usize,
    nheads: usize,
    n_q: usize,
    n_k: usize,
    d: usize,
    br: usize,
    bc: usize,
    causal: bool,
    /// `None`: the default `1/√d`; else a factor times `1/√d`.
    scale: Option<f64>,
    seed: u64,
}

impl Case {
    fn scale(&self) -> Option<f64> {
        self.scale.map(|c| c * default_softmax_scale(self.d))
    }
    fn inputs(&self) -> (Array4<f64>, Array4<f64>, Array4<f64>) {
        let mut rng = Rng::new(self.seed);
        let q = rng.tensor((self.batch, self.n_q, self.nheads, self.d), 2.0);
        let k = rng.tensor((self.batch, self.n_k, self.nheads, self.d), 2.0);
        let v = rng.tensor((self.batch, self.n_k, self.nheads, self.d), 1.0);
        (q, k, v)
    }
}

fn dim() -> impl Strategy<Value = usize> {
    prop_oneof![3 => 1usize..=16, 2 => 1usize..=256]
}

fn case() -> impl Strategy<Value = Case> {
    (
        (dim(), dim(), dim(), dim(), dim()),
        (1usize..=300, 1usize..=300),
        any::<bool>(),
        prop_oneof![Just(None), (0.05f64..2.5).prop_map(Some)],
        any::<u64>(),
    )
        .prop_map(|((batch, nheads, n_q, n_k, d), (br, bc), causal, scale, seed)| {
            // batch and heads matter less than the sequence lengths: cap them first.
            let mut dims = [batch.min(16), nheads.min(16), n_q, n_k, d];
            while dims.iter().product::<usize>() > WORK_BUDGET {
                let big = (0..5).max_by_key(|&i| dims[i]).unwrap();
                dims[big] = dims[big].div_ceil(2);
            }
            let [batch, nheads, n_q, n_k, d] = dims;
            // Block sizes from 1 to a little past the sequence length.
            let br = 1 + br % (n_q + 4);
            let bc = 1 + bc % (n_k + 4);
            Case { batch, nheads, n_q, n_k, d, br, bc, causal, scale, seed }
        })
}

/// Rows with no visible key under the bottom-right causal mask.
fn masked_rows(n_q: usize, n_k: usize, causal: bool) -> usize {
    if causal { n_q.saturating_sub(n_k) } else { 0 }
}

fn check_against(
    what: &str,
    o: &Array4<f64>,
    lse: &Array3<f64>,
    want: &AttnOutput<f64>,
    o_tol: f64,
    lse_tol: f64,
) -> Result<(), TestCaseError> {
    prop_assert!(!any_nan(o.view()) && !any_nan(lse.view()), "{what}: NaN in the output");
    let e = rel_err(o.view(), want.o.view());
    prop_assert!(e <= o_tol, "{what}: ‖ΔO‖/‖O‖ = {e:e} > {o_tol:e}");
    let m = max_abs_diff(o.view(), want.o.view());
    prop_assert!(m <= o_tol, "{what}: max |ΔO| = {m:e} > {o_tol:e}");
    for (&a, &b) in lse.iter().zip(want.lse.iter()) {
        if b == f64::NEG_INFINITY {
            prop_assert_eq!(a, f64::NEG_INFINITY, "{}: lse of a fully masked row", what);
        } else {
            prop_assert!((a - b).abs() <= lse_tol * (1.0 + b.abs()), "{what}: lse {a} vs {b}");
        }
    }
    Ok(())
}

/// FA1's `l`, `m` against the standard path's logsumexp: `m + ln l = lse`,
/// `m ≤ lse ≤ m + ln N_k`, and `l = 0`, `m = -inf` exactly on masked rows.
fn check_fa1_stats(fa1: &Fa1Output<f64>, want: &AttnOutput<f64>, tol: f64, n_k: usize) -> Result<(), TestCaseError> {
    for ((&l, &m), &lse) in fa1.l.iter().zip(fa1.m.iter()).zip(want.lse.iter()) {
        if lse == f64::NEG_INFINITY {
            prop_assert!(l == 0.0 && m == f64::NEG_INFINITY, "FA1 masked row: l = {l}, m = {m}");
        } else {
            prop_assert!(l >= 1.0 - 1e-12 && l <= n_k as f64 * (1.0 + 1e-12), "FA1 l = {l} outside [1, N_k]");
            let got = m + l.ln();
            prop_assert!((got - lse).abs() <= tol * (1.0 + lse.abs()), "FA1 m + ln l = {got} vs lse {lse}");
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn fa1_equals_fa2_equals_standard_f64(c in case()) {
        let (q, k, v) = c.inputs();
        let scale = c.scale();
        let want = standard_attention(q.view(), k.view(), v.view(), c.causal, scale).unwrap();
        let fa2 = fa2_forward(q.view(), k.view(), v.view(), c.causal, scale, c.br, c.bc).unwrap();
        check_against("FA2 f64", &fa2.o, &fa2.lse, &want, 1e-12, 1e-12)?;
        let fa1 = fa1_forward(q.view(), k.view(), v.view(), c.causal, scale, c.br, c.bc).unwrap();
        let fa1_lse = Array3::from_shape_fn(fa1.l.raw_dim(), |i| {
            if fa1.l[i] == 0.0 { f64::NEG_INFINITY } else { fa1.m[i] + fa1.l[i].ln() }
        });
        check_against("FA1 f64", &fa1.o, &fa1_lse, &want, 1e-12, 1e-12)?;
        check_fa1_stats(&fa1, &want, 1e-12, c.n_k)?;
        // Fully masked rows (N_q > N_k, causal): exactly zero output.
        let masked = masked_rows(c.n_q, c.n_k, c.causal);
        prop_assert_eq!(want.lse.iter().filter(|&&x| x == f64::NEG_INFINITY).count(), masked * c.batch * c.nheads);
        for out in [&want.o, &fa1.o, &fa2.o] {
            prop_assert!(out.slice(s![.., ..masked, .., ..]).iter().all(|&x| x == 0.0));
        }
    }

    #[test]
    fn f32_paths_against_f64(c in case()) {
        let (q, k, v) = c.inputs();
        let to32 = |a: &Array4<f64>| a.mapv(|x| x as f32);
        let to64 = |a: &Array4<f32>| a.mapv(|x| x as f64);
        let (q32, k32, v32) = (to32(&q), to32(&k), to32(&v));
        let (q, k, v) = (to64(&q32), to64(&k32), to64(&v32));
        let scale = c.scale();
        let want = standard_attention(q.view(), k.view(), v.view(), c.causal, scale).unwrap();
        let scale32 = scale.map(|x| x as f32);
        let lse64 = |x: &Array3<f32>| x.mapv(|v| v as f64);
        let std32 = standard_attention(q32.view(), k32.view(), v32.view(), c.causal, scale32).unwrap();
        check_against("standard f32", &to64(&std32.o), &lse64(&std32.lse), &want, 2e-5, 2e-5)?;
        let fa2 = fa2_forward(q32.view(), k32.view(), v32.view(), c.causal, scale32, c.br, c.bc).unwrap();
        check_against("FA2 f32", &to64(&fa2.o), &lse64(&fa2.lse), &want, 2e-5, 2e-5)?;
        let fa1 = fa1_forward(q32.view(), k32.view(), v32.view(), c.causal, scale32, c.br, c.bc).unwrap();
        let fa1_lse = Array3::from_shape_fn(fa1.l.raw_dim(), |i| {
            if fa1.l[i] == 0.0 { f64::NEG_INFINITY } else { fa1.m[i] as f64 + (fa1.l[i] as f64).ln() }
        });
        check_against("FA1 f32", &to64(&fa1.o), &fa1_lse, &want, 2e-5, 2e-5)?;
    }

    /// Only the last FA1 snapshot is the result, and every snapshot's rows
    /// equal standard attention restricted to the keys seen so far.
    #[test]
    fn fa1_steps_are_attention_over_the_keys_seen(c in case()) {
        let (q, k, v) = c.inputs();
        let scale = c.scale();
        let steps = fa1_forward_steps(q.view(), k.view(), v.view(), false, scale, c.br, c.bc).unwrap();
        prop_assert_eq!(steps.len(), c.n_k.div_ceil(c.bc));
        for (j, st) in steps.iter().enumerate().step_by(steps.len().div_ceil(3).max(1)) {
            let seen = ((j + 1) * c.bc).min(c.n_k);
            let (kj, vj) = (k.slice(s![.., ..seen, .., ..]), v.slice(s![.., ..seen, .., ..]));
            let want = standard_attention(q.view(), kj, vj, false, scale).unwrap();
            let e = rel_err(st.o.view(), want.o.view());
            prop_assert!(e <= 1e-12, "after j = {}: ‖ΔO‖/‖O‖ = {e:e}", j + 1);
        }
        let last = fa1_forward(q.view(), k.view(), v.view(), false, scale, c.br, c.bc).unwrap();
        prop_assert_eq!(steps.last().unwrap(), &last);
    }
}

/// The worked example of seed 000: N = 4, d = 2, Br = Bc = 2, `S = Q Kᵀ`
/// (softmax_scale = 1). The expected O, l, m after j = 1 and j = 2 were
/// computed independently, by seed 004's `flash_attention` loop transcribed to
/// plain Python floats (no library code involved).
#[test]
fn seed_worked_example_n4_d2_step_by_step() {
    let q = array![[1.0, 0.5], [-0.5, 1.0], [0.25, -1.0], [2.0, 0.0]];
    let k = array![[0.5, 1.0], [1.0, -0.5], [-1.0, 0.25], [0.0, 2.0]];
    let v = array![[1.0, 2.0], [3.0, -1.0], [0.5, 0.0], [-2.0, 1.0]];
    // (N, d) -> (batch 1, N, heads 1, d)
    let lift = |x: &ndarray::Array2<f64>| x.clone().insert_axis(Axis(0)).insert_axis(Axis(2));
    let (q4, k4, v4) = (lift(&q), lift(&k), lift(&v));
    let steps = fa1_forward_steps(q4.view(), k4.view(), v4.view(), false, Some(1.0), 2, 2).unwrap();
    assert_eq!(steps.len(), 2, "Tc = ceil(4 / 2) = 2 outer steps");

    #[rustfmt::skip]
    let expected = [
        // after j = 1 (K_1, V_1: keys 1-2 seen by both Q blocks)
        (
            [[1.8756469982284036, 0.6865295026573942], [1.296094396063379, 1.5558584059049319],
             [2.6709670742068736, -0.5064506113103106], [2.4621171572600096, -0.1931757358900146]],
            [1.778800783071405, 1.173773943450445, 1.196911675204194, 1.3678794411714423],
            [1.0, 0.75, 0.75, 2.0],
        ),
        // after j = 2 (all four keys): the final result
        (
            [[0.48192522947561695, 0.7575311157983252], [-0.8755758702249897, 0.9386404106799221],
             [2.076013904694401, -0.3504383457033047], [2.0416067724155282, -0.08472117121684959]],
            [2.9321557499163333, 1.6227966620882441, 1.5473443332710917, 1.5215303632967891],
            [1.0, 2.0, 0.75, 2.0],
        ),
    ];
    for (j, (st, (o, l, m))) in steps.iter().zip(expected).enumerate() {
        for r in 0..4 {
            for (x, &want) in o[r].iter().enumerate() {
                let got = st.o[[0, r, 0, x]];
                assert!((got - want).abs() < 1e-13, "j={} O[{r}][{x}] = {got}, want {want}", j + 1);
            }
            let (gl, gm) = (st.l[[0, 0, r]], st.m[[0, 0, r]]);
            assert!((gl - l[r]).abs() < 1e-13, "j={} l[{r}] = {gl}, want {}", j + 1, l[r]);
            assert!((gm - m[r]).abs() < 1e-14, "j={} m[{r}] = {gm}, want {}", j + 1, m[r]);
        }
    }

    // Step 2 follows from step 1 by line 12 of Algorithm 1, written out here:
    // O_i <- diag(l_new)^-1 (diag(l_i) e^(m_i - m_new) O_i + e^(m~ - m_new) P~ V_2).
    let (s1, s2) = (&steps[0], &steps[1]);
    for r in 0..4 {
        let sc: Vec<f64> = (2..4).map(|c| q[[r, 0]] * k[[c, 0]] + q[[r, 1]] * k[[c, 1]]).collect();
        let m_tilde = sc[0].max(sc[1]);
        let p: Vec<f64> = sc.iter().map(|s| (s - m_tilde).exp()).collect();
        let l_tilde = p[0] + p[1];
        let (l_i, m_i) = (s1.l[[0, 0, r]], s1.m[[0, 0, r]]);
        let m_new = m_i.max(m_tilde);
        let l_new = (m_i - m_new).exp() * l_i + (m_tilde - m_new).exp() * l_tilde;
        assert!((s2.l[[0, 0, r]] - l_new).abs() < 1e-13 && s2.m[[0, 0, r]] == m_new);
        for x in 0..2 {
            let pv = p[0] * v[[2, x]] + p[1] * v[[3, x]];
            let o = (l_i * (m_i - m_new).exp() * s1.o[[0, r, 0, x]] + (m_tilde - m_new).exp() * pv) / l_new;
            assert!((s2.o[[0, r, 0, x]] - o).abs() < 1e-13, "line 12, row {r}, col {x}");
        }
    }

    // And the final step is standard attention, which FA2 reproduces too.
    let want = standard_attention(q4.view(), k4.view(), v4.view(), false, Some(1.0)).unwrap();
    assert!(rel_err(s2.o.view(), want.o.view()) < 1e-14);
    let fa2 = fa2_forward(q4.view(), k4.view(), v4.view(), false, Some(1.0), 2, 2).unwrap();
    assert!(rel_err(fa2.o.view(), want.o.view()) < 1e-14);
}

/// Causal, N_q ≠ N_k: bottom-right alignment. With N_q = 5, N_k = 3, query row
/// i sees keys j <= i - 2: rows 0, 1 see nothing (O = 0, lse = -inf), row 2
/// sees key 0 only (O = v_0), row 4 sees all three.
#[test]
fn causal_bottom_right_and_fully_masked_rows() {
    let mut rng = Rng::new(7);
    let q = rng.tensor((1, 5, 1, 3), 1.0);
    let k = rng.tensor((1, 3, 1, 3), 1.0);
    let v = rng.tensor((1, 3, 1, 3), 1.0);
    let std = standard_attention(q.view(), k.view(), v.view(), true, None).unwrap();
    let fa1 = fa1_forward(q.view(), k.view(), v.view(), true, None, 2, 2).unwrap();
    let fa2 = fa2_forward(q.view(), k.view(), v.view(), true, None, 2, 2).unwrap();
    for o in [&std.o, &fa1.o, &fa2.o] {
        assert!(o.slice(s![0, ..2, 0, ..]).iter().all(|&x| x == 0.0));
        assert!(max_abs_diff(o.slice(s![0, 2, 0, ..]), v.slice(s![0, 0, 0, ..])) < 1e-15);
    }
    for lse in [&std.lse, &fa2.lse] {
        assert_eq!(lse[[0, 0, 0]], f64::NEG_INFINITY);
        assert_eq!(lse[[0, 0, 1]], f64::NEG_INFINITY);
        assert!(lse[[0, 0, 2]].is_finite());
    }
    assert_eq!((fa1.l[[0, 0, 0]], fa1.m[[0, 0, 0]]), (0.0, f64::NEG_INFINITY));
    // Row 4 = the last row sees every key: same as non-causal.
    let full = standard_attention(q.view(), k.view(), v.view(), false, None).unwrap();
    assert!(max_abs_diff(std.o.slice(s![0, 4, 0, ..]), full.o.slice(s![0, 4, 0, ..])) < 1e-15);
    // N_q < N_k: row i sees keys j <= i + 2 (the last row sees all).
    let q = rng.tensor((1, 2, 1, 3), 1.0);
    let k = rng.tensor((1, 4, 1, 3), 1.0);
    let v = rng.tensor((1, 4, 1, 3), 1.0);
    let causal = standard_attention(q.view(), k.view(), v.view(), true, None).unwrap();
    let first3 = standard_attention(q.view(), k.slice(s![.., ..3, .., ..]), v.slice(s![.., ..3, .., ..]), false, None);
    let first3 = first3.unwrap();
    assert!(max_abs_diff(causal.o.slice(s![0, 0, 0, ..]), first3.o.slice(s![0, 0, 0, ..])) < 1e-15);
}

#[test]
fn argument_errors_name_the_argument() {
    let z = Array4::<f64>::zeros((1, 4, 2, 8));
    let bad_d = Array4::<f64>::zeros((1, 4, 2, 7));
    let empty = Array4::<f64>::zeros((1, 0, 2, 8));
    let e = standard_attention(z.view(), bad_d.view(), z.view(), false, None).unwrap_err();
    assert!(matches!(e, RefError::ShapeMismatch { arg: "k", .. }), "{e}");
    assert!(e.to_string().contains("`k`") && e.to_string().contains("[1, 4, 2, 7]"), "{e}");
    let e = fa2_forward(z.view(), z.view(), bad_d.view(), false, None, 2, 2).unwrap_err();
    assert!(matches!(e, RefError::ShapeMismatch { arg: "v", .. }), "{e}");
    let e = fa1_forward(empty.view(), z.view(), z.view(), false, None, 2, 2).unwrap_err();
    assert!(matches!(e, RefError::ZeroDim { arg: "q", .. }), "{e}");
    let e = fa1_forward(z.view(), z.view(), z.view(), false, None, 0, 2).unwrap_err();
    assert_eq!(e, RefError::ZeroBlock { arg: "br", value: 0 });
    let e = fa2_forward(z.view(), z.view(), z.view(), false, None, 2, 0).unwrap_err();
    assert_eq!(e, RefError::ZeroBlock { arg: "bc", value: 0 });
    let e = fa2_forward(z.view(), z.view(), z.view(), false, Some(f64::NAN), 2, 2).unwrap_err();
    assert!(matches!(e, RefError::BadScale { .. }), "{e}");
    assert_eq!(default_softmax_scale(64), 0.125);
}
