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

/// Flash-decoding: whether the K/V stage tiles of head dim `d` are
/// **swizzled** — unpadded rows of `2d` bytes whose 16-byte chunks are
/// permuted within each 128-byte group by the row (`chunk ^ (row % 8)`,
/// `d` = 64 or 128) — rather than padded (`row_bytes`). The padding
/// puts every other row of a `cp.async` wave off the 128-byte grid: the
/// streaming floor kernel with 272-byte rows reads GQA 32/8's cache 4%
/// slower at 32k and 131k keys (decode step 29); the swizzle keeps the
/// `ldmatrix` rows on different banks without it. Head dims 192 and 256
/// keep the padded rows: the swizzled fragment addresses cost their 4-warp
/// kernels 10+ registers, and d = 256 spilled.
pub const fn dec_kv_swizzled(d: usize) -> bool {
    d == 64 || d == 128
}

/// Flash-decoding: bytes of one K/V stage-tile row (see [`dec_kv_swizzled`]).
pub const fn dec_kv_row_bytes(d: usize) -> usize {
    if dec_kv_swizzled(d) { 2 * d } else { row_bytes(d) }
}

/// Flash-decoding: byte offset of element `(row, col)` (`col` a multiple
/// of 8: one 16-byte chunk) in a K/V stage tile (see [`dec_kv_swizzled`]).
/// 32-bit, as the kernels' shared-memory addresses.
pub const fn dec_kv_offset(d: usize, row: u32, col: u32) -> u32 {
    let chunk = if dec_kv_swizzled(d) { (col / 8) ^ (row % 8) } else { col / 8 };
    row * dec_kv_row_bytes(d) as u32 + chunk * 16 + (col % 8) * 2
}

/// Flash-decoding: bytes of a K/V stage tile of `rows` rows.
pub const fn dec_kv_tile_bytes(rows: usize, d: usize) -> usize {
    rows * dec_kv_row_bytes(d)
}

/// Flash-decoding: the (padded) Q tile, then `stages` stages of K and V
/// tiles (reused for the merge at the end).
pub const fn dec_smem_bytes(d: usize, nw: usize, bc: usize, stages: usize) -> usize {
    let kv = 2 * stages * dec_kv_tile_bytes(bc, d);
    let m = dec_merge_bytes(d, nw);
    tile_bytes(DEC_BR, d) + if kv > m { kv } else { m }
}

/// Flash-decoding over an FP8 cache: bytes of one stage row of `d` e4m3
/// codes — `d` where the chunks are swizzled (d = 64, 128), else `d + 16`
/// (an odd number of 16-byte chunks for every supported `d`, a multiple of
/// 32: the 8 rows of an `ldmatrix` matrix start in 8 bank groups). As for
/// the 16-bit stages ([`dec_kv_swizzled`]), the swizzle's per-chunk
/// fragment addresses cost the large head dims registers (d = 256 spilled).
pub const fn dec_f8_row_bytes(d: usize) -> usize {
    if dec_f8_swizzled(d) { d } else { d + 16 }
}

/// Flash-decoding over an FP8 cache: whether the stage rows are swizzled
/// (see [`dec_f8_offset`]).
pub const fn dec_f8_swizzled(d: usize) -> bool {
    d == 64 || d == 128
}

/// Flash-decoding over an FP8 cache: byte offset of 16-byte chunk `chunk`
/// (codes `16·chunk..16·chunk + 16`) of row `row` in a K/V stage of codes.
/// Swizzled rows ([`dec_f8_swizzled`]) permute their chunks by the row so
/// that any 8 consecutive rows from a multiple of 8 put one chunk in 8
/// different 16-byte bank groups (the kernels read the codes with
/// `ldmatrix`): d = 128 (8 chunks per row) XORs the chunk with `row % 8`,
/// d = 64 (4 chunks, two rows per 128 bytes) with `(row / 2) % 4`; padded
/// rows get the same from their odd stride.
pub const fn dec_f8_offset(d: usize, row: u32, chunk: u32) -> u32 {
    let c = if !dec_f8_swizzled(d) {
        chunk
    } else if d == 128 {
        chunk ^ (row % 8)
    } else {
        chunk ^ ((row / 2) % 4)
    };
    row * dec_f8_row_bytes(d) as u32 + 16 * c
}

