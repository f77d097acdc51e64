//! The backward pass in the CPU reference (`../shared/BACKWARD.md`):
//! gradients `dQ`, `dK`, `dV` of attention with every forward feature
//! (causal, window, softcap, ALiBi, GQA/MQA, scale, `seqlen_q ≠ seqlen_k`,
//! zero-length sequences, varlen), through three formulations:
//!
//! * [`attention_backward`]: the definition. Per head `S` and `P = softmax(S)`
//!   are materialized (natural `exp`), then
//!   `dV = Pᵀ dO`, `dP = dO Vᵀ`, `D_i = rowsum(P_i ∘ dP_i)`,
//!   `dS = P ∘ (dP − D)`, softcap's chain rule `dS ← dS ∘ (1 − (t/cap)²)`
//!   with `t = cap·tanh(scale·q·k/cap)` the softcapped score before mask and
//!   bias, `dQ = scale · dS K`, `dK = scale · dSᵀ Q`. It needs neither `O`
//!   nor the LSE (`D` is taken from `P ∘ dP`, which equals `rowsum(dO ∘ O)`).
//! * [`fa2_backward`]: FlashAttention-2's Algorithm 2 as the paper writes
//!   it: `D_i = rowsum(dO_i ∘ O_i)` once, then K/V blocks outer (`j`, `Tc`),
//!   Q blocks inner (`i`, `Tr`), `P_ij = exp(S_ij − L_i)` recomputed from the
//!   forward's logsumexp, `dV_j`, `dK_j` kept "on chip" for the whole inner
//!   loop, `dQ_i` accumulated in "HBM" (the kernels' f32 atomics). Q blocks
//!   whose window misses key block `j` are skipped, not masked (the blocks
//!   [`KeyWindow::block_range`] excludes, as `fa2_forward_ext` skips).
//! * [`fa1_backward`]: FlashAttention's Algorithm 4: the same loop order,
//!   `P_ij = diag(l_i)⁻¹ exp(S_ij − m_i)` recomputed from the forward's `l`,
//!   `m`, and `D_i = rowsum(dO_i ∘ O_i)` recomputed at each inner step, `dQ_i`
//!   read-modify-written in "HBM". `l`, `m` are in the base-2 units of
//!   [`flash_attn_common::RowState`], as the FA1 kernels store them
//!   ([`crate::RowStats::Fa1`]): `m` is the row maximum of
//!   `log2(e) · s_ij`, `l = Σ_j 2^(log2(e)·s_ij − m)`. (The CPU
//!   [`super::fa1_forward`] returns `m` in natural units: multiply it by
//!   `log2 e`.) The recomputation rule holds for any score function, so every
//!   feature is supported here, even those the FA1 forward kernels refuse.
//!
//! * [`attention_backward_lowp`]: the definition as PyTorch computes it on
//!   16-bit tensors (`pt` of FlashAttention-2's tests, whose error bounds the
//!   16-bit kernels' by FA2's rule): the same products, each result rounded
//!   to the element type where PyTorch's fp16/bf16 autograd rounds it (the
//!   list is on the function).
//!
//! GQA/MQA: query head `h` reads KV head `h / (nheads / nheads_k)`; the
//! gradients of a KV head are the sums over its group of query heads.
//! Masked entries have `P = 0`, `dS = 0`; a row that sees no key gets
//! `dQ = 0` (never NaN) and gives its keys nothing.
//!
//! Options, shape rules and the window normalization are the forward's
//! ([`super::features`]'s `check_dense`, [`ForwardParams::resolve`]); the
//! visibility and score rules are [`KeyWindow`] and [`ScoreMod`].

use flash_attn_common::mask::{KeyWindow, ScoreMod};
use flash_attn_common::{Real, RowState};
use ndarray::{Array3, Array4, ArrayView2, ArrayView3, ArrayView4, ArrayViewMut3, s};

use super::features::{HostAlibi, Opts, check_block, check_dense, dim4, same};
use super::varlen::{check_kv3, check_query_side};
use super::{axpy, dot, softmax_safe};
use crate::error::Result;
use crate::params::ForwardParams;
use crate::varlen::check_varlen;

/// Gradients of a dense call.
#[derive(Clone, Debug, PartialEq)]
pub struct Grads<F> {
    /// `(batch, seqlen_q, nheads, headdim)`, like `q`.
    pub dq: Array4<F>,
    /// `(batch, seqlen_k, nheads_k, headdim)`, like `k`.
    pub dk: Array4<F>,
    /// `(batch, seqlen_k, nheads_k, headdim)`, like `v`.
    pub dv: Array4<F>,
}

