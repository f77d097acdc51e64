//! The device varlen description of a call: packed layouts, the lengths
//! of the prefix-sum arrays and the maxima (the prefix sums themselves are
//! on the device; the kernels clamp them).

use crate::types::Dims;
use crate::error::{FlashAttnError, Result};
use crate::params::ForwardParams;
use crate::tensor::{TensorLayout, Varlen};

use super::{MAX_DIM, Problem, validate};

pub(crate) fn packed(argument: &'static str, l: &TensorLayout) -> Result<()> {
    if l.batch() != 1 {
        return Err(FlashAttnError::InvalidArgument {
            argument,
            value: format!("shape {:?}", l.shape),
            reason: "varlen tensors are packed (total, nheads, headdim): use TensorLayout::varlen (batch axis 1)",
        });
    }
    Ok(())
}

/// The lengths of a varlen description's arrays and its maxima; returns
/// the batch. Pure (no GPU needed).
fn check_lens(lens: (usize, usize, Option<usize>), max_seqlen: (usize, usize)) -> Result<usize> {
    let (cu_q, cu_k, seqused) = lens;
    if cu_q < 2 {
        return Err(FlashAttnError::InvalidArgument {
            argument: "cu_seqlens_q",
            value: format!("length {cu_q}"),
            reason: "must hold batch + 1 ≥ 2 prefix sums",
        });
    }
    if cu_k != cu_q {
        return Err(FlashAttnError::InvalidArgument {
            argument: "cu_seqlens_k",
            value: format!("length {cu_k}"),
            reason: "must have the length of cu_seqlens_q (batch + 1)",
        });
    }
    let batch = cu_q - 1;
    if let Some(n) = seqused
        && n != batch
    {
        return Err(FlashAttnError::InvalidArgument {
            argument: "seqused_k",
            value: format!("length {n}"),
            reason: "must hold one i32 per sequence (batch = cu_seqlens_q.len() − 1)",
        });
    }
    let (max_q, max_k) = max_seqlen;
    if max_q == 0 || max_q > MAX_DIM {
        return Err(FlashAttnError::InvalidArgument {
            argument: "max_seqlen_q",
            value: max_q.to_string(),
            reason: "must be in 1..=2³¹ − 1 and at least every query segment's length",
        });
    }
    if max_k > MAX_DIM {
        return Err(FlashAttnError::InvalidArgument {
            argument: "max_seqlen_k",
            value: max_k.to_string(),
            reason: "must be at most 2³¹ − 1",
        });
    }
    Ok(batch)
}

/// [`check_lens`] of a device varlen description.
pub(crate) fn check_varlen_lens(v: &Varlen<'_>) -> Result<usize> {
    check_lens(
        v.array_lens(),
        (v.max_seqlen_q, v.max_seqlen_k),
    )
}

/// Validates a varlen call: the packed layouts, the prefix-sum lengths and
/// the maxima. Pure (no GPU needed).
pub fn validate_varlen(
    q: (&TensorLayout, usize),
    k: (&TensorLayout, usize),
    v: (&TensorLayout, usize),
    o: (&TensorLayout, usize),
    lens: (usize, usize, Option<usize>),
    max_seqlen: (usize, usize),
    params: &ForwardParams,
) -> Result<Problem> {
    for (name, l) in [("q", q.0), ("k", k.0), ("v", v.0), ("o", o.0)] {
        packed(name, l)?;
    }
    let base = validate(q, k, v, o, params)?;
    let batch = check_lens(lens, max_seqlen)?;
    let (max_q, max_k) = max_seqlen;
    if batch.checked_mul(base.dims.nheads).is_none_or(|x| x > MAX_DIM) {
        return Err(FlashAttnError::DimTooLarge { argument: "cu_seqlens_q", axis: "batch·nheads", value: batch, max: MAX_DIM });
    }
    let opts = params.resolve(base.dims.headdim, max_k)?;
    let dims = Dims { batch, seqlen_q: max_q, seqlen_k: max_k, ..base.dims };
    Ok(Problem { dims, softmax_scale: opts.softmax_scale, opts })
}
