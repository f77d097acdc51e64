//! Varlen (packed batches) in the CPU reference: FlashAttention-2's
//! `flash_attn_varlen_func`. q `(total_q, nheads, d)`, k/v `(total_k,
//! nheads_k, d)`; sequence `b` owns the q rows and k/v rows its
//! `cu_seqlens_q/k` delimit (using the first `seqused_k[b]` keys if given),
//! and is computed exactly as a dense batch of one would be
//! ([`super::attention`]: causal/window aligned bottom-right per sequence,
//! ALiBi `(batch, nheads)` indexed by sequence), except for one FA2 rule: the
//! window is normalized with `max_seqlen_k` (a side `≥ max_seqlen_k` is
//! unbounded), not with the sequence's own length.
//!
//! Each sequence is computed as `params.loop_order` says: `Standard`
//! materializes its `S`, `Fa2`/`Fa1` (the default) run FA2's blocked loop
//! with `params.block` (default [`super::features::DEFAULT_BLOCK`]).
//!
//! LSE is unpadded, `(nheads, total_q)`. Rows of the buffers past
//! `cu_seqlens_q[batch]` belong to no sequence: O = 0, LSE = -inf there.
//! Validation: [`check_varlen`], the
//! device API's own.

use flash_attn_common::Real;
use ndarray::{Array2, Array3, ArrayView3, CowArray, Ix3, s};

use super::features::{HostAlibi, Opts, Path, run_seq};
use crate::error::{FlashAttnError, Result};
use crate::params::ForwardParams;
use crate::varlen::{SeqSpan, check_gqa, check_varlen};

/// Output of [`attention_varlen`] (and of the paged varlen prefill).
#[derive(Clone, Debug, PartialEq)]
pub struct VarlenOutput<F> {
    /// `(total_q, nheads, headdim)`.
    pub o: Array3<F>,
    /// `(nheads, total_q)`, unpadded: natural-log logsumexp of each row's
    /// scores; `-inf` for a row that sees no key.
    pub lse: Array2<F>,
}

/// `Err(InvalidArgument)` unless the heads and headdim of a `(total, nheads,
/// headdim)` tensor are positive.
pub(crate) fn check_dims3(argument: &'static str, shape: (usize, usize, usize)) -> Result<()> {
    if shape.1 == 0 || shape.2 == 0 {
        return Err(FlashAttnError::InvalidArgument {
            argument,
            value: format!("shape {shape:?}"),
            reason: "nheads and headdim must be positive (layout (total, nheads, headdim))",
        });
    }
    Ok(())
}

/// `Err(ShapeMismatch)` unless `x`'s axis `axis` equals `want`.
pub(crate) fn same3(argument: &'static str, axis: &'static str, actual: usize, expected: usize) -> Result<()> {
    super::features::same(argument, axis, actual, expected, "q is (total_q, nheads, headdim), k and v (total_k, nheads_k, headdim)")
}

/// k and v of a varlen call: `(total_k, nheads_k, headdim)` each, the
/// same shape, positive heads and headdim.
pub(crate) fn check_kv3(k: (usize, usize, usize), v: (usize, usize, usize)) -> Result<()> {
    check_dims3("k", k)?;
    same3("v", "total", v.0, k.0)?;
    same3("v", "nheads", v.1, k.1)?;
    same3("v", "headdim", v.2, k.2)
}

/// The query side of a varlen call: q's heads/headdim, `nheads_k`/headdim of
/// the keys, GQA and ALiBi for `batch` sequences.
pub(crate) fn check_query_side(
    q: (usize, usize, usize),
    nheads_k: usize,
    headdim_k: usize,
    batch: usize,
    alibi: Option<&HostAlibi<'_>>,
) -> Result<()> {
    check_dims3("q", q)?;
    same3("k", "headdim", headdim_k, q.2)?;
    check_gqa(q.1, nheads_k)?;
    if let Some(a) = alibi {
        a.check(batch, q.1)?;
    }
    Ok(())
}

/// Runs every sequence of a varlen batch: `kv(b, span)` gives sequence `b`'s
/// keys and values, `(span.seqlen_k, nheads_k, d)` each.
pub(crate) fn run_varlen<'a, F: Real + 'a>(
    q: ArrayView3<F>,
    spans: &[SeqSpan],
    alibi: Option<HostAlibi<'_>>,
    opts: &Opts<F>,
    path: Path,
    mut kv: impl FnMut(usize, &SeqSpan) -> (CowArray<'a, F, Ix3>, CowArray<'a, F, Ix3>),
) -> VarlenOutput<F> {
    let (total_q, nheads, d) = q.dim();
    let mut o = Array3::from_elem((total_q, nheads, d), F::ZERO);
    let mut lse = Array2::from_elem((nheads, total_q), F::NEG_INFINITY);
    for (b, span) in spans.iter().enumerate() {
        let rows = span.q_start..span.q_start + span.seqlen_q;
        let (k, v) = kv(b, span);
        run_seq(
            (q.slice(s![rows.clone(), .., ..]), k.view(), v.view()),
            alibi.map(|a| a.of_seq(b, nheads)),
            opts,
            path,
            (o.slice_mut(s![rows.clone(), .., ..]), lse.slice_mut(s![.., rows])),
        );
    }
    VarlenOutput { o, lse }
}

/// Varlen attention by the standard definition (see the module docs).
///
/// Errors: every [`check_varlen`] error, `nheads % nheads_k != 0`, ALiBi
/// slopes not of shape `(nheads)` / `(batch, nheads)`, k/v shapes, and the
/// [`ForwardParams::resolve`] errors (softcap, causal with a right window).
#[allow(clippy::too_many_arguments)]
pub fn attention_varlen<F: Real>(
    q: ArrayView3<F>,
    k: ArrayView3<F>,
    v: ArrayView3<F>,
    cu_seqlens_q: &[i32],
    cu_seqlens_k: &[i32],
    seqused_k: Option<&[i32]>,
    max_seqlen_q: usize,
    max_seqlen_k: usize,
    params: &ForwardParams,
    alibi: Option<HostAlibi<'_>>,
) -> Result<VarlenOutput<F>> {
    let (qd, kd, vd) = (q.dim(), k.dim(), v.dim());
    check_kv3(kd, vd)?;
    let spans = check_varlen(cu_seqlens_q, cu_seqlens_k, seqused_k, qd.0, kd.0, max_seqlen_q, max_seqlen_k)?;
    check_query_side(qd, kd.1, kd.2, spans.len(), alibi.as_ref())?;
    let opts = Opts::resolve(params, qd.2, max_seqlen_k)?;
    let path = Path::of(params)?;
    let (k, v) = (k.view(), v.view()); // one lifetime for both
    Ok(run_varlen(q, &spans, alibi, &opts, path, |_, sp| {
        let keys = sp.k_start..sp.k_start + sp.seqlen_k;
        (k.slice_move(s![keys.clone(), .., ..]).into(), v.slice_move(s![keys, .., ..]).into())
    }))
}
