//! Helpers of the inference-feature CPU tests (`cpu_features.rs`,
//! `cpu_varlen.rs`, `cpu_decode.rs`): an independent oracle that writes the
//! score matrix straight from the formulas of `../shared/INFERENCE.md`
//! (no library code: not `KeyWindow`, not `ScoreMod`, not `resolve`), the
//! FA2 window normalization restated, random feature options, and the
//! `1e-12` comparison.
#![allow(dead_code)]

use flash_attn::AlibiShape;
use flash_attn::{ForwardParams, LoopOrder};
use flash_attn::reference::{AttnOutput, HostAlibi, attention};
use ndarray::{Array3, Array4, ArrayView, ArrayView4, Dimension, s};
use proptest::prelude::*;

/// The options of one case as plain numbers: what the oracle computes with.
#[derive(Clone, Debug, PartialEq)]
pub struct Feat {
    pub causal: bool,
    pub left: Option<usize>,
    pub right: Option<usize>,
    /// `None`: off (also tried as `Some(0.0)`, which is off too).
    pub softcap: Option<f32>,
    /// `softmax_scale`, or `None` for the default `1/√d`.
    pub scale: Option<f32>,
    pub alibi: Option<AlibiShape>,
    /// Which path the varlen / KV-cache / paged calls run (ignored by
    /// `attention` and `fa2_forward_ext`), and its blocks.
    pub loop_order: LoopOrder,
    pub block: Option<(usize, usize)>,
}

impl Feat {
    pub fn params(&self) -> ForwardParams {
        ForwardParams {
            causal: self.causal,
            window_left: self.left,
            window_right: self.right,
            softcap: self.softcap,
            softmax_scale: self.scale,
            loop_order: self.loop_order,
            block: self.block,
        }
    }

    /// The scale the library uses (`f32`, default `1/√d` rounded to f32).
    pub fn scale_f64(&self, d: usize) -> f64 {
        self.scale.unwrap_or((1.0 / (d as f64).sqrt()) as f32) as f64
    }

    /// FA2's normalization, restated: causal forces right = 0; a side
    /// `≥ n` (the call's `seqlen_k` / `max_seqlen_k` / cache capacity) is
    /// unbounded.
    pub fn window(&self, n: usize) -> (Option<usize>, Option<usize>) {
        let side = |w: Option<usize>| w.filter(|&w| w < n);
        (side(self.left), if self.causal { Some(0) } else { side(self.right) })
    }

    /// Options for running one sequence of `sk` keys alone through the dense
    /// `attention` so that it computes what a call normalized with `n ≥ sk`
    /// computes; `None` where no dense call can (a right side in `sk..n`
    /// that still masks rows: dense normalizes it away).
    pub fn alone(&self, n: usize, sq: usize, sk: usize) -> Option<ForwardParams> {
        let (left, right) = self.window(n);
        if let Some(r) = right
            && !self.causal
            && r >= sk
            && sq > r + 1
        {
            return None;
        }
        let right = if self.causal { None } else { right };
        Some(ForwardParams { window_left: left, window_right: right, ..self.params() })
    }
}

pub fn feat(max_window: usize) -> impl Strategy<Value = Feat> {
    let side = prop_oneof![2 => Just(None), 3 => (0..=max_window).prop_map(Some)];
    (
        any::<bool>(),
        side.clone(),
        side,
        prop_oneof![2 => Just(None), 1 => Just(Some(0.0f32)), 3 => (0.3f32..60.0).prop_map(Some)],
        prop_oneof![Just(None), (0.1f32..3.0).prop_map(Some)],
        prop_oneof![Just(None), Just(Some(AlibiShape::PerHead)), Just(Some(AlibiShape::PerBatchHead))],
        (
            prop::sample::select(vec![LoopOrder::Standard, LoopOrder::Fa2, LoopOrder::Fa1]),
            prop_oneof![Just(None), (1usize..=20, 1usize..=20).prop_map(Some)],
        ),
    )
        .prop_map(|(causal, left, right, softcap, scale, alibi, (loop_order, block))| Feat {
            causal,
            left,
            // causal takes None or Some(0) only
            right: if causal { right.map(|_| 0) } else { right },
            softcap,
            scale,
            alibi,
            loop_order,
            block,
        })
}

