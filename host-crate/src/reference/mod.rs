//! CPU reference: standard attention, the three softmaxes of seed 004, and
//! the FA1 and FA2 loop orders, generic over `f32` and `f64`.
//!
//! Layout of `q`, `k`, `v` and `o`: `(batch, seqlen, nheads, headdim)` (the
//! layout of `flash_attn_func`); `lse`, `l` and `m`: `(batch, nheads, seqlen_q)`.
//!
//! Conventions shared by every function here and by the GPU kernels:
//!
//! * scores are `softmax_scale * q·k`, `softmax_scale` defaulting to `1/√d`
//!   ([`default_softmax_scale`]);
//! * `causal` masks key `j` for query row `i` unless `j <= i + N_k - N_q`:
//!   bottom-right aligned when `N_q != N_k`, as FlashAttention ≥ 2.1 does
//!   ([`AttnParams::causal_key_limit`] is the one definition);
//! * a row whose every key is masked has output 0 and logsumexp `-inf`, never
//!   NaN (the guards of seed 003, [`RowState::safe_max`], [`RowState::inv_l`]);
//! * the online paths (FA1, FA2, [`softmax_online`]) work in base 2 as the
//!   kernels do: scores are multiplied by `softmax_scale * LOG2_E` and the row
//!   state is a [`RowState`] (its `m` in that base-2 domain). Standard
//!   attention and [`softmax_safe`] use the natural `exp` directly, so the
//!   tests compare two independent formulations.
//!
//! The inference features of `../shared/INFERENCE.md` (FlashAttention-2's
//! semantics) live in submodules, all re-exported here:
//!
//! * [`features`]: GQA/MQA, sliding window, softcap, ALiBi — [`attention`]
//!   (standard definition) and [`fa2_forward_ext`] (FA2's blocked loop with
//!   window block skipping). [`standard_attention`] and [`fa2_forward`] are
//!   their feature-free special cases and run the same per-head code.
//! * [`varlen`]: packed batches with `cu_seqlens` ([`attention_varlen`]).
//! * [`backward`]: gradients (the definition, FA2's Algorithm 2, FA1's
//!   Algorithm 4, varlen, and the definition with PyTorch's 16-bit
//!   roundings) — [`attention_backward`], [`fa2_backward`], [`fa1_backward`],
//!   [`varlen_attention_backward`], [`attention_backward_lowp`].
//! * [`decode`]: split-KV partials and their combine ([`combine_partials`],
//!   [`split_kv_forward`]), KV cache with in-place append and
//!   `cache_batch_idx` ([`kvcache_attention`]), paged KV ([`PagedKv`],
//!   [`paged_kvcache_attention`], [`attention_varlen_paged`]).
//! * [`fp8`]: e4m3 rounding as the GPU does it (round to nearest even,
//!   saturating) and the scale conventions of FP8 attention: FP8 results
//!   are checked against f64 attention over the dequantized inputs.

pub mod backward;
pub mod decode;
pub mod features;
pub mod fp8;
pub mod varlen;

pub use decode::{
    PagedKv, PagedKvMut, SplitPartials, attention_varlen_paged, combine_partials, kvcache_attention,
    paged_kvcache_attention, paged_to_contiguous, split_kv_forward, split_kv_partials,
};
pub use backward::{
    Grads, LowpElem, VarlenGrads, attention_backward, attention_backward_lowp, fa1_backward, fa2_backward, varlen_attention_backward,
};
pub use features::{DEFAULT_BLOCK, HostAlibi, attention, fa2_forward_ext};
pub use varlen::{VarlenOutput, attention_varlen};
pub use crate::error::RefError;

use flash_attn_common::{AttnParams, Real, RowState};
use ndarray::{Array3, Array4, ArrayView4, s};

