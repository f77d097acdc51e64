//! The FA2-order forward kernel on wgmma + TMA, warp-specialized.
//!
//! Block `(Q block mb, batch·head bh)` (1-D grid, Q blocks fastest, causal
//! blocks longest first, as the tensor-core kernels): 3 warpgroups.
//!
//! * **Producer** (warpgroup 0, `setmaxnreg.dec` to 24): thread 0 loads the
//!   Q tile once (its own mbarrier), then for each K/V block `j` (last
//!   first: the masked blocks come first) waits until K stage `it % 2` is
//!   free (its *empty* barrier), arms the stage's K *full* barrier with the
//!   tile bytes and issues the TMA copies (64-column panels, 128B swizzle,
//!   rows past seqlen and columns past the caller's head dim zero-filled:
//!   a head dim below `D` runs as `D` with exact products); then the same
//!   for V.
//! * **Consumers** (warpgroups 1, 2, `setmaxnreg.inc` to 240): 64 query rows
//!   each. Per block: wait K full; `S = Q·K_jᵀ` (`wgmma` m64n{Bc}k16, both
//!   operands in shared memory); mask (diagonal and tail blocks only);
//!   online softmax in registers (the accumulator layout is the
//!   `mma.m16n8k16` C layout, so `tc::fa2`'s softmax pieces run unchanged);
//!   wait V full; `O += P·V_j` (`wgmma` m64n{d}k16, P from registers, V read
//!   MN-major). Intra-warpgroup overlap: `S_{i}` and `P_{i−1}·V_{i−1}` are
//!   issued together and the softmax of `S_i` runs while `P·V` is on the
//!   tensor cores; K stages are released when `S_i` completes, V stages
//!   when `P·V` does.
//! * **Epilogue**: the quad sums `l`, `O / l` stored straight from the
//!   accumulators (4-byte pairs, the caller's head dim's columns), the
//!   logsumexp from lanes with `t == 0`.
//!
//! **Varlen and sliding windows** (`VW`, a separate instantiation: the dense
//! kernels keep their code). Thread 0 looks the tile's sequence up once
//! (`AttnParams::seq`: prefix sums clamped to the buffers) and computes its
//! key-block range from the window rule of `flash_attn_common::mask`
//! (blocks outside every row's window are never loaded; blocks not inside
//! every row's window are masked per element); the results live in shared
//! memory ([`Uni`]) and are read where used. A Q block past its sequence's
//! end leaves after the prologue. TMA copies address the packed tensors
//! (one batch of `total` rows) at the sequence's first row: a tile may read
//! rows of the next sequence (masked scores, unstored rows; V's rows past
//! the sequence's last key are zeroed in shared memory, [`zero_v_rows`]),
//! never rows past the tensor (zero-filled by the copy engine). O and the
//! logsumexp are stored per row, only rows of the tile's sequence.

use super::{acc_fence, desc_kmajor, desc_mnmajor, mma_rs, mma_ss};
use crate::arch::named_barrier::{named_bar_arrive, named_bar_sync};
use crate::arch::mbarrier::{
    fence_mbarrier_init, mbarrier_arrive, mbarrier_arrive_expect_tx, mbarrier_init, mbarrier_wait,
};
use crate::arch::setmaxnreg::{setmaxnreg_dec, setmaxnreg_inc};
use crate::arch::smem::{dynamic_smem, ld_volatile_shared_u32, smem_addr, st_shared_u32};
use crate::arch::sreg;
use crate::arch::sync::sync_threads;
use crate::arch::tma::{fence_proxy_async_shared, prefetch_tensormap, tma_load_4d};
use crate::arch::wgmma::{wgmma_commit, wgmma_fence, wgmma_wait};
use crate::arch::shfl::vote_all;
use crate::tc::fa2::{clamp_keys, exp_row, mask, quad_sum, row_max, scale_row};
use crate::tc::{Elem16, pack};
use flash_attn_common::hopper::{
    HOPPER_PRODUCER_REGS, HopperSmem, hopper_br, hopper_consumer_regs, hopper_tile_bytes,
};
use flash_attn_common::{AttnParams, RowState};

/// Row 128-byte panels: a tile of `rows` rows stores its 64-column panel
/// `pn` at `pn · rows · 128` bytes.
const PANEL_ROW_BYTES: usize = 128;

/// The forward kernel body (module docs).
///
/// # Safety
/// See the entry points in `super`: tensor maps `tq`, `tk`, `tv` (generic
/// addresses of the parameters) for q, k, v with boxes `64 × Br` and
/// `64 × Bc`; `p` valid; the launch shape of `HopperSmem`/`hopper_threads(WGS)`.
#[inline(always)]
pub unsafe fn forward<
    T: Elem16,
    const D: usize,
    const BC: usize,
    const DN: usize,
    const BCN: usize,
    const BCK: usize,
    const OVERLAP: bool,
    const PINGPONG: bool,
    const WGS: usize,
    const PERSISTENT: bool,
    const VW: bool,
