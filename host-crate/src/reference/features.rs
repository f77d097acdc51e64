//! The inference features of `../shared/INFERENCE.md` in the CPU reference:
//! GQA/MQA, sliding window (bottom-right, composing with causal), softcap and
//! ALiBi, through two independent formulations:
//!
//! * [`attention`]: the standard definition, `S` materialized per head in the
//!   natural domain: `s_ij = softcap(scale · q_i·k_j) − slope·|i + sk − sq − j|`
//!   for visible keys, `-inf` otherwise; `P = softmax(S)` (natural `exp`),
//!   `O = P V`, `lse_i = ln Σ_j exp(s_ij)`.
//! * [`fa2_forward_ext`]: FlashAttention-2's blocked online loop (Q blocks
//!   outer, K/V blocks inner, base-2 [`RowState`]), visiting per Q block only
//!   the key blocks that intersect its window ([`KeyWindow::block_range`]):
//!   blocks fully outside are skipped, not masked. Scores are formed in the
//!   base-2 domain as the kernels do (`scale·log2e` folded in; softcap and
//!   ALiBi scaled by `log2e`, which [`ScoreMod`] commutes with).
//!
//! Both compute with the options of [`ForwardParams::resolve`] (one definition
//! of the window normalization and of the softcap/scale checks for every
//! path). The per-(sequence, head) kernels here (`run_seq`) are also what
//! the varlen, KV-cache, paged and split-KV references run.
//!
//! Rows that see no key: `O = 0`, `LSE = -inf` (FlashAttention-2 returns
//! `+inf` there; we keep `-inf`, as the rest of the library).

use flash_attn_common::mask::{KeyWindow, ScoreMod};
use flash_attn_common::{Real, RowState};
use ndarray::{Array3, Array4, ArrayView2, ArrayView3, ArrayView4, ArrayViewMut2, ArrayViewMut3, s};

use super::{AttnOutput, axpy, block_pv, dot, softmax_safe};
use crate::error::{FlashAttnError, Result};
use crate::params::{AlibiShape, ForwardParams, LoopOrder};
use crate::varlen::{check_alibi, check_gqa};

/// ALiBi slopes on the host: f32 of shape `(nheads)` or `(batch, nheads)`
/// (row-major), the bias of query head `h` of sequence `b` being
/// `−slopes[b·stride + h] · |i + sk − sq − j|`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct HostAlibi<'a> {
    /// f32 slopes, `(nheads)` or `(batch, nheads)` row-major.
    pub slopes: &'a [f32],
    /// Which of the two shapes `slopes` has.
    pub shape: AlibiShape,
}

impl<'a> HostAlibi<'a> {
    /// The `nheads` slopes of sequence `b` (shape checked by [`check_alibi`]).
    pub fn of_seq(&self, b: usize, nheads: usize) -> &'a [f32] {
        &self.slopes[b * self.shape.batch_stride(nheads)..][..nheads]
    }

    /// [`check_alibi`] of these slopes.
    pub fn check(&self, batch: usize, nheads: usize) -> Result<()> {
        check_alibi(self.shape, self.slopes.len(), batch, nheads)
    }
}

/// The resolved options in the element type: what every (sequence, head)
/// computes with.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Opts<F> {
    /// Natural-domain softmax scale.
    pub scale: F,
    /// Normalized window sides (negative = unbounded).
    pub left: i32,
    pub right: i32,
    /// 0 = off.
    pub softcap: F,
}

impl<F: Real> Opts<F> {
    /// [`ForwardParams::resolve`] for a call whose sequences have at most
    /// `max_seqlen_k` keys, converted to `F`.
    pub fn resolve(params: &ForwardParams, headdim: usize, max_seqlen_k: usize) -> Result<Self> {
        let r = params.resolve(headdim, max_seqlen_k)?;
        Ok(Self {
            scale: F::from_f32(r.softmax_scale),
            left: r.window_left,
            right: r.window_right,
            softcap: F::from_f32(r.softcap),
        })
    }

