//! The parameter block of every attention kernel, shared by the kernel crate
//! (which reads it) and the host (which fills it). Passed by value as the
//! kernel's only parameter (`.param .align 8 .b8 params[..]` in PTX).
//!
//! Tensors use the layout `(batch, seqlen, nheads, headdim)` with explicit
//! element strides for the first three axes; the head dimension is contiguous.

/// Parameters of one attention launch. Pointers are device addresses.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct AttnParams {
    pub q_ptr: u64,
    pub k_ptr: u64,
    pub v_ptr: u64,
    pub o_ptr: u64,
    /// FA2 and Standard: logsumexp (natural log), f32 `(batch, nheads,
    /// seqlen_q)` contiguous. FA1: `l_i`, f32, same layout.
    pub lse_ptr: u64,
    /// FA1: `m_i`, f32 `(batch, nheads, seqlen_q)`, in the base-2 units of
    /// [`crate::RowState`] (the maximum of `softmax_scale * LOG2_E * q·k`).
    /// Unused (0) otherwise.
    pub m_ptr: u64,
    /// Standard: the S/P scratch matrix, f32 `(batch, nheads, seqlen_q,
    /// seqlen_k)` contiguous (S is overwritten in place by P). Unused (0)
    /// otherwise.
    pub scratch_ptr: u64,
    /// FA1 on 16-bit inputs: the f32 running output `O` (same strides as
    /// `o`, contiguous `(batch, seqlen_q, nheads, headdim)`), so that the
    /// per-step rescaling does not round to 16 bits `Tc` times. 0 otherwise.
    pub o_accum_ptr: u64,
    /// Element strides `[batch, seqlen, head]` of q, k, v and o.
    pub q_stride: [u64; 3],
    pub k_stride: [u64; 3],
    pub v_stride: [u64; 3],
    pub o_stride: [u64; 3],
    pub batch: u32,
    pub nheads: u32,
    pub seqlen_q: u32,
    pub seqlen_k: u32,
    pub headdim: u32,
    /// 1 for causal masking (aligned bottom-right when `seqlen_q != seqlen_k`).
    pub causal: u32,
    /// `softmax_scale` (natural domain) and `softmax_scale * LOG2_E`.
    pub softmax_scale: f32,
    pub softmax_scale_log2: f32,
    /// Block sizes `Br` (query rows) and `Bc` (key rows) of this launch.
    pub br: u32,
    pub bc: u32,
}

impl AttnParams {
    /// Causal mask, bottom-right aligned as FlashAttention >= 2.1: query row
    /// `i` may see key column `j` iff `j <= i + seqlen_k - seqlen_q`.
    /// Returns the exclusive bound on visible key columns for query row `i`
    /// (may be <= 0: the row sees nothing and its output is 0).
    #[inline(always)]
    pub fn causal_key_limit(&self, i: u32) -> i64 {
        if self.causal != 0 {
            i as i64 + 1 + self.seqlen_k as i64 - self.seqlen_q as i64
        } else {
            self.seqlen_k as i64
        }
    }
}

/// Parameters of the row-wise online-softmax kernel `softmax_rows_f32`:
/// `y[r, :] = softmax(scale * x[r, :])` and `lse[r] = logsumexp(scale * x[r, :])`
/// over a contiguous row-major `rows x cols` f32 matrix.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct SoftmaxParams {
    pub x_ptr: u64,
    pub y_ptr: u64,
    pub lse_ptr: u64,
    pub rows: u32,
    pub cols: u32,
    /// `scale * LOG2_E`.
    pub scale_log2: f32,
    pub _pad: u32,
}

/// Warps per block of `softmax_rows_f32` (one row per warp).
pub const SOFTMAX_ROWS_PER_BLOCK: u32 = 4;
