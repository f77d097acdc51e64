//! FlashAttention-2 backward, f32 (FA2 paper, Algorithm 2): one work item
//! per `(K/V block j, batch, KV head)`; `K_j`, `V_j` stay in shared memory
//! and `dK_j`, `dV_j` accumulate on chip over the query heads of the KV
//! head's group (GQA/MQA: summed here, never one copy per query head) and
//! over the Q blocks `i` that see block `j` (blocks outside the causal /
//! window range are skipped); `dQ_i` is added to the f32 accumulator with
//! atomics. Runs between `bwd_preprocess_f32` (D, zeroed accumulator and
//! semaphores) and `bwd_dq_convert_f32`.
//!
//! Deterministic mode (`deterministic = 1`): the additions to Q block `i`
//! of head `(b, h)` happen in increasing `j`, behind the semaphore
//! `(b·nheads + h)·Tr + i`: block `j` waits until it counts
//! `j − j_first(i)` (the K/V blocks before `j` that see Q block `i`), adds,
//! then increments it — the same sums in the same order, the same bits.
//! No deadlock: work items are numbered `w = j·(batch·nheads_k) + (b, kvh)`,
//! each thread block takes `w = blockIdx, blockIdx + grid, …` in increasing
//! order, and a wait is only on items with a smaller `j`, hence a smaller
//! `w`. The host launches at most as many blocks as are resident at once
//! (occupancy × SMs), so every block runs; the smallest unfinished item's
//! block has finished all its earlier (smaller) items and so is on it, and
//! everything it waits for is smaller, hence finished: it proceeds.
//!
//! Launch (`host-crate/src/backward/`): `F32_THREADS` threads,
//! `BwdSmem::new(br, bc, d).bytes()` of dynamic shared memory, any grid
//! (deterministic: no more blocks than are resident at once).

use super::step::{self, DqUpdate, Head, Stats, Tiles, kv_blocks_of};
use crate::arch::global::{atom_add_acq_rel_u32_gpu, ld_acquire_u32_gpu, nanosleep};
use crate::arch::{sreg, sync::sync_threads};
use crate::score::ScoreFn;
use crate::tile::{GlobalRows, tid};
use flash_attn_common::BwdParams;

/// `bwd_fa2_f32(params)`.
///
/// # Safety
/// `params` from the host's validated backward launch: q, k, v, o, dO f32 at
/// their strides; dK, dV f32 of k's shape (non-overlapping); LSE, delta of
/// the LSE's length, the accumulator of that × headdim, the semaphores of
/// `semaphore_count` (deterministic); dynamic shared memory
/// `BwdSmem::new(br, bc, headdim).bytes()`, `F32_THREADS` threads.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn bwd_fa2_f32(p: BwdParams) {
    let (br, bc, d) = (p.br as usize, p.bc as usize, p.fwd.headdim as usize);
    // SAFETY: the host sized the dynamic shared memory (contract).
    let t = unsafe { Tiles::new(br, bc, d) };
    t.s_dk.fill(bc, d, 0.0);
    t.s_dv.fill(bc, d, 0.0);
    let bh = p.fwd.batch as u64 * p.fwd.kv_heads() as u64;
    let tc = (p.fwd.seqlen_k as u64).div_ceil(bc as u64);
    let total = tc * bh;
    let mut w = sreg::block_idx_x() as u64;
    while w < total {
        let j = (w / bh) as usize;
        let bhi = w % bh;
        let (b, kvh) = ((bhi / p.fwd.kv_heads() as u64) as usize, (bhi % p.fwd.kv_heads() as u64) as usize);
        // SAFETY: forwarded from this function's contract.
        unsafe { kv_block(&p, &t, j, b, kvh) };
        w += sreg::grid_dim_x() as u64;
    }
}