>(
    tq: u64,
    tk: u64,
    tv: u64,
    p: &AttnParams,
) {
    const { assert!(DN * 8 == D && BCN * 8 == BC && BCK * 16 == BC && D % 64 == 0 && BC % 16 == 0 && (WGS == 2 || WGS == 3) && (OVERLAP || !PINGPONG) && (WGS == 2 || !PINGPONG) && !(PINGPONG && PERSISTENT) && (!VW || (OVERLAP && !PINGPONG && !PERSISTENT))) };
    let br = const { hopper_br(WGS) };
    let lay = const { HopperSmem::new(D, BC, WGS) };
    let q_bytes = hopper_tile_bytes(br, D) as u32;
    let kv_bytes = hopper_tile_bytes(BC, D) as u32;

    // ---- prologue: shared memory, barriers, block coordinates -------------
    let base = (smem_addr(dynamic_smem::<u8>()) + 1023) & !1023;
    let s_q = base + lay.q as u32;
    let s_k = |s: u32| base + lay.k[0] as u32 + s * kv_bytes;
    let s_v = |s: u32| base + lay.v[0] as u32 + s * kv_bytes;
    let bar_q = base + lay.bars as u32;
    let bar_k_full = |s: u32| bar_q + 8 + 8 * s;
    let bar_v_full = |s: u32| bar_q + 24 + 8 * s;
    let bar_k_empty = |s: u32| bar_q + 40 + 8 * s;
    let bar_v_empty = |s: u32| bar_q + 56 + 8 * s;
    let bar_q_empty = bar_q + 72;
    // Stage and phase parity of the `gi`-th K/V block this block processes
    // (counted across tiles when persistent).
    let stage = |gi: usize| ((gi & 1) as u32, ((gi / 2) & 1) as u32);

    // `VW` kernels (one tile per block): the tile's sequence, key blocks and
    // window, computed once by thread 0 and kept in shared memory, read
    // where used (no registers held across the K/V loop; see `Uni`).
    let uni = base + lay.uni as u32;

    let tid = sreg::thread_idx_x() as usize;
    if tid == 0 {
        // SAFETY: 8-byte aligned words inside the requested shared memory,
        // used by no one before the barrier below.
        unsafe {
            mbarrier_init(bar_q, 1);
            mbarrier_init(bar_q_empty, (128 * WGS) as u32);
            for s in 0..2 {
                mbarrier_init(bar_k_full(s), 1);
                mbarrier_init(bar_v_full(s), 1);
                mbarrier_init(bar_k_empty(s), (128 * WGS) as u32);
                mbarrier_init(bar_v_empty(s), (128 * WGS) as u32);
            }
            fence_mbarrier_init();
            if VW {
                // SAFETY: host-checked varlen arrays (values clamped inside);
                // the uniforms are read after the barrier below.
                Tile::new_vw(p, sreg::block_idx_x(), p.seqlen_q.div_ceil(br as u32), br, BC).store(uni);
            }
            prefetch_tensormap(tq);
            prefetch_tensormap(tk);
            prefetch_tensormap(tv);
        }
    }
    sync_threads();
    // Varlen: a Q block past its sequence's end has nothing to do (the grid
    // covers max_seqlen_q for every sequence; block-uniform).
    // SAFETY: written before the barrier above.
    if VW && unsafe { Uni::get(uni, Uni::Q0) >= Uni::get(uni, Uni::NQ) } {
        return;
    }

    // Tiles (Q block, batch·head), Q blocks fastest, causal longest first.
    // A persistent block takes tiles blockIdx.x, + gridDim.x, …; the others
    // exactly one. Computed by each role after its `setmaxnreg` (in 32 bits:
    // the host keeps the tile count under 2³¹): values live across the
    // register reallocation spill, and the producer has 24 registers.
    let tiles = || {
        let num_m = p.seqlen_q.div_ceil(br as u32);
        let num_tiles = num_m * p.batch * p.nheads;
        let first = sreg::block_idx_x();
        let step = if PERSISTENT { sreg::grid_dim_x() } else { num_tiles.max(1) };
        (num_m, num_tiles, first, step)
    };

    if tid < 128 {
        // ---- producer warpgroup ---------------------------------------------
        setmaxnreg_dec::<HOPPER_PRODUCER_REGS>();
        let uni = if VW { uni_addr_fresh(lay.uni) } else { 0 };
        if tid == 0 {
            let (num_m, num_tiles, first, step) = tiles();
            let (mut gi, mut q_round) = (0usize, 0u32);
            let mut tile = first;
            while tile < num_tiles {
                // SAFETY: the uniforms were written before the prologue's barrier.
                let tl = if VW { unsafe { Tile::load(uni, p, tile, num_m) } } else { Tile::new(p, tile, num_m, br, BC) };
                let (n_blocks, q0) = (tl.n_blocks, tl.q0 + tl.q_row0 as usize);
                let (bi, hi) = (tl.tma_b as i32, tl.h as i32);
                // GQA/MQA: K and V come from the query head's KV head (`hi`
                // is not needed past Q's load: reuse its register). The
                // producer runs under a 32-register cap.
                let hki = if p.nheads_k == 0 || p.nheads_k == p.nheads { hi } else { p.kv_head(tl.h as u32) as i32 };
                // SAFETY: every destination is a 1024-aligned panel of a buffer
                // that no one reads until its full barrier completes; the empty
                // barrier waits guarantee the consumers are done with Q (the
                // previous tile) or a K/V stage before it is overwritten.
                unsafe {
                    if n_blocks > 0 {
                        mbarrier_wait(bar_q_empty, (q_round & 1) ^ 1);
                        mbarrier_arrive_expect_tx(bar_q, q_bytes);
                        for pn in 0..D / 64 {
                            tma_load_4d(s_q + (pn * br * PANEL_ROW_BYTES) as u32, tq, [64 * pn as i32, q0 as i32, hi, bi], bar_q);
                        }
                        q_round += 1;
                    }
                    for it in 0..n_blocks {
                        let j = tl.j_first + n_blocks - 1 - it;
                        let (s, phase) = stage(gi);
                        gi += 1;
                        // Stage s was last read by block gi − 2 (phase parity
                        // flipped); for the first two, parity 1 is the phase
                        // "before" the first: no wait. K and V have their own
                        // empty barriers: the consumers are done with K_i (S_i
                        // complete) an iteration before they are done with V_i,
                        // and K_{i+2} must not wait for V_i.
                        let parity = phase ^ 1;
                        mbarrier_wait(bar_k_empty(s), parity);
                        let row = (tl.k_row0 as usize + j * BC) as i32;
                        mbarrier_arrive_expect_tx(bar_k_full(s), kv_bytes);
                        for pn in 0..D / 64 {
                            tma_load_4d(s_k(s) + (pn * BC * PANEL_ROW_BYTES) as u32, tk, [64 * pn as i32, row, hki, bi], bar_k_full(s));
                        }
                        mbarrier_wait(bar_v_empty(s), parity);
                        mbarrier_arrive_expect_tx(bar_v_full(s), kv_bytes);
                        for pn in 0..D / 64 {
                            tma_load_4d(s_v(s) + (pn * BC * PANEL_ROW_BYTES) as u32, tv, [64 * pn as i32, row, hki, bi], bar_v_full(s));
                        }
                    }
                }
                tile += step;
            }
        }
        return;
    }

    // ---- consumer warpgroups ------------------------------------------------
    if WGS == 3 {
        setmaxnreg_inc::<{ hopper_consumer_regs(3) }>();
    } else {
        setmaxnreg_inc::<{ hopper_consumer_regs(2) }>();
    }
    let uni = if VW { uni_addr_fresh(lay.uni) } else { 0 };
    let cw = tid / 128 - 1;
    let warp = (tid / 32) % 4;
    let lane = tid % 32;
    let (g, t) = (lane / 4, lane % 4);
    let s_q_wg = s_q + (cw * 64 * PANEL_ROW_BYTES) as u32;
    let scale_log2 = p.softmax_scale_log2;
    let nq = p.seqlen_q as usize;
    let nk = p.seqlen_k as usize;
    let (num_m, num_tiles, first, step) = tiles();
    let mut tile = first;
    let (mut gi, mut q_round) = (0usize, 0u32);
    // Pingpong (FA3): named barrier 1 + w says "consumer warpgroup w may issue
    // its GEMMs". Each round a warpgroup waits for its turn, issues, and hands
    // the turn to the other, so one's softmax runs while the other's GEMMs
    // do. Warpgroup 1 hands warpgroup 0 the first turn; warpgroup 0 takes a
    // last one after its loop, so every barrier phase is complete at exit.
    let turn = |w: usize| 1 + w as u32;
    let my_turn = || {
        if PINGPONG {
            // SAFETY: 128 threads sync and the other warpgroup's 128 arrive
            // per phase (module docs: both warpgroups run the same rounds).
            unsafe { named_bar_sync(turn(cw), 256) }
        }
    };
    let pass_turn = || {
        if PINGPONG {
            // SAFETY: as above.
            unsafe { named_bar_arrive(turn(1 - cw), 256) }
        }
    };
    if PINGPONG && cw == 1 {
        pass_turn();
    }

    while tile < num_tiles {
        // VW: only the coordinates from the tile index; the rest is read
        // from the uniforms (written before the prologue's barrier) where it
        // is used.
        let tl = if VW { Tile::coords(p, tile, num_m, br) } else { Tile::new(p, tile, num_m, br, BC) };
        let Tile { bh, b, h, q0, .. } = tl;
        // SAFETY: as above.
        let n_blocks = if VW { unsafe { Uni::get(uni, Uni::N_BLOCKS) as usize } } else { tl.n_blocks };
        // Key blocks j_end − 1, j_end − 2, … (dense: from n_blocks − 1; VW:
        // j_first read where used, not held across the loop).
        // SAFETY: as above.
        let j_end = || if VW { (unsafe { Uni::get(uni, Uni::J_FIRST) } as usize) + n_blocks } else { n_blocks };
        let mask_from = tl.full_end;
        let mut r_o = [[[0f32; 4]; DN]; 1];
        let mut st = [[RowState::<f32>::new(); 2]; 1];
        if n_blocks > 0 {
            // SAFETY: armed by the producer (phase q_round of the Q barrier).
            unsafe { mbarrier_wait(bar_q, q_round & 1) };
        }
        let row0 = q0 + cw * 64 + warp * 16 + g;
        // Dense: each thread's two rows see keys [0, lim). (VW kernels derive
        // their window bounds afresh in masked blocks: `vw_mask`.)
        let lim = if VW { [0, 0] } else { [p.causal_key_limit(row0 as u32).min(nk as i64), p.causal_key_limit(row0 as u32 + 8).min(nk as i64)] };
        let block_mask = |j: usize| {
            if VW {
                // SAFETY: as above.
                unsafe { vw_mask::<BC>(p, uni, j) }
            } else {
                (j * BC + BC > mask_from, [0, 0], lim)
            }
        };

        if n_blocks > 0 && OVERLAP {
            // Intra-warpgroup overlap (FA3): while O += P_{i−1}·V_{i−1} runs on
            // the tensor cores, the softmax of S_i = Q·K_iᵀ runs on the FMA/MUFU
            // units. Order per iteration: issue S_i, issue P_{i−1}·V_{i−1},
            // wait_group 1 (S_i done, K stage free), softmax(S_i), wait_group 0
            // (O done, V stage free), O *= alpha_i.
            // SAFETY (waits): barriers armed by the producer for every block.
            let (s0, phase0) = stage(gi);
            unsafe { mbarrier_wait(bar_k_full(s0), phase0) };
            let mut r_s = [[0f32; 4]; BCN];
            my_turn();
            issue_qk::<T, D, BC, BCN>(&mut r_s, s_q_wg, br * PANEL_ROW_BYTES, s_k(s0));
            pass_turn();
            wgmma_wait::<0>();
            acc_fence(&mut r_s);
            // SAFETY: initialized barrier; the products reading K stage s0 completed.
            unsafe { mbarrier_arrive(bar_k_empty(s0)) };
            softmax_block::<BC, BCN>(&mut r_s, &mut st, j_end() - 1, block_mask(j_end() - 1), t, scale_log2); // O = 0: alpha irrelevant
            // P is carried between iterations packed (Bc/4 registers, not Bc/2):
            // the d = 256 kernel spilled with the f32 copy live.
            let mut r_p = pack_p::<T, BCN, BCK>(&r_s);
            for it in 1..n_blocks {
                let j = j_end() - 1 - it;
                let ((s, phase), (sp, phase_p)) = (stage(gi + it), stage(gi + it - 1));
                let mut r_s_next = [[0f32; 4]; BCN];
                // SAFETY: see above.
                unsafe { mbarrier_wait(bar_k_full(s), phase) };
                my_turn();
                issue_qk::<T, D, BC, BCN>(&mut r_s_next, s_q_wg, br * PANEL_ROW_BYTES, s_k(s));
                // SAFETY: see above.
                unsafe { mbarrier_wait(bar_v_full(sp), phase_p) };
                if VW && it == 1 {
                    // SAFETY: V of the first block landed; no P·V read it yet.
                    unsafe { zero_v_tail::<D, BC>(p, uni, s_v(sp), n_blocks, 128 * WGS) };
                }
                issue_pv::<T, BC, DN, BCK>(&mut r_o[0], &r_p, s_v(sp));
                pass_turn();
                wgmma_wait::<1>();
                acc_fence(&mut r_s_next);
                // SAFETY: initialized barrier; S_i (the products reading K stage s) completed.
                unsafe { mbarrier_arrive(bar_k_empty(s)) };
                let alpha = softmax_block::<BC, BCN>(&mut r_s_next, &mut st, j, block_mask(j), t, scale_log2);
                // Pin the softmax above the wait: LLVM would otherwise sink the
                // (pure) exponentials below it, towards their use in `pack_p`,
                // and they would no longer overlap P·V (SASS showed half the
                // MUFU.EX2 after the wait).
                acc_fence(&mut r_s_next);
                wgmma_wait::<0>();
                acc_fence(&mut r_o[0]);
                // SAFETY: initialized barrier; the products reading V stage sp completed.
                unsafe { mbarrier_arrive(bar_v_empty(sp)) };
                rescale_o::<DN>(&mut r_o[0], alpha);
                r_p = pack_p::<T, BCN, BCK>(&r_s_next);
            }
            let (sl, phase_l) = stage(gi + n_blocks - 1);
            // SAFETY: see above.
            unsafe { mbarrier_wait(bar_v_full(sl), phase_l) };
            if VW && n_blocks == 1 {
                // SAFETY: as in the loop.
                unsafe { zero_v_tail::<D, BC>(p, uni, s_v(sl), n_blocks, 128 * WGS) };
            }
            my_turn();
            issue_pv::<T, BC, DN, BCK>(&mut r_o[0], &r_p, s_v(sl));
            pass_turn();
            wgmma_wait::<0>();
            acc_fence(&mut r_o[0]);
            // SAFETY: as above (not needed by the producer, kept for symmetry).
            unsafe { mbarrier_arrive(bar_v_empty(sl)) };
        } else if n_blocks > 0 {
            // No overlap: each GEMM waited for at once (step 3 of the notes).
            for it in 0..n_blocks {
                let j = n_blocks - 1 - it;
                let (s, phase) = stage(gi + it);
                let mut r_s = [[0f32; 4]; BCN];
                // SAFETY: see above.
                unsafe { mbarrier_wait(bar_k_full(s), phase) };
                issue_qk::<T, D, BC, BCN>(&mut r_s, s_q_wg, br * PANEL_ROW_BYTES, s_k(s));
                wgmma_wait::<0>();
                acc_fence(&mut r_s);
                // SAFETY: initialized barrier; the products reading K stage s completed.
                unsafe { mbarrier_arrive(bar_k_empty(s)) };
                let alpha = softmax_block::<BC, BCN>(&mut r_s, &mut st, j, block_mask(j), t, scale_log2);
                rescale_o::<DN>(&mut r_o[0], alpha);
                let r_p = pack_p::<T, BCN, BCK>(&r_s);
                // SAFETY: see above.
                unsafe { mbarrier_wait(bar_v_full(s), phase) };
                issue_pv::<T, BC, DN, BCK>(&mut r_o[0], &r_p, s_v(s));
                wgmma_wait::<0>();
                acc_fence(&mut r_o[0]);
                // SAFETY: initialized barrier; the products reading V stage s completed.
                unsafe { mbarrier_arrive(bar_v_empty(s)) };
            }
        }

        if n_blocks > 0 {
            // Q is free for the next tile's copy (which then overlaps this
            // epilogue).
            // SAFETY: initialized barrier; every product reading Q completed.
            unsafe { mbarrier_arrive(bar_q_empty) };
            gi += n_blocks;
            q_round += 1;
        }

        // ---- epilogue: one 1/l, store O and the logsumexp -------------------------
        let [os0, os1, os2] = p.o_stride;
        // Varlen: the sequence's rows and lse base, read again (not held
        // across the loop); dense: the batch stride and (b, h, row).
        let (nq, q_row0, lse_base) = if VW {
            // SAFETY: as above.
            let (nq, q_row0) = unsafe { (Uni::get(uni, Uni::NQ) as usize, Uni::get(uni, Uni::Q_ROW0) as u64) };
            let lse_base = if p.is_varlen() { h as u64 * p.total_q as u64 + q_row0 } else { bh as u64 * nq as u64 };
            (nq, q_row0, lse_base as usize)
        } else {
            (nq, 0, bh * nq)
        };
        let g_o = (p.o_ptr as *mut u16).wrapping_add((b as u64 * os0 + q_row0 * os1 + h as u64 * os2) as usize);
        // The caller's head dim: D, or a multiple of 8 below it whose extra
        // columns the copies zero-filled (their O columns are not stored).
        let hd = p.headdim as usize;
        for r in 0..2 {
            let row = row0 + 8 * r;
            st[0][r].l = quad_sum(st[0][r].l);
            let inv_l = st[0][r].inv_l();
            if row < nq {
                let o_row = g_o.wrapping_add(row * os1 as usize);
                for n in 0..DN {
                    let v = pack::<T>(r_o[0][n][2 * r] * inv_l, r_o[0][n][2 * r + 1] * inv_l);
                    if n * 8 < hd {
                        // SAFETY: row < nq, col < headdim (a multiple of 8);
                        // 4-byte aligned (even column, host-checked strides).
                        unsafe { *(o_row.wrapping_add(n * 8 + 2 * t) as *mut u32) = v };
                    }
                }
                if t == 0 && p.lse_ptr != 0 {
                    // SAFETY: lse holds batch·nheads·nq f32 (dense) or
                    // nheads·total_q (varlen; row < the clamped segment).
                    unsafe { *(p.lse_ptr as *mut f32).add(lse_base + row) = st[0][r].lse() };
                }
            }
        }
        tile += step;
    }
    if PINGPONG && cw == 0 {
        my_turn();
    }
}