/// Output of [`standard_attention`] and [`fa2_forward`].
#[derive(Clone, Debug, PartialEq)]
pub struct AttnOutput<F> {
    /// `(batch, seqlen_q, nheads, headdim)`.
    pub o: Array4<F>,
    /// `(batch, nheads, seqlen_q)`: natural-log logsumexp of the row's scaled
    /// scores, `ln Σ_j exp(softmax_scale · q_i·k_j)`; `-inf` for a row whose
    /// every key is masked.
    pub lse: Array3<F>,
}

/// Output of [`fa1_forward`]: `O`, `l`, `m` as Algorithm 1 leaves them in HBM.
///
/// `l` and `m` are in the natural-exp domain of the FA1 paper: `m_i` is the
/// row maximum of the scaled scores `softmax_scale · q_i·k_j` and
/// `l_i = Σ_j exp(score_ij − m_i)`. (Internally the row state is the base-2
/// [`RowState`]: its `l` is the same number, its `m` is `m_i · log2 e`, and is
/// converted back with `· ln 2`.) For a fully masked row `m = -inf`, `l = 0`,
/// `O = 0`. `lse = m + ln l`.
#[derive(Clone, Debug, PartialEq)]
pub struct Fa1Output<F> {
    /// `(batch, seqlen_q, nheads, headdim)`.
    pub o: Array4<F>,
    /// `(batch, nheads, seqlen_q)`.
    pub l: Array3<F>,
    /// `(batch, nheads, seqlen_q)`.
    pub m: Array3<F>,
}

/// The default `softmax_scale`, `1/√headdim`.
pub fn default_softmax_scale(headdim: usize) -> f64 {
    1.0 / (headdim as f64).sqrt()
}

// ---------------------------------------------------------------------------
// Softmax of one vector (seed 004).
// ---------------------------------------------------------------------------

/// Standard softmax, `exp(x_i) / Σ_j exp(x_j)`: one pass for the sum, one for
/// the output. Not safe: `exp` overflows for large inputs (`x > 709` in f64,
/// `> 88` in f32) and the result is NaN — which is why safe softmax exists.
/// A vector with no mass at all (`Σ exp = 0`: every entry `-inf`, or every
/// entry underflowing) gives all zeros, the convention for masked rows.
pub fn softmax_standard<F: Real>(x: &[F]) -> Vec<F> {
    let mut sum = F::ZERO;
    for &v in x {
        sum = sum + v.exp();
    }
    if sum == F::ZERO {
        return vec![F::ZERO; x.len()];
    }
    x.iter().map(|&v| v.exp() / sum).collect()
}

/// Safe softmax, `exp(x_i − max x) / Σ_j exp(x_j − max x)`: one pass for the
/// maximum, one for the sum, one for the output. All `-inf` gives all zeros
/// (never `-inf − -inf`).
pub fn softmax_safe<F: Real>(x: &[F]) -> Vec<F> {
    let mut m = F::NEG_INFINITY;
    for &v in x {
        m = m.max_nan(v);
    }
    if m == F::NEG_INFINITY {
        return vec![F::ZERO; x.len()];
    }
    let mut sum = F::ZERO;
    for &v in x {
        sum = sum + (v - m).exp();
    }
    x.iter().map(|&v| (v - m).exp() / sum).collect()
}

/// Online softmax: one pass over `x` in chunks of `block` elements keeping
/// only the running maximum and sum ([`RowState::update`]: `l ← l·2^(m_old −
/// m_new) + Σ 2^(x − m_new)`), then one pass for the output. `block = 1` is the
/// element-by-element online softmax of seed 004; larger blocks are what a
/// FlashAttention row sees, one K/V block at a time. Works in base 2 like the
/// kernels (`x · log2 e`). All `-inf` gives all zeros.
///
/// # Panics
/// If `block == 0` (as [`slice::chunks`]).
pub fn softmax_online<F: Real>(x: &[F], block: usize) -> Vec<F> {
    assert!(block > 0, "softmax_online: block size must be positive");
    let mut st = RowState::<F>::new();
    let mut buf = Vec::with_capacity(block.min(x.len()));
    for chunk in x.chunks(block) {
        buf.clear();
        buf.extend(chunk.iter().map(|&v| v * F::LOG2_E));
        st.update(&buf);
    }
    let m = RowState::<F>::safe_max(st.m);
    let inv_l = st.inv_l();
    x.iter().map(|&v| (v * F::LOG2_E - m).exp2() * inv_l).collect()
}