    /// Plain (optionally causal) attention with an explicit scale.
    pub fn plain(scale: F, causal: bool) -> Self {
        Self { scale, left: -1, right: if causal { 0 } else { -1 }, softcap: F::ZERO }
    }
}

/// `(Br, Bc)` of the blocked paths when `params.block` is `None`.
pub const DEFAULT_BLOCK: (usize, usize) = (64, 64);

/// Which formulation computes a sequence.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Path {
    /// `S` materialized, natural `exp` ([`attention`]).
    Standard,
    /// FA2's blocked online loop over the keys `keys.0..keys.1` only (all of
    /// them, or one split of split-KV): `O` normalized over those keys, `LSE`
    /// theirs.
    Online { br: usize, bc: usize, keys: (usize, usize) },
}

impl Path {
    /// The path `params.loop_order` asks for, over all keys: `Standard`
    /// materializes `S`; `Fa2` and `Fa1` run FA2's blocked loop with
    /// `params.block` (default [`DEFAULT_BLOCK`]), whose memory does not grow
    /// with `seqlen_q · seqlen_k` (the same numbers up to rounding).
    pub fn of(params: &ForwardParams) -> Result<Self> {
        if params.loop_order == LoopOrder::Standard {
            return Ok(Path::Standard);
        }
        let (br, bc) = params.block.unwrap_or(DEFAULT_BLOCK);
        check_block(br, bc)?;
        Ok(Path::Online { br, bc, keys: (0, usize::MAX) })
    }
}

/// Everything one (sequence, query head) needs besides the data: its visible
/// keys, its score modifiers, its scale.
#[derive(Clone, Copy, Debug)]
struct HeadRule<F> {
    window: KeyWindow,
    smod: ScoreMod<F>,
    scale: F,
}

/// One head of one sequence: contiguous row-major `rows × d` copies.
struct HeadData<'a, F> {
    q: &'a [F],
    k: &'a [F],
    v: &'a [F],
    d: usize,
}

impl<F> HeadData<'_, F> {
    fn sq(&self) -> usize {
        self.q.len() / self.d
    }
    fn sk(&self) -> usize {
        self.k.len() / self.d
    }
}

/// A `rows × d` view copied to a contiguous row-major vector.
fn gather<F: Real>(x: ArrayView2<F>) -> Vec<F> {
    x.iter().copied().collect()
}

/// Standard attention of one head: `S` (`sq × sk`, natural domain, masked
/// entries `-inf`), `P = softmax(S)` row by row, `O = P V`. Writes `o`
/// (`sq × d`) and `lse` (`sq`).
fn standard_head<F: Real>(x: &HeadData<F>, rule: &HeadRule<F>, o: &mut [F], lse: &mut [F]) {
    let (sq, sk, d) = (x.sq(), x.sk(), x.d);
    let mut s_mat = vec![F::ZERO; sq * sk];
    for i in 0..sq {
        let q_i = &x.q[i * d..][..d];
        let pos = i as i64 + rule.window.shift;
        for j in 0..sk {
            s_mat[i * sk + j] = if rule.window.visible(i as i64, j as i64) {
                rule.smod.apply(dot(q_i, &x.k[j * d..][..d]) * rule.scale, pos, j as i64)
            } else {
                F::NEG_INFINITY
            };
        }
    }
    for i in 0..sq {
        let row = &s_mat[i * sk..][..sk];
        let p = softmax_safe(row);
        let mut m = F::NEG_INFINITY;
        for &x in row {
            m = m.max_nan(x);
        }
        lse[i] = F::NEG_INFINITY;
        if m != F::NEG_INFINITY {
            let mut sum = F::ZERO;
            for &x in row {
                sum = sum + (x - m).exp();
            }
            lse[i] = m + sum.ln();
        }
        let acc = &mut o[i * d..][..d];
        acc.fill(F::ZERO);
        for (j, &p) in p.iter().enumerate() {
            axpy(acc, p, &x.v[j * d..][..d]);
        }
    }
}

