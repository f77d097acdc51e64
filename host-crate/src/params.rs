//! The user-facing parameter types, imported by the API, the dispatch, the
//! CPU reference and the error type alike. Semantics are FlashAttention-2's
//! (`flash_attn_func` / `flash_attn_varlen_func`, ../shared/INFERENCE.md);
//! the window rule itself is written once in [`flash_attn_common::mask`].

use flash_attn_common::{AttnParams, LOG2_E};

/// Order of the two loops over query and key/value blocks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum LoopOrder {
    /// FlashAttention (Algorithm 1): K/V blocks outer, Q blocks inner; O, l
    /// and m go through HBM at every step. One thread block per head.
    Fa1,
    /// FlashAttention-2: Q blocks across the grid, K/V blocks inner, O on
    /// chip, one final `1/l`; writes the logsumexp.
    #[default]
    Fa2,
    /// Standard attention: S and P materialized in HBM (a scratch matrix of
    /// `batch·nheads·seqlen_q·seqlen_k` f32), the baseline.
    Standard,
}

/// User parameters of a forward pass (names as in `flash_attn_func`).
///
/// ```
/// use flash_attn::ForwardParams;
/// // Mistral's sliding window of 4096 tokens (vLLM maps W to (W − 1, 0)):
/// let p = ForwardParams { causal: true, window_left: Some(4095), ..Default::default() };
/// // Gemma 2's softcap:
/// let g = ForwardParams { causal: true, softcap: Some(50.0), ..Default::default() };
/// # let _ = (p, g);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ForwardParams {
    /// Causal mask, aligned to the bottom-right corner when
    /// `seqlen_q != seqlen_k` (query `i` sees keys `j <= i + seqlen_k - seqlen_q`).
    /// Equivalent to `window_right = Some(0)`.
    pub causal: bool,
    /// Scale of `QKᵀ` before the softmax; `None` means `1 / sqrt(headdim)`.
    pub softmax_scale: Option<f32>,
    /// Sliding window: query `i` sees key `j` iff
    /// `i + sk − sq − left ≤ j ≤ i + sk − sq + right`; `None` is unbounded on
    /// that side, and a side `≥ seqlen_k` (`max_seqlen_k` for varlen) too.
    /// With `causal`, `window_right` must be `None` or `Some(0)`.
    pub window_left: Option<usize>,
    /// The right side of the window (see `window_left`).
    pub window_right: Option<usize>,
    /// Softcap: scores become `cap · tanh(scale · q·k / cap)` before masks
    /// and bias (Gemma 2, Grok); `None` or `Some(0.0)` is off. Must be finite
    /// and ≥ 0.
    pub softcap: Option<f32>,
    /// FA2 (the default), FA1 or standard attention.
    pub loop_order: LoopOrder,
    /// `(Br, Bc)` query and key block sizes for FA1/FA2 (ignored by
    /// `Standard`); `None` picks the default for the head dim and device
    /// (see `dispatch`). A size whose tiles do not fit the device's shared
    /// memory is an error.
    pub block: Option<(usize, usize)>,
}

/// The shape of ALiBi slopes: `(nheads)` or `(batch, nheads)`, f32.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AlibiShape {
    /// One slope per query head, shared by the batch.
    PerHead,
    /// One slope per (sequence, query head), row-major.
    PerBatchHead,
}

impl AlibiShape {
    /// Slopes the shape holds for `batch` sequences of `nheads` heads.
    pub fn len(self, batch: usize, nheads: usize) -> usize {
        match self {
            AlibiShape::PerHead => nheads,
            AlibiShape::PerBatchHead => batch * nheads,
        }
    }

    /// Index step between sequences.
    pub fn batch_stride(self, nheads: usize) -> usize {
        match self {
            AlibiShape::PerHead => 0,
            AlibiShape::PerBatchHead => nheads,
        }
    }
}

/// The effective, validated options of one call: what every path (CPU
/// reference, f32 kernels, tensor cores) computes with.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Resolved {
    /// Natural-domain `softmax_scale`.
    pub softmax_scale: f32,
    /// Normalized window sides ([`flash_attn_common::UNBOUNDED`] = −1 for none).
    pub window_left: i32,
    /// The normalized right side of the window (−1 for none).
    pub window_right: i32,
    /// 0 = off.
    pub softcap: f32,
}

impl Resolved {
    /// The kernel parameter fields these options set (scale in both
    /// domains, window, softcap and its pre-factor); every other field at
    /// its default. One place for every launch path to start from.
    pub fn kernel_params(&self) -> AttnParams {
        AttnParams {
            softmax_scale: self.softmax_scale,
            softmax_scale_log2: self.softmax_scale * LOG2_E,
            window_left: self.window_left,
            window_right: self.window_right,
            softcap: self.softcap,
            softcap_pre: if self.softcap > 0.0 { self.softmax_scale / self.softcap } else { 0.0 },
            ..Default::default()
        }
    }

    /// Whether the window is plain causal (or unbounded): no left bound.
    pub fn has_left_bound(&self) -> bool {
        self.window_left >= 0
    }
}

/// `1 / sqrt(headdim)`, the default `softmax_scale`.
pub fn default_softmax_scale(headdim: usize) -> f32 {
    (1.0 / (headdim as f64).sqrt()) as f32
}