// ---------------------------------------------------------------------------
// Attention: shared plumbing.
// ---------------------------------------------------------------------------

#[derive(Clone, Copy, Debug)]
struct Dims {
    batch: usize,
    nheads: usize,
    n_q: usize,
    n_k: usize,
    d: usize,
}

fn shape4<F>(x: &ArrayView4<F>) -> [usize; 4] {
    let s = x.shape();
    [s[0], s[1], s[2], s[3]]
}

fn validate<F: Real>(
    q: &ArrayView4<F>,
    k: &ArrayView4<F>,
    v: &ArrayView4<F>,
    softmax_scale: Option<F>,
) -> Result<(Dims, F), RefError> {
    let (qs, ks, vs) = (shape4(q), shape4(k), shape4(v));
    for (arg, shape) in [("q", qs), ("k", ks), ("v", vs)] {
        if shape.contains(&0) {
            return Err(RefError::ZeroDim { arg, shape });
        }
    }
    if ks[0] != qs[0] || ks[2] != qs[2] || ks[3] != qs[3] {
        return Err(RefError::ShapeMismatch {
            arg: "k",
            shape: ks,
            other: "q",
            other_shape: qs,
            axes: "batch, nheads and headdim",
        });
    }
    if vs != ks {
        return Err(RefError::ShapeMismatch { arg: "v", shape: vs, other: "k", other_shape: ks, axes: "every axis" });
    }
    for (arg, n) in [("q", qs[1]), ("k", ks[1])] {
        if u32::try_from(n).is_err() {
            return Err(RefError::TooLong { arg, value: n });
        }
    }
    let dims = Dims { batch: qs[0], n_q: qs[1], nheads: qs[2], d: qs[3], n_k: ks[1] };
    let scale = softmax_scale.unwrap_or_else(|| F::from_f64(default_softmax_scale(dims.d)));
    if !scale.to_f64().is_finite() {
        return Err(RefError::BadScale { value: scale.to_f64() });
    }
    Ok((dims, scale))
}

fn check_blocks(br: usize, bc: usize) -> Result<(), RefError> {
    if br == 0 {
        return Err(RefError::ZeroBlock { arg: "br", value: br });
    }
    if bc == 0 {
        return Err(RefError::ZeroBlock { arg: "bc", value: bc });
    }
    Ok(())
}

/// Number of keys query row `i` sees (`0..=n_k`), from the shared definition
/// [`AttnParams::causal_key_limit`].
struct KeyLimit(AttnParams);

impl KeyLimit {
    fn new(dims: &Dims, causal: bool) -> Self {
        // Lengths were checked to fit u32 in `validate`.
        Self(AttnParams {
            seqlen_q: dims.n_q as u32,
            seqlen_k: dims.n_k as u32,
            causal: causal as u32,
            ..Default::default()
        })
    }
    fn of(&self, i: usize) -> usize {
        self.0.causal_key_limit(i as u32).clamp(0, self.0.seqlen_k as i64) as usize
    }
}

/// One head of `x` as a contiguous row-major `seqlen × d` matrix.
fn head<F: Real>(x: &ArrayView4<F>, b: usize, h: usize) -> Vec<F> {
    x.slice(s![b, .., h, ..]).iter().copied().collect()
}

/// Dot product with eight partial sums (vectorizes; also more accurate than
/// one running sum).
#[inline]
fn dot<F: Real>(a: &[F], b: &[F]) -> F {
    let mut acc = [F::ZERO; 8];
    let (ac, bc) = (a.chunks_exact(8), b.chunks_exact(8));
    let (ar, br) = (ac.remainder(), bc.remainder());
    for (x, y) in ac.zip(bc) {
        for t in 0..8 {
            acc[t] = acc[t] + x[t] * y[t];
        }
    }
    let mut tail = F::ZERO;
    for (&x, &y) in ar.iter().zip(br) {
        tail = tail + x * y;
    }
    ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7])) + tail
}