/// Gradients of a varlen call ([`varlen_attention_backward`]).
#[derive(Clone, Debug, PartialEq)]
pub struct VarlenGrads<F> {
    /// `(total_q, nheads, headdim)`, like `q`.
    pub dq: Array3<F>,
    /// `(total_k, nheads_k, headdim)`, like `k`.
    pub dk: Array3<F>,
    /// `(total_k, nheads_k, headdim)`, like `v`.
    pub dv: Array3<F>,
}

// ---------------------------------------------------------------------------
// The score of one (row, key) and its derivative.
// ---------------------------------------------------------------------------

/// The score rule of one (sequence, query head), split where the backward
/// needs it: `t = softcap(scale · q·k)` (the softcapped score, whose
/// derivative is `1 − (t/cap)²`), then `s = t − slope·|pos − j|`.
#[derive(Clone, Copy, Debug)]
struct Scorer<F> {
    window: KeyWindow,
    /// Softcap only.
    cap: ScoreMod<F>,
    /// ALiBi only.
    bias: ScoreMod<F>,
    scale: F,
}

impl<F: Real> Scorer<F> {
    fn new(window: KeyWindow, opts: &Opts<F>, slope: F) -> Self {
        Self {
            window,
            cap: ScoreMod { softcap: opts.softcap, alibi_slope: F::ZERO },
            bias: ScoreMod { softcap: F::ZERO, alibi_slope: slope },
            scale: opts.scale,
        }
    }

    /// `(s_ij, ∂s_ij/∂(scale·q·k))` for row `i`, key `j`, or `None` if the
    /// key is masked.
    #[inline]
    fn score(&self, q_i: &[F], k_j: &[F], i: usize, j: usize) -> Option<(F, F)> {
        let (i, j) = (i as i64, j as i64);
        if !self.window.visible(i, j) {
            return None;
        }
        let pos = i + self.window.shift;
        let t = self.cap.apply(dot(q_i, k_j) * self.scale, pos, j);
        let dcap = if self.cap.softcap > F::ZERO {
            let u = t / self.cap.softcap;
            F::ONE - u * u
        } else {
            F::ONE
        };
        Some((self.bias.apply(t, pos, j), dcap))
    }

    /// `t − slope·|pos − j|`: ALiBi's bias added to the softcapped score `t`
    /// of a visible (row `i`, key `j`).
    #[inline]
    fn biased(&self, t: F, i: usize, j: usize) -> F {
        self.bias.apply(t, i as i64 + self.window.shift, j as i64)
    }
}

// ---------------------------------------------------------------------------
// One head.
// ---------------------------------------------------------------------------

/// One (sequence, query head): contiguous row-major copies, `sq × d` for
/// `q`, `dout` (and `out`), `sk × d` for `k`, `v`.
struct HeadIn<'a, F> {
    q: &'a [F],
    k: &'a [F],
    v: &'a [F],
    dout: &'a [F],
    d: usize,
}

impl<F> HeadIn<'_, F> {
    fn sq(&self) -> usize {
        self.q.len() / self.d
    }
    fn sk(&self) -> usize {
        self.k.len() / self.d
    }
}

/// Where one head's gradients go: `dq` (`sq × d`, overwritten), `dk`, `dv`
/// (`sk × d`, the KV head's sums: added to).
struct HeadOut<'a, F> {
    dq: &'a mut [F],
    dk: &'a mut [F],
    dv: &'a mut [F],
}

/// The definition, one head: `S`, `P` materialized (see the module docs).
fn definition_head<F: Real>(x: &HeadIn<F>, sc: &Scorer<F>, g: HeadOut<F>) {
    let (sq, sk, d) = (x.sq(), x.sk(), x.d);
    // S (masked entries -inf) and the softcap factor of each entry.
    let mut s_mat = vec![F::NEG_INFINITY; sq * sk];
    let mut dcap = vec![F::ZERO; sq * sk];
    for i in 0..sq {
        for j in 0..sk {
            if let Some((s, c)) = sc.score(&x.q[i * d..][..d], &x.k[j * d..][..d], i, j) {
                s_mat[i * sk + j] = s;
                dcap[i * sk + j] = c;
            }
        }
    }
    g.dq.fill(F::ZERO);
    let mut dp = vec![F::ZERO; sk];
    for i in 0..sq {
        // P_i = softmax(S_i): all zeros for a row that sees no key.
        let p = softmax_safe(&s_mat[i * sk..][..sk]);
        let do_i = &x.dout[i * d..][..d];
        // dP_i = dO_i Vᵀ, D_i = Σ_j P_ij dP_ij.
        let mut d_i = F::ZERO;
        for j in 0..sk {
            dp[j] = dot(do_i, &x.v[j * d..][..d]);
            d_i = d_i + p[j] * dp[j];
        }
        for j in 0..sk {
            if p[j] == F::ZERO {
                continue; // masked (or underflowed): dV, dS contributions are 0
            }
            axpy(&mut g.dv[j * d..][..d], p[j], do_i);
            let ds = p[j] * (dp[j] - d_i) * dcap[i * sk + j];
            axpy(&mut g.dq[i * d..][..d], sc.scale * ds, &x.k[j * d..][..d]);
            axpy(&mut g.dk[j * d..][..d], sc.scale * ds, &x.q[i * d..][..d]);
        }
    }
}

