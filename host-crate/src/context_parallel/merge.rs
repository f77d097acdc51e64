//! The exact merge of partial attentions over disjoint key sets (the
//! formula: [`flash_attn_common::ring::merge_lse`], the one the GPU's
//! `ring_merge_*` kernels run).

use flash_attn_common::Real;
use flash_attn_common::ring::merge_lse;
use ndarray::{ArrayView3, ArrayView4, ArrayViewMut3, ArrayViewMut4, Axis};

use crate::error::{FlashAttnError, Result};

/// Merges the partial `(o, lse)` into the accumulator `(o_acc, lse_acc)`,
/// row by row: `LSE = ln(exp(LSE_acc) + exp(LSE))`,
/// `O_acc ← exp(LSE_acc_old − LSE)·O_acc + exp(LSE_b − LSE)·O`. An
/// accumulator that has seen nothing is `O = 0`, `LSE = −inf`; a row no key
/// of either side reaches stays `O = 0`, `LSE = −inf`.
///
/// Layouts as the reference's: `o` `(batch, rows, nheads, headdim)`, `lse`
/// `(batch, nheads, rows)`; the accumulator's shapes must equal the
/// partial's (a typed error otherwise).
pub fn merge_partial<F: Real>(
    mut o_acc: ArrayViewMut4<F>,
    mut lse_acc: ArrayViewMut3<F>,
    o: ArrayView4<F>,
    lse: ArrayView3<F>,
) -> Result<()> {
    let rule = "o is (batch, rows, nheads, headdim) and lse (batch, nheads, rows), as the accumulator";
    for (axis, (a, b)) in ["batch", "rows", "nheads", "headdim"].into_iter().zip(o_acc.shape().iter().zip(o.shape())) {
        if a != b {
            return Err(FlashAttnError::ShapeMismatch { argument: "o", axis, actual: *b, expected: *a, rule });
        }
    }
    let (batch, rows, nheads, _) = o.dim();
    for (name, (a, b)) in [("lse_acc", (lse_acc.dim(), (batch, nheads, rows))), ("lse", (lse.dim(), (batch, nheads, rows)))] {
        if a != b {
            return Err(FlashAttnError::InvalidArgument { argument: name, value: format!("shape {a:?}"), reason: rule });
        }
    }
    for b in 0..batch {
        for h in 0..nheads {
            for r in 0..rows {
                let (total, w_acc, w_part) = merge_lse(lse_acc[[b, h, r]], lse[[b, h, r]]);
                lse_acc[[b, h, r]] = total;
                let mut acc = o_acc.index_axis_mut(Axis(0), b);
                let mut acc = acc.index_axis_mut(Axis(0), r);
                let part = o.index_axis(Axis(0), b);
                let part = part.index_axis(Axis(0), r);
                for (x, &y) in acc.index_axis_mut(Axis(0), h).iter_mut().zip(part.index_axis(Axis(0), h)) {
                    // A zero weight adds nothing (never 0·inf of an unwritten row).
                    let from_acc = if w_acc == F::ZERO { F::ZERO } else { w_acc * *x };
                    let from_part = if w_part == F::ZERO { F::ZERO } else { w_part * y };
                    *x = from_acc + from_part;
                }
            }
        }
    }
    Ok(())
}