/// One tile's coordinates: (batch·head, batch, head), first query row (in
/// the sequence), the K/V blocks it visits, the keys every row of it sees,
/// and (varlen) where its sequence lies in the packed tensors.
pub(super) struct Tile {
    pub(super) bh: usize,
    pub(super) b: usize,
    pub(super) h: usize,
    pub(super) q0: usize,
    /// Key blocks `j_first..j_first + n_blocks` (visited last first).
    j_first: usize,
    n_blocks: usize,
    /// Keys every row of the tile sees: a block inside `[full_start,
    /// full_end)` needs no mask (dense causal/none: `[0, first key some row
    /// cannot see)`).
    full_start: usize,
    full_end: usize,
    /// First row of the sequence in q/o and in k/v (0 dense), and the batch
    /// coordinate of the TMA copies (`b` dense, 0 varlen: packed tensors are
    /// mapped with one batch of `total` rows).
    q_row0: u32,
    k_row0: u32,
    tma_b: u32,
    /// The sequence's query and key counts.
    nq: u32,
    nk: u32,
}

impl Tile {
    /// Dense kernels (causal or no mask): the parameter block's lengths.
    #[inline(always)]
    fn new(p: &AttnParams, tile: u32, num_m: u32, br: usize, bc: usize) -> Self {
        let (nq, nk) = (p.seqlen_q as usize, p.seqlen_k as usize);
        let bh = tile / num_m;
        let r = tile - bh * num_m;
        let mb = if p.causal != 0 { num_m - 1 - r } else { r };
        let (bh, mb) = (bh as usize, mb as usize);
        let q0 = mb * br;
        // Keys this tile can see: causal rows see keys < i + 1 + nk − nq.
        let shift = nk as i64 - nq as i64;
        let (kv_end, mask_from) = if p.causal != 0 {
            (clamp_keys((q0 + br) as i64 + shift, nk), clamp_keys(q0 as i64 + 1 + shift, nk))
        } else {
            (nk, nk)
        };
        let (b, h) = ((bh as u32 / p.nheads) as usize, (bh as u32 % p.nheads) as usize);
        Self {
            bh,
            b,
            h,
            q0,
            j_first: 0,
            n_blocks: kv_end.div_ceil(bc),
            full_start: 0,
            full_end: mask_from,
            q_row0: 0,
            k_row0: 0,
            tma_b: b as u32,
            nq: nq as u32,
            nk: nk as u32,
        }
    }

