//! The block-wide product of two shared-memory tiles, on CUDA cores (FFMA).
//!
//! Thread layout (`smem_layout::GEMM_*`): the 256 threads form a 16 × 16
//! grid `(ty, tx)`; for each 64 × 64 chunk of C a thread owns the 4 × 4
//! elements at rows `i0 + ty + 16·t` and columns `j0 + tx + 16·u`
//! (`t, u < 4`). Per step of the reduction it reads 4 values of A and 4 of
//! B from shared memory and issues 16 FMAs. Along a warp, `tx` runs over 16
//! consecutive columns of C: for `B[k][j]` these are 16 consecutive words
//! (16 banks), for `B[j][k]` 16 rows of an odd-strided tile (16 banks);
//! the A operand is the same word for the 16 lanes of a row (broadcast).

use super::SmemTile;
use core::intrinsics::fmaf32;
use flash_attn_common::smem_layout::{GEMM_CHUNK, GEMM_MICRO, GEMM_THREADS_X};

/// One operand of [`block_gemm`]: element `(i, k)` — `i` the output index
/// (row of C for A, column of C for B), `k` the reduction index — at
/// `ptr + i·i_stride + k·k_stride`, inside a shared-memory tile.
#[derive(Clone, Copy)]
pub struct Operand {
    ptr: *const f32,
    i_stride: usize,
    k_stride: usize,
    /// Extents of the tile along `i` and `k`, for the bounds checks.
    i_len: usize,
    k_len: usize,
}

impl Operand {
    /// The tile as `X[i][k]`: its rows index the output, its columns are the
    /// reduction (Q for S = Q·Kᵀ, K for the Kᵀ side, P for O = P·V).
    #[inline(always)]
    pub fn rows(t: &SmemTile) -> Self {
        Self { ptr: t.ptr(), i_stride: t.stride(), k_stride: 1, i_len: t.rows(), k_len: t.cols() }
    }

    /// The tile as `X[k][i]`: its columns index the output, its rows are the
    /// reduction (V for O = P·V).
    #[inline(always)]
    pub fn cols(t: &SmemTile) -> Self {
        Self { ptr: t.ptr(), i_stride: 1, k_stride: t.stride(), i_len: t.cols(), k_len: t.rows() }
    }
}

/// Block-wide (every thread calls it, none diverged): computes
/// `C[i][j] = Σ_{k < kdim} A(i, k) · B(j, k)` for `i < m`, `j < n`, and calls
/// `store(i, j, C[i][j])` exactly once per element, always from the same
/// thread for the same `(i, j, m, n)` — so a `store` that reads and writes
/// its own element (an accumulator in shared memory or HBM) needs no barrier
/// between two calls. Reads only shared memory; callers put a
/// `sync_threads` between writing A or B and calling this.
#[inline(always)]
pub fn block_gemm(a: Operand, b: Operand, m: usize, n: usize, kdim: usize, mut store: impl FnMut(usize, usize, f32)) {
    super::check(m <= a.i_len && n <= b.i_len && kdim <= a.k_len && kdim <= b.k_len);
    if m == 0 || n == 0 {
        return;
    }
    let tid = super::tid();
    let (ty, tx) = (tid / GEMM_THREADS_X, tid % GEMM_THREADS_X);
    let step = GEMM_THREADS_X; // = GEMM_THREADS_Y
    let mut i0 = 0;
    while i0 < m {
        let mut j0 = 0;
        while j0 < n {
            // Rows/columns past m/n are clamped to the last one, so that every
            // read stays inside the tiles; their results are never stored.
            let pa: [*const f32; GEMM_MICRO] =
                core::array::from_fn(|t| a.ptr.wrapping_add((i0 + ty + step * t).min(m - 1) * a.i_stride));
            let pb: [*const f32; GEMM_MICRO] =
                core::array::from_fn(|u| b.ptr.wrapping_add((j0 + tx + step * u).min(n - 1) * b.i_stride));
            let mut acc = [[0.0f32; GEMM_MICRO]; GEMM_MICRO];
            for k in 0..kdim {
                // SAFETY: rows < m <= a.i_len, k < kdim <= a.k_len (checked
                // above); the operand lies inside its shared-memory tile.
                let av: [f32; GEMM_MICRO] = core::array::from_fn(|t| unsafe { *pa[t].add(k * a.k_stride) });
                // SAFETY: as above for B.
                let bv: [f32; GEMM_MICRO] = core::array::from_fn(|u| unsafe { *pb[u].add(k * b.k_stride) });
                for t in 0..GEMM_MICRO {
                    for u in 0..GEMM_MICRO {
                        acc[t][u] = fmaf32(av[t], bv[u], acc[t][u]);
                    }
                }
            }
            for t in 0..GEMM_MICRO {
                for u in 0..GEMM_MICRO {
                    let (i, j) = (i0 + ty + step * t, j0 + tx + step * u);
                    if i < m && j < n {
                        store(i, j, acc[t][u]);
                    }
                }
            }
            j0 += GEMM_CHUNK;
        }
        i0 += GEMM_CHUNK;
    }
}