/// A dense problem: its shapes (`nheads = nheads_k · group`), options and
/// the seed of its data.
#[derive(Clone, Debug)]
pub struct Dense {
    pub batch: usize,
    pub sq: usize,
    pub sk: usize,
    pub nheads_k: usize,
    pub group: usize,
    pub d: usize,
    pub f: Feat,
    pub seed: u64,
}

impl Dense {
    pub fn nheads(&self) -> usize {
        self.nheads_k * self.group
    }

    /// q `(batch, sq, h, d)` and k in `[-2, 2)`, v in `[-1, 1)`, ALiBi slopes.
    pub fn inputs(&self) -> (Array4<f64>, Array4<f64>, Array4<f64>, Vec<f32>) {
        let mut rng = crate::cpu_support::Rng::new(self.seed);
        let q = rng.tensor((self.batch, self.sq, self.nheads(), self.d), 2.0);
        let k = rng.tensor((self.batch, self.sk, self.nheads_k, self.d), 2.0);
        let v = rng.tensor((self.batch, self.sk, self.nheads_k, self.d), 1.0);
        let sl = slopes(&mut rng, self.f.alibi, self.batch, self.nheads());
        (q, k, v, sl)
    }
}

/// Dense problems with the given ranges; windows drawn from 0 to a little
/// past seqlen_k (where they are normalized away).
pub fn dense(
    batch: std::ops::RangeInclusive<usize>,
    sq: impl Strategy<Value = usize>,
    sk: impl Strategy<Value = usize>,
    (nheads_k, group, d): (std::ops::RangeInclusive<usize>, std::ops::RangeInclusive<usize>, std::ops::RangeInclusive<usize>),
) -> impl Strategy<Value = Dense> {
    (batch, sq, sk, nheads_k, group, d, any::<u64>()).prop_flat_map(|(batch, sq, sk, nheads_k, group, d, seed)| {
        feat(sk + 3).prop_map(move |f| Dense { batch, sq, sk, nheads_k, group, d, f, seed })
    })
}

/// Slopes of `shape` for `batch × nheads`, in `[0, 1)`, or none.
pub fn slopes(rng: &mut crate::cpu_support::Rng, shape: Option<AlibiShape>, batch: usize, nheads: usize) -> Vec<f32> {
    shape.map_or(vec![], |sh| (0..sh.len(batch, nheads)).map(|_| rng.unit() as f32).collect())
}

pub fn host_alibi(shape: Option<AlibiShape>, slopes: &[f32]) -> Option<HostAlibi<'_>> {
    shape.map(|shape| HostAlibi { slopes, shape })
}

/// Slope of (sequence `b`, head `h`), 0 without ALiBi.
pub fn slope_of(shape: Option<AlibiShape>, slopes: &[f32], b: usize, h: usize, nheads: usize) -> f64 {
    match shape {
        None => 0.0,
        Some(AlibiShape::PerHead) => slopes[h] as f64,
        Some(AlibiShape::PerBatchHead) => slopes[b * nheads + h] as f64,
    }
}

