//! The score of one (query row, key) pair in the f32 kernels: scale,
//! softcap and ALiBi in the base-2 domain, from the launch's parameters
//! (the semantics are `flash_attn_common::mask`'s, which the CPU reference
//! runs in the natural domain).

use flash_attn_common::{AttnParams, LOG2_E, Real};

/// Base-2 score of `acc = q·k` for one (sequence, head).
#[derive(Clone, Copy)]
pub struct ScoreFn {
    /// `softmax_scale · log2 e` (no softcap).
    pub scale_log2: f32,
    /// Softcap: `cap·log2 e · tanh(acc · scale / cap)`; `cap_post == 0` = off.
    pub cap_pre: f32,
    pub cap_post: f32,
    /// ALiBi slope × log2 e (0 = off).
    pub slope_log2: f32,
    /// `seqlen_k − seqlen_q` of the sequence (query `i` sits at key `i + shift`).
    pub shift: i64,
}

impl ScoreFn {
    /// # Safety
    /// `p.alibi_ptr`, if set, holds the slopes of the documented shape.
    #[inline(always)]
    pub unsafe fn new(p: &AttnParams, b: usize, h: usize, shift: i64) -> Self {
        Self {
            scale_log2: p.softmax_scale_log2,
            cap_pre: p.softcap_pre,
            cap_post: p.softcap * LOG2_E,
            // SAFETY: caller.
            slope_log2: unsafe { p.alibi_slope_log2(b as u32, h as u32) },
            shift,
        }
    }

    /// The base-2 score of query row `i`, key `j`.
    #[inline(always)]
    pub fn apply(&self, acc: f32, i: usize, j: usize) -> f32 {
        let mut y = if self.cap_post != 0.0 { self.cap_post * (acc * self.cap_pre).tanh() } else { acc * self.scale_log2 };
        if self.slope_log2 != 0.0 {
            let d = i as i64 + self.shift - j as i64;
            y -= self.slope_log2 * d.unsigned_abs() as f32;
        }
        y
    }
}