    /// The varlen/window kernels (`VW`): the sequence from the prefix sums
    /// (`AttnParams::seq`, clamped) and the key window of
    /// `flash_attn_common::mask` (blocks outside every row's window are not
    /// visited).
    ///
    /// # Safety
    /// As [`AttnParams::seq`].
    #[inline(always)]
    pub(super) unsafe fn new_vw(p: &AttnParams, tile: u32, num_m: u32, br: usize, bc: usize) -> Self {
        let bh = tile / num_m;
        let r = tile - bh * num_m;
        let mb = if p.causal != 0 { num_m - 1 - r } else { r };
        let (b, h) = (bh / p.nheads, bh % p.nheads);
        // SAFETY: caller.
        let seq = unsafe { p.seq(b, h) };
        let (nq, nk) = (seq.seqlen_q as usize, seq.seqlen_k as usize);
        let q0 = mb as usize * br;
        let win = p.key_window(seq.seqlen_q, seq.seqlen_k);
        let q_end = (q0 + br).min(nq) as i64;
        let (kv_start, kv_end) = win.block_range(q0 as i64, q_end);
        let (full_start, full_end) = win.unmasked_range(q0 as i64, q_end);
        let j_first = kv_start as usize / bc;
        let j_end = if kv_start < kv_end { (kv_end as usize).div_ceil(bc) } else { j_first };
        Self {
            bh: bh as usize,
            b: b as usize,
            h: h as usize,
            q0,
            j_first,
            n_blocks: if q0 < nq { j_end - j_first } else { 0 },
            full_start: clamp_keys(full_start, nk),
            full_end: clamp_keys(full_end, nk),
            q_row0: seq.q_row0 as u32,
            k_row0: seq.k_row0 as u32,
            tma_b: if p.is_varlen() { 0 } else { b },
            nq: nq as u32,
            nk: nk as u32,
        }
    }
}