/// FA2's loop for one head over the keys `keys.0..keys.1`: per Q block of
/// `br` rows, the key blocks (multiples of `bc`, as the kernels tile) that
/// intersect the block's window and `keys`, each element masked by the
/// window and `keys`; output accumulated unnormalized, one `1/l` at the end.
fn online_head<F: Real>(
    x: &HeadData<F>,
    rule: &HeadRule<F>,
    (br, bc): (usize, usize),
    keys: (usize, usize),
    o: &mut [F],
    lse: &mut [F],
) {
    let (sq, sk, d) = (x.sq(), x.sk(), x.d);
    let scale_log2 = rule.scale * F::LOG2_E;
    // cap·tanh(s/cap) − slope·dist is homogeneous in (s, cap, slope): the
    // base-2 score is the natural one with all three times log2(e).
    let smod2 = ScoreMod { softcap: rule.smod.softcap * F::LOG2_E, alibi_slope: rule.smod.alibi_slope * F::LOG2_E };
    let w = rule.window;
    let mut s2 = vec![F::ZERO; bc];
    let mut acc = vec![F::ZERO; br * d];
    let mut rows = vec![RowState::<F>::new(); br];
    for r0 in (0..sq).step_by(br) {
        let r1 = (r0 + br).min(sq);
        let nr = r1 - r0;
        acc[..nr * d].fill(F::ZERO);
        rows[..nr].fill(RowState::new());
        let (start, end) = w.block_range(r0 as i64, r1 as i64);
        let (start, end) = ((start as usize).max(keys.0), (end as usize).min(keys.1));
        // Key blocks fully outside [start, end) are never visited.
        let mut c0 = start / bc * bc;
        while c0 < end {
            let c1 = (c0 + bc).min(sk);
            let s2 = &mut s2[..c1 - c0];
            for r in r0..r1 {
                let t = r - r0;
                let q_r = &x.q[r * d..][..d];
                let pos = r as i64 + w.shift;
                let mut block_max = F::NEG_INFINITY;
                for (u, s) in s2.iter_mut().enumerate() {
                    let c = c0 + u;
                    *s = if c >= keys.0 && c < keys.1 && w.visible(r as i64, c as i64) {
                        smod2.apply(dot(q_r, &x.k[c * d..][..d]) * scale_log2, pos, c as i64)
                    } else {
                        F::NEG_INFINITY
                    };
                    block_max = block_max.max_nan(*s);
                }
                let (alpha, m_safe) = rows[t].rescale(block_max);
                let acc_r = &mut acc[t * d..][..d];
                for a in acc_r.iter_mut() {
                    *a = *a * alpha;
                }
                let sum = block_pv(s2, m_safe, x.v, d, c0, acc_r);
                rows[t].accumulate(sum);
            }
            c0 += bc;
        }
        // Epilogue: one 1/l per row, lse written once.
        for r in r0..r1 {
            let t = r - r0;
            let inv_l = rows[t].inv_l();
            for (o, &a) in o[r * d..][..d].iter_mut().zip(&acc[t * d..][..d]) {
                *o = a * inv_l;
            }
            lse[r] = rows[t].lse();
        }
    }
}

