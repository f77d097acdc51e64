//! `order_block_table`: each row of a block table with its position-free
//! full pages (`flash_attn_common::page_order`) sorted by page index, in
//! place — the device twin of the host's `flash_attn::order_block_table`,
//! for tables that live on the GPU (a decode loop in a CUDA graph).
//!
//! One thread block per row, a bitonic sort of the row's first `n` entries
//! (`n` from the row's `cache_seqlens`, clamped to the capacity) padded to
//! a power of two `n2` with `i32::MAX`. Each warp holds runs of
//! [`WARP_RUN`] entries in registers (two per lane): the steps with a
//! distance under a run go through shuffles, without shared memory or
//! barriers — the first six stages entirely, then the last six steps of
//! every later stage; only the steps with a longer distance (15 of the 66 of
//! a 2048-entry row) exchange through shared memory under the block's
//! barrier. Only the row's own `n` slots are read and written.

use crate::arch::shfl::shfl_xor_i32;
use crate::arch::smem::dynamic_smem;
use crate::arch::sreg::{block_dim_x, block_idx_x, thread_idx_x};
use crate::arch::sync::sync_threads;
use flash_attn_common::page_order::{PageOrderParams, WARP_RUN, bitonic_pair, free_pages, keeps_min};

/// `order_block_table(p)`: see the module docs. Grid `(batch)`, a block of
/// whole warps, `p.sort_len · 4` bytes of dynamic shared memory.
///
/// # Safety
/// `p.table_ptr` holds `batch · max_blocks_per_seq` i32, `p.cache_seqlens_ptr`
/// `batch` i32; `p.sort_len` is a power of two ≥ `max_blocks_per_seq`, and
/// the launch gives that many i32 of dynamic shared memory; `page_size ≥ 1`.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn order_block_table(p: PageOrderParams) {
    let (b, tid, nt) = (block_idx_x() as usize, thread_idx_x() as usize, block_dim_x() as usize);
    let max_blocks = p.max_blocks_per_seq as usize;
    let capacity = max_blocks as u64 * p.page_size as u64;
    // SAFETY: `batch` entries (the grid).
    let cached = unsafe { *(p.cache_seqlens_ptr as *const i32).add(b) };
    let cached = (cached.max(0) as u64).min(capacity);
    let n = free_pages(cached, p.seqlen_q as u64, p.s_new as u64, p.right, p.page_size as u64, max_blocks as u64) as usize;
    let n2 = n.next_power_of_two();
    if n < 2 || n2 > p.sort_len as usize {
        // Uniform over the block (no barrier is skipped by some threads
        // only); a row longer than the launch's buffer (not launched so by
        // the host) is left as it is.
        return;
    }
    // SAFETY: row `b` of `(batch, max_blocks)`; `n ≤ max_blocks`.
    let row = unsafe { (p.table_ptr as *mut i32).add(b * max_blocks) };
    let sm = dynamic_smem::<i32>();
    let (warp, lane, warps) = (tid / 32, tid % 32, nt / 32);
    // Runs of WARP_RUN entries (one, partly used, below that), dealt to the
    // warps in turn. Lane `lane` of run `r` holds entries `e0 = r·64 + 2·lane`
    // and `e0 + 1`; a lane with `e0 ≥ n2` holds two i32::MAX it never stores
    // (its shuffle partners at distances under n2 are such lanes too).
    let runs = n2.div_ceil(WARP_RUN);
    let top = if n2 < WARP_RUN { n2 } else { WARP_RUN };

    // Stages 2..=top in registers: straight from the row.
    let mut r = warp;
    while r < runs {
        let e0 = r * WARP_RUN + 2 * lane;
        // SAFETY: entries `< n ≤ max_blocks` of the row.
        let ld = |e: usize| if e < n { unsafe { *row.add(e) } } else { i32::MAX };
        let mut x = [ld(e0), ld(e0 + 1)];
        let mut k = 2;
        while k <= top {
            warp_steps(&mut x, e0, k, k / 2);
            k *= 2;
        }
        if e0 < n2 {
            // SAFETY: `e0 + 1 < n2 ≤ sort_len` (n2 even).
            unsafe { (*sm.add(e0), *sm.add(e0 + 1)) = (x[0], x[1]) };
        }
        r += warps;
    }
    sync_threads();
    // Later stages: the steps of distance ≥ WARP_RUN through shared memory
    // (one barrier each), then the last six in registers.
    let mut k = 2 * WARP_RUN;
    while k <= n2 {
        let mut j = k / 2;
        while j >= WARP_RUN {
            let lj = j.trailing_zeros();
            let mut q = tid;
            while q < n2 / 2 {
                let (i, l) = bitonic_pair(q, lj);
                // SAFETY: `i < l < n2`; each pair has one owner this step.
                unsafe {
                    let (a, c) = (*sm.add(i), *sm.add(l));
                    if (a > c) == (i & k == 0) {
                        *sm.add(i) = c;
                        *sm.add(l) = a;
                    }
                }
                q += nt;
            }
            sync_threads();
            j /= 2;
        }
        let mut r = warp;
        while r < runs {
            let e0 = r * WARP_RUN + 2 * lane;
            // SAFETY: `e0 + 1 < n2` (n2 ≥ 2·WARP_RUN here); the run is this warp's alone.
            unsafe {
                let mut x = [*sm.add(e0), *sm.add(e0 + 1)];
                warp_steps(&mut x, e0, k, WARP_RUN / 2);
                (*sm.add(e0), *sm.add(e0 + 1)) = (x[0], x[1]);
            }
            r += warps;
        }
        sync_threads();
        k *= 2;
    }
    let mut i = tid;
    while i < n {
        // SAFETY: `i < n ≤ max_blocks`, written before the last barrier.
        unsafe { *row.add(i) = *sm.add(i) };
        i += nt;
    }
}

/// The steps `j = j_top, j_top / 2, …, 1` of stage `k` on a lane's two
/// entries `e0`, `e0 + 1` (`x`): distance 1 inside the lane, the others
/// with lane `lane ^ j/2` (whose entries are `e0 ^ j`, `e0 + 1 ^ j`). All 32
/// lanes call it.
#[inline(always)]
fn warp_steps(x: &mut [i32; 2], e0: usize, k: usize, j_top: usize) {
    let mut j = j_top;
    while j >= 2 {
        let y = [shfl_xor_i32(x[0], (j / 2) as u32), shfl_xor_i32(x[1], (j / 2) as u32)];
        // e0 and e0 + 1 differ in bit 0 only: one rule for both.
        let min = keeps_min(e0, j, k);
        for t in 0..2 {
            x[t] = if min == (x[t] < y[t]) { x[t] } else { y[t] };
        }
        j /= 2;
    }
    let (lo, hi) = if x[0] < x[1] { (x[0], x[1]) } else { (x[1], x[0]) };
    *x = if keeps_min(e0, 1, k) { [lo, hi] } else { [hi, lo] };
}