/// The definition as PyTorch's 16-bit autograd computes it, one head
/// (rounding points: [`attention_backward_lowp`]). `round` rounds a value to
/// the element type; products accumulate in `F` (f32: PyTorch's "opmath").
fn lowp_head<F: Real>(x: &HeadIn<F>, sc: &Scorer<F>, round: fn(F) -> F, g: HeadOut<F>) {
    let (sq, sk, d) = (x.sq(), x.sk(), x.d);
    let (cap, alibi) = (sc.cap.softcap, sc.bias.alibi_slope != F::ZERO);
    // `reorder_ops`: K / √d, not Q, is scaled (and rounded).
    let k_scaled: Vec<F> = x.k.iter().map(|&v| round(v * sc.scale)).collect();
    // Σ_i dS_ijᵀ Q_i and Σ_i P_ijᵀ dO_i in f32, rounded once at the end.
    let mut dk_scaled = vec![F::ZERO; sk * d];
    let mut dv = vec![F::ZERO; sk * d];
    let mut s_i = vec![F::NEG_INFINITY; sk];
    let mut tanh_i = vec![F::ZERO; sk];
    let mut dp_i = vec![F::ZERO; sk];
    let mut dq_i = vec![F::ZERO; d];
    for i in 0..sq {
        let (q_i, do_i) = (&x.q[i * d..][..d], &x.dout[i * d..][..d]);
        // S_i: masked entries -inf.
        for j in 0..sk {
            s_i[j] = F::NEG_INFINITY;
            if !sc.window.visible(i as i64, j as i64) {
                continue;
            }
            let s = round(dot(q_i, &k_scaled[j * d..][..d]));
            let t = if cap > F::ZERO {
                tanh_i[j] = round(round(s / cap).tanh());
                round(tanh_i[j] * cap)
            } else {
                s
            };
            // The f32 bias promotes S to f32: no rounding after it.
            s_i[j] = if alibi { sc.biased(t, i, j) } else { t };
        }
        // P_i = softmax(S_i) (f32 inside); the PV product and dV read it
        // rounded, softmax's backward reads softmax's own output: rounded too,
        // except with ALiBi (f32 softmax, then `.to(dtype)`).
        let p32 = softmax_safe(&s_i);
        // dP_i = dO_i Vᵀ (rounded), D_i = Σ_j P_ij dP_ij (f32).
        let mut d_i = F::ZERO;
        for j in 0..sk {
            if p32[j] == F::ZERO {
                continue;
            }
            dp_i[j] = round(dot(do_i, &x.v[j * d..][..d]));
            let p_bwd = if alibi { p32[j] } else { round(p32[j]) };
            d_i = d_i + p_bwd * dp_i[j];
        }
        dq_i.fill(F::ZERO);
        for j in 0..sk {
            if p32[j] == F::ZERO {
                continue; // masked or underflowed: P = 0, dS = 0
            }
            let p = round(p32[j]);
            axpy(&mut dv[j * d..][..d], p, do_i);
            let p_bwd = if alibi { p32[j] } else { p };
            // dS = P ∘ (dP − D), rounded; softcap's backward: ·cap, ·(1 − tanh²), /cap, each rounded.
            let mut ds = round(p_bwd * (dp_i[j] - d_i));
            if cap > F::ZERO {
                let th = tanh_i[j];
                ds = round(round(round(ds * cap) * (F::ONE - th * th)) / cap);
            }
            axpy(&mut dq_i, ds, &k_scaled[j * d..][..d]);
            axpy(&mut dk_scaled[j * d..][..d], ds, q_i);
        }
        // dQ_i = dS_i (K/√d), rounded.
        for (dst, &src) in g.dq[i * d..][..d].iter_mut().zip(&dq_i) {
            *dst = round(src);
        }
    }
    // dK = (dSᵀ Q rounded) / √d rounded; dV = Pᵀ dO rounded; added to the KV
    // head's sums (rounded by the caller).
    for (dst, &src) in g.dk.iter_mut().zip(&dk_scaled) {
        *dst = *dst + round(round(src) * sc.scale);
    }
    for (dst, &src) in g.dv.iter_mut().zip(&dv) {
        *dst = *dst + round(src);
    }
}

/// The forward's row statistics a blocked loop recomputes `P` from.
#[derive(Clone, Copy)]
enum RowStats<'a, F> {
    /// FA2: the natural-log logsumexp `L_i` (`-inf`: the row sees no key).
    Lse(&'a [F]),
    /// FA1: base-2 `m_i` and `l_i` ([`RowState`]).
    Fa1 { l: &'a [F], m: &'a [F] },
}

