//! Validation of a backward call: the forward's rules for q, k, v, out and
//! the parameters (`api::validate`), then dout, the row statistics and the
//! gradient buffers. Pure (no GPU), so every error path is unit-tested.

use crate::api::{Problem, TensorLayout, check_layout, validate};
use crate::error::{FlashAttnError, Result};
use crate::params::{ForwardParams, LoopOrder};

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
    if params.loop_order == LoopOrder::Standard {
        return Err(FlashAttnError::InvalidArgument {
            argument: "params.loop_order",
            value: "Standard".into(),
            reason: "the backward pass runs in the FA1 or FA2 loop order",
        });
    }
    let problem = validate(s.q, s.k, s.v, s.out, params)?;
    let qs = s.q.0.shape;
    same_shape("out", s.out.0, qs, "out has the shape of q")?;
    same_shape("dout", s.dout.0, qs, "dout has the shape of q (and out)")?;
    check_layout("dout", s.dout.0, s.dout.1)?;
    check_grad("dq", s.dq, qs, "dq has the shape of q")?;
    check_grad("dk", s.dk, s.k.0.shape, "dk has the shape of k")?;
    check_grad("dv", s.dv, s.v.0.shape, "dv has the shape of v")?;
    Ok(problem)
}

/// Row statistics of the forward call: exactly `batch·nheads·seqlen_q`
/// f32 (a buffer of another length comes from another call's shape).
pub fn check_stats_len(argument: &'static str, len: usize, required: usize) -> Result<()> {
    crate::api::check_stats(argument, len, required)?;
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
