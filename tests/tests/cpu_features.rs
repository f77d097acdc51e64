//! The inference features of the CPU reference (`flash_attn::reference::
//! {attention, fa2_forward_ext}`) against their definitions
//! (`../shared/INFERENCE.md`, FlashAttention-2's semantics):
//!
//! * window / softcap / ALiBi / GQA = an explicit score matrix written from
//!   the formulas in `cpu_support/infer.rs` (independent code);
//! * GQA = the same call with each K/V head repeated over its query group;
//! * FA2's blocked loop (random `Br`, `Bc`, window block skipping) = the
//!   standard definition;
//! * the normalization rules of the window; f32 against f64;
//! * bad options are typed errors naming the argument.
//!
//! f64 tolerance: `|ΔO| ≤ 1e-12` elementwise, `|ΔLSE| ≤ 1e-12·(1 + |LSE|)`,
//! rows that see no key exactly O = 0, LSE = -inf. 256 cases per property.

mod cpu_support;
#[path = "cpu_support/infer.rs"]
mod infer;

use flash_attn::reference::{AttnOutput, HostAlibi, attention, fa2_forward_ext};
use flash_attn::{AlibiShape, FlashAttnError, ForwardParams};
use infer::{Dense, assert_invalid, check_out, dense, host_alibi, oracle, repeat_heads};
use ndarray::{Array4, array};
use proptest::prelude::*;

#[derive(Clone, Debug)]
struct Case {
    x: Dense,
    br: usize,
    bc: usize,
}

fn seqlen() -> impl Strategy<Value = usize> {
    prop_oneof![1 => Just(0usize), 6 => 1usize..=24, 2 => 25usize..=70]
}

fn case() -> impl Strategy<Value = Case> {
    (dense(1..=3, seqlen(), seqlen(), (1..=3, 1..=3, 1..=24)), 1usize..=40, 1usize..=40)
        .prop_map(|(x, br, bc)| Case { x, br, bc })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Window, softcap, ALiBi and GQA together = the explicit score matrix.
    #[test]
    fn standard_equals_explicit_score_matrix(c in case()) {
        let (q, k, v, sl) = c.x.inputs();
        let got = attention(q.view(), k.view(), v.view(), &c.x.f.params(), host_alibi(c.x.f.alibi, &sl)).unwrap();
        let want = oracle(q.view(), k.view(), v.view(), &c.x.f, c.x.f.window(c.x.sk), &sl);
        check_out("attention vs explicit scores", &got, &want, 1e-12)?;
    }

    /// FA2's blocked online loop with random blocks = the standard definition.
    #[test]
    fn fa2_blocked_equals_standard(c in case()) {
        let (q, k, v, sl) = c.x.inputs();
        let p = c.x.f.params();
        let want = attention(q.view(), k.view(), v.view(), &p, host_alibi(c.x.f.alibi, &sl)).unwrap();
        let got = fa2_forward_ext(q.view(), k.view(), v.view(), &p, host_alibi(c.x.f.alibi, &sl), c.br, c.bc).unwrap();
        check_out("fa2_forward_ext vs attention", &got, &want, 1e-12)?;
    }

    /// GQA/MQA = MHA with each K/V head repeated over its group of query
    /// heads (contiguous groups: query head h reads KV head h / group).
    #[test]
    fn gqa_equals_mha_with_repeated_kv(c in case()) {
        let (q, k, v, sl) = c.x.inputs();
        let (kr, vr) = (repeat_heads(&k, c.x.group), repeat_heads(&v, c.x.group));
        let p = c.x.f.params();
        let al = || host_alibi(c.x.f.alibi, &sl);
        let gqa = attention(q.view(), k.view(), v.view(), &p, al()).unwrap();
        let mha = attention(q.view(), kr.view(), vr.view(), &p, al()).unwrap();
        check_out("GQA vs repeated-KV MHA (standard)", &gqa, &mha, 1e-12)?;
        let gqa = fa2_forward_ext(q.view(), k.view(), v.view(), &p, al(), c.br, c.bc).unwrap();
        let mha = fa2_forward_ext(q.view(), kr.view(), vr.view(), &p, al(), c.br, c.bc).unwrap();
        check_out("GQA vs repeated-KV MHA (FA2)", &gqa, &mha, 1e-12)?;
    }

    /// f32 inputs through both paths against the f64 reference on the same
    /// (rounded) inputs.
    #[test]
    fn f32_paths_against_f64(c in case()) {
        let (q, k, v, sl) = c.x.inputs();
        let to32 = |a: &Array4<f64>| a.mapv(|x| x as f32);
        let (q32, k32, v32) = (to32(&q), to32(&k), to32(&v));
        let up = |a: &Array4<f32>| a.mapv(|x| x as f64);
        let (q, k, v) = (up(&q32), up(&k32), up(&v32));
        let p = c.x.f.params();
        let al = || host_alibi(c.x.f.alibi, &sl);
        let want = attention(q.view(), k.view(), v.view(), &p, al()).unwrap();
        let lift = |o: AttnOutput<f32>| AttnOutput { o: o.o.mapv(|x| x as f64), lse: o.lse.mapv(|x| x as f64) };
        let std32 = lift(attention(q32.view(), k32.view(), v32.view(), &p, al()).unwrap());
        check_out("attention f32", &std32, &want, 5e-5)?;
        let fa2 = lift(fa2_forward_ext(q32.view(), k32.view(), v32.view(), &p, al(), c.br, c.bc).unwrap());
        check_out("fa2_forward_ext f32", &fa2, &want, 5e-5)?;
    }

    /// FA2's rules: causal = window (None, Some(0)) (and any left window
    /// composes with it); a side ≥ seqlen_k is unbounded; softcap Some(0) is off.
    #[test]
    fn window_normalization_rules(c in case(), extra in 0usize..5) {
        let (q, k, v, sl) = c.x.inputs();
        let run = |p: &ForwardParams| attention(q.view(), k.view(), v.view(), p, host_alibi(c.x.f.alibi, &sl)).unwrap();
        let base = c.x.f.params();
        let causal = run(&ForwardParams { causal: true, window_right: None, ..base });
        let as_window = run(&ForwardParams { causal: false, window_right: Some(0), ..base });
        prop_assert_eq!(&causal, &as_window);
        let causal0 = run(&ForwardParams { causal: true, window_right: Some(0), ..base });
        prop_assert_eq!(&causal, &causal0);
        let wide = Some(c.x.sk + extra);
        let unbounded = run(&ForwardParams { causal: false, window_left: None, window_right: None, ..base });
        let normalized = run(&ForwardParams { causal: false, window_left: wide, window_right: wide, ..base });
        prop_assert_eq!(&unbounded, &normalized);
        let off = run(&ForwardParams { softcap: None, ..base });
        let zero = run(&ForwardParams { softcap: Some(0.0), ..base });
        prop_assert_eq!(off, zero);
    }
}