/// FA2 (Algorithm 2) or FA1 (Algorithm 4), one head: K/V blocks outer,
/// Q blocks inner; `out` is the forward's `O` (`sq × d`).
fn blocked_head<F: Real>(x: &HeadIn<F>, out: &[F], stats: RowStats<F>, sc: &Scorer<F>, (br, bc): (usize, usize), g: HeadOut<F>) {
    let (sq, sk, d) = (x.sq(), x.sk(), x.d);
    let rowsum_do_o = |r: usize| dot(&x.dout[r * d..][..d], &out[r * d..][..d]);
    // FA2, preprocessing: D = rowsum(dO ∘ O) once for every row.
    let d_pre: Vec<F> = match stats {
        RowStats::Lse(_) => (0..sq).map(rowsum_do_o).collect(),
        RowStats::Fa1 { .. } => vec![],
    };
    // dQ lives in "HBM": zeroed once, added to at every (i, j).
    g.dq.fill(F::ZERO);
    let mut dk_j = vec![F::ZERO; bc * d];
    let mut dv_j = vec![F::ZERO; bc * d];
    // for 1 <= j <= Tc: load K_j, V_j; dK_j = 0, dV_j = 0 on chip.
    for c0 in (0..sk).step_by(bc) {
        let c1 = (c0 + bc).min(sk);
        dk_j.fill(F::ZERO);
        dv_j.fill(F::ZERO);
        // for 1 <= i <= Tr (only the Q blocks whose window meets K_j).
        for r0 in (0..sq).step_by(br) {
            let r1 = (r0 + br).min(sq);
            let (start, end) = sc.window.block_range(r0 as i64, r1 as i64);
            if start >= end || end <= c0 as i64 || start >= c1 as i64 {
                continue;
            }
            for r in r0..r1 {
                let (q_r, do_r) = (&x.q[r * d..][..d], &x.dout[r * d..][..d]);
                // D_i: precomputed (FA2) or recomputed at this step (FA1).
                let d_r = match stats {
                    RowStats::Lse(_) => d_pre[r],
                    RowStats::Fa1 { .. } => rowsum_do_o(r),
                };
                for c in c0..c1 {
                    let (k_c, v_c) = (&x.k[c * d..][..d], &x.v[c * d..][..d]);
                    let Some((s, dcap)) = sc.score(q_r, k_c, r, c) else { continue };
                    // P_ij recomputed from the forward's statistics.
                    let p = match stats {
                        RowStats::Lse(lse) if lse[r] == F::NEG_INFINITY => F::ZERO,
                        RowStats::Lse(lse) => (s - lse[r]).exp(),
                        RowStats::Fa1 { l, m } => {
                            let st = RowState { m: m[r], l: l[r] };
                            (s * F::LOG2_E - RowState::<F>::safe_max(st.m)).exp2() * st.inv_l()
                        }
                    };
                    // dV_j += P_ijᵀ dO_i
                    axpy(&mut dv_j[(c - c0) * d..][..d], p, do_r);
                    // dP_ij = dO_i V_jᵀ, dS_ij = P_ij ∘ (dP_ij − D_i) (∘ softcap')
                    let ds = p * (dot(do_r, v_c) - d_r) * dcap;
                    // dQ_i += scale dS_ij K_j (HBM), dK_j += scale dS_ijᵀ Q_i (chip)
                    axpy(&mut g.dq[r * d..][..d], sc.scale * ds, k_c);
                    axpy(&mut dk_j[(c - c0) * d..][..d], sc.scale * ds, q_r);
                }
            }
        }
        // Write dK_j, dV_j (added to the KV head's sums over its group).
        for (dst, &src) in g.dk[c0 * d..c1 * d].iter_mut().zip(&dk_j) {
            *dst = *dst + src;
        }
        for (dst, &src) in g.dv[c0 * d..c1 * d].iter_mut().zip(&dv_j) {
            *dst = *dst + src;
        }
    }
}

// ---------------------------------------------------------------------------
// One sequence, every head.
// ---------------------------------------------------------------------------

/// Which formulation a sequence is differentiated with, and its inputs:
/// `out` `(sq, nheads, d)`, statistics `(nheads, sq)`.
#[derive(Clone, Copy)]
enum SeqPath<'a, F> {
    Definition,
    /// The definition with PyTorch's 16-bit roundings (`round` to the dtype).
    LowPrecision { round: fn(F) -> F },
    Fa2 { out: ArrayView3<'a, F>, lse: ArrayView2<'a, F>, block: (usize, usize) },
    Fa1 { out: ArrayView3<'a, F>, l: ArrayView2<'a, F>, m: ArrayView2<'a, F>, block: (usize, usize) },
}

/// A `rows × d` view copied to a contiguous row-major vector.
fn gather<F: Real>(x: ArrayView2<F>) -> Vec<F> {
    x.iter().copied().collect()
}

