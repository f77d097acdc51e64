//! The parameter block of every attention kernel, shared by the kernel crate
//! (which reads it) and the host (which fills it). Passed by value as the
//! kernel's only parameter (`.param .align 8 .b8 params[..]` in PTX).
//!
//! Tensors use the layout `(batch, seqlen, nheads, headdim)` with explicit
//! element strides for the first three axes; the head dimension is contiguous.

/// Parameters of one attention launch. Pointers are device addresses.
/// `Default` is all zeros (features off) but for the window sides, which
/// are [`crate::mask::UNBOUNDED`].
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
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
    /// seqlen_k)` contiguous (S is overwritten in place by P).
    /// Flash-decoding kernels: an optional per-block timeline,
    /// `tc::timeline::WORDS` u64 per block (see [`crate::tc::timeline`]). Unused (0)
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
    // ---- inference features (../shared/INFERENCE.md; zero = off) ----------
    /// Heads of k and v (GQA/MQA): query head `h` reads KV head
    /// `h / (nheads / nheads_k)`. Equal to `nheads` for MHA.
    pub nheads_k: u32,
    /// Window sides after [`crate::mask::normalize_window`] ([`crate::mask::UNBOUNDED`]
    /// = −1 for none; causal has `window_right == 0`).
    pub window_left: i32,
    pub window_right: i32,
    /// Softcap `cap` (0 = off): the kernels compute
    /// `cap·log2(e)·tanh(q·k · softcap_pre)` with `softcap_pre = scale/cap`.
    pub softcap: f32,
    pub softcap_pre: f32,
    /// ALiBi: f32 slopes, `slope(b, h) = alibi_ptr[b·alibi_batch_stride + h]`
    /// (`alibi_batch_stride` 0 for slopes of shape `(nheads)`); 0 = off.
    pub alibi_ptr: u64,
    pub alibi_batch_stride: u32,
    /// Varlen (packed batches): 0 = dense. Otherwise q/o rows of sequence `b`
    /// are `cu_seqlens_q[b]..cu_seqlens_q[b+1]` (i32 device arrays of
    /// `batch + 1` prefix sums; the batch stride is unused), likewise k/v
    /// with `cu_seqlens_k`; `seqlen_q`/`seqlen_k` hold the maxima (grid size
    /// only). The kernels clamp every value they read to `0..=total_q` /
    /// `0..=total_k` (and a sequence's length to the maximum), so device
    /// content the host cannot check never makes them read or write out of
    /// bounds. LSE is unpadded `(nheads, total_q)`.
    pub cu_seqlens_q_ptr: u64,
    pub cu_seqlens_k_ptr: u64,
    /// Optional (0 = none): keys actually used per sequence, i32 `(batch)`,
    /// clamped to the sequence's segment.
    pub seqused_k_ptr: u64,
    /// Rows in the q/o (`total_q`) and k/v (`total_k`) buffers (varlen).
    pub total_q: u32,
    pub total_k: u32,
    // ---- decode (KV cache, paged KV, split-KV); 0 = off -------------------
    /// KV cache: i32 `(batch)` keys already in the cache per sequence; the
    /// sequence attends to `cache_seqlens[b] + seqlen_new` keys (clamped to
    /// the capacity `seqlen_k`). Replaces `cu_seqlens_k`.
    pub cache_seqlens_ptr: u64,
    /// Optional i32 `(batch)`: the cache row (`k_stride[0]` steps) of
    /// sequence `b` (clamped to `0..cache_batch`).
    pub cache_batch_idx_ptr: u64,
    pub cache_batch: u32,
    /// New keys appended before this launch (`k_new` rows), counted in.
    pub seqlen_new: u32,
    /// Paged KV: i32 `(batch, block_table_stride)` page indices (clamped to
    /// `0..num_pages`); key `t` of sequence `b` is row `t % page_size` of page
    /// `block_table[b][t / page_size]` (`k_stride[0]` = page stride,
    /// `k_stride[1]` = row stride inside a page).
    pub block_table_ptr: u64,
    pub block_table_stride: u32,
    pub page_size: u32,
    pub num_pages: u32,
    /// Split-KV: the key range of each (Q block, head) is cut into
    /// `num_splits` parts; with more than one, each part writes its
    /// normalized O (f32 `(splits, batch, nheads, seqlen_q, d_kernel)` at
    /// `o_accum_ptr`) and LSE (f32 `(splits, batch, nheads, seqlen_q)` at
    /// `lse_accum_ptr`) for the combine kernel. 0 or 1 = no split.
    pub num_splits: u32,
    pub lse_accum_ptr: u64,
    /// Split-KV in the flash-decoding kernels: one u32 per (Q block, head)
    /// tile (`grid / num_splits` of them), zero at launch. The last split
    /// of a tile to finish merges the tile's partials itself (no combine
    /// launch) and puts the count back to 0 for the next launch. 0: the
    /// combine kernel runs after the launch.
    pub split_counter_ptr: u64,
    /// Split-KV with the fused combine (`split_counter_ptr` set): 1 hands a
    /// tile's key blocks to its splits one at a time, from a ticket count
    /// in the high 16 bits of the tile's counter (split `s` of `ns` takes
    /// blocks `s + i·ns` for `i ≤ S` (its stages), then the block of each
    /// ticket it draws, in order), so splits on faster SMs take more blocks;
    /// the result is the same up to the order of the sums (not bitwise
    /// reproducible). Bit 0 clear: each split takes a fixed share — over a
    /// contiguous cache, and over pages when bit 1 ([`INTERLEAVE_PAGED`])
    /// is set, blocks `s + i·ns`; over other pages a contiguous run. The
    /// host sets bit 0 only when the count fits 16 bits
    /// ([`MAX_TICKET_BLOCKS`]) and for kernels built with the schedule,
    /// bit 1 on devices where the interleaved order pays over pages of at
    /// least a key block (decode step 38).
    pub split_tickets: u32,
    /// KV cache with the append fused into the flash-decoding kernel
    /// (`knew_ptr` set): rows `cache_seqlens[b]..` + `seqlen_new` of sequence
    /// `b` come from `knew`/`vnew` `(batch, seqlen_new, nheads_k, d)` (strides
    /// `knew_stride`/`vnew_stride`) instead of the cache, and the first tile
    /// of each KV head (query block 0, the first query head of its group)
    /// writes them to the cache as it copies them (rows past the capacity
    /// neither read nor written). 0: the new rows are in the cache already.
    pub knew_ptr: u64,
    pub vnew_ptr: u64,
    pub knew_stride: [u64; 3],
    pub vnew_stride: [u64; 3],
    /// FP8 (e4m3) inputs: f32 dequantization scales, `k = k_descale ·
    /// e4m3(k)`. The `_e4m3` flash-decoding kernels (K and V caches): the
    /// scale of KV head `h` at `h · descale_head_stride` (0: one scale per
    /// tensor, 1: one per KV head). The FP8 prefill kernels (q, k and v,
    /// FA3's `(batch, nheads_k)` scales): the scale of (sequence `b`, KV
    /// head `h`) at `b · descale_batch_stride + h · descale_head_stride`; a
    /// null pointer reads as 1. 0 for 16-bit inputs.
    pub k_descale_ptr: u64,
    pub v_descale_ptr: u64,
    pub descale_head_stride: u32,
    pub descale_batch_stride: u32,
    pub q_descale_ptr: u64,
}