/// The shared-window address of the uniforms (`HopperSmem::uni` from the
/// 1024-aligned base), computed by an asm statement the compiler may not
/// merge with the prologue's: a value live across `setmaxnreg` is spilled,
/// so each role derives it again after its register reallocation.
#[inline(always)]
pub(super) fn uni_addr_fresh(uni_off: usize) -> u32 {
    let a: u32;
    // SAFETY: address arithmetic only (no `pure`: not merged across the
    // register reallocation).
    unsafe {
        core::arch::asm!(
            "{{ .reg .u64 t; cvta.to.shared.u64 t, {p}; cvt.u32.u64 {a}, t; }}",
            a = out(reg32) a, p = in(reg64) dynamic_smem::<u8>(),
            options(nomem, nostack)
        )
    };
    ((a + 1023) & !1023) + uni_off as u32
}

/// The tile uniforms of the `VW` kernels in shared memory (`HopperSmem::uni`,
/// 4-byte words at these offsets): thread 0 writes them before the
/// prologue's barrier; every role reads them with volatile loads where it
/// uses them, so the compiler holds none of them in registers across the
/// K/V loop (the varlen and window state pushed the d = 64 and d = 256
/// consumers into spills when it lived in registers).
pub(super) struct Uni;

impl Uni {
    pub(super) const Q0: u32 = 0;
    pub(super) const NQ: u32 = 4;
    pub(super) const NK: u32 = 8;
    pub(super) const J_FIRST: u32 = 12;
    pub(super) const N_BLOCKS: u32 = 16;
    const FULL_START: u32 = 20;
    const FULL_END: u32 = 24;
    pub(super) const Q_ROW0: u32 = 28;
    pub(super) const K_ROW0: u32 = 32;
    pub(super) const TMA_B: u32 = 36;

