//! The FA2-order forward kernel on wgmma + TMA, warp-specialized.
//!
//! Block `(Q block mb, batch·head bh)` (1-D grid, Q blocks fastest, causal
//! blocks longest first, as the tensor-core kernels): 3 warpgroups.
//!
//! * **Producer** (warpgroup 0, `setmaxnreg.dec` to 24): thread 0 loads the
//!   Q tile once (its own mbarrier), then for each K/V block `j` (last
//!   first: the masked blocks come first) waits until stage `it % 2` is
//!   free (the *empty* barrier), arms the stage's K and V *full* barriers
//!   with the tile bytes and issues their TMA copies (64-column panels,
//!   128B swizzle, rows past seqlen zero-filled).
//! * **Consumers** (warpgroups 1, 2, `setmaxnreg.inc` to 240): 64 query rows
//!   each. Per block: wait K full; `S = Q·K_jᵀ` (`wgmma` m64n{Bc}k16, both
//!   operands in shared memory); mask (diagonal and tail blocks only);
//!   online softmax in registers (the accumulator layout is the
//!   `mma.m16n8k16` C layout, so `tc::fa2`'s softmax runs unchanged); wait
//!   V full; `O += P·V_j` (`wgmma` m64n{d}k16, P from registers, V read
//!   MN-major); arrive on the stage's empty barrier.
//! * **Epilogue**: the quad sums `l`, `O / l` stored straight from the
//!   accumulators (4-byte pairs), the logsumexp from lanes with `t == 0`.