/// [`AttnParams::split_tickets`] bit 1: fixed split shares interleaved over
/// a paged cache too (the H100: 1–1.5% faster over 256-token pages; the
/// H200, whose blocks stream faster than each one's page lookup returns:
/// 6–7% slower; decode step 38).
pub const INTERLEAVE_PAGED: u32 = 2;

/// Key blocks plus tickets drawn past the end (two per split) that the
/// ticket schedule ([`AttnParams::split_tickets`]) can count: the count
/// lives in the high 16 bits of a tile's counter.
pub const MAX_TICKET_BLOCKS: u32 = (1 << 16) - 1;

impl Default for AttnParams {
    fn default() -> Self {
        Self {
            q_ptr: 0,
            k_ptr: 0,
            v_ptr: 0,
            o_ptr: 0,
            lse_ptr: 0,
            m_ptr: 0,
            scratch_ptr: 0,
            o_accum_ptr: 0,
            q_stride: [0; 3],
            k_stride: [0; 3],
            v_stride: [0; 3],
            o_stride: [0; 3],
            batch: 0,
            nheads: 0,
            seqlen_q: 0,
            seqlen_k: 0,
            headdim: 0,
            causal: 0,
            softmax_scale: 0.0,
            softmax_scale_log2: 0.0,
            br: 0,
            bc: 0,
            nheads_k: 0,
            window_left: crate::mask::UNBOUNDED,
            window_right: crate::mask::UNBOUNDED,
            softcap: 0.0,
            softcap_pre: 0.0,
            alibi_ptr: 0,
            alibi_batch_stride: 0,
            cu_seqlens_q_ptr: 0,
            cu_seqlens_k_ptr: 0,
            seqused_k_ptr: 0,
            total_q: 0,
            total_k: 0,
            cache_seqlens_ptr: 0,
            cache_batch_idx_ptr: 0,
            cache_batch: 0,
            seqlen_new: 0,
            block_table_ptr: 0,
            block_table_stride: 0,
            page_size: 0,
            num_pages: 0,
            num_splits: 0,
            lse_accum_ptr: 0,
            split_counter_ptr: 0,
            split_tickets: 0,
            knew_ptr: 0,
            vnew_ptr: 0,
            knew_stride: [0; 3],
            vnew_stride: [0; 3],
            k_descale_ptr: 0,
            v_descale_ptr: 0,
            descale_head_stride: 0,
            descale_batch_stride: 0,
            q_descale_ptr: 0,
        }
    }
}