/// One (sequence, head) by the formulas: query `i` at key position
/// `c = i + sk − sq` sees key `j` iff `c − left ≤ j ≤ c + right` (sides
/// already normalized; `None` unbounded) and `0 ≤ j < sk`; its score is
/// `cap·tanh(scale·q·k/cap)` (cap > 0) minus `slope·|c − j|`; softmax with
/// the natural exp. `q`: `sq × d`, `k`, `v`: `sk × d`. Returns O rows and LSE.
#[allow(clippy::too_many_arguments)]
pub fn oracle_head(
    q: &[Vec<f64>],
    k: &[Vec<f64>],
    v: &[Vec<f64>],
    scale: f64,
    (left, right): (Option<usize>, Option<usize>),
    softcap: f64,
    slope: f64,
) -> (Vec<Vec<f64>>, Vec<f64>) {
    let (sq, sk) = (q.len() as i64, k.len() as i64);
    let d = q.first().map_or(0, |r| r.len());
    let mut o = vec![vec![0.0; d]; q.len()];
    let mut lse = vec![f64::NEG_INFINITY; q.len()];
    for i in 0..sq {
        let c = i + sk - sq;
        let mut scores = vec![];
        for j in 0..sk {
            let lo_ok = left.is_none_or(|l| j >= c - l as i64);
            let hi_ok = right.is_none_or(|r| j <= c + r as i64);
            if !(lo_ok && hi_ok) {
                continue;
            }
            let qk: f64 = (0..d).map(|x| q[i as usize][x] * k[j as usize][x]).sum();
            let mut sc = scale * qk;
            if softcap > 0.0 {
                sc = softcap * (sc / softcap).tanh();
            }
            sc -= slope * (c - j).abs() as f64;
            scores.push((j as usize, sc));
        }
        if scores.is_empty() {
            continue;
        }
        let m = scores.iter().map(|&(_, x)| x).fold(f64::NEG_INFINITY, f64::max);
        let z: f64 = scores.iter().map(|&(_, x)| (x - m).exp()).sum();
        lse[i as usize] = m + z.ln();
        for &(j, x) in &scores {
            let p = (x - m).exp() / z;
            for t in 0..d {
                o[i as usize][t] += p * v[j][t];
            }
        }
    }
    (o, lse)
}

/// Rows of head `h` of a `(seqlen, heads, d)` slice.
fn rows(x: ndarray::ArrayView3<f64>, h: usize) -> Vec<Vec<f64>> {
    x.slice(s![.., h, ..]).outer_iter().map(|r| r.to_vec()).collect()
}

/// The oracle over a dense batch: q `(b, sq, h, d)`, k/v `(b, sk, hk, d)`,
/// query head `h` reading KV head `h / (h_q / hk)` (written out here), the
/// window already normalized.
pub fn oracle(
    q: ArrayView4<f64>,
    k: ArrayView4<f64>,
    v: ArrayView4<f64>,
    f: &Feat,
    window: (Option<usize>, Option<usize>),
    slopes: &[f32],
) -> AttnOutput<f64> {
    let (batch, sq, nheads, d) = q.dim();
    let nheads_k = k.dim().2;
    let mut o = Array4::zeros((batch, sq, nheads, d));
    let mut lse = Array3::from_elem((batch, nheads, sq), f64::NEG_INFINITY);
    for b in 0..batch {
        for h in 0..nheads {
            let kv = h * nheads_k / nheads; // = h / (nheads / nheads_k)
            let (ob, lb) = oracle_head(
                &rows(q.slice(s![b, .., .., ..]), h),
                &rows(k.slice(s![b, .., .., ..]), kv),
                &rows(v.slice(s![b, .., .., ..]), kv),
                f.scale_f64(d),
                window,
                f.softcap.unwrap_or(0.0) as f64,
                slope_of(f.alibi, slopes, b, h, nheads),
            );
            for i in 0..sq {
                for x in 0..d {
                    o[[b, i, h, x]] = ob[i][x];
                }
                lse[[b, h, i]] = lb[i];
            }
        }
    }
    AttnOutput { o, lse }
}