/// A worked example pinning the bottom-right offsets: one query over two
/// keys (its position is `0 + 2 − 1 = 1`), d = 1, scale 1.
#[test]
fn worked_example_alibi_window_softcap() {
    let q = array![[[[1.0]]]];
    let k = array![[[[1.0]], [[2.0]]]];
    let v = array![[[[1.0]], [[3.0]]]];
    let base = ForwardParams { softmax_scale: Some(1.0), ..Default::default() };
    let alibi = Some(HostAlibi { slopes: &[0.5], shape: AlibiShape::PerHead });
    // Scores: key 0: 1 − 0.5·|1 − 0| = 0.5; key 1: 2 − 0.5·0 = 2.
    let out = attention(q.view(), k.view(), v.view(), &base, alibi).unwrap();
    let (e0, e1) = (0.5f64.exp(), 2.0f64.exp());
    assert!((out.o[[0, 0, 0, 0]] - (e0 + 3.0 * e1) / (e0 + e1)).abs() < 1e-15);
    assert!((out.lse[[0, 0, 0]] - (e0 + e1).ln()).abs() < 1e-15);
    // Window left 0: only key 1 (the query's own position) is visible.
    let w0 = ForwardParams { window_left: Some(0), ..base };
    let out = attention(q.view(), k.view(), v.view(), &w0, alibi).unwrap();
    assert_eq!((out.o[[0, 0, 0, 0]], out.lse[[0, 0, 0]]), (3.0, 2.0));
    // Softcap 1: scores tanh(1), tanh(2); ALiBi after the cap.
    let cap = ForwardParams { softcap: Some(1.0), ..base };
    let out = attention(q.view(), k.view(), v.view(), &cap, alibi).unwrap();
    let (s0, s1) = (1.0f64.tanh() - 0.5, 2.0f64.tanh());
    assert!((out.lse[[0, 0, 0]] - (s0.exp() + s1.exp()).ln()).abs() < 1e-15);
    // Causal with seqlen_q > seqlen_k: row i sits at key i − 1, so row 0
    // sees nothing (O = 0, LSE = -inf) and row 1 sees key 0 only.
    let q3 = array![[[[1.0]], [[1.0]], [[1.0]]]];
    let out = attention(q3.view(), k.view(), v.view(), &ForwardParams { causal: true, ..base }, None).unwrap();
    assert_eq!(out.lse[[0, 0, 0]], f64::NEG_INFINITY);
    assert_eq!(out.o[[0, 0, 0, 0]], 0.0);
    assert_eq!(out.o[[0, 1, 0, 0]], 1.0); // row 1 sits at key 0
}