/// One sequence: q, dout `(sq, nheads, d)`, k, v `(sk, nheads_k, d)`;
/// writes dq `(sq, nheads, d)`, dk, dv `(sk, nheads_k, d)`.
fn backward_seq<F: Real>(
    (q, k, v, dout): (ArrayView3<F>, ArrayView3<F>, ArrayView3<F>, ArrayView3<F>),
    path: SeqPath<F>,
    slopes: Option<&[f32]>,
    opts: &Opts<F>,
    (mut dq, mut dk, mut dv): (ArrayViewMut3<F>, ArrayViewMut3<F>, ArrayViewMut3<F>),
) {
    let (sq, nheads, d) = q.dim();
    let (sk, nheads_k, _) = k.dim();
    let group = nheads / nheads_k;
    let window = KeyWindow::new(sq as u32, sk as u32, opts.left, opts.right);
    let mut dq_h = vec![F::ZERO; sq * d];
    for g in 0..nheads_k {
        let (kh, vh) = (gather(k.slice(s![.., g, ..])), gather(v.slice(s![.., g, ..])));
        // The KV head's gradients: sums over its group of query heads.
        let mut dk_g = vec![F::ZERO; sk * d];
        let mut dv_g = vec![F::ZERO; sk * d];
        for h in g * group..(g + 1) * group {
            let slope = slopes.map_or(F::ZERO, |s| F::from_f32(s[h]));
            let sc = Scorer::new(window, opts, slope);
            let (qh, doh) = (gather(q.slice(s![.., h, ..])), gather(dout.slice(s![.., h, ..])));
            let x = HeadIn { q: &qh, k: &kh, v: &vh, dout: &doh, d };
            let out = HeadOut { dq: &mut dq_h, dk: &mut dk_g, dv: &mut dv_g };
            match path {
                SeqPath::Definition => definition_head(&x, &sc, out),
                SeqPath::LowPrecision { round } => lowp_head(&x, &sc, round, out),
                SeqPath::Fa2 { out: o, lse, block } => {
                    let (oh, lh) = (gather(o.slice(s![.., h, ..])), lse.row(h).to_vec());
                    blocked_head(&x, &oh, RowStats::Lse(&lh), &sc, block, out)
                }
                SeqPath::Fa1 { out: o, l, m, block } => {
                    let (oh, lh, mh) = (gather(o.slice(s![.., h, ..])), l.row(h).to_vec(), m.row(h).to_vec());
                    blocked_head(&x, &oh, RowStats::Fa1 { l: &lh, m: &mh }, &sc, block, out)
                }
            }
            for (dst, &src) in dq.slice_mut(s![.., h, ..]).iter_mut().zip(&dq_h) {
                *dst = src;
            }
        }
        for (dst, &src) in dk.slice_mut(s![.., g, ..]).iter_mut().zip(&dk_g) {
            *dst = src;
        }
        for (dst, &src) in dv.slice_mut(s![.., g, ..]).iter_mut().zip(&dv_g) {
            *dst = src;
        }
    }
}

// ---------------------------------------------------------------------------
// Dense entry points.
// ---------------------------------------------------------------------------

/// The per-sequence inputs of a dense call's batch entry `b`.
#[derive(Clone, Copy)]
enum DensePath<'a, F> {
    Definition,
    LowPrecision { round: fn(F) -> F },
    Fa2 { out: ArrayView4<'a, F>, lse: ArrayView3<'a, F>, block: (usize, usize) },
    Fa1 { out: ArrayView4<'a, F>, l: ArrayView3<'a, F>, m: ArrayView3<'a, F>, block: (usize, usize) },
}

impl<'a, F: Real> DensePath<'a, F> {
    fn of_seq(&self, b: usize) -> SeqPath<'a, F> {
        match *self {
            DensePath::Definition => SeqPath::Definition,
            DensePath::LowPrecision { round } => SeqPath::LowPrecision { round },
            DensePath::Fa2 { out, lse, block } => {
                SeqPath::Fa2 { out: out.index_axis_move(ndarray::Axis(0), b), lse: lse.index_axis_move(ndarray::Axis(0), b), block }
            }
            DensePath::Fa1 { out, l, m, block } => SeqPath::Fa1 {
                out: out.index_axis_move(ndarray::Axis(0), b),
                l: l.index_axis_move(ndarray::Axis(0), b),
                m: m.index_axis_move(ndarray::Axis(0), b),
                block,
            },
        }
    }
}

/// `dout` (and `out`) must have q's shape.
fn check_like_q<F>(argument: &'static str, x: &ArrayView4<F>, q: &ArrayView4<F>) -> Result<()> {
    let (xs, qs) = (dim4(x), dim4(q));
    for (a, axis) in super::features::AXES.iter().enumerate() {
        same(argument, axis, xs[a], qs[a], "must have the shape of q, (batch, seqlen_q, nheads, headdim)")?;
    }
    Ok(())
}