    /// # Safety
    /// Written (by [`Tile::store`]) before a barrier this thread passed.
    #[inline(always)]
    pub(super) unsafe fn get(uni: u32, off: u32) -> u32 {
        // SAFETY: caller; inside the block's shared memory.
        unsafe { ld_volatile_shared_u32(uni + off) }
    }
}

impl Tile {
    /// Writes the uniforms (see [`Uni`]).
    ///
    /// # Safety
    /// `uni` is the block's uniform area, read by no one before a barrier.
    #[inline(always)]
    pub(super) unsafe fn store(&self, uni: u32) {
        let vals = [
            (Uni::Q0, self.q0 as u32),
            (Uni::NQ, self.nq),
            (Uni::NK, self.nk),
            (Uni::J_FIRST, self.j_first as u32),
            (Uni::N_BLOCKS, self.n_blocks as u32),
            (Uni::FULL_START, self.full_start as u32),
            (Uni::FULL_END, self.full_end as u32),
            (Uni::Q_ROW0, self.q_row0),
            (Uni::K_ROW0, self.k_row0),
            (Uni::TMA_B, self.tma_b),
        ];
        for (off, v) in vals {
            // SAFETY: caller.
            unsafe { st_shared_u32(uni + off, v) };
        }
    }

    /// The coordinates that follow from the tile index alone (batch·head,
    /// batch, head, first query row); the other fields are zero.
    #[inline(always)]
    pub(super) fn coords(p: &AttnParams, tile: u32, num_m: u32, br: usize) -> Self {
        let bh = tile / num_m;
        let r = tile - bh * num_m;
        let mb = if p.causal != 0 { num_m - 1 - r } else { r };
        let (b, h) = (bh / p.nheads, bh % p.nheads);
        Self {
            bh: bh as usize,
            b: b as usize,
            h: h as usize,
            q0: mb as usize * br,
            j_first: 0,
            n_blocks: 0,
            full_start: 0,
            full_end: 0,
            q_row0: 0,
            k_row0: 0,
            tma_b: 0,
            nq: 0,
            nk: 0,
        }
    }

