//! Validation of a backward call: the forward's rules for q, k, v, out and
//! the parameters (`api::validate`), then dout, the row statistics and the
//! gradient buffers. Pure (no GPU), so every error path is unit-tested.

use crate::tensor::TensorLayout;
use crate::validate::{Problem, check_layout, validate};
use crate::error::{FlashAttnError, Result};
use crate::params::{ForwardParams, LoopOrder};
use crate::validate::varlen::{packed, validate_varlen};

const AXES: [&str; 4] = ["batch", "seqlen", "nheads", "headdim"];

/// Layouts and buffer lengths of one backward call (`(layout, len)` pairs).
pub struct BackwardShapes<'a> {
    pub q: (&'a TensorLayout, usize),
    pub k: (&'a TensorLayout, usize),
    pub v: (&'a TensorLayout, usize),
    pub out: (&'a TensorLayout, usize),
    pub dout: (&'a TensorLayout, usize),
    pub dq: (&'a TensorLayout, usize),
    pub dk: (&'a TensorLayout, usize),
    pub dv: (&'a TensorLayout, usize),
}

fn same_shape(argument: &'static str, l: &TensorLayout, want: [usize; 4], rule: &'static str) -> Result<()> {
    for (a, (&got, &w)) in l.shape.iter().zip(want.iter()).enumerate() {
        if got != w {
            return Err(FlashAttnError::ShapeMismatch { argument, axis: AXES[a], actual: got, expected: w, rule });
        }
    }
    Ok(())
}

/// A gradient buffer: the shape of its input, inside its buffer, no two
/// elements at one address.
fn check_grad(argument: &'static str, g: (&TensorLayout, usize), want: [usize; 4], rule: &'static str) -> Result<()> {
    same_shape(argument, g.0, want, rule)?;
    check_layout(argument, g.0, g.1)?;
    if g.0.may_overlap() {
        return Err(FlashAttnError::OverlappingOutput { argument, shape: g.0.shape, strides: g.0.strides });
    }
    Ok(())
}

/// The checked problem of a backward call.
pub fn validate_backward(s: &BackwardShapes<'_>, params: &ForwardParams) -> Result<Problem> {
    check_loop_order(params, false)?;
    // out first: the forward's rules would name it `o`.
    same_shape("out", s.out.0, s.q.0.shape, "out has the shape of q")?;
    let problem = validate(s.q, s.k, s.v, s.out, params)?;
    check_grads(s)?;
    Ok(problem)
}

/// The checked problem of a varlen backward call (`backward_varlen`):
/// packed layouts (batch axis 1) for every tensor, the forward's varlen
/// rules (`validate_varlen`: prefix-sum lengths, maxima), then the
/// gradients' rules of [`validate_backward`]. FA2 loop order only (the FA1
/// kernels have no varlen). Pure (no GPU).
pub fn validate_backward_varlen(
    s: &BackwardShapes<'_>,
    lens: (usize, usize, Option<usize>),
    max_seqlen: (usize, usize),
    params: &ForwardParams,
) -> Result<Problem> {
    check_loop_order(params, true)?;
    for (name, l) in [("dout", s.dout.0), ("dq", s.dq.0), ("dk", s.dk.0), ("dv", s.dv.0)] {
        packed(name, l)?;
    }
    same_shape("out", s.out.0, s.q.0.shape, "out has the shape of q")?;
    let problem = validate_varlen(s.q, s.k, s.v, s.out, lens, max_seqlen, params)?;
    check_grads(s)?;
    Ok(problem)
}

fn check_loop_order(params: &ForwardParams, varlen: bool) -> Result<()> {
    let (ok, reason) = if varlen {
        (params.loop_order == LoopOrder::Fa2, "the varlen backward pass runs in the FA2 loop order (softmax_lse)")
    } else {
        (params.loop_order != LoopOrder::Standard, "the backward pass runs in the FA1 or FA2 loop order")
    };
    if !ok {
        return Err(FlashAttnError::InvalidArgument { argument: "params.loop_order", value: format!("{:?}", params.loop_order), reason });
    }
    Ok(())
}

/// out and dout shaped like q; dq, dk, dv like q, k, v, inside their
/// buffers, not overlapping themselves.
fn check_grads(s: &BackwardShapes<'_>) -> Result<()> {
    let qs = s.q.0.shape;
    same_shape("dout", s.dout.0, qs, "dout has the shape of q (and out)")?;
    check_layout("dout", s.dout.0, s.dout.1)?;
    check_grad("dq", s.dq, qs, "dq has the shape of q")?;
    check_grad("dk", s.dk, s.k.0.shape, "dk has the shape of k")?;
    check_grad("dv", s.dv, s.v.0.shape, "dv has the shape of v")?;
    Ok(())
}

/// Row statistics of the forward call: exactly `batch·nheads·seqlen_q`
/// f32 (a buffer of another length comes from another call's shape).
pub fn check_stats_len(argument: &'static str, len: usize, required: usize) -> Result<()> {
    crate::validate::check_stats(argument, len, required)?;
    if len != required {
        return Err(FlashAttnError::ShapeMismatch {
            argument,
            axis: "batch·nheads·seqlen_q",
            actual: len,
            expected: required,
            rule: "the row statistics of the forward call with these q, k, v",
        });
    }
    Ok(())
}

/// Whether two byte ranges `[a, a + an)`, `[b, b + bn)` intersect.
pub fn ranges_overlap(a: u64, an: u64, b: u64, bn: u64) -> bool {
    an > 0 && bn > 0 && a < b.saturating_add(bn) && b < a.saturating_add(an)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A varlen call over packed q `(8, 4, 32)`, k/v `(10, 2, 32)` (GQA).
    fn call(dout: TensorLayout, dk: TensorLayout, lens: (usize, usize, Option<usize>), loop_order: LoopOrder) -> Result<Problem> {
        let (q, k) = (TensorLayout::varlen(8, 4, 32), TensorLayout::varlen(10, 2, 32));
        let n = |l: &TensorLayout| l.required_len().unwrap();
        let s = BackwardShapes { q: (&q, n(&q)), k: (&k, n(&k)), v: (&k, n(&k)), out: (&q, n(&q)), dout: (&dout, n(&dout)), dq: (&q, n(&q)), dk: (&dk, n(&dk)), dv: (&k, n(&k)) };
        validate_backward_varlen(&s, lens, (5, 6), &ForwardParams { loop_order, ..Default::default() })
    }

    #[test]
    fn varlen_accepts_a_packed_gqa_call() {
        let p = call(TensorLayout::varlen(8, 4, 32), TensorLayout::varlen(10, 2, 32), (3, 3, None), LoopOrder::Fa2).unwrap();
        assert_eq!((p.dims.batch, p.dims.seqlen_q, p.dims.seqlen_k, p.dims.nheads_k), (2, 5, 6, 2));
    }

    #[test]
    fn varlen_errors_are_typed() {
        let (q, k) = (TensorLayout::varlen(8, 4, 32), TensorLayout::varlen(10, 2, 32));
        let e = call(TensorLayout::varlen(7, 4, 32), k, (3, 3, None), LoopOrder::Fa2).unwrap_err();
        assert!(matches!(e, FlashAttnError::ShapeMismatch { argument: "dout", axis: "seqlen", actual: 7, expected: 8, .. }), "{e}");
        let e = call(q, TensorLayout::varlen(10, 4, 32), (3, 3, None), LoopOrder::Fa2).unwrap_err();
        assert!(matches!(e, FlashAttnError::ShapeMismatch { argument: "dk", axis: "nheads", .. }), "{e}");
        let e = call(TensorLayout::contiguous([2, 4, 4, 32]), k, (3, 3, None), LoopOrder::Fa2).unwrap_err();
        assert!(matches!(e, FlashAttnError::InvalidArgument { argument: "dout", .. }), "{e}");
        let e = call(q, k, (1, 1, None), LoopOrder::Fa2).unwrap_err();
        assert!(matches!(e, FlashAttnError::InvalidArgument { argument: "cu_seqlens_q", .. }), "{e}");
        let e = call(q, k, (3, 4, None), LoopOrder::Fa2).unwrap_err();
        assert!(matches!(e, FlashAttnError::InvalidArgument { argument: "cu_seqlens_k", .. }), "{e}");
        let e = call(q, k, (3, 3, Some(3)), LoopOrder::Fa2).unwrap_err();
        assert!(matches!(e, FlashAttnError::InvalidArgument { argument: "seqused_k", .. }), "{e}");
        for order in [LoopOrder::Fa1, LoopOrder::Standard] {
            let e = call(q, k, (3, 3, None), order).unwrap_err();
            assert!(matches!(e, FlashAttnError::InvalidArgument { argument: "params.loop_order", .. }), "{e}");
        }
    }

    #[test]
    fn stats_of_another_shape_are_refused() {
        assert!(check_stats_len("softmax_lse", 32, 32).is_ok());
        let e = check_stats_len("softmax_lse", 40, 32).unwrap_err();
        assert!(matches!(e, FlashAttnError::ShapeMismatch { argument: "softmax_lse", actual: 40, expected: 32, .. }), "{e}");
        let e = check_stats_len("softmax_lse", 31, 32).unwrap_err();
        assert!(matches!(e, FlashAttnError::StatsTooShort { argument: "softmax_lse", .. }), "{e}");
    }
}