/// One sequence, every query head: q `(sq, nheads, d)`, k/v `(sk, nheads_k,
/// d)` (query head `h` reads KV head `h / (nheads / nheads_k)`), `slopes`
/// the sequence's `nheads` ALiBi slopes. Writes o `(sq, nheads, d)` and lse
/// `(nheads, sq)`. Shapes are the caller's to check (lengths fit `u32`).
pub(crate) fn run_seq<F: Real>(
    (q, k, v): (ArrayView3<F>, ArrayView3<F>, ArrayView3<F>),
    slopes: Option<&[f32]>,
    opts: &Opts<F>,
    path: Path,
    (mut o, mut lse): (ArrayViewMut3<F>, ArrayViewMut2<F>),
) {
    let (sq, nheads, d) = q.dim();
    let (sk, nheads_k, _) = k.dim();
    let group = nheads / nheads_k;
    let window = KeyWindow::new(sq as u32, sk as u32, opts.left, opts.right);
    let ks: Vec<Vec<F>> = (0..nheads_k).map(|g| gather(k.slice(s![.., g, ..]))).collect();
    let vs: Vec<Vec<F>> = (0..nheads_k).map(|g| gather(v.slice(s![.., g, ..]))).collect();
    let mut oh = vec![F::ZERO; sq * d];
    let mut lh = vec![F::NEG_INFINITY; sq];
    for h in 0..nheads {
        let slope = slopes.map_or(F::ZERO, |s| F::from_f32(s[h]));
        let rule = HeadRule { window, smod: ScoreMod { softcap: opts.softcap, alibi_slope: slope }, scale: opts.scale };
        let qh = gather(q.slice(s![.., h, ..]));
        let x = HeadData { q: &qh, k: &ks[h / group], v: &vs[h / group], d };
        match path {
            Path::Standard => standard_head(&x, &rule, &mut oh, &mut lh),
            Path::Online { br, bc, keys } => online_head(&x, &rule, (br, bc), keys, &mut oh, &mut lh),
        }
        for (dst, &src) in o.slice_mut(s![.., h, ..]).iter_mut().zip(&oh) {
            *dst = src;
        }
        for (dst, &src) in lse.slice_mut(s![h, ..]).iter_mut().zip(&lh) {
            *dst = src;
        }
    }
}

/// A dense batch through [`run_seq`]: q `(batch, sq, h, d)`, k/v `(batch,
/// sk, hk, d)`; returns o `(batch, sq, h, d)`, lse `(batch, h, sq)`.
pub(crate) fn run_dense<F: Real>(
    q: ArrayView4<F>,
    k: ArrayView4<F>,
    v: ArrayView4<F>,
    alibi: Option<HostAlibi<'_>>,
    opts: &Opts<F>,
    path: Path,
) -> AttnOutput<F> {
    let (batch, sq, nheads, d) = q.dim();
    let mut o = Array4::from_elem((batch, sq, nheads, d), F::ZERO);
    let mut lse = Array3::from_elem((batch, nheads, sq), F::NEG_INFINITY);
    for b in 0..batch {
        run_seq(
            (q.slice(s![b, .., .., ..]), k.slice(s![b, .., .., ..]), v.slice(s![b, .., .., ..])),
            alibi.map(|a| a.of_seq(b, nheads)),
            opts,
            path,
            (o.slice_mut(s![b, .., .., ..]), lse.slice_mut(s![b, .., ..])),
        );
    }
    AttnOutput { o, lse }
}

// ---------------------------------------------------------------------------
// Validation shared by the dense entry points.
// ---------------------------------------------------------------------------

pub(crate) const AXES: [&str; 4] = ["batch", "seqlen", "nheads", "headdim"];

/// `Err(ShapeMismatch)` unless `actual == expected`.
pub(crate) fn same(argument: &'static str, axis: &'static str, actual: usize, expected: usize, rule: &'static str) -> Result<()> {
    if actual == expected {
        Ok(())
    } else {
        Err(FlashAttnError::ShapeMismatch { argument, axis, actual, expected, rule })
    }
}

/// `Err(ZeroSizedDim)` if one of the `axes` (indices into `AXES`) of a
/// `(batch, seqlen, nheads, headdim)` shape is 0 (sequence lengths may be 0:
/// a query row with no key has O = 0, LSE = -inf), `Err(DimTooLarge)` if the
/// seqlen exceeds `u32` (the kernels' and [`KeyWindow`]'s index type).
pub(crate) fn check_dims(argument: &'static str, shape: [usize; 4], nonzero: &[usize]) -> Result<()> {
    if let Some(&a) = nonzero.iter().find(|&&a| shape[a] == 0) {
        return Err(FlashAttnError::ZeroSizedDim { argument, axis: AXES[a], shape });
    }
    if u32::try_from(shape[1]).is_err() {
        return Err(FlashAttnError::DimTooLarge { argument, axis: "seqlen", value: shape[1], max: u32::MAX as usize });
    }
    Ok(())
}