    /// The whole tile of a `VW` kernel: coordinates and uniforms.
    ///
    /// # Safety
    /// As [`Uni::get`].
    #[inline(always)]
    unsafe fn load(uni: u32, p: &AttnParams, tile: u32, num_m: u32) -> Self {
        // SAFETY: caller.
        unsafe {
            Self {
                q0: Uni::get(uni, Uni::Q0) as usize,
                nq: Uni::get(uni, Uni::NQ),
                nk: Uni::get(uni, Uni::NK),
                j_first: Uni::get(uni, Uni::J_FIRST) as usize,
                n_blocks: Uni::get(uni, Uni::N_BLOCKS) as usize,
                full_start: Uni::get(uni, Uni::FULL_START) as usize,
                full_end: Uni::get(uni, Uni::FULL_END) as usize,
                q_row0: Uni::get(uni, Uni::Q_ROW0),
                k_row0: Uni::get(uni, Uni::K_ROW0),
                tma_b: Uni::get(uni, Uni::TMA_B),
                // q0 comes from the uniforms (the Q-block size is not needed).
                ..Self::coords(p, tile, num_m, 0)
            }
        }
    }
}

/// `VW` kernels: whether key block `j` needs the per-element mask (window
/// edge, diagonal or tail: not inside the keys every row of the tile sees),
/// and if so the visible keys `[lo, hi)` of this thread's two rows (`g`,
/// `g + 8` of its warp), derived afresh from the special registers and the
/// uniforms.
///
/// # Safety
/// As [`Uni::get`]; called by consumer threads only.
#[inline(always)]
pub(super) unsafe fn vw_mask<const BC: usize>(p: &AttnParams, uni: u32, j: usize) -> (bool, [i64; 2], [i64; 2]) {
    let k0 = (j * BC) as u32;
    // SAFETY: caller.
    let masked = unsafe { k0 < Uni::get(uni, Uni::FULL_START) || k0 + BC as u32 > Uni::get(uni, Uni::FULL_END) };
    if !masked {
        return (false, [0; 2], [0; 2]);
    }
    let (_, tid) = sreg::block_and_thread_idx_fresh();
    let tid = tid as usize;
    let in_tile = (tid / 128 - 1) * 64 + (tid / 32 % 4) * 16 + (tid % 32) / 4;
    // SAFETY: caller.
    let (q0, nq, nk) = unsafe { (Uni::get(uni, Uni::Q0), Uni::get(uni, Uni::NQ), Uni::get(uni, Uni::NK)) };
    let r0 = q0 as i64 + in_tile as i64;
    let win = p.key_window(nq, nk);
    (true, [win.lo(r0), win.lo(r0 + 8)], [win.hi(r0), win.hi(r0 + 8)])
}

/// Varlen: the K/V copies of the block holding the sequence's last key run
/// on into the next sequence's rows (or, with seqused_k, into keys the call
/// does not use). Their scores are masked, but V's rows meet P = 0 in P·V,
/// and 0 · NaN is NaN: when the tile's first block (`j_first + n_blocks −
/// 1`, visited first) holds the last key and ends past it, its V rows past
/// the key are zeroed ([`zero_v_rows`]) before any P·V reads them (the
/// mma.sync kernels zero-fill them in the copy). Called just before the
/// first P·V, when the consumers wait for that V anyway.
///
/// # Safety
/// As [`zero_v_rows`] and [`Uni::get`]; `s_v` holds the tile's first block;
/// called by the `n` consumer threads (thread indices 128..128 + n).
#[inline(always)]
unsafe fn zero_v_tail<const D: usize, const BC: usize>(p: &AttnParams, uni: u32, s_v: u32, n_blocks: usize, n: usize) {
    if !p.is_varlen() {
        return; // dense: the copy engine zero-fills rows past seqlen_k
    }
    // SAFETY: caller.
    let (nk, j_first) = unsafe { (Uni::get(uni, Uni::NK) as usize, Uni::get(uni, Uni::J_FIRST) as usize) };
    if nk % BC != 0 && j_first + n_blocks - 1 == nk / BC {
        // The consumer's index, from the special register (not held live
        // across the K/V loop).
        let (_, tid) = sreg::block_and_thread_idx_fresh();
        // SAFETY: caller (block-uniform condition: every consumer calls it).
        unsafe { zero_v_rows::<D, BC>(s_v, nk % BC, tid as usize - 128, n) };
    }
}