/// A row statistic (`softmax_lse`, `l`, `m`) must be `(batch, nheads, seqlen_q)`.
fn check_stats<F>(argument: &'static str, x: &ArrayView3<F>, q: &ArrayView4<F>) -> Result<()> {
    let ((b, h, n), qs) = (x.dim(), dim4(q));
    let rule = "row statistics are (batch, nheads, seqlen_q)";
    same(argument, "batch", b, qs[0], rule)?;
    same(argument, "nheads", h, qs[2], rule)?;
    same(argument, "seqlen_q", n, qs[1], rule)
}

fn run_dense<F: Real>(
    (q, k, v, dout): (ArrayView4<F>, ArrayView4<F>, ArrayView4<F>, ArrayView4<F>),
    path: DensePath<F>,
    alibi: Option<HostAlibi<'_>>,
    opts: &Opts<F>,
) -> Grads<F> {
    let (batch, _, nheads, _) = q.dim();
    let mut dq = Array4::from_elem(q.dim(), F::ZERO);
    let mut dk = Array4::from_elem(k.dim(), F::ZERO);
    let mut dv = Array4::from_elem(v.dim(), F::ZERO);
    for b in 0..batch {
        let sl = s![b, .., .., ..];
        backward_seq(
            (q.slice(sl), k.slice(sl), v.slice(sl), dout.slice(sl)),
            path.of_seq(b),
            alibi.map(|a| a.of_seq(b, nheads)),
            opts,
            (dq.slice_mut(sl), dk.slice_mut(sl), dv.slice_mut(sl)),
        );
    }
    Grads { dq, dk, dv }
}

/// Gradients of [`super::attention`] by the definition (`S`, `P`
/// materialized per head; see the module docs). `dout` is `∂loss/∂O`, of
/// q's shape. Shapes, options and errors are [`super::attention`]'s, plus
/// `ShapeMismatch` for a `dout` not shaped like `q`.
pub fn attention_backward<F: Real>(
    q: ArrayView4<F>,
    k: ArrayView4<F>,
    v: ArrayView4<F>,
    dout: ArrayView4<F>,
    params: &ForwardParams,
    alibi: Option<HostAlibi<'_>>,
) -> Result<Grads<F>> {
    let opts = check_dense(&q, &k, &v, params, alibi.as_ref())?;
    check_like_q("dout", &dout, &q)?;
    Ok(run_dense((q, k, v, dout), DensePath::Definition, alibi, &opts))
}

/// The element types [`attention_backward_lowp`] computes in: `f32`,
/// `half::f16`, `half::bf16` (the reference's own trait: it imports no
/// GPU-side type).
pub trait LowpElem: Copy {
    /// Widens to f32 (exact).
    fn widen(self) -> f32;
    /// Rounds from f32 to nearest even.
    fn narrow(x: f32) -> Self;
}

impl LowpElem for f32 {
    fn widen(self) -> f32 {
        self
    }
    fn narrow(x: f32) -> Self {
        x
    }
}

impl LowpElem for half::f16 {
    fn widen(self) -> f32 {
        self.to_f32()
    }
    fn narrow(x: f32) -> Self {
        half::f16::from_f32(x)
    }
}

impl LowpElem for half::bf16 {
    fn widen(self) -> f32 {
        self.to_f32()
    }
    fn narrow(x: f32) -> Self {
        half::bf16::from_f32(x)
    }
}

/// `x` rounded to `T` (to nearest even) and widened back.
fn round_to<T: LowpElem>(x: f32) -> f32 {
    T::narrow(x).widen()
}

