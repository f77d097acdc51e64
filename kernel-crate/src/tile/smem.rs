//! Row-major tiles in the block's dynamic shared memory.

use super::{GlobalRows, check, tid};
use flash_attn_common::smem_layout::F32_THREADS;

/// A `rows × cols` row-major f32 tile in shared memory with row stride
/// `stride` (≥ `cols`; the f32 kernels use an odd stride, see
/// `smem_layout::padded_stride`). Element `(r, c)` is at `ptr + r·stride + c`.
///
/// A tile is a view: it is `Copy`, and every thread of the block holds the
/// same one. Writes from one thread become visible to the others after the
/// next `sync_threads`.
#[derive(Clone, Copy)]
pub struct SmemTile {
    ptr: *mut f32,
    rows: usize,
    cols: usize,
    stride: usize,
}

impl SmemTile {
    /// A tile at `base + offset` (in f32 elements).
    ///
    /// # Safety
    /// `base + offset .. base + offset + rows·stride` must lie inside this
    /// block's dynamic shared memory (as sized by the host from the same
    /// `smem_layout` type that gave `offset`), and `cols <= stride`.
    #[inline(always)]
    pub unsafe fn new(base: *mut f32, offset: usize, rows: usize, cols: usize, stride: usize) -> Self {
        Self { ptr: base.wrapping_add(offset), rows, cols, stride }
    }

    #[inline(always)]
    pub fn rows(&self) -> usize {
        self.rows
    }
    #[inline(always)]
    pub fn cols(&self) -> usize {
        self.cols
    }
    #[inline(always)]
    pub fn stride(&self) -> usize {
        self.stride
    }
    #[inline(always)]
    pub(super) fn ptr(&self) -> *mut f32 {
        self.ptr
    }

    /// Element `(r, c)`; traps when out of the tile.
    #[inline(always)]
    pub fn get(&self, r: usize, c: usize) -> f32 {
        check(r < self.rows && c < self.cols);
        // SAFETY: (r, c) is inside the tile, which lies in shared memory (`new`).
        unsafe { *self.ptr.add(r * self.stride + c) }
    }

    /// Sets element `(r, c)`; traps when out of the tile.
    #[inline(always)]
    pub fn set(&self, r: usize, c: usize, x: f32) {
        check(r < self.rows && c < self.cols);
        // SAFETY: (r, c) is inside the tile, which lies in shared memory (`new`).
        unsafe { *self.ptr.add(r * self.stride + c) = x }
    }

    /// Block-wide: every thread calls it. Sets `rows × cols` elements
    /// starting at `(0, 0)` to `x`. Needs a `sync_threads` before others read.
    #[inline(always)]
    pub fn fill(&self, rows: usize, cols: usize, x: f32) {
        check(rows <= self.rows && cols <= self.cols);
        if cols == 0 {
            return;
        }
        let mut idx = tid();
        let n = rows * cols;
        while idx < n {
            let (r, c) = (idx / cols, idx % cols);
            // SAFETY: r < rows <= self.rows, c < cols <= self.cols.
            unsafe { *self.ptr.add(r * self.stride + c) = x };
            idx += F32_THREADS as usize;
        }
    }

    /// Block-wide: every thread calls it. Copies the `nrows × ncols` block of
    /// `g` at `(row0, col0)` into this tile at `(0, 0)`, consecutive threads
    /// on consecutive columns (coalesced HBM reads). Needs a `sync_threads`
    /// before others read the tile.
    #[inline(always)]
    pub fn load(&self, g: &GlobalRows, row0: usize, nrows: usize, col0: usize, ncols: usize) {
        check(nrows <= self.rows && ncols <= self.cols);
        check(row0 + nrows <= g.rows() && col0 + ncols <= g.cols());
        if ncols == 0 {
            return;
        }
        let src = g.ptr().wrapping_add(row0 * g.row_stride() + col0);
        let mut idx = tid();
        let n = nrows * ncols;
        while idx < n {
            // u32 division: n fits in u32 (a tile is at most 227 KB).
            let (r, c) = ((idx as u32 / ncols as u32) as usize, (idx as u32 % ncols as u32) as usize);
            // SAFETY: (r, c) is inside both the tile and `g` (checked above).
            unsafe { *self.ptr.add(r * self.stride + c) = *src.add(r * g.row_stride() + c) };
            idx += F32_THREADS as usize;
        }
    }
}
