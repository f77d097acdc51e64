//! The option rules of FlashAttention-2 (`softmax_scale`, softcap, the
//! window and its causal form): [`ForwardParams::resolve`]. Imports only the
//! parameter and error types, so the CPU reference validates through the
//! same rules.

use flash_attn_common::mask::normalize_window;

use crate::error::{FlashAttnError, Result};
use crate::params::{ForwardParams, Resolved, default_softmax_scale};

impl ForwardParams {
    /// Validates the options and normalizes them for a call whose sequences
    /// have at most `max_seqlen_k` keys (FlashAttention-2's rules).
    pub fn resolve(&self, headdim: usize, max_seqlen_k: usize) -> Result<Resolved> {
        let softmax_scale = self.softmax_scale.unwrap_or_else(|| default_softmax_scale(headdim));
        if !softmax_scale.is_finite() {
            return Err(FlashAttnError::InvalidSoftmaxScale { value: softmax_scale });
        }
        let softcap = self.softcap.unwrap_or(0.0);
        if !softcap.is_finite() || softcap < 0.0 {
            return Err(FlashAttnError::InvalidArgument {
                argument: "softcap",
                value: format!("{softcap}"),
                reason: "must be a finite number ≥ 0 (0 = off)",
            });
        }
        if self.causal && matches!(self.window_right, Some(r) if r != 0) {
            return Err(FlashAttnError::InvalidArgument {
                argument: "window_right",
                value: format!("{:?}", self.window_right),
                reason: "causal attention sees no key to the right of the diagonal: use None or Some(0) with causal = true",
            });
        }
        let (window_left, window_right) = normalize_window(self.causal, self.window_left, self.window_right, max_seqlen_k);
        Ok(Resolved { softmax_scale, window_left, window_right, softcap })
    }

    /// Whether any inference feature beyond causal is on (window, softcap).
    pub fn has_window_or_softcap(&self) -> bool {
        self.window_left.is_some() || self.window_right.is_some() || self.softcap.is_some_and(|c| c != 0.0)
    }
}