/// Flash-decoding over an FP8 cache: the Q tile, then `stages` stages of K
/// and V codes (`bc` rows of [`dec_f8_row_bytes`] each; the kernel reads its
/// tensor-core fragments straight from them); the merge reuses the space
/// after the Q tile.
pub const fn dec_f8_smem_bytes(d: usize, nw: usize, bc: usize, stages: usize) -> usize {
    let kv = 2 * stages * bc * dec_f8_row_bytes(d);
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Every head dim of the flash-decoding kernels.
    const DEC_DIMS: [usize; 8] = [32, 64, 96, 128, 160, 192, 224, 256];

    #[test]
    fn dec_kv_offsets_are_a_permutation_of_the_tile() {
        for d in DEC_DIMS {
            let rows = 64u32;
            let rb = dec_kv_row_bytes(d) as u32;
            let mut seen = vec![false; (rows * rb / 16) as usize];
            for r in 0..rows {
                for c in (0..d as u32).step_by(8) {
                    let o = dec_kv_offset(d, r, c);
                    assert_eq!(o % 16, 0, "d {d}: chunk-aligned");
                    assert!(o / rb == r, "d {d}: row {r} chunk {c} stays in its row");
                    assert!(!seen[(o / 16) as usize], "d {d}: two chunks at {o}");
                    seen[(o / 16) as usize] = true;
                }
            }
            assert_eq!(dec_kv_tile_bytes(rows as usize, d) as u32, rows * rb);
        }
    }

    /// The 8 row addresses of an `ldmatrix` 8×8 matrix (8 consecutive rows
    /// from a multiple of 8, one 16-byte column chunk) fall in 8 different
    /// 16-byte bank groups (no bank conflict), for every chunk.
    #[test]
    fn dec_kv_ldmatrix_rows_hit_distinct_banks() {
        for d in DEC_DIMS {
            for r0 in (0..64u32).step_by(8) {
                for c in (0..d as u32).step_by(8) {
                    let mut groups: Vec<u32> = (0..8).map(|i| dec_kv_offset(d, r0 + i, c) % 128 / 16).collect();
                    groups.sort_unstable();
                    groups.dedup();
                    assert_eq!(groups.len(), 8, "d {d}: rows {r0}.. chunk {c}");
                }
            }
        }
    }

    /// FP8 stages: chunk offsets are a permutation of each row's chunks,
    /// and the 8 rows of an `ldmatrix` matrix (from a multiple of 8, one
    /// chunk) start in 8 different bank groups.
    #[test]
    fn dec_f8_stage_rows_are_permuted_and_conflict_free() {
        for d in DEC_DIMS {
            let rb = dec_f8_row_bytes(d) as u32;
            assert!(rb >= d as u32 && rb % 16 == 0);
            for r in 0..64u32 {
                let mut cs: Vec<u32> = (0..d as u32 / 16).map(|c| dec_f8_offset(d, r, c)).collect();
                assert!(cs.iter().all(|&o| o / rb == r && o % 16 == 0 && o % rb + 16 <= d as u32), "d {d}: row {r} stays in its row's codes");
                cs.sort_unstable();
                cs.dedup();
                assert_eq!(cs.len(), d / 16, "d {d}: row {r}: two chunks at one offset");
            }
            for r0 in (0..64u32).step_by(8) {
                for c in 0..d as u32 / 16 {
                    let mut groups: Vec<u32> = (0..8).map(|i| dec_f8_offset(d, r0 + i, c) % 128 / 16).collect();
                    groups.sort_unstable();
                    groups.dedup();
                    assert_eq!(groups.len(), 8, "d {d}: rows {r0}.. chunk {c}");
                }
            }
        }
        assert_eq!(dec_f8_row_bytes(128), 128);
        assert_eq!(dec_f8_row_bytes(96), 112);
        assert_eq!(dec_f8_row_bytes(256), 272);
    }

    /// Swizzled tiles: a row's chunks fill whole 128-byte groups (the
    /// copies of one warp land on the 128-byte grid, decode step 29), and
    /// rows are unpadded.
    #[test]
    fn dec_kv_swizzled_rows_fill_128_byte_groups() {
        for d in DEC_DIMS.into_iter().filter(|&d| dec_kv_swizzled(d)) {
            assert_eq!(dec_kv_row_bytes(d), 2 * d);
            for r in 0..16u32 {
                for g in 0..(d as u32 / 64) {
                    let mut lines: Vec<u32> = (0..8).map(|k| dec_kv_offset(d, r, (8 * g + k) * 8) / 128).collect();
                    lines.dedup();
                    assert_eq!(lines, vec![(r * 2 * d as u32) / 128 + g], "d {d}: row {r} group {g}");
                }
            }
        }
        assert!(!dec_kv_swizzled(96) && !dec_kv_swizzled(256));
    }
}
