//! The parameter block of the backward kernels (recomputation, seed 000
//! §3.2; `../shared/BACKWARD.md`), shared by the kernel crate and the host.
//!
//! The forward's own block ([`AttnParams`]) describes q, k, v, o, the masks,
//! softcap, ALiBi, GQA and varlen exactly as in the forward; the fields here
//! add the gradients and the scratch of the backward pass. Every f32 row
//! buffer (`delta`, the LSE, FA1's `l`/`m`) is indexed like the forward's
//! LSE: `SeqInfo::lse_base + row` (dense `(batch, nheads, seqlen_q)`, varlen
//! `(nheads, total_q)`); the f32 dQ accumulator is that index times `headdim`
//! plus the column.
//!
//! Owned by the backward host module (`host-crate`), which may append
//! fields; the kernels read only what they document.

use crate::params::AttnParams;

/// Parameters of one backward launch (preprocess, main kernel, dQ pass).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BwdParams {
    /// The forward's block: q, k, v, o (`o_ptr` = the forward's output),
    /// strides, shapes, masks, features, varlen; `lse_ptr` = the forward's
    /// logsumexp (FA2 order) or `l_i` (FA1 order, base-2 units of
    /// [`crate::RowState`]), `m_ptr` = FA1's `m_i`.
    pub fwd: AttnParams,
    /// `dO`, same shape as `o`, element strides `[batch, seqlen, head]`.
    pub do_ptr: u64,
    pub do_stride: [u64; 3],
    /// Gradients out: `dQ` like q, `dK`/`dV` like k/v (`nheads_k` heads).
    pub dq_ptr: u64,
    pub dq_stride: [u64; 3],
    pub dk_ptr: u64,
    pub dk_stride: [u64; 3],
    pub dv_ptr: u64,
    pub dv_stride: [u64; 3],
    /// f32 `D_i = rowsum(dO_i ∘ O_i)`, indexed like the LSE.
    pub delta_ptr: u64,
    /// f32 dQ accumulator (`lse index · headdim + column`), zeroed by the
    /// preprocess kernel; 0 where a kernel writes dQ directly.
    pub dq_accum_ptr: u64,
    /// Deterministic mode: u32 per (Q block, batch·head) ordering the dQ
    /// additions (zeroed by the preprocess kernel); 0 = atomics in any order.
    pub dq_semaphore_ptr: u64,
    /// 1: deterministic (same bits every run).
    pub deterministic: u32,
    /// Launch-specific block sizes of the backward (may differ from
    /// `fwd.br`/`fwd.bc`, which describe nothing here).
    pub br: u32,
    pub bc: u32,
    pub _pad: u32,
}

impl Default for BwdParams {
    fn default() -> Self {
        Self {
            fwd: AttnParams::default(),
            do_ptr: 0,
            do_stride: [0; 3],
            dq_ptr: 0,
            dq_stride: [0; 3],
            dk_ptr: 0,
            dk_stride: [0; 3],
            dv_ptr: 0,
            dv_stride: [0; 3],
            delta_ptr: 0,
            dq_accum_ptr: 0,
            dq_semaphore_ptr: 0,
            deterministic: 0,
            br: 0,
            bc: 0,
            _pad: 0,
        }
    }
}