/// One sequence of a launch, as a kernel sees it: where its rows start in
/// q/o and k/v, its lengths and its lse base.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SeqInfo {
    /// Row offsets (elements = rows × seqlen stride) in q/o and in k/v.
    pub q_row0: u64,
    pub k_row0: u64,
    pub seqlen_q: u32,
    pub seqlen_k: u32,
    /// Index of row 0 of this (sequence, head) in the lse buffer.
    pub lse_base: u64,
}

impl AttnParams {
    /// Whether this launch is varlen (packed batch).
    #[inline(always)]
    pub fn is_varlen(&self) -> bool {
        self.cu_seqlens_q_ptr != 0
    }

    /// KV heads (`nheads_k`, or `nheads` where it is 0).
    #[inline(always)]
    pub fn kv_heads(&self) -> u32 {
        if self.nheads_k == 0 { self.nheads } else { self.nheads_k }
    }

    /// KV head read by query head `h` (GQA/MQA).
    #[inline(always)]
    pub fn kv_head(&self, h: u32) -> u32 {
        h / (self.nheads / self.kv_heads())
    }

    /// The window rule of a sequence with these lengths.
    #[inline(always)]
    pub fn key_window(&self, seqlen_q: u32, seqlen_k: u32) -> crate::mask::KeyWindow {
        // `causal` is authoritative (right side 0) even in a parameter block
        // whose window fields were left at their defaults.
        let right = if self.causal != 0 { 0 } else { self.window_right };
        crate::mask::KeyWindow::new(seqlen_q, seqlen_k, self.window_left, right)
    }

    /// Sequence `b` of head `h` of a dense (not varlen) launch.
    #[inline(always)]
    pub fn dense_seq(&self, b: u32, h: u32) -> SeqInfo {
        SeqInfo {
            q_row0: 0,
            k_row0: 0,
            seqlen_q: self.seqlen_q,
            seqlen_k: self.seqlen_k,
            lse_base: (b as u64 * self.nheads as u64 + h as u64) * self.seqlen_q as u64,
        }
    }

