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
//!   rows past seqlen zero-filled); then the same for V.
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
//!   accumulators (4-byte pairs), the logsumexp from lanes with `t == 0`.

use super::{acc_fence, desc_kmajor, desc_mnmajor, mma_rs, mma_ss};
use crate::arch::named_barrier::{named_bar_arrive, named_bar_sync};
use crate::arch::mbarrier::{
    fence_mbarrier_init, mbarrier_arrive, mbarrier_arrive_expect_tx, mbarrier_init, mbarrier_wait,
};
use crate::arch::setmaxnreg::{setmaxnreg_dec, setmaxnreg_inc};
use crate::arch::smem::{dynamic_smem, smem_addr};
use crate::arch::sreg;
use crate::arch::sync::sync_threads;
use crate::arch::tma::{prefetch_tensormap, tma_load_4d};
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
>(
    tq: u64,
    tk: u64,
    tv: u64,
    p: &AttnParams,
) {
    const { assert!(DN * 8 == D && BCN * 8 == BC && BCK * 16 == BC && D % 64 == 0 && BC % 16 == 0 && (WGS == 2 || WGS == 3) && (OVERLAP || !PINGPONG) && (WGS == 2 || !PINGPONG) && !(PINGPONG && PERSISTENT)) };
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
            prefetch_tensormap(tq);
            prefetch_tensormap(tk);
            prefetch_tensormap(tv);
        }
    }
    sync_threads();

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
        if tid == 0 {
            let (num_m, num_tiles, first, step) = tiles();
            let (mut gi, mut q_round) = (0usize, 0u32);
            let mut tile = first;
            while tile < num_tiles {
                let tl = Tile::new(p, tile, num_m, br, BC);
                let (n_blocks, q0) = (tl.n_blocks, tl.q0);
                let (bi, hi) = (tl.b as i32, tl.h as i32);
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
                        let j = n_blocks - 1 - it;
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
                        let row = (j * BC) as i32;
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
        let Tile { bh, b, h, q0, mask_from, n_blocks } = Tile::new(p, tile, num_m, br, BC);
        let mut r_o = [[[0f32; 4]; DN]; 1];
        let mut st = [[RowState::<f32>::new(); 2]; 1];
        if n_blocks > 0 {
            // SAFETY: armed by the producer (phase q_round of the Q barrier).
            unsafe { mbarrier_wait(bar_q, q_round & 1) };
        }
        let row0 = q0 + cw * 64 + warp * 16 + g;
        let lim = [p.causal_key_limit(row0 as u32).min(nk as i64), p.causal_key_limit(row0 as u32 + 8).min(nk as i64)];

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
            softmax_block::<BC, BCN>(&mut r_s, &mut st, n_blocks - 1, mask_from, t, lim, scale_log2); // O = 0: alpha irrelevant
            // P is carried between iterations packed (Bc/4 registers, not Bc/2):
            // the d = 256 kernel spilled with the f32 copy live.
            let mut r_p = pack_p::<T, BCN, BCK>(&r_s);
            for it in 1..n_blocks {
                let j = n_blocks - 1 - it;
                let ((s, phase), (sp, phase_p)) = (stage(gi + it), stage(gi + it - 1));
                let mut r_s_next = [[0f32; 4]; BCN];
                // SAFETY: see above.
                unsafe { mbarrier_wait(bar_k_full(s), phase) };
                my_turn();
                issue_qk::<T, D, BC, BCN>(&mut r_s_next, s_q_wg, br * PANEL_ROW_BYTES, s_k(s));
                // SAFETY: see above.
                unsafe { mbarrier_wait(bar_v_full(sp), phase_p) };
                issue_pv::<T, BC, DN, BCK>(&mut r_o[0], &r_p, s_v(sp));
                pass_turn();
                wgmma_wait::<1>();
                acc_fence(&mut r_s_next);
                // SAFETY: initialized barrier; S_i (the products reading K stage s) completed.
                unsafe { mbarrier_arrive(bar_k_empty(s)) };
                let alpha = softmax_block::<BC, BCN>(&mut r_s_next, &mut st, j, mask_from, t, lim, scale_log2);
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
                let alpha = softmax_block::<BC, BCN>(&mut r_s, &mut st, j, mask_from, t, lim, scale_log2);
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
        let g_o = (p.o_ptr as *mut u16).wrapping_add((b as u64 * os0 + h as u64 * os2) as usize);
        for r in 0..2 {
            let row = row0 + 8 * r;
            st[0][r].l = quad_sum(st[0][r].l);
            let inv_l = st[0][r].inv_l();
            if row < nq {
                let o_row = g_o.wrapping_add(row * os1 as usize);
                for n in 0..DN {
                    let v = pack::<T>(r_o[0][n][2 * r] * inv_l, r_o[0][n][2 * r + 1] * inv_l);
                    // SAFETY: row < nq, col < D; 4-byte aligned (even column,
                    // host-checked strides).
                    unsafe { *(o_row.wrapping_add(n * 8 + 2 * t) as *mut u32) = v };
                }
                if t == 0 && p.lse_ptr != 0 {
                    // SAFETY: lse holds batch·nheads·nq f32.
                    unsafe { *(p.lse_ptr as *mut f32).add(bh * nq + row) = st[0][r].lse() };
                }
            }
        }
        tile += step;
    }
    if PINGPONG && cw == 0 {
        my_turn();
    }
}

/// One tile's coordinates: (batch·head, batch, head), first query row, the
/// first key some row of the tile cannot see (causal), and the K/V blocks.
struct Tile {
    bh: usize,
    b: usize,
    h: usize,
    q0: usize,
    mask_from: usize,
    n_blocks: usize,
}

impl Tile {
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
        Self { bh, b, h, q0, mask_from, n_blocks: kv_end.div_ceil(bc) }
    }
}

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

/// The softmax of block `j`: mask (diagonal and tail blocks), scale, new
/// row maxima, `P = exp2(S − m)` in place, row sums; returns the O rescale
/// factors of the thread's two rows (applied by the caller once the O
/// accumulators are no longer in flight).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn softmax_block<const BC: usize, const BCN: usize>(
    r_s: &mut [[f32; 4]; BCN],
    st: &mut [[RowState<f32>; 2]; 1],
    j: usize,
    mask_from: usize,
    t: usize,
    lim: [i64; 2],
    scale_log2: f32,
) -> [f32; 2] {
    let k0 = j * BC;
    let masked = k0 + BC > mask_from;
    if masked {
        mask::<BCN>(r_s, k0, t, [0, 0], lim);
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
fn rescale_o<const DN: usize>(r_o: &mut [[f32; 4]; DN], alpha: [f32; 2]) {
    if !vote_all(alpha[0] == 1.0 && alpha[1] == 1.0) {
        for n in 0..DN {
            for e in 0..4 {
                r_o[n][e] *= alpha[e >> 1];
            }
        }
    }
}