/// Zeroes rows `from..BC` of a `BC × D` K/V tile (64-column panels of
/// `BC × 128` bytes; whole rows, so the swizzle does not matter) with the
/// `n` consumer threads (`ct` = this thread's index among them), then makes
/// the stores visible to the tensor cores' (async proxy) reads and waits
/// for every consumer thread (named barrier 3).
///
/// # Safety
/// `s_v` a landed tile no product has started reading; every consumer
/// thread calls it with the same arguments.
#[inline(always)]
unsafe fn zero_v_rows<const D: usize, const BC: usize>(s_v: u32, from: usize, ct: usize, n: usize) {
    let words = (BC - from) * PANEL_ROW_BYTES / 4;
    for pn in 0..D / 64 {
        let base = s_v + (pn * BC * PANEL_ROW_BYTES + from * PANEL_ROW_BYTES) as u32;
        let mut w = ct;
        while w < words {
            // SAFETY: inside the tile (caller).
            unsafe { st_shared_u32(base + 4 * w as u32, 0) };
            w += n;
        }
    }
    fence_proxy_async_shared();
    // SAFETY: all `n` consumer threads call this (caller).
    unsafe { named_bar_sync(ZERO_V_BARRIER, n as u32) };
}

/// Named barrier of [`zero_v_rows`] (1 and 2 are pingpong's).
const ZERO_V_BARRIER: u32 = 3;

/// Issues `S = Q·Kᵀ` (`D/16` products, one commit group) for the
/// warpgroup's 64 rows of Q at `s_q_wg` and the K tile at `s_k`.
#[inline(always)]
fn issue_qk<T: Elem16, const D: usize, const BC: usize, const BCN: usize>(
    r_s: &mut [[f32; 4]; BCN],
    s_q_wg: u32,
    q_panel_bytes: usize,
    s_k: u32,
) {
    wgmma_fence();
    for kk in 0..D / 16 {
        let da = desc_kmajor(s_q_wg + ((kk / 4) * q_panel_bytes + (kk % 4) * 32) as u32);
        let db = desc_kmajor(s_k + ((kk / 4) * BC * PANEL_ROW_BYTES + (kk % 4) * 32) as u32);
        // SAFETY: Q and K landed (their barriers completed); neither is
        // rewritten before this warpgroup arrives on the empty barrier.
        unsafe { mma_ss::<T, BCN>(r_s, da, db, (kk > 0) as u32) };
    }
    wgmma_commit();
}

/// The probabilities (S accumulator layout, f32) as the register A operand
/// of `P·V`: k16 step `kk` takes accumulator columns `16kk..16kk+16`.
#[inline(always)]
fn pack_p<T: Elem16, const BCN: usize, const BCK: usize>(r_s: &[[f32; 4]; BCN]) -> [[u32; 4]; BCK] {
    let mut r_p = [[0u32; 4]; BCK];
    for kk in 0..BCK {
        let (s0, s1) = (&r_s[2 * kk], &r_s[2 * kk + 1]);
        r_p[kk] = [pack::<T>(s0[0], s0[1]), pack::<T>(s0[2], s0[3]), pack::<T>(s1[0], s1[1]), pack::<T>(s1[2], s1[3])];
    }
    r_p
}

/// Issues `O += P·V` (`Bc/16` products, one commit group), P the packed
/// register A operand, V the tile at `s_v`.
#[inline(always)]
fn issue_pv<T: Elem16, const BC: usize, const DN: usize, const BCK: usize>(
    r_o: &mut [[f32; 4]; DN],
    r_p: &[[u32; 4]; BCK],
    s_v: u32,
) {
    wgmma_fence();
    for kk in 0..BCK {
        let a = r_p[kk];
        let db = desc_mnmajor(s_v + (kk * 16 * PANEL_ROW_BYTES) as u32, (BC * PANEL_ROW_BYTES) as u32);
        // SAFETY: V landed; rewritten only after the empty barrier.
        unsafe { mma_rs::<T, DN>(r_o, a, db, 1) };
    }
    wgmma_commit();
}

/// The softmax of block `j`: mask (window edge, diagonal and tail blocks:
/// keys outside each row's `[lo, hi)`), scale, new
/// row maxima, `P = exp2(S − m)` in place, row sums; returns the O rescale
/// factors of the thread's two rows (applied by the caller once the O
/// accumulators are no longer in flight).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(super) fn softmax_block<const BC: usize, const BCN: usize>(
    r_s: &mut [[f32; 4]; BCN],
    st: &mut [[RowState<f32>; 2]; 1],
    j: usize,
    (masked, lo, hi): (bool, [i64; 2], [i64; 2]),
    t: usize,
    scale_log2: f32,
) -> [f32; 2] {
    let k0 = j * BC;
    if masked {
        mask::<BCN>(r_s, k0, t, lo, hi);
    }
    let mut alpha = [1f32; 2];
    for r in 0..2 {
        if masked {
            scale_row::<BCN, true>(r_s, r, scale_log2);
        } else {
            scale_row::<BCN, false>(r_s, r, scale_log2);
        }
        let (a, m_safe) = st[0][r].rescale(row_max::<BCN>(r_s, r));
        alpha[r] = a;
        let sum = exp_row::<BCN>(r_s, r, m_safe);
        st[0][r].accumulate(sum);
    }
    alpha
}

/// `O *= alpha` per row (thread rows g, g + 8), skipped when no row maximum
/// moved in the whole warp (one vote instead of `4·DN` multiplies).
#[inline(always)]
pub(super) fn rescale_o<const DN: usize>(r_o: &mut [[f32; 4]; DN], alpha: [f32; 2]) {
    if !vote_all(alpha[0] == 1.0 && alpha[1] == 1.0) {
        for n in 0..DN {
            for e in 0..4 {
                r_o[n][e] *= alpha[e >> 1];
            }
        }
    }
}
