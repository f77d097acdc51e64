//! Views of tensors in HBM (global memory).

use super::check;

/// The `rows × cols` rows of one `(batch, head)` slice of a
/// `(batch, seqlen, nheads, headdim)` tensor — or any row-major matrix with
/// a row stride: element `(n, c)` is at `ptr + n·row_stride + c`.
#[derive(Clone, Copy)]
pub struct GlobalRows {
    ptr: *mut f32,
    row_stride: usize,
    rows: usize,
    cols: usize,
}

impl GlobalRows {
    /// The `(b, h)` slice of a tensor at device address `base` with element
    /// strides `[batch, seqlen, head]`: `seqlen × headdim` rows.
    ///
    /// # Safety
    /// Every element `(n, c)`, `n < seqlen`, `c < headdim`, of the slice must
    /// be inside one device allocation (the host checks the buffer length
    /// against the strides), and if the view is written through, no other
    /// thread may access the same element concurrently.
    #[inline(always)]
    pub unsafe fn head(base: u64, strides: [u64; 3], b: usize, h: usize, seqlen: usize, headdim: usize) -> Self {
        let off = b * strides[0] as usize + h * strides[2] as usize;
        Self { ptr: (base as *mut f32).wrapping_add(off), row_stride: strides[1] as usize, rows: seqlen, cols: headdim }
    }

    /// A row-major `rows × cols` matrix at `ptr` with row stride `row_stride`.
    ///
    /// # Safety
    /// As [`GlobalRows::head`].
    #[inline(always)]
    pub unsafe fn matrix(ptr: *mut f32, row_stride: usize, rows: usize, cols: usize) -> Self {
        Self { ptr, row_stride, rows, cols }
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
    pub fn row_stride(&self) -> usize {
        self.row_stride
    }
    #[inline(always)]
    pub(super) fn ptr(&self) -> *mut f32 {
        self.ptr
    }

    /// Element `(n, c)`; traps when out of the view.
    #[inline(always)]
    pub fn get(&self, n: usize, c: usize) -> f32 {
        check(n < self.rows && c < self.cols);
        // SAFETY: inside the view (`head`/`matrix` contract).
        unsafe { *self.ptr.add(n * self.row_stride + c) }
    }

    /// Sets element `(n, c)`; traps when out of the view.
    #[inline(always)]
    pub fn set(&self, n: usize, c: usize, x: f32) {
        check(n < self.rows && c < self.cols);
        // SAFETY: inside the view (`head`/`matrix` contract).
        unsafe { *self.ptr.add(n * self.row_stride + c) = x }
    }
}
