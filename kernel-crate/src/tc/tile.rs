//! Shared-memory tiles of 16-bit elements and the warp fragments read from
//! them.
//!
//! A tile holds `ROWS` rows of `D` elements. Rows are padded by 16 bytes
//! (`row_bytes = 2D + 16`): the 8 row addresses of one `ldmatrix` 8×8 matrix
//! then start in 8 different 16-byte bank groups (the row stride is an odd
//! number of 16-byte chunks whenever `D/8` is even, which holds for every
//! supported head dim), so `ldmatrix` and `cp.async` are free of bank
//! conflicts without a swizzle.
//!
//! The flash-decoding kernels' K/V stages ([`KvTile`]) are unpadded and
//! swizzled instead where the head dim allows
//! (`flash_attn_common::tc::dec_kv_swizzled`): their copies stream the cache
//! 4% faster (decode step 29). [`FragTile`] reads the warp fragments from
//! either layout.

use crate::arch::cp_async::cp_async_cg_16;
use crate::arch::ldmatrix::{ldmatrix_x4, ldmatrix_x4_trans};

pub use flash_attn_common::tc::{dec_kv_offset, dec_kv_row_bytes, dec_kv_tile_bytes, row_bytes, tile_bytes};

/// A shared-memory tile of 16-bit elements that `ldmatrix` reads: its
/// layout is [`FragTile::addr`], the fragments follow from it.
pub trait FragTile: Copy {
    /// Shared address of element `(row, col)`, `col` a multiple of 8 (one
    /// 16-byte chunk).
    fn addr(&self, row: usize, col: usize) -> u32;

    /// A fragment (16 rows × 16 cols) of a row-major A operand, rows
    /// `row0..row0+16`, cols `col0..col0+16`.
    ///
    /// # Safety
    /// All 32 lanes call it; the tile was filled and a barrier passed.
    #[inline(always)]
    unsafe fn a_frag(&self, row0: usize, col0: usize, lane: usize) -> [u32; 4] {
        // lanes 0-15: rows 0-15 at col0; lanes 16-31: rows 0-15 at col0+8.
        // SAFETY: forwarded.
        unsafe { ldmatrix_x4(self.addr(row0 + (lane & 15), col0 + (lane >> 4) * 8)) }
    }

    /// B fragments of `Bᵀ` stored row-major (rows = n, cols = k; e.g. K for
    /// `S = Q·Kᵀ`): n-tiles `n0..n0+8` and `n0+8..n0+16`, k `k0..k0+16`.
    /// Returns `[b0, b1]` of the first n-tile then of the second.
    ///
    /// # Safety
    /// As [`FragTile::a_frag`].
    #[inline(always)]
    unsafe fn bt_frag_x2(&self, n0: usize, k0: usize, lane: usize) -> [u32; 4] {
        let m = lane >> 3;
        // SAFETY: forwarded.
        unsafe { ldmatrix_x4(self.addr(n0 + (m >> 1) * 8 + (lane & 7), k0 + (m & 1) * 8)) }
    }

    /// B fragments of `B` stored row-major (rows = k, cols = n; e.g. V for
    /// `O = P·V`), through `ldmatrix.trans`: k `k0..k0+16`, n-tiles
    /// `n0..n0+8` and `n0+8..n0+16`. Returns `[b0, b1]` of each n-tile.
    ///
    /// # Safety
    /// As [`FragTile::a_frag`].
    #[inline(always)]
    unsafe fn b_frag_trans_x2(&self, k0: usize, n0: usize, lane: usize) -> [u32; 4] {
        let m = lane >> 3;
        // SAFETY: forwarded.
        unsafe { ldmatrix_x4_trans(self.addr(k0 + (m & 1) * 8 + (lane & 7), n0 + (m >> 1) * 8)) }
    }
}

/// A K/V stage tile of the flash-decoding kernels: `D` elements per row,
/// swizzled where `dec_kv_swizzled(D)` (unpadded rows, chunk `c` of row `r`
/// at chunk `c ^ (r % 8)`: the 8 rows of an `ldmatrix` matrix hit 8
/// different chunks of one 128-byte group; a warp's copies fill whole
/// 128-byte groups), padded as [`SmemTile`] otherwise. A tile whose base is
/// moved by a multiple of 8 rows is the same layout (the warps' key slices).
#[derive(Clone, Copy)]
pub struct KvTile<const D: usize> {
    pub base: u32,
}

impl<const D: usize> KvTile<D> {
    /// Bytes per row.
    pub const RB: u32 = dec_kv_row_bytes(D) as u32;
}

