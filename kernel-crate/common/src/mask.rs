//! Which keys a query row sees, and how its scores are modified before the
//! softmax: FlashAttention-2's causal / sliding-window / softcap / ALiBi
//! semantics (`../shared/INFERENCE.md`), written once for the GPU kernels and
//! the host (CPU reference, validation, dispatch).
//!
//! For one sequence with `seqlen_q` queries and `seqlen_k` keys, queries are
//! aligned to the bottom-right corner: query `i` sits at key position
//! `c = i + seqlen_k − seqlen_q`. With a window `(left, right)` it sees key `j`
//! iff `c − left ≤ j ≤ c + right` (a negative bound is unbounded on that side),
//! and always `0 ≤ j < seqlen_k`. Causal is the window `(left, 0)`.
//!
//! Both ends of the visible range grow (weakly) with `i`: for a block of rows
//! `r0..r1` the union of their ranges is `[lo(r0), hi(r1 − 1))` and the keys
//! every row sees are `[lo(r1 − 1), hi(r0))`; the kernels skip blocks outside
//! the first and mask only blocks not inside the second.

use crate::Real;

/// The value of an unbounded window side in [`KeyWindow`] and `AttnParams`.
pub const UNBOUNDED: i32 = -1;

/// FlashAttention-2's normalization of `(causal, window_left, window_right)`
/// for a call whose sequences have at most `max_seqlen_k` keys (the API's
/// `seqlen_k`, or `max_seqlen_k` for varlen): causal forces `right = 0`; a
/// side `≥ max_seqlen_k` is unbounded (as `flash_api.cpp` does). Returns
/// `(left, right)` with [`UNBOUNDED`] for an unbounded side.
pub fn normalize_window(causal: bool, left: Option<usize>, right: Option<usize>, max_seqlen_k: usize) -> (i32, i32) {
    let side = |w: Option<usize>| match w {
        Some(w) if w < max_seqlen_k && w <= i32::MAX as usize => w as i32,
        _ => UNBOUNDED,
    };
    let right = if causal { 0 } else { side(right) };
    (side(left), right)
}

/// The visible-key rule of one sequence (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KeyWindow {
    /// `seqlen_k − seqlen_q`: query `i` sits at key position `i + shift`.
    pub shift: i64,
    pub seqlen_k: i64,
    /// Window sides, [`UNBOUNDED`] (negative) for none.
    pub left: i32,
    pub right: i32,
}

impl KeyWindow {
    #[inline(always)]
    pub fn new(seqlen_q: u32, seqlen_k: u32, left: i32, right: i32) -> Self {
        Self { shift: seqlen_k as i64 - seqlen_q as i64, seqlen_k: seqlen_k as i64, left, right }
    }

    /// Whether any key can be masked at all (a window side is bounded).
    #[inline(always)]
    pub fn is_windowed(&self) -> bool {
        self.left >= 0 || self.right >= 0
    }

    /// First visible key of row `i` (may exceed `seqlen_k`: nothing visible).
    #[inline(always)]
    pub fn lo(&self, i: i64) -> i64 {
        if self.left < 0 { 0 } else { (i + self.shift - self.left as i64).max(0) }
    }

    /// One past the last visible key of row `i` (may be ≤ 0: nothing visible).
    #[inline(always)]
    pub fn hi(&self, i: i64) -> i64 {
        if self.right < 0 { self.seqlen_k } else { (i + self.shift + self.right as i64 + 1).min(self.seqlen_k) }
    }

    /// Whether row `i` sees key `j`.
    #[inline(always)]
    pub fn visible(&self, i: i64, j: i64) -> bool {
        j >= self.lo(i) && j < self.hi(i)
    }

    /// Keys any row of `r0..r1` (`r1 > r0`) sees: `[start, end)`, clamped to
    /// `0..=seqlen_k` (empty when `start >= end`).
    #[inline(always)]
    pub fn block_range(&self, r0: i64, r1: i64) -> (i64, i64) {
        let end = self.hi(r1 - 1).max(0);
        (self.lo(r0).min(end), end)
    }

    /// Keys every row of `r0..r1` sees: `[start, end)` (empty when
    /// `start >= end`); a key block inside it needs no mask.
    #[inline(always)]
    pub fn unmasked_range(&self, r0: i64, r1: i64) -> (i64, i64) {
        (self.lo(r1 - 1), self.hi(r0))
    }
}

/// Score modifiers after `scale · q·k`, in the natural domain: softcap
/// (`cap · tanh(s / cap)`, 0 = off) then ALiBi (`− slope · |i + shift − j|`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ScoreMod<F> {
    pub softcap: F,
    pub alibi_slope: F,
}

impl<F: Real> ScoreMod<F> {
    pub fn none() -> Self {
        Self { softcap: F::ZERO, alibi_slope: F::ZERO }
    }

    /// The modified score of `s = scale·q·k` for a query at key position
    /// `pos = i + shift` and key `j`.
    #[inline(always)]
    pub fn apply(&self, s: F, pos: i64, j: i64) -> F {
        let s = if self.softcap > F::ZERO { self.softcap * (s / self.softcap).tanh() } else { s };
        if self.alibi_slope == F::ZERO {
            s
        } else {
            let dist = if pos > j { pos - j } else { j - pos };
            s - self.alibi_slope * F::from_f64(dist as f64)
        }
    }
}
