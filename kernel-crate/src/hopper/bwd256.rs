//! The Hopper backward main kernel at head dim 256 (`flash_attn_common::
//! hopper_bwd`'s d 256 layout). Its prologue, uniform words and producer
//! warpgroup are those of the d 64/128 kernel (`super::bwd`, whose module
//! docs describe them and the deterministic mode) with `Bc` = `Br` = 64 —
//! a copy, not a shared function: the d 64/128 kernels' code is kept
//! unchanged (generic `Bc` moved their register allocation: a spill) —
//! except that the dQ block is staged in the step's own stage and warp 1
//! releases the stage (`empty`, one arrival) after its reductions have read
//! it. The consumers differ.
//!
//! At d 256 the d 64/128 split — 64 keys per consumer warpgroup, `dK`, `dV`
//! over the whole head dim in its registers — needs `2 · 64·256/128` = 256
//! accumulator registers per thread, over the 240 of `setmaxnreg`. So both
//! consumers work on the same 64 keys and split the head dim: consumer `c`
//! owns `dK_j`, `dV_j` columns `[128c, 128c + 128)` (2 × 64 registers).
//! Per step (`Q_i`, `dO_i`: 64 queries):
//!
//! * `Sᵀ = K_j·Q_iᵀ` and `dPᵀ = V_j·dO_iᵀ` are split by queries: consumer
//!   `c` computes columns `[32c, 32c + 32)` of both (`wgmma` m64n32k16 SS over
//!   the full head dim, two commit groups, 16 registers each), then
//!   `Pᵀ = exp2(Sᵀ·scale·log2 e − LSE_i·log2 e)` (masked on boundary blocks;
//!   rows past the sequence have `LSE = +∞`: `P = 0`) and
//!   `dSᵀ = Pᵀ∘(dPᵀ − D_i)` in f32 for its 32 queries — no f32 exchange.
//! * Its halves of `Pᵀ` and `dSᵀ` go to shared memory in 16 bits (keys ×
//!   queries, one 128B-swizzled panel each), a proxy fence and a named
//!   barrier of the two consumers (id 1, 256 threads).
//! * `dV_c += Pᵀ·dO_i[:, c]` and `dK_c += dSᵀ·Q_i[:, c]` (m64n128k16, A
//!   K-major from the `Pᵀ`/`dSᵀ` panels, B MN-major from the stage: SS, 4
//!   products each) and `dQ_c = dS·K_j[:, c]` (m64n128k16, both MN-major: 4
//!   products), one wait for all three.
//! * A second barrier (id 1): both consumers are done with the stage and
//!   with `Pᵀ`, `dSᵀ` (the next step rewrites those only after it). Then
//!   `dQ_c · scale` (64 queries × 128 columns, f32) is staged in the stage
//!   itself — consumer 0 over `Q_i`, consumer 1 over `dO_i`, four 64 × 32
//!   panels each, swizzled as the accumulator's tensor map says — fenced,
//!   and released to the producer's warp 1 (`dq_full`, 256 arrivals), whose
//!   eight TMA reductions read it and then free the stage for the loads
//!   (`empty`, one arrival).
//!
//! Registers: `dK_c`, `dV_c` 128, `dQ_c` 64, `Sᵀ`/`dPᵀ` 32 (dead before
//! `dQ_c` is live). Shared memory: K, V 64 KB, two stages of `Q_i | dO_i`
//! 128 KB, `Pᵀ`, `dSᵀ` 16 KB, rows, barriers and uniform words: 210 KB
//! (a separate double-buffered dQ staging, 128 KB, does not fit; staging in
//! the stage costs the producer the time between the consumers' last read
//! of a stage and the reductions' read, against a full step of prefetch).