/// `acc += p · row` over a `d`-vector.
#[inline]
fn axpy<F: Real>(acc: &mut [F], p: F, row: &[F]) {
    for (a, &x) in acc.iter_mut().zip(row) {
        *a = *a + p * x;
    }
}

// ---------------------------------------------------------------------------
// Standard attention (seed 002, Algorithm 0).
// ---------------------------------------------------------------------------

/// Standard attention with `S = scale · Q Kᵀ` and `P = softmax(S)` materialized
/// (`N_q × N_k` each, per head), `O = P V`. `P` is the safe softmax of each row
/// of `S` with the natural `exp(s − rowmax)`; masked scores are `-inf`.
/// (The feature-free case of [`attention`], with an explicit scale.)
pub fn standard_attention<F: Real>(
    q: ArrayView4<F>,
    k: ArrayView4<F>,
    v: ArrayView4<F>,
    causal: bool,
    softmax_scale: Option<F>,
) -> Result<AttnOutput<F>, RefError> {
    let (_, scale) = validate(&q, &k, &v, softmax_scale)?;
    Ok(features::run_dense(q, k, v, None, &features::Opts::plain(scale, causal), features::Path::Standard))
}

// ---------------------------------------------------------------------------
// One block of base-2 scores, shared by FA1 and FA2.
// ---------------------------------------------------------------------------

/// Fills `s2[..]` with `scale_log2 · q_r·k_c` for keys `c0..c0+s2.len()`,
/// `-inf` from key `lim` on; returns the block's row maximum (`-inf` if every
/// key is masked).
#[inline]
fn block_scores<F: Real>(q_r: &[F], kh: &[F], d: usize, c0: usize, lim: usize, scale_log2: F, s2: &mut [F]) -> F {
    let mut mx = F::NEG_INFINITY;
    for (t, s) in s2.iter_mut().enumerate() {
        let c = c0 + t;
        *s = if c < lim { dot(q_r, &kh[c * d..][..d]) * scale_log2 } else { F::NEG_INFINITY };
        mx = mx.max_nan(*s);
    }
    mx
}

/// `p = 2^(s2 − m_safe)` in place (masked scores give exactly 0) and
/// `acc += p V_block`; returns `Σ p`.
#[inline]
fn block_pv<F: Real>(s2: &mut [F], m_safe: F, vh: &[F], d: usize, c0: usize, acc: &mut [F]) -> F {
    let mut sum = F::ZERO;
    for (t, s) in s2.iter_mut().enumerate() {
        let p = (*s - m_safe).exp2();
        *s = p;
        sum = sum + p;
        if p != F::ZERO {
            axpy(acc, p, &vh[(c0 + t) * d..][..d]);
        }
    }
    sum
}

// ---------------------------------------------------------------------------
// FA1 loop order (seed 002, Algorithm 1).
// ---------------------------------------------------------------------------

/// FA1's loop order: K/V blocks outer (`j`), Q blocks inner (`i`), with `O`,
/// `l`, `m` initialized to 0, 0, `-inf` and written back after every inner
/// step with Algorithm 1 lines 10–13:
///
/// ```text
/// m~_ij = rowmax(S_ij),  P~_ij = exp(S_ij − m~_ij),  l~_ij = rowsum(P~_ij)
/// m_new = max(m_i, m~_ij),  l_new = e^(m_i − m_new) l_i + e^(m~_ij − m_new) l~_ij
/// O_i ← diag(l_new)⁻¹ (diag(l_i) e^(m_i − m_new) O_i + e^(m~_ij − m_new) P~_ij V_j)
/// ```
///
/// The `m`/`l` update is [`RowState::merge`] of `(m_i, l_i)` with
/// `(m~_ij, l~_ij)`. `br`, `bc` are arbitrary (need not divide the lengths).
pub fn fa1_forward<F: Real>(
    q: ArrayView4<F>,
    k: ArrayView4<F>,
    v: ArrayView4<F>,
    causal: bool,
    softmax_scale: Option<F>,
    br: usize,
    bc: usize,
) -> Result<Fa1Output<F>, RefError> {
    let mut last = None;
    fa1_run(q, k, v, causal, softmax_scale, br, bc, |_, st| {
        if st.is_last {
            last = Some(st.to_output());
        }
    })?;
    Ok(last.expect("FA1 runs at least one outer step"))
}