/// Gradients of attention as PyTorch's standard attention computes them on
/// tensors of the 16-bit type `T` (`half::f16`, `half::bf16`): the `pt` of
/// FlashAttention-2's tests (`attention_ref(..., upcast=False,
/// reorder_ops=True)` differentiated by autograd), whose error against the
/// f64 definition ([`attention_backward`]) bounds the 16-bit kernels' by
/// FA2's rule `max|g − g_ref| ≤ 2·max|g_pt − g_ref| + ε`.
///
/// Every product accumulates in f32 (cuBLAS's fp16/bf16 GEMMs, PyTorch's
/// softmax and reductions); the result of each operation is rounded to `T`
/// where PyTorch stores it as a `T` tensor:
///
/// * forward: `K·scale` (`reorder_ops` scales K, not Q); `S = Q (K·scale)ᵀ`;
///   softcap `S/cap`, `tanh`, `·cap` (three roundings); masks (`-inf`); ALiBi
///   adds an f32 bias, which promotes `S` to f32 (no rounding after it);
///   `P = softmax(S)`, rounded (with ALiBi: computed in f32, then
///   `.to(dtype)`);
/// * backward: `dP = dO Vᵀ`; `dV = Pᵀ dO`; softmax's backward
///   `dS = P ∘ (dP − D)`, `D = rowsum(P ∘ dP)` in f32 with `P` softmax's own
///   output (rounded; with ALiBi the f32 one, and `dS` is rounded when it
///   reaches the 16-bit `S`); softcap's backward `·cap`, `·(1 − tanh²)`,
///   `/cap`, each rounded; `dQ = dS (K·scale)`; `dK = (dSᵀ Q)·scale`, two
///   roundings; GQA/MQA: the per-query-head `dK`, `dV` (rounded) summed over
///   the group in f32 and rounded (the backward of `repeat`).
///
/// The O of the forward is not needed (`D` comes from `P ∘ dP`). Where FA2
/// divides by `√d` this multiplies by `scale` (the same number up to one f32
/// rounding before the 16-bit one); its causal ALiBi bias differs from ours
/// by a per-row constant, which softmax ignores. For `T = f32` every rounding
/// is exact and this is [`attention_backward`] in f32 up to the order of
/// operations. Shapes, options and errors: [`attention_backward`]'s.
pub fn attention_backward_lowp<T: LowpElem>(
    q: ArrayView4<T>,
    k: ArrayView4<T>,
    v: ArrayView4<T>,
    dout: ArrayView4<T>,
    params: &ForwardParams,
    alibi: Option<HostAlibi<'_>>,
) -> Result<Grads<T>> {
    let up = |x: ArrayView4<T>| x.mapv(T::widen);
    let (q, k, v, dout) = (up(q), up(k), up(v), up(dout));
    let opts = check_dense(&q.view(), &k.view(), &v.view(), params, alibi.as_ref())?;
    check_like_q("dout", &dout.view(), &q.view())?;
    let path = DensePath::LowPrecision { round: round_to::<T> };
    let g = run_dense((q.view(), k.view(), v.view(), dout.view()), path, alibi, &opts);
    // The last rounding: the KV heads' sums over their groups (a no-op for
    // dq and for groups of one head).
    let down = |x: Array4<f32>| x.mapv(T::narrow);
    Ok(Grads { dq: down(g.dq), dk: down(g.dk), dv: down(g.dv) })
}

/// FlashAttention-2's backward (Algorithm 2, see the module docs) with `br`
/// query rows and `bc` keys per block (any positive sizes). `out` and
/// `lse` are the forward's `O` `(batch, seqlen_q, nheads, d)` and natural-log
/// logsumexp `(batch, nheads, seqlen_q)` (`AttnOutput`'s `o`, `lse` of
/// [`super::attention`] / [`super::fa2_forward_ext`]); `dout` is shaped like
/// `q`. Errors: [`attention_backward`]'s, `ShapeMismatch` naming `out` or
/// `softmax_lse`, `InvalidBlock`.
#[allow(clippy::too_many_arguments)]
pub fn fa2_backward<F: Real>(
    q: ArrayView4<F>,
    k: ArrayView4<F>,
    v: ArrayView4<F>,
    out: ArrayView4<F>,
    dout: ArrayView4<F>,
    lse: ArrayView3<F>,
    params: &ForwardParams,
    alibi: Option<HostAlibi<'_>>,
    br: usize,
    bc: usize,
) -> Result<Grads<F>> {
    let opts = check_dense(&q, &k, &v, params, alibi.as_ref())?;
    check_like_q("out", &out, &q)?;
    check_like_q("dout", &dout, &q)?;
    check_stats("softmax_lse", &lse, &q)?;
    check_block(br, bc)?;
    Ok(run_dense((q, k, v, dout), DensePath::Fa2 { out: out.view(), lse: lse.view(), block: (br, bc) }, alibi, &opts))
}

/// FlashAttention's backward (Algorithm 4, see the module docs) with `br`
/// query rows and `bc` keys per block. `l`, `m` `(batch, nheads, seqlen_q)`
/// are the FA1 forward's final row statistics in base-2 units
/// ([`crate::RowStats::Fa1`]; for the CPU [`super::fa1_forward`]'s output
/// pass `m · log2 e`); `out` its `O`. Every feature of
/// [`attention_backward`] is supported. Errors: [`fa2_backward`]'s, with
/// `l` / `m` in place of `softmax_lse`.
#[allow(clippy::too_many_arguments)]
pub fn fa1_backward<F: Real>(
    q: ArrayView4<F>,
    k: ArrayView4<F>,
    v: ArrayView4<F>,
    out: ArrayView4<F>,
    dout: ArrayView4<F>,
    l: ArrayView3<F>,
    m: ArrayView3<F>,
    params: &ForwardParams,
    alibi: Option<HostAlibi<'_>>,
    br: usize,
    bc: usize,
) -> Result<Grads<F>> {
    let opts = check_dense(&q, &k, &v, params, alibi.as_ref())?;
    check_like_q("out", &out, &q)?;
    check_like_q("dout", &dout, &q)?;
    check_stats("l", &l, &q)?;
    check_stats("m", &m, &q)?;
    check_block(br, bc)?;
    Ok(run_dense((q, k, v, dout), DensePath::Fa1 { out: out.view(), l: l.view(), m: m.view(), block: (br, bc) }, alibi, &opts))
}

