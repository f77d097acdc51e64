//! The online softmax of FlashAttention, one row at a time.
//!
//! Scores enter already multiplied by `softmax_scale * LOG2_E`, so that
//! `exp(scale * s - m) == exp2(s2 - m2)` with `s2 = s * scale * log2(e)` and
//! `m2 = m * log2(e)`. The state of a row is the running maximum `m_i` (in that
//! base-2 domain) and the running sum `l_i = sum_j exp2(s2_j - m_i)`.
//!
//! Guards (seed 003): a row whose every score so far is `-inf` has
//! `m_i = -inf`; subtracting it would compute `-inf - -inf = NaN`, so the
//! maximum used for exponentiation is replaced by 0 ([`RowState::safe_max`]),
//! which makes every `exp2(-inf - 0)` an exact 0. A row that stays empty to the
//! end (`l_i == 0`) finalizes to output 0 and logsumexp `-inf`, never NaN.

use crate::real::Real;

/// log2(e), the factor folded into the softmax scale on the host.
pub const LOG2_E: f32 = core::f32::consts::LOG2_E;
/// ln(2), converts a base-2 logsumexp back to natural log.
pub const LN_2: f32 = core::f32::consts::LN_2;

/// Online-softmax state of one query row: `m_i` and `l_i` of the papers.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RowState<F> {
    /// Running maximum of the (base-2 scaled) scores seen so far.
    pub m: F,
    /// Running sum of `exp2(score - m)` over the scores seen so far.
    pub l: F,
}

impl<F: Real> Default for RowState<F> {
    fn default() -> Self {
        Self::new()
    }
}

impl<F: Real> RowState<F> {
    /// The empty row: `m = -inf`, `l = 0` (what FA1 initializes in HBM).
    #[inline(always)]
    pub fn new() -> Self {
        Self { m: F::NEG_INFINITY, l: F::ZERO }
    }

    /// The maximum to subtract before exponentiating: `m`, or 0 while the row
    /// has seen nothing but `-inf` (never compute `-inf - -inf`).
    #[inline(always)]
    pub fn safe_max(m: F) -> F {
        if m == F::NEG_INFINITY { F::ZERO } else { m }
    }

    /// Starts a new block whose row maximum is `block_max`: raises `m_i` to
    /// `max(m_i, block_max)`, rescales `l_i`, and returns `(alpha, m_safe)`:
    /// the factor the accumulated output row must be multiplied by
    /// (`exp2(m_old - m_new)`) and the maximum to subtract from this block's
    /// scores. The caller then adds the block's `exp2(s - m_safe)` with
    /// [`RowState::accumulate`].
    #[inline(always)]
    pub fn rescale(&mut self, block_max: F) -> (F, F) {
        let m_new = self.m.max_nan(block_max);
        let m_safe = Self::safe_max(m_new);
        let alpha = (self.m - m_safe).exp2();
        self.m = m_new;
        self.l = self.l * alpha;
        (alpha, m_safe)
    }

    /// Adds a block's row sum of `exp2(s - m_safe)`.
    #[inline(always)]
    pub fn accumulate(&mut self, block_sum: F) {
        self.l = self.l + block_sum;
    }

    /// One full step over a block of scores: rescale, then accumulate. Returns
    /// `(alpha, m_safe)` as [`RowState::rescale`] does.
    #[inline(always)]
    pub fn update(&mut self, scores: &[F]) -> (F, F) {
        let mut block_max = F::NEG_INFINITY;
        for &s in scores {
            block_max = block_max.max_nan(s);
        }
        let (alpha, m_safe) = self.rescale(block_max);
        let mut sum = F::ZERO;
        for &s in scores {
            sum = sum + (s - m_safe).exp2();
        }
        self.accumulate(sum);
        (alpha, m_safe)
    }

    /// Merges two partial states of the same row (FA1's update of `m_i`,
    /// `l_i` with a block's `m~_ij`, `l~_ij`; also the split-K combine of
    /// seed 003). Returns the merged state and the factors each side's
    /// unnormalized output must be multiplied by.
    #[inline(always)]
    pub fn merge(self, other: Self) -> (Self, F, F) {
        let m_new = self.m.max_nan(other.m);
        let m_safe = Self::safe_max(m_new);
        let a = (self.m - m_safe).exp2();
        let b = (other.m - m_safe).exp2();
        (Self { m: m_new, l: self.l * a + other.l * b }, a, b)
    }

    /// `1 / l_i`, or 0 for an empty row (all scores `-inf`), so that the
    /// output row becomes 0 instead of NaN. A NaN `l_i` (NaN in the inputs)
    /// stays NaN: NaN is propagated, never hidden.
    #[inline(always)]
    pub fn inv_l(&self) -> F {
        if self.l == F::ZERO { F::ZERO } else { F::ONE / self.l }
    }

    /// The natural-log logsumexp of the row's *unscaled-by-log2e* scores:
    /// `(m + log2 l) * ln 2`, or `-inf` for an empty row (NaN stays NaN).
    #[inline(always)]
    pub fn lse(&self) -> F {
        if self.l == F::ZERO {
            F::NEG_INFINITY
        } else {
            (self.m + self.l.log2()) * F::LN_2
        }
    }
}
