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