// ---------------------------------------------------------------------------
// Varlen.
// ---------------------------------------------------------------------------

/// Gradients of [`super::attention_varlen`] by the definition, each sequence
/// alone (its rows of q/dout, its `seqused_k` keys; window normalized with
/// `max_seqlen_k`, ALiBi indexed by sequence, as the forward). q and dout
/// `(total_q, nheads, d)`, k and v `(total_k, nheads_k, d)`; arguments in
/// the forward's order with `dout` after `v`. Rows past
/// `cu_seqlens_q[batch]` and keys no sequence uses get zero gradients.
/// Errors: [`super::attention_varlen`]'s, and `ShapeMismatch` for `dout`.
#[allow(clippy::too_many_arguments)]
pub fn varlen_attention_backward<F: Real>(
    q: ArrayView3<F>,
    k: ArrayView3<F>,
    v: ArrayView3<F>,
    dout: ArrayView3<F>,
    cu_seqlens_q: &[i32],
    cu_seqlens_k: &[i32],
    seqused_k: Option<&[i32]>,
    max_seqlen_q: usize,
    max_seqlen_k: usize,
    params: &ForwardParams,
    alibi: Option<HostAlibi<'_>>,
) -> Result<VarlenGrads<F>> {
    let (qd, kd, vd, dd) = (q.dim(), k.dim(), v.dim(), dout.dim());
    check_kv3(kd, vd)?;
    let rule = "dout must have the shape of q, (total_q, nheads, headdim)";
    same("dout", "total", dd.0, qd.0, rule)?;
    same("dout", "nheads", dd.1, qd.1, rule)?;
    same("dout", "headdim", dd.2, qd.2, rule)?;
    let spans = check_varlen(cu_seqlens_q, cu_seqlens_k, seqused_k, qd.0, kd.0, max_seqlen_q, max_seqlen_k)?;
    check_query_side(qd, kd.1, kd.2, spans.len(), alibi.as_ref())?;
    let opts = Opts::resolve(params, qd.2, max_seqlen_k)?;
    let nheads = qd.1;
    let mut dq = Array3::from_elem(qd, F::ZERO);
    let mut dk = Array3::from_elem(kd, F::ZERO);
    let mut dv = Array3::from_elem(vd, F::ZERO);
    for (b, sp) in spans.iter().enumerate() {
        let rows = sp.q_start..sp.q_start + sp.seqlen_q;
        let keys = sp.k_start..sp.k_start + sp.seqlen_k;
        let (rq, rk) = (s![rows.clone(), .., ..], s![keys.clone(), .., ..]);
        // A sequence's keys are its own (cu_seqlens_k: disjoint segments),
        // so its dK/dV rows are written by it alone.
        let mut dk_b = Array3::from_elem((sp.seqlen_k, kd.1, kd.2), F::ZERO);
        let mut dv_b = Array3::from_elem((sp.seqlen_k, kd.1, kd.2), F::ZERO);
        backward_seq(
            (q.slice(rq), k.slice(rk), v.slice(rk), dout.slice(rq)),
            SeqPath::Definition,
            alibi.map(|a| a.of_seq(b, nheads)),
            &opts,
            (dq.slice_mut(rq), dk_b.view_mut(), dv_b.view_mut()),
        );
        for (dst, &src) in dk.slice_mut(rk).iter_mut().zip(&dk_b) {
            *dst = src;
        }
        for (dst, &src) in dv.slice_mut(rk).iter_mut().zip(&dv_b) {
            *dst = src;
        }
    }
    Ok(VarlenGrads { dq, dk, dv })
}

/// Per-row `D_i = rowsum(dO_i ∘ O_i)` of a dense call, `(batch, nheads,
/// seqlen_q)`: what FA2's preprocessing kernel writes (for tests of it).
pub fn rowsum_do_o<F: Real>(out: ArrayView4<F>, dout: ArrayView4<F>) -> Result<Array3<F>> {
    check_like_q("dout", &dout, &out)?;
    let (batch, sq, nheads, _) = out.dim();
    Ok(Array3::from_shape_fn((batch, nheads, sq), |(b, h, i)| {
        let (o, d) = (out.slice(s![b, i, h, ..]), dout.slice(s![b, i, h, ..]));
        dot(&o.iter().copied().collect::<Vec<_>>(), &d.iter().copied().collect::<Vec<_>>())
    }))
}