    /// Sequence `b` of head `h`: dense (batch strides) or varlen (prefix sums,
    /// clamped; see the field docs).
    ///
    /// # Safety
    /// For varlen, the `cu_seqlens_*` pointers hold `batch + 1` i32 and
    /// `seqused_k_ptr` (if set) `batch` i32 (host-checked lengths).
    #[inline(always)]
    pub unsafe fn seq(&self, b: u32, h: u32) -> SeqInfo {
        if !self.is_varlen() {
            return self.dense_seq(b, h);
        }
        let rd = |p: u64, i: u32, hi: u32| -> u32 {
            // SAFETY: i ≤ batch, within the array (caller).
            let x = unsafe { *(p as *const i32).add(i as usize) };
            if x < 0 { 0 } else if x as u32 > hi { hi } else { x as u32 }
        };
        let q0 = rd(self.cu_seqlens_q_ptr, b, self.total_q);
        let q1 = rd(self.cu_seqlens_q_ptr, b + 1, self.total_q).max(q0);
        let k0 = rd(self.cu_seqlens_k_ptr, b, self.total_k);
        let k1 = rd(self.cu_seqlens_k_ptr, b + 1, self.total_k).max(k0);
        let mut sk = (k1 - k0).min(self.seqlen_k);
        if self.seqused_k_ptr != 0 {
            sk = rd(self.seqused_k_ptr, b, sk);
        }
        SeqInfo {
            q_row0: q0 as u64,
            k_row0: k0 as u64,
            seqlen_q: (q1 - q0).min(self.seqlen_q),
            seqlen_k: sk,
            lse_base: h as u64 * self.total_q as u64 + q0 as u64,
        }
    }

    /// [`AttnParams::seq`] for the decode kernels, which also take a KV
    /// cache (`cache_seqlens`, contiguous or paged) in place of `cu_seqlens_k`.
    ///
    /// # Safety
    /// As [`AttnParams::seq`]; `cache_seqlens_ptr`, if set, holds `batch` i32.
    #[inline(always)]
    pub unsafe fn seq_general(&self, b: u32, h: u32) -> SeqInfo {
        if !self.is_varlen() && self.cache_seqlens_ptr == 0 {
            return self.dense_seq(b, h);
        }
        let rd = |p: u64, i: u32, hi: u32| -> u32 {
            // SAFETY: i ≤ batch, within the array (caller).
            let x = unsafe { *(p as *const i32).add(i as usize) };
            if x < 0 { 0 } else if x as u32 > hi { hi } else { x as u32 }
        };
        let mut info = self.dense_seq(b, h);
        if self.is_varlen() {
            let q0 = rd(self.cu_seqlens_q_ptr, b, self.total_q);
            let q1 = rd(self.cu_seqlens_q_ptr, b + 1, self.total_q).max(q0);
            info.q_row0 = q0 as u64;
            info.seqlen_q = (q1 - q0).min(self.seqlen_q);
            info.lse_base = h as u64 * self.total_q as u64 + q0 as u64;
        }
        if self.cache_seqlens_ptr != 0 {
            // KV cache: keys from the cache row of this sequence (contiguous
            // caches: k_row0 counts cache rows via the batch stride, see
            // `kv_batch`), the cached keys plus the appended ones.
            let cached = rd(self.cache_seqlens_ptr, b, self.seqlen_k) as u64;
            info.k_row0 = 0;
            info.seqlen_k = (cached + self.seqlen_new as u64).min(self.seqlen_k as u64) as u32;
        } else if self.is_varlen() {
            let k0 = rd(self.cu_seqlens_k_ptr, b, self.total_k);
            let k1 = rd(self.cu_seqlens_k_ptr, b + 1, self.total_k).max(k0);
            info.k_row0 = k0 as u64;
            info.seqlen_k = (k1 - k0).min(self.seqlen_k);
        }
        if self.seqused_k_ptr != 0 {
            info.seqlen_k = rd(self.seqused_k_ptr, b, info.seqlen_k);
        }
        info
    }