use super::{acc_fence, desc_kmajor, desc_mnmajor, mma_rs, mma_ss};
use crate::arch::mbarrier::{
    fence_mbarrier_init, mbarrier_arrive, mbarrier_arrive_expect_tx, mbarrier_init, mbarrier_wait,
};
use crate::arch::setmaxnreg::{setmaxnreg_dec, setmaxnreg_inc};
use crate::arch::smem::{dynamic_smem, smem_addr};
use crate::arch::sreg;
use crate::arch::sync::sync_threads;
use crate::arch::tma::{prefetch_tensormap, tma_load_4d};
use crate::arch::wgmma::{wgmma_commit, wgmma_fence, wgmma_wait};
use crate::tc::fa2::{clamp_keys, mask, quad_sum, softmax_step};
use crate::tc::{Elem16, pack};
use flash_attn_common::hopper::{
    HOPPER_BR, HOPPER_CONSUMER_REGS, HOPPER_CONSUMER_WGS, HOPPER_PRODUCER_REGS, HopperSmem, hopper_tile_bytes,
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
/// `64 × Bc`; `p` valid; the launch shape of `HopperSmem`/`HOPPER_THREADS`.
#[inline(always)]
pub unsafe fn forward<T: Elem16, const D: usize, const BC: usize, const DN: usize, const BCN: usize>(
    tq: u64,
    tk: u64,
    tv: u64,
    p: &AttnParams,
) {
    const { assert!(DN * 8 == D && BCN * 8 == BC && D % 64 == 0 && BC % 16 == 0 && HOPPER_CONSUMER_WGS == 2) };
    let lay = const { HopperSmem::new(D, BC) };
    let q_bytes = hopper_tile_bytes(HOPPER_BR, D) as u32;
    let kv_bytes = hopper_tile_bytes(BC, D) as u32;

    // ---- prologue: shared memory, barriers, block coordinates -------------
    let base = (smem_addr(dynamic_smem::<u8>()) + 1023) & !1023;
    let s_q = base + lay.q as u32;
    let s_k = |s: u32| base + lay.k[0] as u32 + s * kv_bytes;
    let s_v = |s: u32| base + lay.v[0] as u32 + s * kv_bytes;
    let bar_q = base + lay.bars as u32;
    let bar_k_full = |s: u32| bar_q + 8 + 8 * s;
    let bar_v_full = |s: u32| bar_q + 24 + 8 * s;
    let bar_empty = |s: u32| bar_q + 40 + 8 * s;

    let tid = sreg::thread_idx_x() as usize;
    if tid == 0 {
        // SAFETY: 8-byte aligned words inside the requested shared memory,
        // used by no one before the barrier below.
        unsafe {
            mbarrier_init(bar_q, 1);
            for s in 0..2 {
                mbarrier_init(bar_k_full(s), 1);
                mbarrier_init(bar_v_full(s), 1);
                mbarrier_init(bar_empty(s), (128 * HOPPER_CONSUMER_WGS) as u32);
            }
            fence_mbarrier_init();
            prefetch_tensormap(tq);
            prefetch_tensormap(tk);
            prefetch_tensormap(tv);
        }
    }
    sync_threads();

    let (nq, nk) = (p.seqlen_q as usize, p.seqlen_k as usize);
    let num_m = nq.div_ceil(HOPPER_BR);
    let idx = sreg::block_idx_x() as usize;
    let bh = idx / num_m;
    let mb = if p.causal != 0 { num_m - 1 - idx % num_m } else { idx % num_m };
    let (b, h) = (bh / p.nheads as usize, bh % p.nheads as usize);
    let q0 = mb * HOPPER_BR;
    // Keys this block can see: causal rows see keys < i + 1 + nk - nq.
    let shift = nk as i64 - nq as i64;
    let (kv_end, mask_from) = if p.causal != 0 {
        (clamp_keys((q0 + HOPPER_BR) as i64 + shift, nk), clamp_keys(q0 as i64 + 1 + shift, nk))
    } else {
        (nk, nk)
    };
    let n_blocks = kv_end.div_ceil(BC);

    if tid < 128 {
        // ---- producer warpgroup ---------------------------------------------
        setmaxnreg_dec::<HOPPER_PRODUCER_REGS>();
        if tid == 0 && n_blocks > 0 {
            let (bi, hi) = (b as i32, h as i32);
            // SAFETY: every destination is a 1024-aligned panel of a buffer
            // that no one reads until its full barrier completes; the empty
            // barrier wait guarantees the consumers are done with a stage
            // before it is overwritten.
            unsafe {
                mbarrier_arrive_expect_tx(bar_q, q_bytes);
                for pn in 0..D / 64 {
                    tma_load_4d(s_q + (pn * HOPPER_BR * PANEL_ROW_BYTES) as u32, tq, [64 * pn as i32, q0 as i32, hi, bi], bar_q);
                }
                for it in 0..n_blocks {
                    let j = n_blocks - 1 - it;
                    let s = (it & 1) as u32;
                    // Stage s was last read in iteration it − 2 (phase (it/2 − 1) & 1);
                    // for it < 2 parity 1 is the "previous" phase: no wait.
                    mbarrier_wait(bar_empty(s), ((it / 2) as u32 & 1) ^ 1);
                    let row = (j * BC) as i32;
                    mbarrier_arrive_expect_tx(bar_k_full(s), kv_bytes);
                    for pn in 0..D / 64 {
                        tma_load_4d(s_k(s) + (pn * BC * PANEL_ROW_BYTES) as u32, tk, [64 * pn as i32, row, hi, bi], bar_k_full(s));
                    }
                    mbarrier_arrive_expect_tx(bar_v_full(s), kv_bytes);
                    for pn in 0..D / 64 {
                        tma_load_4d(s_v(s) + (pn * BC * PANEL_ROW_BYTES) as u32, tv, [64 * pn as i32, row, hi, bi], bar_v_full(s));
                    }
                }
            }
        }
        return;
    }

    // ---- consumer warpgroups ------------------------------------------------
    setmaxnreg_inc::<HOPPER_CONSUMER_REGS>();
    let cw = tid / 128 - 1;
    let warp = (tid / 32) % 4;
    let lane = tid % 32;
    let (g, t) = (lane / 4, lane % 4);
    let s_q_wg = s_q + (cw * 64 * PANEL_ROW_BYTES) as u32;
    let scale_log2 = p.softmax_scale_log2;
    let mut r_o = [[[0f32; 4]; DN]; 1];
    let mut st = [[RowState::<f32>::new(); 2]; 1];
    if n_blocks > 0 {
        // SAFETY: armed by the producer.
        unsafe { mbarrier_wait(bar_q, 0) };
    }
    let row0 = q0 + cw * 64 + warp * 16 + g;

    for it in 0..n_blocks {
        let j = n_blocks - 1 - it;
        let s = (it & 1) as u32;
        let phase = (it / 2) as u32 & 1;

        // S = Q·K_jᵀ
        // SAFETY: armed by the producer; K_j lands before the phase completes.
        unsafe { mbarrier_wait(bar_k_full(s), phase) };
        let mut r_s = [[[0f32; 4]; BCN]; 1];
        wgmma_fence();
        for kk in 0..D / 16 {
            let off = (kk / 4) * PANEL_ROW_BYTES;
            let da = desc_kmajor(s_q_wg + ((kk / 4) * HOPPER_BR * PANEL_ROW_BYTES + (kk % 4) * 32) as u32);
            let db = desc_kmajor(s_k(s) + (off * BC + (kk % 4) * 32) as u32);
            // SAFETY: Q and K_j landed (their barriers completed); neither is
            // rewritten before this warpgroup arrives on the empty barrier.
            unsafe { mma_ss::<T, BCN>(&mut r_s[0], da, db, (kk > 0) as u32) };
        }
        wgmma_commit();
        wgmma_wait::<0>();
        acc_fence(&mut r_s[0]);

        // Mask (causal diagonal blocks, the key tail), online softmax.
        let k0 = j * BC;
        if k0 + BC > mask_from {
            let lim = [p.causal_key_limit(row0 as u32).min(nk as i64), p.causal_key_limit(row0 as u32 + 8).min(nk as i64)];
            mask::<BCN>(&mut r_s[0], k0, t, lim);
            softmax_step::<BCN, DN, 1, true>(&mut r_s, &mut r_o, &mut st, scale_log2);
        } else {
            softmax_step::<BCN, DN, 1, false>(&mut r_s, &mut r_o, &mut st, scale_log2);
        }

        // O += P·V_j
        // SAFETY: as for K.
        unsafe { mbarrier_wait(bar_v_full(s), phase) };
        wgmma_fence();
        for kk in 0..BC / 16 {
            let (s0, s1) = (&r_s[0][2 * kk], &r_s[0][2 * kk + 1]);
            let a = [pack::<T>(s0[0], s0[1]), pack::<T>(s0[2], s0[3]), pack::<T>(s1[0], s1[1]), pack::<T>(s1[2], s1[3])];
            let db = desc_mnmajor(s_v(s) + (kk * 16 * PANEL_ROW_BYTES) as u32, (BC * PANEL_ROW_BYTES) as u32);
            // SAFETY: V_j landed; rewritten only after the empty barrier.
            unsafe { mma_rs::<T, DN>(&mut r_o[0], a, db, 1) };
        }
        wgmma_commit();
        wgmma_wait::<0>();
        acc_fence(&mut r_o[0]);
        // SAFETY: initialized barrier; this thread's products reading stage s
        // have completed (wait_group 0).
        unsafe { mbarrier_arrive(bar_empty(s)) };
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
}