/// [`fa1_forward`], returning the state `O`, `l`, `m` as it stands in HBM after
/// each outer step `j = 1..=Tc` (`Tc = ceil(N_k / bc)` entries; the last is
/// [`fa1_forward`]'s result). For following the seed's worked example.
pub fn fa1_forward_steps<F: Real>(
    q: ArrayView4<F>,
    k: ArrayView4<F>,
    v: ArrayView4<F>,
    causal: bool,
    softmax_scale: Option<F>,
    br: usize,
    bc: usize,
) -> Result<Vec<Fa1Output<F>>, RefError> {
    let mut steps = Vec::new();
    fa1_run(q, k, v, causal, softmax_scale, br, bc, |_, st| steps.push(st.to_output()))?;
    Ok(steps)
}

/// FA1's HBM state, one entry per (batch, head): `o` row-major `N_q × d`,
/// `m` (base 2) and `l` per row.
struct Fa1State<F> {
    dims: Dims,
    o: Vec<Vec<F>>,
    l: Vec<Vec<F>>,
    m: Vec<Vec<F>>,
    is_last: bool,
}

impl<F: Real> Fa1State<F> {
    fn to_output(&self) -> Fa1Output<F> {
        let Dims { batch, nheads, n_q, d, .. } = self.dims;
        let mut o = Array4::from_elem((batch, n_q, nheads, d), F::ZERO);
        let mut l = Array3::from_elem((batch, nheads, n_q), F::ZERO);
        let mut m = Array3::from_elem((batch, nheads, n_q), F::NEG_INFINITY);
        for b in 0..batch {
            for h in 0..nheads {
                let bh = b * nheads + h;
                for i in 0..n_q {
                    for x in 0..d {
                        o[[b, i, h, x]] = self.o[bh][i * d + x];
                    }
                    l[[b, h, i]] = self.l[bh][i];
                    // base-2 m · ln 2 = natural m (-inf stays -inf).
                    let m2 = self.m[bh][i];
                    m[[b, h, i]] = if m2 == F::NEG_INFINITY { m2 } else { m2 * F::LN_2 };
                }
            }
        }
        Fa1Output { o, l, m }
    }
}