/// Work item `(j, b, kvh)`: `dK_j`, `dV_j` of KV head `kvh` over its query
/// heads, and their `dQ` contributions.
///
/// # Safety
/// As [`bwd_fa2_f32`].
#[inline(always)]
unsafe fn kv_block(p: &BwdParams, t: &Tiles, j: usize, b: usize, kvh: usize) {
    let a = &p.fwd;
    let (br, bc, d) = (p.br as usize, p.bc as usize, a.headdim as usize);
    // SAFETY: host-checked varlen arrays (values clamped inside).
    let seq = unsafe { a.seq(b as u32, kvh as u32) };
    let (nq, nk) = (seq.seqlen_q as usize, seq.seqlen_k as usize);
    let k0 = j * bc;
    if k0 >= nk {
        return; // varlen: this K/V block lies past its sequence
    }
    let kv_rows = bc.min(nk - k0);
    let row_off = |base: u64, stride: [u64; 3], row0: u64| base + 4 * row0 * stride[1];
    // SAFETY: the host checked every buffer against its shape and strides;
    // rows k0.. of dK, dV of (b, kvh) are written by this work item only.
    let (g_k, g_v, g_dk, g_dv) = unsafe {
        (
            GlobalRows::head(row_off(a.k_ptr, a.k_stride, seq.k_row0), a.k_stride, b, kvh, nk, d),
            GlobalRows::head(row_off(a.v_ptr, a.v_stride, seq.k_row0), a.v_stride, b, kvh, nk, d),
            GlobalRows::head(row_off(p.dk_ptr, p.dk_stride, seq.k_row0), p.dk_stride, b, kvh, nk, d),
            GlobalRows::head(row_off(p.dv_ptr, p.dv_stride, seq.k_row0), p.dv_stride, b, kvh, nk, d),
        )
    };
    sync_threads(); // the previous work item is done with s_k, s_v
    t.s_k.load(&g_k, k0, kv_rows, 0, d);
    t.s_v.load(&g_v, k0, kv_rows, 0, d);

    let group = (a.nheads / a.kv_heads()) as usize;
    let tr = (a.seqlen_q as usize).div_ceil(br);
    let win = a.key_window(seq.seqlen_q, seq.seqlen_k);
    for h in kvh * group..(kvh + 1) * group {
        // SAFETY: as above (same sequence, query head h).
        let seq = unsafe { a.seq(b as u32, h as u32) };
        // SAFETY: host-checked buffers and ALiBi slopes; dQ rows reached only
        // through the accumulator.
        let hd = unsafe {
            Head {
                p,
                b,
                h,
                win,
                score: ScoreFn::new(a, b, h, win.shift),
                lse_base: seq.lse_base as usize,
                nq,
                g_q: GlobalRows::head(row_off(a.q_ptr, a.q_stride, seq.q_row0), a.q_stride, b, h, nq, d),
                g_do: GlobalRows::head(row_off(p.do_ptr, p.do_stride, seq.q_row0), p.do_stride, b, h, nq, d),
            }
        };
        for i in 0..nq.div_ceil(br) {
            let q0 = i * br;
            let (j_first, j_end) = kv_blocks_of(&win, q0, br.min(nq - q0), bc);
            if j < j_first || j >= j_end {
                continue; // causal/window: no row of Q_i sees a key of block j
            }
            let sem = (p.dq_semaphore_ptr as *mut u32).wrapping_add((b * a.nheads as usize + h) * tr + i);
            if p.deterministic != 0 {
                // Wait for the j − j_first K/V blocks before this one.
                if tid() == 0 {
                    // SAFETY: semaphore (b, h, i) < semaphore_count (contract).
                    while unsafe { ld_acquire_u32_gpu(sem) } < (j - j_first) as u32 {
                        nanosleep(32);
                    }
                }
                // Thread 0's acquire, then the barrier: every thread's
                // additions below come after the earlier blocks'.
                sync_threads();
            }
            // SAFETY: this function's contract; the accumulator rows are
            // shared with other blocks only through atomics.
            unsafe { step::step(t, &hd, Stats::Lse, DqUpdate::Atomic, q0, k0, kv_rows) };
            if p.deterministic != 0 {
                step::release_dq();
                if tid() == 0 {
                    // SAFETY: as above.
                    unsafe { atom_add_acq_rel_u32_gpu(sem, 1) };
                }
            }
        }
    }
    step::store_dkv(t, &g_dk, &g_dv, k0, kv_rows, d, a.softmax_scale);
}