#[test]
fn bad_options_are_typed_errors() {
    let q = Array4::<f64>::zeros((2, 3, 6, 4));
    let k = Array4::<f64>::zeros((2, 5, 2, 4));
    let run = |p: &ForwardParams, al: Option<HostAlibi<'_>>| attention(q.view(), k.view(), k.view(), p, al);
    for cap in [-1.0f32, f32::NAN, f32::INFINITY] {
        assert_invalid(run(&ForwardParams { softcap: Some(cap), ..Default::default() }, None), "softcap", &[&format!("{cap}")]);
    }
    let p = ForwardParams { causal: true, window_right: Some(2), ..Default::default() };
    assert_invalid(run(&p, None), "window_right", &["Some(2)"]);
    let e = run(&ForwardParams { softmax_scale: Some(f32::NAN), ..Default::default() }, None).unwrap_err();
    assert!(matches!(e, FlashAttnError::InvalidSoftmaxScale { .. }), "{e}");
    // ALiBi of the wrong shape: 2 slopes for 6 heads; (nheads) given as (batch, nheads).
    let two = [0.1f32; 2];
    let six = [0.1f32; 6];
    let al = Some(HostAlibi { slopes: &two, shape: AlibiShape::PerHead });
    assert_invalid(run(&ForwardParams::default(), al), "alibi_slopes", &["2 slopes", "needs 6"]);
    let al = Some(HostAlibi { slopes: &six, shape: AlibiShape::PerBatchHead });
    assert_invalid(run(&ForwardParams::default(), al), "alibi_slopes", &["6 slopes", "needs 12"]);
    // nheads % nheads_k != 0
    let k4 = Array4::<f64>::zeros((2, 5, 4, 4));
    let r = attention(q.view(), k4.view(), k4.view(), &ForwardParams::default(), None);
    assert_invalid(r, "nheads_k", &["nheads_k = 4", "nheads = 6"]);
    let r = fa2_forward_ext(q.view(), k4.view(), k4.view(), &ForwardParams::default(), None, 4, 4);
    assert_invalid(r, "nheads_k", &["nheads_k = 4"]);
    // Shapes, blocks.
    let kb = Array4::<f64>::zeros((1, 5, 2, 4));
    let e = attention(q.view(), kb.view(), kb.view(), &ForwardParams::default(), None).unwrap_err();
    assert!(matches!(e, FlashAttnError::ShapeMismatch { argument: "k", axis: "batch", actual: 1, expected: 2, .. }), "{e}");
    let vb = Array4::<f64>::zeros((2, 4, 2, 4));
    let e = attention(q.view(), k.view(), vb.view(), &ForwardParams::default(), None).unwrap_err();
    assert!(matches!(e, FlashAttnError::ShapeMismatch { argument: "v", axis: "seqlen", actual: 4, expected: 5, .. }), "{e}");
    let q0 = Array4::<f64>::zeros((2, 3, 0, 4));
    let e = attention(q0.view(), k.view(), k.view(), &ForwardParams::default(), None).unwrap_err();
    assert!(matches!(e, FlashAttnError::ZeroSizedDim { argument: "q", axis: "nheads", .. }), "{e}");
    let e = fa2_forward_ext(q.view(), k.view(), k.view(), &ForwardParams::default(), None, 0, 8).unwrap_err();
    assert!(matches!(e, FlashAttnError::InvalidBlock { br: 0, bc: 8, .. }), "{e}");
}
