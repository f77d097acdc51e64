//! Tiles of the f32 kernels, named after where they live: [`global`] (HBM
//! views of one `(batch, head)` slice of a tensor), [`smem`] (tiles in the
//! block's dynamic shared memory), [`gemm`] (the block-wide product of two
//! shared-memory tiles) and [`rows`] (one warp per tile row: the online
//! softmax over a row of scores).
//!
//! The f32 kernels (`fa1`, `fa2`, `standard`) are written against these
//! types only; the pointer arithmetic and its `unsafe` stay here.

pub mod gemm;
pub mod global;
pub mod rows;
pub mod smem;

pub use gemm::{Operand, block_gemm};
pub use global::GlobalRows;
pub use smem::SmemTile;

/// Traps (aborts the kernel with an error the host sees at its next
/// synchronization) when `ok` is false. Used for the bounds checks of the
/// safe tile accessors: a failed check is a bug in the kernel, never a
/// silent out-of-bounds access. Cheaper than `panic!`, which would build its
/// message in local memory.
#[inline(always)]
pub fn check(ok: bool) {
    if !ok {
        // SAFETY: `trap` aborts the kernel; nothing after it runs.
        unsafe { core::arch::nvptx::trap() }
    }
}

/// Thread index inside the block, as `usize`.
#[inline(always)]
pub fn tid() -> usize {
    crate::arch::sreg::thread_idx_x() as usize
}