impl<const D: usize> FragTile for KvTile<D> {
    #[inline(always)]
    fn addr(&self, row: usize, col: usize) -> u32 {
        self.base + dec_kv_offset(D, row as u32, col as u32)
    }
}

impl<const D: usize> FragTile for SmemTile<D> {
    #[inline(always)]
    fn addr(&self, row: usize, col: usize) -> u32 {
        SmemTile::addr(self, row, col)
    }

    #[inline(always)]
    unsafe fn a_frag(&self, row0: usize, col0: usize, lane: usize) -> [u32; 4] {
        // SAFETY: forwarded.
        unsafe { SmemTile::a_frag(self, row0, col0, lane) }
    }

    #[inline(always)]
    unsafe fn bt_frag_x2(&self, n0: usize, k0: usize, lane: usize) -> [u32; 4] {
        // SAFETY: forwarded.
        unsafe { SmemTile::bt_frag_x2(self, n0, k0, lane) }
    }

    #[inline(always)]
    unsafe fn b_frag_trans_x2(&self, k0: usize, n0: usize, lane: usize) -> [u32; 4] {
        // SAFETY: forwarded.
        unsafe { SmemTile::b_frag_trans_x2(self, k0, n0, lane) }
    }
}

/// A tile of padded rows of `D` elements at a shared-window address.
#[derive(Clone, Copy)]
pub struct SmemTile<const D: usize> {
    pub base: u32,
}

impl<const D: usize> SmemTile<D> {
    const RB: u32 = row_bytes(D) as u32;

    /// Shared address of element `(row, col)`.
    #[inline(always)]
    pub fn addr(&self, row: usize, col: usize) -> u32 {
        self.base + row as u32 * Self::RB + (col * 2) as u32
    }

    /// Issues `cp.async` copies of `rows` rows from global memory (row `r` at
    /// `g + r * row_stride` elements) into the tile, the `nt` threads
    /// (`tid < nt`) sharing the 16-byte chunks. Rows `>= rows_valid` and
    /// columns `>= cols_valid` (a multiple of 8: the caller's head dim, when
    /// the tile is compiled for a larger `D`) are zero-filled, never read: a
    /// zero keeps `0 * garbage` out of the products.
    ///
    /// # Safety
    /// `g` rows `< rows_valid` are readable for `cols_valid` elements,
    /// 16-byte aligned; the tile lies in the block's dynamic shared memory;
    /// all `nt` threads call it.
    #[inline(always)]
    pub unsafe fn load_async(&self, g: *const u16, row_stride: u64, rows: usize, rows_valid: usize, cols_valid: usize, tid: usize, nt: usize) {
        // SAFETY: forwarded (rows < rows_valid are readable at this address).
        unsafe { self.load_chunks_async(g, |r| g.wrapping_add(r * row_stride as usize), rows, rows_valid, cols_valid, tid, nt) }
    }

    /// [`SmemTile::load_async`] with the address of each row given by
    /// `row_ptr(r)` (paged K/V: rows of one tile may sit in several pages);
    /// `base` is the (never read) source of the zero-filling copies.
    ///
    /// # Safety
    /// `row_ptr(r)` for `r < rows_valid` is readable for `cols_valid`
    /// elements, 16-byte aligned; otherwise as [`SmemTile::load_async`].
    #[inline(always)]
    pub unsafe fn load_rows_async(
        &self,
        base: *const u16,
        row_ptr: impl Fn(usize) -> *const u16,
        rows: usize,
        rows_valid: usize,
        cols_valid: usize,
        tid: usize,
        nt: usize,
    ) {
        const { assert!(D % 8 == 0) };
        let cpr = D / 8; // 16-byte chunks per row
        // One address per row and thread when the threads split the rows
        // evenly (paged K/V: the page lookup is per row, not per chunk):
        // thread `tid` copies chunks `c0..c0 + cpt` of row `tid / tpr`.
        if nt % rows == 0 && nt >= rows && cpr % (nt / rows) == 0 {
            let tpr = nt / rows;
            let cpt = cpr / tpr;
            if tid < nt {
                let r = tid / tpr;
                let c0 = (tid % tpr) * cpt;
                let ok_row = r < rows_valid;
                let src_row = if ok_row { row_ptr(r) } else { base };
                for c in c0..c0 + cpt {
                    let ok = ok_row && c * 8 < cols_valid;
                    let src = if ok { src_row.wrapping_add(c * 8) } else { base };
                    // SAFETY: see the function's contract; src_size 0 reads nothing.
                    unsafe { cp_async_cg_16(self.addr(r, c * 8), src as *const u8, if ok { 16 } else { 0 }) };
                }
            }
            return;
        }
        // SAFETY: forwarded.
        unsafe { self.load_chunks_async(base, row_ptr, rows, rows_valid, cols_valid, tid, nt) }
    }