#[allow(clippy::too_many_arguments)]
fn fa1_run<F: Real>(
    q: ArrayView4<F>,
    k: ArrayView4<F>,
    v: ArrayView4<F>,
    causal: bool,
    softmax_scale: Option<F>,
    br: usize,
    bc: usize,
    mut after_outer_step: impl FnMut(usize, &Fa1State<F>),
) -> Result<(), RefError> {
    let (dims, scale) = validate(&q, &k, &v, softmax_scale)?;
    check_blocks(br, bc)?;
    let Dims { batch, nheads, n_q, n_k, d } = dims;
    let scale_log2 = scale * F::LOG2_E;
    let limit = KeyLimit::new(&dims, causal);
    let bhs: Vec<(usize, usize)> = (0..batch).flat_map(|b| (0..nheads).map(move |h| (b, h))).collect();
    let qs: Vec<Vec<F>> = bhs.iter().map(|&(b, h)| head(&q, b, h)).collect();
    let ks: Vec<Vec<F>> = bhs.iter().map(|&(b, h)| head(&k, b, h)).collect();
    let vs: Vec<Vec<F>> = bhs.iter().map(|&(b, h)| head(&v, b, h)).collect();
    // Algorithm 1 line 2: O = 0, l = 0, m = -inf "in HBM".
    let mut st = Fa1State {
        dims,
        o: vec![vec![F::ZERO; n_q * d]; bhs.len()],
        l: vec![vec![F::ZERO; n_q]; bhs.len()],
        m: vec![vec![F::NEG_INFINITY; n_q]; bhs.len()],
        is_last: false,
    };
    let (tr, tc) = (n_q.div_ceil(br), n_k.div_ceil(bc));
    let mut s2 = vec![F::ZERO; bc];
    let mut pv = vec![F::ZERO; d];
    // Line 5: for 1 <= j <= Tc (K_j, V_j "loaded" once per j).
    for j in 0..tc {
        let c0 = j * bc;
        let c1 = (c0 + bc).min(n_k);
        let s2 = &mut s2[..c1 - c0];
        for bh in 0..bhs.len() {
            let (qh, kh, vh) = (&qs[bh], &ks[bh], &vs[bh]);
            // Line 7: for 1 <= i <= Tr.
            for i in 0..tr {
                let r0 = i * br;
                let r1 = (r0 + br).min(n_q);
                for r in r0..r1 {
                    // Line 8: load Q_i, O_i, l_i, m_i (row r of them).
                    let old = RowState { m: st.m[bh][r], l: st.l[bh][r] };
                    // Lines 9-10: S_ij, m~_ij, P~_ij = exp(S_ij - m~_ij), l~_ij.
                    let m_tilde = block_scores(&qh[r * d..][..d], kh, d, c0, limit.of(r), scale_log2, s2);
                    pv.fill(F::ZERO);
                    let l_tilde = block_pv(s2, RowState::<F>::safe_max(m_tilde), vh, d, c0, &mut pv);
                    // Line 11: m_new, l_new; a = e^(m_i - m_new), b = e^(m~_ij - m_new).
                    let (new, a, b) = old.merge(RowState { m: m_tilde, l: l_tilde });
                    // Line 12: O_i <- diag(l_new)^-1 (diag(l_i) a O_i + b P~_ij V_j);
                    // inv_l is 0 for a row that has seen only masked keys (O stays 0).
                    let inv_l_new = new.inv_l();
                    let o_r = &mut st.o[bh][r * d..][..d];
                    for (o, &p) in o_r.iter_mut().zip(pv.iter()) {
                        *o = (old.l * a * *o + b * p) * inv_l_new;
                    }
                    // Line 13: l_i <- l_new, m_i <- m_new.
                    st.l[bh][r] = new.l;
                    st.m[bh][r] = new.m;
                }
            }
        }
        st.is_last = j + 1 == tc;
        after_outer_step(j, &st);
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// FA2 loop order (seed 001).
// ---------------------------------------------------------------------------

/// FA2's loop order: Q blocks outer, K/V blocks inner. Per Q block the row
/// states and the output block stay "on chip": the output is accumulated
/// unnormalized (`acc ← 2^(m_old − m_new) acc + P V_j`, [`RowState::rescale`])
/// and divided by `l` once at the end ([`RowState::inv_l`]); the logsumexp
/// ([`RowState::lse`]) is the only statistic written. With `causal`, K/V blocks
/// that every row of the Q block must mask are skipped (they and all later
/// blocks lie past the diagonal). (The feature-free case of
/// [`fa2_forward_ext`], with an explicit scale.)
pub fn fa2_forward<F: Real>(
    q: ArrayView4<F>,
    k: ArrayView4<F>,
    v: ArrayView4<F>,
    causal: bool,
    softmax_scale: Option<F>,
    br: usize,
    bc: usize,
) -> Result<AttnOutput<F>, RefError> {
    let (dims, scale) = validate(&q, &k, &v, softmax_scale)?;
    check_blocks(br, bc)?;
    let path = features::Path::Online { br, bc, keys: (0, dims.n_k) };
    Ok(features::run_dense(q, k, v, None, &features::Opts::plain(scale, causal), path))
}