use super::bwd::{PANEL_ROW, ld_shared_f32x2, swizzle128, uni, write_dkdv};
use super::{desc_kmajor, desc_mnmajor, mma_ss_n32, mma_st, mma_tt_n128};
use crate::arch::global::{atom_add_acq_rel_u32_gpu, ld_acquire_u32_gpu};
use crate::arch::mbarrier::{fence_mbarrier_init, mbarrier_arrive, mbarrier_arrive_expect_tx, mbarrier_init, mbarrier_wait};
use crate::arch::named_barrier::named_bar_sync;
use crate::arch::opaque;
use crate::arch::setmaxnreg::{setmaxnreg_dec, setmaxnreg_inc};
use crate::arch::smem::{dynamic_smem, ld_volatile_shared_u64, smem_addr, st_shared_u32, st_shared_u64};
use crate::arch::sreg;
use crate::arch::sync::sync_threads;
use crate::arch::tma::{bulk_commit_group, bulk_wait_group, bulk_wait_group_read, fence_proxy_async_global, fence_proxy_async_shared, prefetch_tensormap, tma_load_4d, tma_reduce_add_2d};
use crate::arch::wgmma::{acc_fence_n32, acc_fence_n128, wgmma_commit, wgmma_fence, wgmma_wait};
use crate::tc::fa2::mask;
use crate::tc::{Elem16, pack};
use flash_attn_common::hopper_bwd::{
    HOPPER_BWD_CONSUMER_REGS, HOPPER_BWD_DQ_PANEL_BYTES, HOPPER_BWD_PRODUCER_REGS, HOPPER_BWD_STAGES, HOPPER_BWD_UNI_WORDS, HopperBwdSmem, hopper_bwd_bc,
    hopper_bwd_br,
};
use flash_attn_common::tc_bwd::{bwd_key_blocks, bwd_query_range, bwd_semaphore_index, bwd_visiting_query_blocks};
use flash_attn_common::{BwdParams, LOG2_E, Real};

/// Head dim, query rows per step, keys per block.
const D: usize = 256;
const BR: usize = hopper_bwd_br(D);
const BC: usize = hopper_bwd_bc(D);
/// Queries of `Sᵀ`, `dPᵀ` per consumer (the `wgmma` N), and in 8-column groups.
const BRH: usize = BR / 2;
const BRHN: usize = BRH / 8;
/// Head-dim columns per consumer (`dK`, `dV`, `dQ` shares), in 8-column groups.
const DH: usize = D / 2;
const DHN: usize = DH / 8;

const _: () = assert!(BR == 64 && BC == 64 && BRHN == 4 && DHN == 16);

/// Issues `acc = A·Bᵀ` over the head dim (16 products, one commit group):
/// A the `64 × 256` K/V tile (four panels of `BC` rows), B the 32 rows of
/// a Q/dO tile (four panels of `BR` rows) from `s_b`, both K-major: this
/// consumer's query half of `Sᵀ` or `dPᵀ`.
#[inline(always)]
fn issue_abt_n32<T: Elem16>(acc: &mut [[f32; 4]; BRHN], s_a: u32, s_b: u32) {
    // Bases unknown to LLVM here (as the d 64/128 kernel's `issue_abt`).
    let (s_a, s_b) = (opaque::u32_fresh(s_a), opaque::u32_fresh(s_b));
    wgmma_fence();
    for kk in 0..D / 16 {
        let da = desc_kmajor(s_a + ((kk / 4) * BC * PANEL_ROW + (kk % 4) * 32) as u32);
        let db = desc_kmajor(s_b + ((kk / 4) * BR * PANEL_ROW + (kk % 4) * 32) as u32);
        // SAFETY: both tiles landed (barriers waited); neither is rewritten
        // before this warpgroup waits for the group.
        unsafe { mma_ss_n32::<T>(acc, da, db, (kk > 0) as u32) };
    }
    wgmma_commit();
}

/// Issues `acc += X·B` (`BR/16` products; the caller fences and commits): X the `64 × BR` 16-bit `Pᵀ`/`dSᵀ` panel at
/// `s_x` (K-major), B the `BR × 128` column half of a Q/dO tile from `s_b`
/// (MN-major, two panels of `BR` rows).
#[inline(always)]
fn issue_xb_ss<T: Elem16>(acc: &mut [[f32; 4]; DHN], s_x: u32, s_b: u32) {
    let (s_x, s_b) = (opaque::u32_fresh(s_x), opaque::u32_fresh(s_b));
    for kk in 0..BR / 16 {
        let da = desc_kmajor(s_x + (kk * 32) as u32);
        let db = desc_mnmajor(s_b + (kk * 16 * PANEL_ROW) as u32, (BR * PANEL_ROW) as u32);
        // SAFETY: the panels written and fenced before the consumers'
        // barrier, the tile landed; neither rewritten before both consumers
        // waited for the group (the second barrier of the step).
        unsafe { mma_st::<T>(acc, da, db, 1) };
    }
}