pub(crate) fn dim4<F>(x: &ArrayView4<F>) -> [usize; 4] {
    let (a, b, c, d) = x.dim();
    [a, b, c, d]
}

/// q `(batch, sq, h, d)`, k and v `(batch, sk, hk, d)` with `h % hk == 0`,
/// ALiBi slopes of `(h)` or `(batch, h)`; returns the resolved options (window
/// normalized with `sk`, as `flash_attn_func`).
pub(crate) fn check_dense<F: Real>(
    q: &ArrayView4<F>,
    k: &ArrayView4<F>,
    v: &ArrayView4<F>,
    params: &ForwardParams,
    alibi: Option<&HostAlibi<'_>>,
) -> Result<Opts<F>> {
    let (qs, ks, vs) = (dim4(q), dim4(k), dim4(v));
    check_dims("q", qs, &[0, 2, 3])?;
    check_dims("k", ks, &[2])?;
    let rule = "q is (batch, seqlen_q, nheads, headdim), k and v (batch, seqlen_k, nheads_k, headdim)";
    same("k", "batch", ks[0], qs[0], rule)?;
    same("k", "headdim", ks[3], qs[3], rule)?;
    for (a, axis) in AXES.iter().enumerate() {
        same("v", axis, vs[a], ks[a], "v must have the shape of k")?;
    }
    check_gqa(qs[2], ks[2])?;
    if let Some(a) = alibi {
        a.check(qs[0], qs[2])?;
    }
    Opts::resolve(params, qs[3], ks[1])
}

/// Checks FA2 block sizes.
pub(crate) fn check_block(br: usize, bc: usize) -> Result<()> {
    if br == 0 || bc == 0 {
        return Err(FlashAttnError::InvalidBlock { br, bc, reason: "block sizes must be positive" });
    }
    Ok(())
}

/// Attention with every inference feature, by the standard definition (`S`
/// materialized per head, natural `exp`; see the module docs).
///
/// q `(batch, seqlen_q, nheads, d)`, k/v `(batch, seqlen_k, nheads_k, d)`,
/// `nheads % nheads_k == 0` (query head `h` reads KV head
/// `h / (nheads / nheads_k)`). Options from `params` (`loop_order` and
/// `block` are ignored): causal / window aligned bottom-right, normalized
/// with `seqlen_k`; softcap `cap·tanh(scale·q·k/cap)` before masks and bias;
/// ALiBi `−slope·|i + sk − sq − j|` after the softcap. Sequence lengths may be
/// 0 (a query with no visible key: O = 0, LSE = -inf); batch, heads and
/// headdim may not.
pub fn attention<F: Real>(
    q: ArrayView4<F>,
    k: ArrayView4<F>,
    v: ArrayView4<F>,
    params: &ForwardParams,
    alibi: Option<HostAlibi<'_>>,
) -> Result<AttnOutput<F>> {
    let opts = check_dense(&q, &k, &v, params, alibi.as_ref())?;
    Ok(run_dense(q, k, v, alibi, &opts, Path::Standard))
}

/// [`attention`] through FlashAttention-2's blocked online loop with `br`
/// query rows and `bc` keys per block (any positive sizes), skipping every
/// key block that lies fully outside a Q block's window.
pub fn fa2_forward_ext<F: Real>(
    q: ArrayView4<F>,
    k: ArrayView4<F>,
    v: ArrayView4<F>,
    params: &ForwardParams,
    alibi: Option<HostAlibi<'_>>,
    br: usize,
    bc: usize,
) -> Result<AttnOutput<F>> {
    let opts = check_dense(&q, &k, &v, params, alibi.as_ref())?;
    check_block(br, bc)?;
    let sk = k.dim().1;
    Ok(run_dense(q, k, v, alibi, &opts, Path::Online { br, bc, keys: (0, sk) }))
}