    /// The chunk loop of the loads: consecutive threads on consecutive
    /// 16-byte chunks (coalesced rows), one `row_ptr` per chunk.
    ///
    /// # Safety
    /// As [`SmemTile::load_rows_async`].
    #[inline(always)]
    unsafe fn load_chunks_async(
        &self,
        base: *const u16,
        row_ptr: impl Fn(usize) -> *const u16,
        rows: usize,
        rows_valid: usize,
        cols_valid: usize,
        tid: usize,
        nt: usize,
    ) {
        let cpr = D / 8;
        let total = rows * cpr;
        let mut i = tid;
        while i < total {
            let r = i / cpr;
            let c = i % cpr;
            let ok = r < rows_valid && c * 8 < cols_valid;
            let src = if ok { row_ptr(r).wrapping_add(c * 8) } else { base };
            // SAFETY: see the function's contract; src_size 0 reads nothing.
            unsafe { cp_async_cg_16(self.addr(r, c * 8), src as *const u8, if ok { 16 } else { 0 }) };
            i += nt;
        }
    }

    /// A fragment (16 rows × 16 cols) of a row-major A operand, rows
    /// `row0..row0+16`, cols `col0..col0+16`.
    ///
    /// # Safety
    /// All 32 lanes call it; the tile was filled and a barrier passed.
    #[inline(always)]
    pub unsafe fn a_frag(&self, row0: usize, col0: usize, lane: usize) -> [u32; 4] {
        // lanes 0-15: rows 0-15 at col0; lanes 16-31: rows 0-15 at col0+8.
        // SAFETY: forwarded.
        unsafe { ldmatrix_x4(self.addr(row0 + (lane & 15), col0 + (lane >> 4) * 8)) }
    }

    /// A fragment (16 × 16) of an A operand stored **transposed** (the tile
    /// holds `Aᵀ` row-major: e.g. the backward's `dSᵀ`, rows = keys, for
    /// `dQ = dS·K`), through `ldmatrix.trans`: A rows `col0..col0+16` (tile
    /// columns), A cols `row0..row0+16` (tile rows). Matrix `m = lane / 8`
    /// is tile rows `row0 + 8·(m / 2)`, tile cols `col0 + 8·(m % 2)`: with
    /// `.trans` lane `l` gets tile `(rows 2(l%4)..+2, col l/4)` =
    /// `A[l/4][2(l%4)..+2]` of that 8×8 block — `a0` (A rows 0–7, cols
    /// 0–7), `a1` (rows 8–15), `a2` (cols 8–15), `a3` as `mma` wants.
    ///
    /// # Safety
    /// As [`SmemTile::a_frag`].
    #[inline(always)]
    pub unsafe fn a_frag_trans(&self, row0: usize, col0: usize, lane: usize) -> [u32; 4] {
        let m = lane >> 3;
        // SAFETY: forwarded.
        unsafe { ldmatrix_x4_trans(self.addr(row0 + (m >> 1) * 8 + (lane & 7), col0 + (m & 1) * 8)) }
    }

    /// B fragments of `Bᵀ` stored row-major (rows = n, cols = k; e.g. K for
    /// `S = Q·Kᵀ`): n-tiles `n0..n0+8` and `n0+8..n0+16`, k `k0..k0+16`.
    /// Returns `[b0, b1]` of the first n-tile then of the second.
    ///
    /// # Safety
    /// As [`SmemTile::a_frag`].
    #[inline(always)]
    pub unsafe fn bt_frag_x2(&self, n0: usize, k0: usize, lane: usize) -> [u32; 4] {
        let m = lane >> 3;
        // SAFETY: forwarded.
        unsafe { ldmatrix_x4(self.addr(n0 + (m >> 1) * 8 + (lane & 7), k0 + (m & 1) * 8)) }
    }

    /// B fragments of `B` stored row-major (rows = k, cols = n; e.g. V for
    /// `O = P·V`), through `ldmatrix.trans`: k `k0..k0+16`, n-tiles
    /// `n0..n0+8` and `n0+8..n0+16`. Returns `[b0, b1]` of each n-tile.
    ///
    /// # Safety
    /// As [`SmemTile::a_frag`].
    #[inline(always)]
    pub unsafe fn b_frag_trans_x2(&self, k0: usize, n0: usize, lane: usize) -> [u32; 4] {
        let m = lane >> 3;
        // SAFETY: forwarded.
        unsafe { ldmatrix_x4_trans(self.addr(k0 + (m & 1) * 8 + (lane & 7), n0 + (m >> 1) * 8)) }
    }
}
