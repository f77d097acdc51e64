//! Varlen (packed batches) in the CPU reference: `attention_varlen` = each
//! sequence run alone through the dense `attention` (batch 1), for random
//! lengths including empty q or k segments, `seqused_k`, rows past the last
//! sequence, GQA and every window/softcap/ALiBi option; the unpadded LSE
//! layout `(nheads, total_q)`; and every bad-input error of
//! `flash_attn::advanced::validate::check_varlen`, naming the argument and the value.
//!
//! One FA2 rule cannot be expressed by a dense call of one sequence: the
//! window is normalized with `max_seqlen_k`, so a right side in
//! `seqlen_k..max_seqlen_k` still masks early rows when `seqlen_q > right + 1`
//! (dense normalizes it away). Such sequences are compared with the explicit
//! score matrix instead (`cpu_support/infer.rs`), and a worked example pins
//! the rule. f64, 1e-12 (O and LSE); 256 cases.

mod cpu_support;
#[path = "cpu_support/infer.rs"]
mod infer;

use cpu_support::Rng;
use flash_attn::reference::{HostAlibi, attention, attention_varlen};
use flash_attn::advanced::validate::check_varlen;
use flash_attn::{AlibiShape, FlashAttnError, ForwardParams};
use infer::{Feat, assert_invalid, check_close, expected_alone, feat, host_alibi, prefix_sums, seq_slopes, slopes};
use ndarray::{Array3, Axis, s};
use proptest::prelude::*;

#[derive(Clone, Debug)]
struct Seq {
    sq: usize,
    seg_k: usize,
    /// `seqused_k` as a fraction of the segment, when the case uses it.
    used_frac: f64,
}

#[derive(Clone, Debug)]
struct Case {
    seqs: Vec<Seq>,
    use_seqused: bool,
    nheads_k: usize,
    group: usize,
    d: usize,
    /// Rows past the last sequence in q and k/v; slack of max_seqlen_q/k.
    extra: (usize, usize),
    slack: (usize, usize),
    f: Feat,
    seed: u64,
}

/// Everything a case's call takes.
struct Inputs {
    q: Array3<f64>,
    k: Array3<f64>,
    v: Array3<f64>,
    cu_q: Vec<i32>,
    cu_k: Vec<i32>,
    seqused: Option<Vec<i32>>,
    used: Vec<usize>,
    max_q: usize,
    max_k: usize,
    slopes: Vec<f32>,
}

impl Case {
    fn nheads(&self) -> usize {
        self.nheads_k * self.group
    }
    fn inputs(&self) -> Inputs {
        let mut rng = Rng::new(self.seed);
        let cu_q = prefix_sums(self.seqs.iter().map(|s| s.sq));
        let cu_k = prefix_sums(self.seqs.iter().map(|s| s.seg_k));
        let used: Vec<usize> = self
            .seqs
            .iter()
            .map(|s| if self.use_seqused { (s.seg_k as f64 * s.used_frac).round() as usize } else { s.seg_k })
            .collect();
        let seqused = self.use_seqused.then(|| used.iter().map(|&n| n as i32).collect());
        let total_q = *cu_q.last().unwrap() as usize + self.extra.0;
        let total_k = *cu_k.last().unwrap() as usize + self.extra.1;
        let (h, hk, d) = (self.nheads(), self.nheads_k, self.d);
        let mut t3 = |shape: (usize, usize, usize), a: f64| Array3::from_shape_simple_fn(shape, || rng.sym(a));
        let q = t3((total_q, h, d), 2.0);
        let k = t3((total_k, hk, d), 2.0);
        let v = t3((total_k, hk, d), 1.0);
        let max_q = self.seqs.iter().map(|s| s.sq).max().unwrap() + self.slack.0;
        let max_k = used.iter().copied().max().unwrap() + self.slack.1;
        let slopes = slopes(&mut rng, self.f.alibi, self.seqs.len(), h);
        Inputs { q, k, v, cu_q, cu_k, seqused, used, max_q, max_k, slopes }
    }
}

fn len() -> impl Strategy<Value = usize> {
    prop_oneof![1 => Just(0usize), 5 => 1usize..=20]
}