/// What sequence `b` of a varlen or cache call must compute: dense `attention` over
/// its keys alone (or the explicit scores where a window side between the
/// sequence's length and the normalization length `n` still masks).
pub fn expected_alone(
    f: &Feat,
    n: usize,
    q_b: ArrayView4<f64>,
    k_b: ArrayView4<f64>,
    v_b: ArrayView4<f64>,
    slopes_b: &[f32],
) -> AttnOutput<f64> {
    let fb = Feat { alibi: f.alibi.map(|_| AlibiShape::PerHead), ..f.clone() };
    match f.alone(n, q_b.dim().1, k_b.dim().1) {
        Some(p) => attention(q_b, k_b, v_b, &p, host_alibi(fb.alibi, slopes_b)).unwrap(),
        None => oracle(q_b, k_b, v_b, &fb, f.window(n), slopes_b),
    }
}

pub fn seq_slopes(f: &Feat, slopes: &[f32], b: usize, h: usize) -> Vec<f32> {
    match f.alibi {
        Some(AlibiShape::PerBatchHead) => slopes[b * h..(b + 1) * h].to_vec(),
        _ => slopes.to_vec(),
    }
}

/// Prefix sums `[0, n_0, n_0 + n_1, …]` of sequence lengths (`cu_seqlens`).
pub fn prefix_sums(lens: impl IntoIterator<Item = usize>) -> Vec<i32> {
    let mut cu = vec![0i32];
    for n in lens {
        cu.push(cu.last().unwrap() + n as i32);
    }
    cu
}

/// `|Δo| ≤ tol` elementwise, `|Δlse| ≤ tol·(1 + |lse|)`, `-inf` LSE matched
/// exactly (and its O row then 0, checked through `o`), no NaN.
pub fn check_close<D: Dimension, E: Dimension>(
    what: &str,
    (o, lse): (ArrayView<f64, D>, ArrayView<f64, E>),
    (want_o, want_lse): (ArrayView<f64, D>, ArrayView<f64, E>),
    tol: f64,
) -> Result<(), TestCaseError> {
    prop_assert_eq!(o.shape(), want_o.shape(), "{}: O shape", what);
    prop_assert_eq!(lse.shape(), want_lse.shape(), "{}: LSE shape", what);
    prop_assert!(!o.iter().chain(lse.iter()).any(|x| x.is_nan()), "{what}: NaN in the output");
    let m = crate::cpu_support::max_abs_diff(o, want_o);
    prop_assert!(m <= tol, "{what}: max |ΔO| = {m:e} > {tol:e}");
    for (&a, &b) in lse.iter().zip(want_lse.iter()) {
        if b == f64::NEG_INFINITY {
            prop_assert_eq!(a, f64::NEG_INFINITY, "{}: LSE of a row that sees no key", what);
        } else {
            prop_assert!((a - b).abs() <= tol * (1.0 + b.abs()), "{what}: LSE {a} vs {b}");
        }
    }
    Ok(())
}

/// [`check_close`] of two dense outputs.
pub fn check_out(what: &str, got: &AttnOutput<f64>, want: &AttnOutput<f64>, tol: f64) -> Result<(), TestCaseError> {
    check_close(what, (got.o.view(), got.lse.view()), (want.o.view(), want.lse.view()), tol)
}

/// K/V with each of the `hk` heads repeated `group` times (MHA layout).
pub fn repeat_heads(x: &Array4<f64>, group: usize) -> Array4<f64> {
    let (b, n, hk, d) = x.dim();
    Array4::from_shape_fn((b, n, hk * group, d), |(bb, i, h, c)| x[[bb, i, h / group, c]])
}

/// Asserts `r` is `InvalidArgument` naming `argument`, and that the message
/// contains each of `needles`.
pub fn assert_invalid<T: std::fmt::Debug>(r: flash_attn::Result<T>, argument: &str, needles: &[&str]) {
    let e = r.expect_err("expected an error");
    let msg = e.to_string();
    match &e {
        flash_attn::FlashAttnError::InvalidArgument { argument: a, .. } => {
            assert_eq!(*a, argument, "wrong argument in: {msg}")
        }
        _ => panic!("expected InvalidArgument {{ argument: {argument} }}, got: {msg}"),
    }
    for n in needles {
        assert!(msg.contains(n), "`{n}` missing in: {msg}");
    }
}