/// Stores this thread's 16-bit `64 × 32` values (`Pᵀ` or `dSᵀ`, the
/// accumulator layout of columns `[32c, 32c + 32)`) into the swizzled
/// `64 × 64` panel at `s_x`: row = key `kr (+8)`, the 16-byte chunk of
/// columns `8(4c + nn)..` at `(4c + nn) ^ (key % 8)`.
#[inline(always)]
fn store_panel<T: Elem16>(x: &[[f32; 4]; BRHN], s_x: u32, kr: usize, c: usize, t: usize) {
    let row0 = opaque::u32_fresh(s_x + (kr * PANEL_ROW + 4 * t) as u32);
    for nn in 0..BRHN {
        for r in 0..2 {
            let lin = row0 + (8 * r * PANEL_ROW + (4 * c + nn) * 16) as u32;
            // SAFETY: inside the panel; read by the products after the barrier.
            unsafe { st_shared_u32(swizzle128(lin), pack::<T>(x[nn][2 * r], x[nn][2 * r + 1])) };
        }
    }
}

/// The d 256 backward main kernel body (see the module docs; the prologue
/// and the producer warpgroup are `super::bwd::backward`'s with `Bc` = `Br`
/// = 64, the stage released by warp 1's reductions instead of the
/// consumers, no separate dQ staging).
///
/// # Safety
/// As `super::bwd::backward` at D = 256: `p` valid (host-checked shapes,
/// strides, dQ accumulator zeroed, delta computed), `maps` the generic
/// addresses of tensor maps of q, dO (boxes `64 × 64`), k and v (`64 × 64`)
/// and the f32 dQ accumulator (`lse rows × headdim`, boxes `32 × 64`, 128B
/// swizzle) describing `p`'s buffers, launched with `HOPPER_BWD_THREADS`
/// threads, `HopperBwdSmem::new(256).request_bytes()` of dynamic shared
/// memory and `batch · nheads_k · ceil(seqlen_k / 64)` blocks.
#[inline(always)]
pub unsafe fn backward<T: Elem16>(maps: [u64; 5], p: &BwdParams) {
    const { assert!(uni::COUNT == HOPPER_BWD_UNI_WORDS) };
    let lay = const { HopperBwdSmem::new(D) };
    let f = &p.fwd;
    let tid = sreg::thread_idx_x() as usize;

    // ---- shared memory (1024-aligned base) -------------------------------------
    let raw = dynamic_smem::<u8>();
    let base = (smem_addr(raw) + 1023) & !1023;
    let s_k = base + lay.k as u32;
    let s_v = base + lay.v as u32;
    let s_q = |s: usize| base + lay.q[s] as u32;
    let s_do = |s: usize| base + lay.dout[s] as u32;
    let s_dq = |b: usize| base + lay.dq[b] as u32;
    // LSE_i·log2 e (`rows(s, 0)`) and D_i (`rows(s, 1)`) of stage s.
    let rows = |s: usize, k: usize| base + (lay.rows + (2 * s + k) * BR * 4) as u32;
    let bar = |k: usize| base + (lay.bars + 8 * k) as u32;
    let bar_kv = bar(0);
    let bar_full = |s: usize| bar(1 + s);
    let bar_empty = |s: usize| bar(1 + HOPPER_BWD_STAGES + s);
    let bar_dq_full = |b: usize| bar(1 + 2 * HOPPER_BWD_STAGES + b);
    let uni = base + lay.uni as u32;
    // SAFETY: written before the prologue's barrier.
    let u = |w: u32| unsafe { ld_volatile_shared_u64(opaque::u32_fresh(uni) + 8 * w) };
    // Step n: stage n % 2 (phase (n / 2) % 2), query head h0 + n / ni, Q block ia + n % ni.
    let stage = |n: usize| (n % HOPPER_BWD_STAGES, ((n / HOPPER_BWD_STAGES) & 1) as u32);

    // ---- prologue (thread 0): who am I, what do I read ---------------------------
    if tid == 0 {
        let num_n = (f.seqlen_k as usize).div_ceil(BC);
        let idx = sreg::block_idx_x() as usize;
        // Deterministic mode numbers the K/V blocks from the end (block
        // j = num_n − 1 first): see the module docs.
        let (jr, bkh) = (idx % num_n, idx / num_n);
        let j = if p.deterministic != 0 { num_n - 1 - jr } else { jr };
        let nkh = f.kv_heads() as usize;
        let (b, kvh) = (bkh / nkh, bkh % nkh);
        let group = f.nheads as usize / nkh;
        let h0 = kvh * group;
        // SAFETY: host-checked varlen arrays (values clamped inside).
        let seq = unsafe { f.seq(b as u32, h0 as u32) };
        let (nq, nk) = (seq.seqlen_q as usize, seq.seqlen_k as usize);
        let k0 = j * BC;
        let win = f.key_window(seq.seqlen_q, seq.seqlen_k);
        let mut steps = 0;
        let (mut ia, mut ni, mut full_lo, mut full_hi) = (0, 0, 1, 0);
        // Varlen: a K/V block past its sequence has nothing to do (and no
        // keys to write).
        if k0 < nk {
            // The Q blocks that see block j (a contiguous range).
            let (a, ib) = bwd_visiting_query_blocks(&win, j, BR, BC, nq);
            (ia, ni) = (a, ib - a);
            steps = group * ni;
            // Queries every key of the block sees (a Q block inside needs no mask).
            if k0 + BC <= nk {
                let k_last = (k0 + BC - 1) as i64;
                (full_lo, full_hi) = (bwd_query_range(&win, k_last, nq as i64).0, bwd_query_range(&win, k0 as i64, nq as i64).1);
            }
        }
        let bu = b as u64;
        // SAFETY: 8-byte aligned words inside the requested shared memory,
        // used by no one before the barrier below. (One store per word: an
        // array of them iterated over lands in a stack frame.)
        let put = |w: u32, v: u64| unsafe { st_shared_u64(uni + 8 * w, v) };
        put(uni::Q_ROW0, seq.q_row0);
        put(uni::TMA_B, if f.is_varlen() { 0 } else { bu });
        put(uni::LSE, f.lse_ptr + 4 * seq.lse_base);
        put(uni::DELTA, p.delta_ptr + 4 * seq.lse_base);
        put(uni::LSE_HEAD_STRIDE, if f.is_varlen() { f.total_q } else { f.seqlen_q } as u64);
        put(uni::FULL_LO, full_lo as u64);
        put(uni::FULL_HI, full_hi as u64);
        put(uni::IA, ia as u64);
        put(uni::NI, ni as u64);
        put(uni::STEPS, steps as u64);
        put(uni::NQ, nq as u64);
        put(uni::H0, h0 as u64);
        put(uni::K_ROW, seq.k_row0 + k0 as u64);
        put(uni::KVH, kvh as u64);
        put(uni::K0, k0 as u64);
        put(uni::NK, nk as u64);
        put(uni::DK, p.dk_ptr + 2 * (bu * p.dk_stride[0] + seq.k_row0 * p.dk_stride[1] + kvh as u64 * p.dk_stride[2]));
        put(uni::DV, p.dv_ptr + 2 * (bu * p.dv_stride[0] + seq.k_row0 * p.dv_stride[1] + kvh as u64 * p.dv_stride[2]));
        put(uni::TMAP, maps[0]);
        put(uni::TMAP + 1, maps[1]);
        put(uni::TMAP + 2, maps[2]);
        put(uni::TMAP + 3, maps[3]);
        put(uni::TMAP + 4, maps[4]);
        put(uni::LSE_ROW0, seq.lse_base);
        put(uni::B, bu);
        put(uni::J, j as u64);
        // SAFETY: 8-byte aligned words inside the requested shared memory,
        // used by no one before the barrier below.
        unsafe {
            mbarrier_init(bar_kv, 1);
            for s in 0..HOPPER_BWD_STAGES {
                // Thread 0's expect_tx and warp 0's 32 row stores.
                mbarrier_init(bar_full(s), 33);
                // Released by warp 1 once its reductions have read the dQ
                // block staged in the stage.
                mbarrier_init(bar_empty(s), 1);
                mbarrier_init(bar_dq_full(s), 256);
            }
            fence_mbarrier_init();
            // (One call per map: a loop over the array is not unrolled and
            // puts it in a stack frame.)
            prefetch_tensormap(maps[0]);
            prefetch_tensormap(maps[1]);
            prefetch_tensormap(maps[2]);
            prefetch_tensormap(maps[3]);
            prefetch_tensormap(maps[4]);
        }
    }
    sync_threads();
    let steps = u(uni::STEPS) as usize;

    if tid < 128 {
        // ---- producer warpgroup --------------------------------------------------
        setmaxnreg_dec::<HOPPER_BWD_PRODUCER_REGS>();
        // (32-bit counters and indices here: the producer has 24 registers.)
        let (warp, lane) = ((tid / 32) as u32, (tid % 32) as u32);
        let steps = steps as u32;
        // Step n's query head (relative to h0) and first query row.
        let step_q = |n: u32| {
            let ni = u(uni::NI) as u32;
            (n / ni, (u(uni::IA) as u32 + n % ni) * BR as u32)
        };
        if warp == 0 && steps > 0 {
            if lane == 0 {
                let kv_bytes = (BC * D * 2) as u32;
                let (row, kvh, tb) = (u(uni::K_ROW) as i32, u(uni::KVH) as i32, u(uni::TMA_B) as i32);
                // SAFETY: the maps describe k and v (caller); the tiles are
                // read by no one before bar_kv completes.
                unsafe {
                    mbarrier_arrive_expect_tx(bar_kv, 2 * kv_bytes);
                    for pn in 0..D / 64 {
                        tma_load_4d(s_k + (pn * BC * PANEL_ROW) as u32, u(uni::TMAP + 2), [(64 * pn) as i32, row, kvh, tb], bar_kv);
                        tma_load_4d(s_v + (pn * BC * PANEL_ROW) as u32, u(uni::TMAP + 3), [(64 * pn) as i32, row, kvh, tb], bar_kv);
                    }
                }
            }
            for n in 0..steps {
                let (s, phase) = stage(n as usize);
                let (hh, q0) = step_q(n);
                // SAFETY: barriers initialized; the consumers release stage s
                // (read by step n − 2) on its empty barrier.
                unsafe { mbarrier_wait(bar_empty(s), phase ^ 1) };
                if lane == 0 {
                    let qd_bytes = (BR * D * 2) as u32;
                    let (row, h, tb) = ((u(uni::Q_ROW0) as u32 + q0) as i32, (u(uni::H0) as u32 + hh) as i32, u(uni::TMA_B) as i32);
                    // SAFETY: the maps describe q and dO (caller); stage s is
                    // free (waited above) until bar_full(s) completes.
                    unsafe {
                        mbarrier_arrive_expect_tx(bar_full(s), 2 * qd_bytes);
                        for pn in 0..D / 64 {
                            tma_load_4d(s_q(s) + (pn * BR * PANEL_ROW) as u32, u(uni::TMAP), [(64 * pn) as i32, row, h, tb], bar_full(s));
                            tma_load_4d(s_do(s) + (pn * BR * PANEL_ROW) as u32, u(uni::TMAP + 1), [(64 * pn) as i32, row, h, tb], bar_full(s));
                        }
                    }
                }
                let at = hh as u64 * u(uni::LSE_HEAD_STRIDE) + q0 as u64;
                for k in 0..(BR / 32) as u32 {
                    let r = lane + 32 * k;
                    let (mut l2, mut dl) = (f32::INFINITY, 0.0);
                    if q0 + r < u(uni::NQ) as u32 {
                        let i = (at + r as u64) as usize;
                        // SAFETY: row q0 + r < nq of head h0 + hh: inside the
                        // LSE and delta buffers (indexed alike).
                        let (l, dd) = unsafe { (*(u(uni::LSE) as *const f32).add(i), *(u(uni::DELTA) as *const f32).add(i)) };
                        // A row that sees no key (LSE −∞) has P = 0: never −∞ − −∞.
                        l2 = if l == f32::NEG_INFINITY { f32::INFINITY } else { l * LOG2_E };
                        dl = dd;
                    }
                    // SAFETY: inside stage s's rows, free as the tiles above.
                    unsafe {
                        st_shared_u32(rows(s, 0) + 4 * r, l2.to_bits());
                        st_shared_u32(rows(s, 1) + 4 * r, dl.to_bits());
                    }
                }
                // SAFETY: each lane's stores, released by its arrival.
                unsafe { mbarrier_arrive(bar_full(s)) };
            }
        } else if warp == 1 && steps > 0 && lane == 0 {
            let det = p.deterministic != 0;
            // The semaphore index of (Q block at row q0, batch, head h0 + hh).
            let dq_sem_index = |hh: u32, q0: u32| {
                let num_m = (f.seqlen_q as usize).div_ceil(BR);
                bwd_semaphore_index(u(uni::B) as usize, (u(uni::H0) as u32 + hh) as usize, q0 as usize / BR, f.nheads as usize, num_m)
            };
            // dQ: each staged block added to the accumulator by eight TMA
            // reductions.
            for n in 0..steps {
                let (b, phase) = stage(n as usize);
                let (hh, q0) = step_q(n);
                let row0 = (u(uni::LSE_ROW0) + hh as u64 * u(uni::LSE_HEAD_STRIDE) + q0 as u64) as i32;
                // SAFETY: the consumers' 256 arrivals after their staging stores.
                unsafe { mbarrier_wait(bar_dq_full(b), phase) };
                // Deterministic mode: the semaphore of step n's (Q block,
                // batch, head).
                let sem = (p.dq_semaphore_ptr as *mut u32).wrapping_add(if det { dq_sem_index(hh, q0) } else { 0 });
                if det {
                    // This block's turn: the K/V blocks after j that see Q
                    // block i (up to its last, `end − 1`) have added theirs.
                    let nq = u(uni::NQ) as usize;
                    let win = f.key_window(nq as u32, u(uni::NK) as u32);
                    let turn = (bwd_key_blocks(&win, q0 as usize / BR, BR, BC, nq).1 - 1 - u(uni::J) as usize) as u32;
                    // SAFETY: the semaphore of (i, b, h), zeroed at launch.
                    while unsafe { ld_acquire_u32_gpu(sem) } != turn {}
                    fence_proxy_async_global();
                }
                // The step's 64 × 256 block in eight 32-column panels,
                // staged in its stage: rows past the sequence are zero
                // (their P is) and columns past the head dim lie outside
                // the map: skipped.
                for pn in 0..8u32 {
                    // SAFETY: the map describes the accumulator (caller);
                    // the panel written, fenced and released by the
                    // consumers' arrivals (waited above), 1024-aligned.
                    unsafe { tma_reduce_add_2d(u(uni::TMAP + 4), [(32 * pn) as i32, row0], s_dq(b) + pn * HOPPER_BWD_DQ_PANEL_BYTES as u32) };
                }
                bulk_commit_group();
                if det {
                    // Complete (not only read) before the release.
                    bulk_wait_group();
                    fence_proxy_async_global();
                    // SAFETY: the semaphore waited for above.
                    unsafe { atom_add_acq_rel_u32_gpu(sem, 1) };
                } else {
                    bulk_wait_group_read();
                }
                // SAFETY: the reductions have read the stage, which the
                // loads may now refill.
                unsafe { mbarrier_arrive(bar_empty(b)) };
            }
            bulk_wait_group();
        }
        return;
    }

    // ---- consumer warpgroups ----------------------------------------------------------
    setmaxnreg_inc::<HOPPER_BWD_CONSUMER_REGS>();
    // SAFETY: the consumer threads of this block, after the prologue's barrier.
    unsafe { consumers::<T>(p, base, steps) };
}