fn case() -> impl Strategy<Value = Case> {
    (
        prop::collection::vec((len(), len(), 0.0f64..=1.0).prop_map(|(sq, seg_k, used_frac)| Seq { sq, seg_k, used_frac }), 1..=5),
        any::<bool>(),
        (1usize..=3, 1usize..=3, 1usize..=16),
        ((0usize..=3, 0usize..=3), (0usize..=3, 0usize..=3)),
        any::<u64>(),
    )
        .prop_flat_map(|(seqs, use_seqused, (nheads_k, group, d), (extra, slack), seed)| {
            let max_k = seqs.iter().map(|s| s.seg_k).max().unwrap() + slack.1;
            feat(max_k + 3).prop_map(move |f| Case { seqs: seqs.clone(), use_seqused, nheads_k, group, d, extra, slack, f, seed })
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn varlen_equals_each_sequence_alone(c in case()) {
        let x = c.inputs();
        let h = c.nheads();
        let p = c.f.params();
        let out = attention_varlen(
            x.q.view(), x.k.view(), x.v.view(), &x.cu_q, &x.cu_k, x.seqused.as_deref(), x.max_q, x.max_k,
            &p, host_alibi(c.f.alibi, &x.slopes),
        ).unwrap();
        prop_assert_eq!(out.o.dim(), x.q.dim());
        prop_assert_eq!(out.lse.dim(), (h, x.q.dim().0));
        for (b, s) in c.seqs.iter().enumerate() {
            let (q0, k0, sk) = (x.cu_q[b] as usize, x.cu_k[b] as usize, x.used[b]);
            let lift = |a: &Array3<f64>, r0: usize, n: usize| a.slice(s![r0..r0 + n, .., ..]).insert_axis(Axis(0)).to_owned();
            let (qb, kb, vb) = (lift(&x.q, q0, s.sq), lift(&x.k, k0, sk), lift(&x.v, k0, sk));
            let want = expected_alone(&c.f, x.max_k, qb.view(), kb.view(), vb.view(), &seq_slopes(&c.f, &x.slopes, b, h));
            let rows = q0..q0 + s.sq;
            check_close(
                &format!("sequence {b}"),
                (out.o.slice(s![rows.clone(), .., ..]), out.lse.slice(s![.., rows])),
                (want.o.index_axis(Axis(0), 0), want.lse.index_axis(Axis(0), 0)),
                1e-12,
            )?;
        }
        // Rows past the last sequence: no sequence, O = 0 and LSE = -inf.
        let end = *x.cu_q.last().unwrap() as usize;
        prop_assert!(out.o.slice(s![end.., .., ..]).iter().all(|&v| v == 0.0));
        prop_assert!(out.lse.slice(s![.., end..]).iter().all(|&v| v == f64::NEG_INFINITY));
    }
}

/// FA2 normalizes the window with `max_seqlen_k`: here sequence 0 has 2 keys
/// and 5 queries, `window_right = 2 < max_seqlen_k = 4`, so query 0 (at key
/// position −3) sees keys up to −1: none. Alone (seqlen_k = 2) the same
/// window would be unbounded.
#[test]
fn window_is_normalized_with_max_seqlen_k() {
    let mut rng = Rng::new(3);
    let q = Array3::from_shape_simple_fn((6, 1, 4), || rng.sym(1.0));
    let k = Array3::from_shape_simple_fn((6, 1, 4), || rng.sym(1.0));
    let p = ForwardParams { window_right: Some(2), ..Default::default() };
    let out = attention_varlen(q.view(), k.view(), k.view(), &[0, 5, 6], &[0, 2, 6], None, 5, 4, &p, None).unwrap();
    assert_eq!(out.lse[[0, 0]], f64::NEG_INFINITY);
    assert!(out.o.slice(s![0, .., ..]).iter().all(|&v| v == 0.0));
    // Query 1 (position −2) sees key 0 only: O = v_0.
    assert!((out.lse[[0, 1]]).is_finite());
    assert_eq!(out.o.slice(s![1, 0, ..]), k.slice(s![0, 0, ..]));
    // With max_seqlen_k = 2 (sequence 1 then has too many keys) … and alone:
    let alone = attention(
        q.slice(s![0..5, .., ..]).insert_axis(Axis(0)),
        k.slice(s![0..2, .., ..]).insert_axis(Axis(0)),
        k.slice(s![0..2, .., ..]).insert_axis(Axis(0)),
        &p,
        None,
    )
    .unwrap();
    assert!(alone.lse.iter().all(|v| v.is_finite()), "alone, right = 2 ≥ seqlen_k is unbounded");
}

#[test]
fn every_bad_varlen_input_is_a_typed_error() {
    let (tq, tk) = (6, 7);
    let chk = |cq: &[i32], ck: &[i32], used: Option<&[i32]>, mq: usize, mk: usize| check_varlen(cq, ck, used, tq, tk, mq, mk);
    assert_invalid(chk(&[], &[], None, 4, 4), "cu_seqlens_q", &["0 entries"]);
    assert_invalid(chk(&[0], &[0], None, 4, 4), "cu_seqlens_q", &["batch is 0"]);
    assert_invalid(chk(&[0, 3, 6], &[0, 7], None, 4, 7), "cu_seqlens_k", &["2 entries", "cu_seqlens_q has 3"]);
    assert_invalid(chk(&[1, 3], &[0, 7], None, 4, 7), "cu_seqlens_q", &["cu_seqlens_q[0] = 1"]);
    assert_invalid(chk(&[0, 3], &[2, 7], None, 4, 7), "cu_seqlens_k", &["cu_seqlens_k[0] = 2"]);
    assert_invalid(chk(&[0, 4, 3], &[0, 1, 2], None, 4, 4), "cu_seqlens_q", &["cu_seqlens_q[2] = 3 < cu_seqlens_q[1] = 4"]);
    assert_invalid(chk(&[0, 1, 2], &[0, 3, 1], None, 4, 4), "cu_seqlens_k", &["cu_seqlens_k[2] = 1 < cu_seqlens_k[1] = 3"]);
    assert_invalid(chk(&[0, 3, 7], &[0, 1, 2], None, 4, 4), "cu_seqlens_q", &["cu_seqlens_q[2] = 7", "buffer rows = 6"]);
    assert_invalid(chk(&[0, 3, 6], &[0, 4, 8], None, 4, 4), "cu_seqlens_k", &["cu_seqlens_k[2] = 8", "buffer rows = 7"]);
    assert_invalid(chk(&[0, 5, 6], &[0, 1, 2], None, 4, 4), "cu_seqlens_q", &["sequence 0 has 5 rows", "max_seqlen_q = 4"]);
    assert_invalid(chk(&[0, 1, 2], &[0, 1, 6], None, 4, 4), "cu_seqlens_k", &["sequence 1 has 5 rows", "max_seqlen_k = 4"]);
    assert_invalid(chk(&[0, 1, 2], &[0, 1, 6], Some(&[1]), 4, 5), "seqused_k", &["1 entries", "batch = 2"]);
    assert_invalid(chk(&[0, 1, 2], &[0, 1, 6], Some(&[1, 6]), 4, 6), "seqused_k", &["seqused_k[1] = 6", "segment of sequence 1 = 5"]);
    assert_invalid(chk(&[0, 1, 2], &[0, 1, 6], Some(&[-1, 2]), 4, 6), "seqused_k", &["seqused_k[0] = -1"]);
    assert_invalid(chk(&[0, 1, 2], &[0, 1, 6], Some(&[1, 5]), 4, 4), "seqused_k", &["sequence 1 uses 5 keys", "max_seqlen_k = 4"]);
    // With seqused_k the segment may exceed max_seqlen_k: only the used keys count.
    let spans = chk(&[0, 1, 2], &[0, 1, 6], Some(&[1, 3]), 4, 3).unwrap();
    assert_eq!((spans[1].k_start, spans[1].seqlen_k), (1, 3));
    let e = chk(&[0, 1], &[0, 1], None, 1usize << 33, 4).unwrap_err();
    assert!(matches!(e, FlashAttnError::DimTooLarge { argument: "max_seqlen_q", .. }), "{e}");

    // Through attention_varlen: the same errors, and the tensor/option ones.
    let q = Array3::<f64>::zeros((tq, 6, 4));
    let k = Array3::<f64>::zeros((tk, 2, 4));
    let p = ForwardParams::default();
    let run = |q: &Array3<f64>, k: &Array3<f64>, v: &Array3<f64>, cq: &[i32], p: &ForwardParams, al: Option<HostAlibi<'_>>| {
        attention_varlen(q.view(), k.view(), v.view(), cq, &[0, 3, 7], None, 4, 4, p, al)
    };
    assert_invalid(run(&q, &k, &k, &[0, 4, 3], &p, None), "cu_seqlens_q", &["< cu_seqlens_q[1]"]);
    let k4 = Array3::<f64>::zeros((tk, 4, 4));
    assert_invalid(run(&q, &k4, &k4, &[0, 3, 6], &p, None), "nheads_k", &["nheads_k = 4", "nheads = 6"]);
    let sl = [0.5f32; 6];
    let al = Some(HostAlibi { slopes: &sl, shape: AlibiShape::PerBatchHead });
    assert_invalid(run(&q, &k, &k, &[0, 3, 6], &p, al), "alibi_slopes", &["6 slopes", "needs 12"]);
    let cap = ForwardParams { softcap: Some(-2.0), ..p };
    assert_invalid(run(&q, &k, &k, &[0, 3, 6], &cap, None), "softcap", &["-2"]);
    let bad = ForwardParams { causal: true, window_right: Some(1), ..p };
    assert_invalid(run(&q, &k, &k, &[0, 3, 6], &bad, None), "window_right", &["Some(1)"]);
    let v3 = Array3::<f64>::zeros((tk - 1, 2, 4));
    let e = run(&q, &k, &v3, &[0, 3, 6], &p, None).unwrap_err();
    assert!(matches!(e, FlashAttnError::ShapeMismatch { argument: "v", axis: "total", actual: 6, expected: 7, .. }), "{e}");
    let kd = Array3::<f64>::zeros((tk, 2, 8));
    let e = run(&q, &kd, &kd, &[0, 3, 6], &p, None).unwrap_err();
    assert!(matches!(e, FlashAttnError::ShapeMismatch { argument: "k", axis: "headdim", actual: 8, expected: 4, .. }), "{e}");
    let q0 = Array3::<f64>::zeros((tq, 0, 4));
    assert_invalid(run(&q0, &k, &k, &[0, 3, 6], &p, None), "q", &["nheads and headdim"]);
}
