//! The compact parameter block of the flash-decoding kernels' `_c` entries.
//!
//! A kernel launch with a parameter block over ~184 bytes costs the H100
//! 0.3–0.85 µs more than one at or under it (`scripts/microbench/decode_stream.cu`,
//! docs/perf-notes.md decode step 17: 16–184 bytes 3.1–3.3 µs event time for an
//! empty grid, 200–232 bytes +0.3, 264 bytes and more +0.7–0.85). [`AttnParams`]
//! is 336 bytes. A decode step is 17–60 µs at batch 1, so the common KV-cache
//! call — no ALiBi, softcap, varlen q, `seqused_k`, `cache_batch_idx` or
//! timeline, strides and sizes that fit 32 / 16 bits — passes this 184-byte
//! block instead and the kernel rebuilds the full [`AttnParams`] from it
//! ([`DecodeParams::to_attn`]): the same values, so the same kernel body,
//! the same bits.

use crate::AttnParams;

/// The fields of an [`AttnParams`] a plain KV-cache call sets (see the
/// module docs). `#[repr(C)]`, 184 bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DecodeParams {
    pub q_ptr: u64,
    pub k_ptr: u64,
    pub v_ptr: u64,
    pub o_ptr: u64,
    pub lse_ptr: u64,
    pub o_accum_ptr: u64,
    pub lse_accum_ptr: u64,
    pub split_counter_ptr: u64,
    pub cache_seqlens_ptr: u64,
    pub block_table_ptr: u64,
    /// `q_stride`, `k_stride`, `v_stride`, `o_stride` in this order.
    pub strides: [u32; 12],
    pub batch: u32,
    pub seqlen_q: u32,
    pub seqlen_k: u32,
    pub cache_batch: u32,
    pub seqlen_new: u32,
    pub block_table_stride: u32,
    pub num_pages: u32,
    pub softmax_scale: f32,
    pub softmax_scale_log2: f32,
    pub window_left: i32,
    pub window_right: i32,
    pub nheads: u16,
    pub nheads_k: u16,
    pub headdim: u16,
    /// Bit 0: `causal`; bits 1–2: `split_tickets` (its two bits).
    pub flags: u16,
    pub page_size: u16,
    pub num_splits: u16,
}

/// Bytes of [`DecodeParams`] (at most the 184 that launch without the
/// large-parameter cost).
pub const DECODE_PARAMS_BYTES: usize = core::mem::size_of::<DecodeParams>();
const _: () = assert!(DECODE_PARAMS_BYTES <= 184);

impl DecodeParams {
    /// The compact block of `p`, or `None` when `p` sets a field the block
    /// does not carry (ALiBi, softcap, varlen q/k, `seqused_k`,
    /// `cache_batch_idx`, FA1's `m`, a timeline, fused new k/v) or a value that does not
    /// fit (a stride ≥ 2³², a head count, head dim, page size or split
    /// count ≥ 2¹⁶), or `br`/`bc` other than the kernel's `br`, `bc`.
    /// [`DecodeParams::to_attn`] with the same `br`, `bc` gives `p` back.
    pub fn from_attn(p: &AttnParams, br: u32, bc: u32) -> Option<Self> {
        let unsupported = p.m_ptr != 0
            || p.scratch_ptr != 0
            || p.alibi_ptr != 0
            || p.alibi_batch_stride != 0
            || p.cu_seqlens_q_ptr != 0
            || p.cu_seqlens_k_ptr != 0
            || p.seqused_k_ptr != 0
            || p.total_q != 0
            || p.total_k != 0
            || p.cache_batch_idx_ptr != 0
            || p.knew_ptr != 0
            || p.vnew_ptr != 0
            || p.softcap.to_bits() != 0
            || p.softcap_pre.to_bits() != 0
            || p.br != br
            || p.bc != bc;
        if unsupported {
            return None;
        }
        let mut strides = [0u32; 12];
        for (i, s) in p.q_stride.iter().chain(&p.k_stride).chain(&p.v_stride).chain(&p.o_stride).enumerate() {
            strides[i] = u32::try_from(*s).ok()?;
        }
        let u16_of = |x: u32| u16::try_from(x).ok();
        Some(Self {
            q_ptr: p.q_ptr,
            k_ptr: p.k_ptr,
            v_ptr: p.v_ptr,
            o_ptr: p.o_ptr,
            lse_ptr: p.lse_ptr,
            o_accum_ptr: p.o_accum_ptr,
            lse_accum_ptr: p.lse_accum_ptr,
            split_counter_ptr: p.split_counter_ptr,
            cache_seqlens_ptr: p.cache_seqlens_ptr,
            block_table_ptr: p.block_table_ptr,
            strides,
            batch: p.batch,
            seqlen_q: p.seqlen_q,
            seqlen_k: p.seqlen_k,
            cache_batch: p.cache_batch,
            seqlen_new: p.seqlen_new,
            block_table_stride: p.block_table_stride,
            num_pages: p.num_pages,
            softmax_scale: p.softmax_scale,
            softmax_scale_log2: p.softmax_scale_log2,
            window_left: p.window_left,
            window_right: p.window_right,
            nheads: u16_of(p.nheads)?,
            nheads_k: u16_of(p.nheads_k)?,
            headdim: u16_of(p.headdim)?,
            flags: if p.causal > 1 || p.split_tickets > 3 { return None } else { (p.causal | p.split_tickets << 1) as u16 },
            page_size: u16_of(p.page_size)?,
            num_splits: u16_of(p.num_splits)?,
        })
    }

    /// The full parameter block: the carried fields, `br`/`bc` as given
    /// (the kernel's own), every other field 0 (off).
    #[inline(always)]
    pub fn to_attn(&self, br: u32, bc: u32) -> AttnParams {
        let s = |i: usize| [self.strides[i] as u64, self.strides[i + 1] as u64, self.strides[i + 2] as u64];
        AttnParams {
            q_ptr: self.q_ptr,
            k_ptr: self.k_ptr,
            v_ptr: self.v_ptr,
            o_ptr: self.o_ptr,
            lse_ptr: self.lse_ptr,
            o_accum_ptr: self.o_accum_ptr,
            q_stride: s(0),
            k_stride: s(3),
            v_stride: s(6),
            o_stride: s(9),
            batch: self.batch,
            nheads: self.nheads as u32,
            seqlen_q: self.seqlen_q,
            seqlen_k: self.seqlen_k,
            headdim: self.headdim as u32,
            causal: (self.flags & 1) as u32,
            softmax_scale: self.softmax_scale,
            softmax_scale_log2: self.softmax_scale_log2,
            br,
            bc,
            nheads_k: self.nheads_k as u32,
            window_left: self.window_left,
            window_right: self.window_right,
            cache_seqlens_ptr: self.cache_seqlens_ptr,
            cache_batch: self.cache_batch,
            seqlen_new: self.seqlen_new,
            block_table_ptr: self.block_table_ptr,
            block_table_stride: self.block_table_stride,
            page_size: self.page_size as u32,
            num_pages: self.num_pages,
            num_splits: self.num_splits as u32,
            lse_accum_ptr: self.lse_accum_ptr,
            split_counter_ptr: self.split_counter_ptr,
            split_tickets: (self.flags >> 1 & 3) as u32,
            ..AttnParams::default()
        }
    }
}