/// The two consumer warpgroups at d 256 (see the module docs), from after
/// their `setmaxnreg` to the end of the kernel.
///
/// # Safety
/// Called by [`backward`]'s consumer threads (tid 128..384) only, after its
/// prologue and barrier: `base` the
/// 1024-aligned base of this block's layout (`HopperBwdSmem::new(256)`),
/// its barriers initialized and uniform words written, `steps` the block's
/// steps; the producer warpgroup runs the protocol of the module docs.
#[inline(always)]
unsafe fn consumers<T: Elem16>(p: &BwdParams, base: u32, steps: usize) {
    let lay = const { HopperBwdSmem::new(D) };
    let f = &p.fwd;
    let tid = sreg::thread_idx_x() as usize;
    let s_k = base + lay.k as u32;
    let s_v = base + lay.v as u32;
    let s_q = |s: usize| base + lay.q[s] as u32;
    let s_do = |s: usize| base + lay.dout[s] as u32;
    let s_p = base + lay.ds as u32;
    let s_ds = base + lay.ds_d256() as u32;
    let rows = |s: usize, k: usize| base + (lay.rows + (2 * s + k) * BR * 4) as u32;
    let bar = |k: usize| base + (lay.bars + 8 * k) as u32;
    let bar_kv = bar(0);
    let bar_full = |s: usize| bar(1 + s);
    let bar_dq_full = |b: usize| bar(1 + 2 * HOPPER_BWD_STAGES + b);
    let uni = base + lay.uni as u32;
    // SAFETY: written before the prologue's barrier.
    let u = |w: u32| unsafe { ld_volatile_shared_u64(opaque::u32_fresh(uni) + 8 * w) };
    let stage = |n: usize| (n % HOPPER_BWD_STAGES, ((n / HOPPER_BWD_STAGES) & 1) as u32);

    let c = tid / 128 - 1;
    let wl = tid % 128;
    let (ww, lane) = (wl / 32, tid % 32);
    let (g, t) = (lane / 4, lane % 4);
    let kw = ww * 16; // this warp's first key, in the block (both consumers: all 64)
    let scale = f.softmax_scale;
    let mut r_dk = [[0f32; 4]; DHN];
    let mut r_dv = [[0f32; 4]; DHN];
    if steps > 0 {
        // SAFETY: armed by the producer when there are steps.
        unsafe { mbarrier_wait(bar_kv, 0) };
    }
    for n in 0..steps {
        let (s, phase) = stage(n);
        let q0 = (u(uni::IA) as usize + n % u(uni::NI) as usize) * BR;
        // SAFETY: armed by the producer for every step.
        unsafe { mbarrier_wait(bar_full(s), phase) };

        // Sᵀ, dPᵀ for this consumer's 32 queries.
        let mut r_p = [[0f32; 4]; BRHN];
        let mut r_ds = [[0f32; 4]; BRHN];
        let qoff = (BRH * c * PANEL_ROW) as u32;
        issue_abt_n32::<T>(&mut r_p, s_k, s_q(s) + qoff);
        issue_abt_n32::<T>(&mut r_ds, s_v, s_do(s) + qoff);
        wgmma_wait::<1>();
        acc_fence_n32(&mut r_p);
        for nn in 0..BRHN {
            for e in 0..4 {
                r_p[nn][e] *= f.softmax_scale_log2;
            }
        }
        if !(u(uni::FULL_LO) as i64 <= q0 as i64 && (q0 + BR) as i64 <= u(uni::FULL_HI) as i64) {
            // Boundary block (window, causal diagonal, sequence ends): the
            // rows' query ranges recomputed here, as the d 64/128 kernel.
            let nq = u(uni::NQ) as i64;
            let win = f.key_window(nq as u32, u(uni::NK) as u32);
            let k0 = u(uni::K0) as usize;
            let k_row = opaque::u32_fresh((k0 + kw + g) as u32) as i64;
            let r0 = bwd_query_range(&win, k_row, nq);
            let r1 = bwd_query_range(&win, k_row + 8, nq);
            mask::<BRHN>(&mut r_p, q0 + BRH * c, t, [r0.0, r1.0], [r0.1, r1.1]);
        }
        let col = 4 * (BRH * c + 2 * t) as u32;
        let lse = rows(s, 0) + col;
        for nn in 0..BRHN {
            // SAFETY: stage s landed (its full barrier); 8-byte aligned (even column).
            let l = unsafe { ld_shared_f32x2(lse + 32 * nn as u32) };
            for e in 0..4 {
                r_p[nn][e] = (r_p[nn][e] - l[e & 1]).exp2();
            }
        }
        wgmma_wait::<0>();
        acc_fence_n32(&mut r_ds);
        let dlt = rows(s, 1) + col;
        for nn in 0..BRHN {
            // SAFETY: as above.
            let dv = unsafe { ld_shared_f32x2(dlt + 32 * nn as u32) };
            for e in 0..4 {
                r_ds[nn][e] = r_p[nn][e] * (r_ds[nn][e] - dv[e & 1]);
            }
        }
        // Pᵀ, dSᵀ halves (16-bit) to shared memory: free, as both consumers
        // passed the previous step's second barrier after their products.
        store_panel::<T>(&r_p, s_p, kw + g, c, t);
        store_panel::<T>(&r_ds, s_ds, kw + g, c, t);
        fence_proxy_async_shared();
        // SAFETY: barrier 1: the 256 consumer threads, twice per step.
        unsafe { named_bar_sync(1, 256) }; // Pᵀ, dSᵀ complete

        // dV_c += Pᵀ·dO_i[:, c], dK_c += dSᵀ·Q_i[:, c], dQ_c = dS·K_j[:, c].
        let half = (2 * c * BR * PANEL_ROW) as u32;
        wgmma_fence();
        issue_xb_ss::<T>(&mut r_dv, s_p, s_do(s) + half);
        issue_xb_ss::<T>(&mut r_dk, s_ds, s_q(s) + half);
        let mut r_dq = [[0f32; 4]; DHN];
        let (s_dsf, s_kf) = (opaque::u32_fresh(s_ds), opaque::u32_fresh(s_k + (2 * c * BC * PANEL_ROW) as u32));
        for kq in 0..BC / 16 {
            let da = desc_mnmajor(s_dsf + (kq * 16 * PANEL_ROW) as u32, (BC * PANEL_ROW) as u32);
            let db = desc_mnmajor(s_kf + (kq * 16 * PANEL_ROW) as u32, (BC * PANEL_ROW) as u32);
            // SAFETY: dSᵀ written (fenced, barrier passed), K_j landed.
            unsafe { mma_tt_n128::<T>(&mut r_dq, da, db, (kq > 0) as u32) };
        }
        wgmma_commit();
        wgmma_wait::<0>();
        acc_fence_n128(&mut r_dq);
        acc_fence_n128(&mut r_dv);
        acc_fence_n128(&mut r_dk);
        // SAFETY: barrier 1 again: both consumers' products that read stage
        // s, Pᵀ and dSᵀ are complete.
        unsafe { named_bar_sync(1, 256) };

        // dQ_c · scale into the stage: consumer c's four panels of 64 rows
        // × 32 columns (128-byte rows, 128B-swizzled as the accumulator's
        // tensor map says), dQ columns 128c + 32p..: row r = 16·warp + g
        // (+ 8), columns 8nn + 2t, + 1 of the consumer's 128.
        let s_dqf = opaque::u32_fresh(s_q(s) + (4 * c * HOPPER_BWD_DQ_PANEL_BYTES + (kw + g) * PANEL_ROW + 8 * t) as u32);
        for nn in 0..DHN {
            for r in 0..2 {
                let lin = s_dqf + ((nn / 4) * HOPPER_BWD_DQ_PANEL_BYTES + 8 * r * PANEL_ROW + (nn % 4) * 32) as u32;
                let v = ((r_dq[nn][2 * r + 1] * scale).to_bits() as u64) << 32 | (r_dq[nn][2 * r] * scale).to_bits() as u64;
                // SAFETY: inside stage s, no longer read by any product
                // (waited above) nor written by the loads until warp 1
                // releases it.
                unsafe { st_shared_u64(swizzle128(lin), v) };
            }
        }
        fence_proxy_async_shared();
        // SAFETY: the stores above, released to warp 1 (256 arrivals).
        unsafe { mbarrier_arrive(bar_dq_full(s)) };
    }

    // ---- epilogue: dK_j · scale and dV_j, this consumer's 128 columns -----------
    write_dkdv::<T, DHN>(p, u, &r_dk, &r_dv, kw + g, DH * c + 2 * t);
}
