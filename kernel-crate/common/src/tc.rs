//! Shared-memory footprint of the tensor-core kernels, computed once for the
//! kernels (which carve their dynamic shared memory with it) and the host
//! (which requests exactly that much at launch).
//!
//! Tiles hold rows of `d` 16-bit elements padded by 16 bytes, so that the 8
//! row addresses of one `ldmatrix` land in 8 different bank groups.

/// Bytes of one padded tile row of `d` 16-bit elements.
pub const fn row_bytes(d: usize) -> usize {
    2 * d + 16
}

/// Bytes of a tile of `rows` padded rows.
pub const fn tile_bytes(rows: usize, d: usize) -> usize {
    rows * row_bytes(d)
}

/// Query rows per block (`Br`) of a tensor-core kernel with `warps` warps,
/// each owning `mt` m-tiles of 16 rows.
pub const fn tc_br(warps: usize, mt: usize) -> usize {
    16 * mt * warps
}

/// FA2: the Q tile (`br` rows) plus double-buffered K and V tiles.
pub const fn fa2_tc_smem_bytes(d: usize, br: usize, bc: usize) -> usize {
    tile_bytes(br, d) + 4 * tile_bytes(bc, d)
}

/// FA1: single K and V tiles plus the block's `br` Q rows (16 per warp).
pub const fn fa1_tc_smem_bytes(d: usize, br: usize, bc: usize) -> usize {
    tile_bytes(br, d) + 2 * tile_bytes(bc, d)
}

/// Flash-decoding kernels: query rows per block (one m-tile).
pub const DEC_BR: usize = 16;

/// Flash-decoding: row stride (f32) of the merge area, `d + 8` (the 8 row
/// groups of a warp's fragment stores fall on different banks).
pub const fn dec_merge_stride(d: usize) -> usize {
    d + 8
}

/// Flash-decoding: bytes of the merge area, `nw` partial O tiles (16 ×
/// (d + 8) f32) and the warps' `m_i`, `l_i`.
pub const fn dec_merge_bytes(d: usize, nw: usize) -> usize {
    nw * DEC_BR * dec_merge_stride(d) * 4 + nw * DEC_BR * 2 * 4
}

/// Flash-decoding: the Q tile, then `stages` stages of K and V tiles
/// (reused for the merge at the end).
pub const fn dec_smem_bytes(d: usize, nw: usize, bc: usize, stages: usize) -> usize {
    let kv = 2 * stages * tile_bytes(bc, d);
    let m = dec_merge_bytes(d, nw);
    tile_bytes(DEC_BR, d) + if kv > m { kv } else { m }
}

/// Flash-decoding kernels' optional per-block timeline (`AttnParams::scratch_ptr`,
/// written by thread 0 of each block): word 0 holds `smid | split << 16 |
/// last << 32` (`last`: the block merged its tile's splits), words
/// `1 + k` the `%globaltimer` (ns) and words `8 + k` the SM's `%clock64` at
/// point `k` of [`timeline::POINTS`].
pub mod timeline {
    /// u64 words per block.
    pub const WORDS: usize = 16;
    /// The points: block start, the prologue's copies issued, the main loop
    /// done (every copy landed), the merged partial or output stored, the
    /// split counted (fused combine), the block's end.
    pub const POINTS: [&str; 6] = ["start", "prologue", "loop_end", "stored", "counted", "end"];
}
