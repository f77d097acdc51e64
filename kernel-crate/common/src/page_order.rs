//! Which pages of a block-table row may be read in any order — the rule of
//! `flash_attn::order_block_table` (host) and of the `order_block_table`
//! kernel (device), written once.
//!
//! For one sequence of a call with `seqlen_q` query rows, `cached` keys in
//! the cache and `s_new` keys appended (`seqlen_k = cached + s_new`, queries
//! aligned bottom-right): a key is position-free when it is cached (no
//! append writes near it) and every query row sees it with no
//! position-dependent term. Callers refuse ALiBi and left window bounds
//! (every key's weight depends on its position there); a right bound `r`
//! (causal: 0) lets row 0 see keys `≤ seqlen_k − seqlen_q + r`.

/// The parameter block of the `order_block_table` kernel. `#[repr(C)]`, 40
/// bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PageOrderParams {
    /// i32 `(batch, max_blocks_per_seq)`, sorted in place.
    pub table_ptr: u64,
    /// i32 `(batch)`: keys cached per sequence (clamped to the capacity).
    pub cache_seqlens_ptr: u64,
    pub max_blocks_per_seq: u32,
    pub page_size: u32,
    pub seqlen_q: u32,
    pub s_new: u32,
    /// The right window bound after FlashAttention-2's normalization,
    /// [`crate::UNBOUNDED`] (negative) for none.
    pub right: i32,
    /// Entries of the kernel's shared-memory sort buffer (the launch's
    /// dynamic shared memory / 4: a power of two ≥ `max_blocks_per_seq`); a
    /// row needing more is left unsorted.
    pub sort_len: u32,
}

/// The leading keys of a sequence with `cached` keys that every query row
/// sees with no position-dependent term (see the module docs).
#[inline(always)]
pub fn free_keys(cached: u64, seqlen_q: u64, s_new: u64, right: i32) -> u64 {
    if right < 0 {
        return cached;
    }
    // Row 0 sits at key position seqlen_k − seqlen_q and sees `right` keys past it.
    let seen = (cached + s_new + right as u64 + 1).saturating_sub(seqlen_q);
    if seen < cached { seen } else { cached }
}

/// The slots of a row to sort: its full pages of free keys, at most
/// `max_blocks_per_seq`.
#[inline(always)]
pub fn free_pages(cached: u64, seqlen_q: u64, s_new: u64, right: i32, page_size: u64, max_blocks_per_seq: u64) -> u64 {
    let n = free_keys(cached, seqlen_q, s_new, right) / page_size;
    if n < max_blocks_per_seq { n } else { max_blocks_per_seq }
}

/// The entries `(i, i + 2^lj)` of the bitonic step with distance `j =
/// 2^lj` that pair number `p` compare-exchanges (`p < n2 / 2`; the pairs of
/// one step cover every entry once).
#[inline(always)]
pub fn bitonic_pair(p: usize, lj: u32) -> (usize, usize) {
    let i = ((p >> lj) << (lj + 1)) | (p & ((1 << lj) - 1));
    (i, i + (1 << lj))
}

/// Entries a warp holds in registers in the kernel's bitonic sort (two per
/// lane): steps with a distance under it run on shuffles.
pub const WARP_RUN: usize = 64;

/// Whether entry `e` keeps the smaller of its pair at step `j` of stage `k`
/// (`j < k`, powers of two): the lower entry `e & !j` of an ascending pair
/// (`(e & !j) & k == 0`, i.e. `e & k == 0`) or the upper of a descending one.
#[inline(always)]
pub fn keeps_min(e: usize, j: usize, k: usize) -> bool {
    (e & j == 0) == (e & k == 0)
}