    /// The K/V batch index of sequence `b`: `cache_batch_idx[b]` (clamped)
    /// for a KV cache with one, else `b`. Unused for paged caches.
    ///
    /// # Safety
    /// `cache_batch_idx_ptr`, if set, holds `batch` i32.
    #[inline(always)]
    pub unsafe fn kv_batch(&self, b: u32) -> u32 {
        if self.cache_batch_idx_ptr == 0 {
            return b;
        }
        // SAFETY: caller.
        let x = unsafe { *(self.cache_batch_idx_ptr as *const i32).add(b as usize) };
        if x < 0 { 0 } else if x as u32 >= self.cache_batch { self.cache_batch.saturating_sub(1) } else { x as u32 }
    }

    /// Paged KV: `t / page_size` (a shift for power-of-two pages: 32-bit
    /// division costs ~20 instructions per row in the K/V loads).
    #[inline(always)]
    pub fn page_index(&self, t: u32) -> u32 {
        if self.page_size.is_power_of_two() { t >> self.page_size.trailing_zeros() } else { t / self.page_size }
    }

    /// Paged KV: `t % page_size`.
    #[inline(always)]
    pub fn page_row(&self, t: u32) -> u32 {
        if self.page_size.is_power_of_two() { t & (self.page_size - 1) } else { t % self.page_size }
    }

    /// Paged KV: the page holding key `t` of sequence `b` (clamped to
    /// `0..num_pages`).
    ///
    /// # Safety
    /// `block_table_ptr` holds `batch · block_table_stride` i32 and
    /// `t / page_size < block_table_stride` (the sequence's clamped length).
    #[inline(always)]
    pub unsafe fn page_of(&self, b: u32, t: u32) -> u32 {
        // SAFETY: caller.
        self.clamp_page(unsafe { self.page_entry(b, t) })
    }

    /// Paged KV: the block-table entry of key `t` of sequence `b` as
    /// stored (unclamped; [`AttnParams::clamp_page`] makes it a page) —
    /// for loads issued ahead of their use, the clamp where they are used.
    ///
    /// # Safety
    /// As [`AttnParams::page_of`].
    #[inline(always)]
    pub unsafe fn page_entry(&self, b: u32, t: u32) -> i32 {
        let slot = b as u64 * self.block_table_stride as u64 + self.page_index(t) as u64;
        // SAFETY: caller.
        unsafe { *(self.block_table_ptr as *const i32).add(slot as usize) }
    }

    /// Paged KV: a block-table entry clamped to `0..num_pages`.
    #[inline(always)]
    pub fn clamp_page(&self, x: i32) -> u32 {
        if x < 0 { 0 } else if x as u32 >= self.num_pages { self.num_pages.saturating_sub(1) } else { x as u32 }
    }

    /// ALiBi slope of (sequence `b`, head `h`) (0 when off).
    ///
    /// # Safety
    /// `alibi_ptr`, if set, holds the slopes of the documented shape.
    #[inline(always)]
    pub unsafe fn alibi_slope(&self, b: u32, h: u32) -> f32 {
        if self.alibi_ptr == 0 {
            return 0.0;
        }
        // SAFETY: caller.
        unsafe { *(self.alibi_ptr as *const f32).add((b as u64 * self.alibi_batch_stride as u64 + h as u64) as usize) }
    }

    /// [`AttnParams::alibi_slope`] times `log2(e)`.
    ///
    /// # Safety
    /// As [`AttnParams::alibi_slope`].
    #[inline(always)]
    pub unsafe fn alibi_slope_log2(&self, b: u32, h: u32) -> f32 {
        // SAFETY: caller.
        unsafe { self.alibi_slope(b, h) * crate::LOG2_E }
    }

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
