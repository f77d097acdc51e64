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
#[derive(Clone, Copy, Debug, Default, PartialEq)]
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

/// Dynamic shared memory of the f32 backward kernels (`bwd_fa2_f32`,
/// `bwd_fa1_f32`) for blocks `Br × Bc` and head dim `d`, in f32 elements:
/// `K_j`, `V_j` and the on-chip accumulators `dK_j`, `dV_j` (Bc × d each),
/// `Q_i`, `dO_i` (Br × d), `P_ij` (overwritten by `dS_ij`) and the softcap
/// factor `1 − tanh²` (Br × Bc each), and per query row the base-2 LSE and
/// `D_i`. Computed by the same code on the host (launch size, fit check)
/// and the GPU (tile offsets). Saturating arithmetic, as `Fa2Smem`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BwdSmem {
    /// Row stride of the `d`-wide tiles.
    pub d_stride: usize,
    /// Row stride of the `Bc`-wide tiles.
    pub s_stride: usize,
    pub k: usize,
    pub v: usize,
    pub dk: usize,
    pub dv: usize,
    pub q: usize,
    pub do_: usize,
    pub p: usize,
    pub cap: usize,
    pub lse: usize,
    pub delta: usize,
    /// Total f32 elements.
    pub floats: usize,
}

impl BwdSmem {
    #[inline(always)]
    pub const fn new(br: usize, bc: usize, d: usize) -> Self {
        use crate::smem_layout::padded_stride;
        let d_stride = padded_stride(d);
        let s_stride = padded_stride(bc);
        let kv_tile = bc.saturating_mul(d_stride);
        let q_tile = br.saturating_mul(d_stride);
        let s_tile = br.saturating_mul(s_stride);
        let k = 0;
        let v = k + kv_tile;
        let dk = v.saturating_add(kv_tile);
        let dv = dk.saturating_add(kv_tile);
        let q = dv.saturating_add(kv_tile);
        let do_ = q.saturating_add(q_tile);
        let p = do_.saturating_add(q_tile);
        let cap = p.saturating_add(s_tile);
        let lse = cap.saturating_add(s_tile);
        let delta = lse.saturating_add(br);
        let floats = delta.saturating_add(br);
        Self { d_stride, s_stride, k, v, dk, dv, q, do_, p, cap, lse, delta, floats }
    }

    /// Bytes of dynamic shared memory.
    #[inline(always)]
    pub const fn bytes(&self) -> usize {
        crate::smem_layout::f32_bytes(self.floats)
    }
}

/// Query blocks `Tr = ceil(seqlen_q / br)` of a launch (`seqlen_q` the
/// maximum for varlen): the semaphores are `Tr · batch · nheads` u32, index
/// `(b · nheads + h) · Tr + i`.
#[inline(always)]
pub const fn semaphore_count(p: &BwdParams) -> usize {
    let tr = (p.fwd.seqlen_q as usize).div_ceil(if p.br == 0 { 1 } else { p.br as usize });
    tr.saturating_mul(p.fwd.batch as usize).saturating_mul(p.fwd.nheads as usize)
}
