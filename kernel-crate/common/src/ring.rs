//! Context-parallel (ring) attention: the exact merge of two partial
//! attentions over disjoint key sets, written once for the host (the CPU
//! simulation of `host-crate/src/context_parallel`) and the GPU (the
//! `ring_merge_*` kernels), and the parameter block of those kernels.
//!
//! A partial `(O_a, LSE_a)` is attention of a query row over key set `A`
//! (`O_a` normalized over `A`, `LSE_a = ln Σ_{j∈A} exp(s_j)`). Over `A ∪ B`
//! (disjoint): `LSE = ln(exp(LSE_a) + exp(LSE_b))` and
//! `O = exp(LSE_a − LSE)·O_a + exp(LSE_b − LSE)·O_b`, seed 003's split-K
//! combine with two splits (ring-flash-attention writes the same as
//! `O ← O − sigmoid(LSE_b − LSE)·(O − O_b)`).

use crate::Real;

/// The merged logsumexp and the weights of the two partials:
/// `(LSE, w_a, w_b)` with `O = w_a·O_a + w_b·O_b`.
///
/// Computed from the larger of the two (`M = max(LSE_a, LSE_b)`,
/// `LSE = M + ln(1 + exp(min − M))`), so nothing overflows. A side with
/// `LSE = −inf` (a row that saw no key of that set) gets weight 0 and the
/// other side weight 1; both `−inf` gives `(−inf, 0, 0)`: never
/// `−inf − −inf`, never NaN.
#[inline(always)]
pub fn merge_lse<F: Real>(lse_a: F, lse_b: F) -> (F, F, F) {
    if lse_a == F::NEG_INFINITY {
        let w_b = if lse_b == F::NEG_INFINITY { F::ZERO } else { F::ONE };
        return (lse_b, F::ZERO, w_b);
    }
    if lse_b == F::NEG_INFINITY {
        return (lse_a, F::ONE, F::ZERO);
    }
    let (m, lo) = if lse_a >= lse_b { (lse_a, lse_b) } else { (lse_b, lse_a) };
    let lse = m + (F::ONE + (lo - m).exp()).ln();
    (lse, (lse_a - lse).exp(), (lse_b - lse).exp())
}

/// What a `ring_merge_*` launch does with its rows.
pub mod merge_mode {
    /// `acc[row0 + r] = part[r]` (the first partial of a row).
    pub const INIT: u32 = 0;
    /// `acc[row0 + r] = merge(acc[row0 + r], part[r])` ([`super::merge_lse`]).
    pub const MERGE: u32 = 1;
    /// `out[r] = acc[r]` rounded to the element type, every row of `acc`
    /// (`rows = seqlen_acc`, `row0 = 0`; `part` unused).
    pub const FINALIZE: u32 = 2;
    /// `acc[row0 + r] = part[r]` as plain f32 sums, no LSE (a gradient's
    /// first partial: the ring's backward; `lse_*` unused).
    pub const COPY: u32 = 3;
    /// `acc[row0 + r] += part[r]`, no LSE (the gradients' partials of the
    /// ring's backward summed in f32).
    pub const ADD: u32 = 4;

    /// Whether `mode` weighs its rows by their LSEs (and writes `lse_acc`).
    #[inline(always)]
    pub fn uses_lse(mode: u32) -> bool {
        mode == INIT || mode == MERGE
    }
}

/// Parameters of `ring_merge_{f16,bf16}`: one warp per (batch, head, row)
/// of the partial, four columns per lane.
///
/// Layouts (all contiguous): the accumulator `o_acc` f32 `(batch,
/// seqlen_acc, nheads, headdim)` and `lse_acc` f32 `(batch, nheads,
/// seqlen_acc)`; the partial `o_part` (16-bit) `(batch, rows, nheads,
/// headdim)` and `lse_part` f32 `(batch, nheads, rows)`, covering
/// accumulator rows `row0..row0 + rows`; `out` (16-bit) like `o_acc`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct RingMergeParams {
    pub o_acc_ptr: u64,
    pub lse_acc_ptr: u64,
    pub o_part_ptr: u64,
    pub lse_part_ptr: u64,
    pub out_ptr: u64,
    pub batch: u32,
    pub nheads: u32,
    pub headdim: u32,
    pub seqlen_acc: u32,
    pub rows: u32,
    pub row0: u32,
    /// One of [`merge_mode`].
    pub mode: u32,
    pub _pad: u32,
}

/// Warps per block of `ring_merge_*`.
pub const RING_MERGE_WARPS: u32 = 4;
