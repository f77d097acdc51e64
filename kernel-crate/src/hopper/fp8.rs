//! The FP8 (e4m3) forward kernel on wgmma + TMA (FlashAttention-3's FP8
//! design, `../shared/FP8.md`): Q, K and V one byte per element with f32
//! dequantization scales per (sequence, KV head), O in f16/bf16, the
//! logsumexp in f32.
//!
//! `S = (q_descale · k_descale · softmax_scale) · Q₈K₈ᵀ`, the online softmax
//! of the 16-bit kernel ([`super::fwd`]) in f32, `P = exp(S − m)` rounded to
//! e4m3 (`P ≤ 1`: satfinite never clips), `O = v_descale · (P₈V₈) / l` with
//! `l` the row sums of the f32 `P`.
//!
//! * 8-bit `wgmma` (`m64nNk32`) reads both operands K-major only. Q and K
//!   are (their head dim contiguous); V is not for `P·V`, so the **producer
//!   warpgroup transposes V in shared memory**: thread 0 copies each V block
//!   (`Bc × d`, swizzled panels like K) by TMA, then the producer's 128
//!   threads write it as `Vᵀ` (`d × Bc`, keys contiguous, swizzled as the
//!   tensor cores read it) — `ldmatrix.trans`, two `prmt`s per 4 bytes,
//!   `stmatrix`, without bank conflicts ([`transpose_v`]) — overlapped with
//!   the consumers' products of the previous block. `Vᵀ`'s rows (O's
//!   columns) are interleaved within each 16 ([`vt_row`]); the epilogue
//!   writes them back in order.
//! * P goes from the f32 accumulator to the register A operand of the next
//!   product without leaving its thread. The accumulator gives thread `t`
//!   of a quad the key columns `2t, 2t+1, 8+2t, 9+2t` (and `+16`) of a
//!   32-key step, where the 8-bit A operand wants `4t..4t+4` (and `+16`).
//!   So the keys of `P·V` run in a permuted order — position `16h + 4t + i`
//!   holds key `16h + 8⌊i/2⌋ + 2t + i%2` — and the transpose writes `Vᵀ`'s
//!   key columns in that same order: the product is unchanged, and no byte
//!   crosses a lane ([`pack_p`]).
//! * Everything else is the 16-bit `_vw` kernel's: one Q tile per block
//!   (`Br = 128`, two consumer warpgroups, intra-warpgroup overlap of
//!   `S_i` with `P_{i−1}·V_{i−1}`), the tile uniforms in shared memory
//!   (varlen, windows, causal, GQA), the mask only in edge blocks. V rows
//!   past the sequence's last key (varlen: the next sequence's rows) are
//!   written to `Vᵀ` as zeros, so `P = 0` never meets a NaN code.
//!
//! Shared memory: [`HopperFp8Smem`]. Barriers: Q full/empty; K full/empty
//! per stage (the consumers free K when `S` completes); V full per stage
//! (the copy, waited for by the producer's threads); `Vᵀ` full (thread 0
//! after the producer's named barrier) and empty (the consumers, when
//! `P·V` completes).

use super::fwd::{Tile, Uni, rescale_o, softmax_block, uni_addr_fresh, vw_mask};
use crate::arch::cvt::{pack_e4m3x2, prmt};
use crate::arch::ldmatrix::{ldmatrix_x4_trans, stmatrix_x4};
use crate::arch::math::fma_f32;
use crate::arch::mbarrier::{fence_mbarrier_init, mbarrier_arrive, mbarrier_arrive_expect_tx, mbarrier_init, mbarrier_wait};
use crate::arch::named_barrier::named_bar_sync;
use crate::arch::opaque;
use crate::arch::setmaxnreg::{setmaxnreg_dec, setmaxnreg_inc};
use crate::arch::smem::{dynamic_smem, smem_addr};
use crate::arch::sreg;
use crate::arch::sync::sync_threads;
use crate::arch::tma::{fence_proxy_async_shared, prefetch_tensormap, tma_load_4d};
use crate::arch::wgmma::{self, wgmma_commit, wgmma_fence, wgmma_wait};
use crate::tc::fa2::{quad_max, quad_sum};
use crate::tc::{Elem16, pack};
use flash_attn_common::hopper_fp8::{
    HOPPER_FP8_BR, HOPPER_FP8_CONSUMER_REGS, HOPPER_FP8_PRODUCER_REGS, HOPPER_FP8_STAGES, HopperFp8Smem, hopper_fp8_panel_bytes,
};
use flash_attn_common::{AttnParams, Real, RowState};

/// Named barrier of the producer warpgroup's transpose (1–3 are the 16-bit
/// kernels').
const TRANSPOSE_BARRIER: u32 = 4;

/// Shared-memory descriptor of a K-major e4m3 tile whose rows are `rb`
/// bytes (128: 128B swizzle, 8-row groups 1024 bytes apart; 64: 64B
/// swizzle, 512 bytes apart); leading offset unused (16).
#[inline(always)]
const fn desc_k8(addr: u32, rb: usize) -> u64 {
    let (sbo, mode) = if rb == 128 { (1024u64, 1u64) } else { (512, 2) };
    (((addr & 0x3FFFF) >> 4) as u64) | (1u64 << 16) | ((sbo >> 4) << 32) | (mode << 62)
}

/// The swizzled offset of byte `off` of a tile of `rb`-byte rows (from a
/// 1024-byte aligned base): 16-byte chunk bits 4.. XOR the 128-byte line
/// index bits 7.. (3 bits for 128B, 2 for 64B), as TMA writes and `wgmma`
/// reads them.
#[inline(always)]
const fn swizzle(off: u32, rb: usize) -> u32 {
    let mask = if rb == 128 { 7 } else { 3 };
    off ^ (((off >> 7) & mask) << 4)
}

/// The FP8 forward kernel body (module docs).
///
/// # Safety
/// See the entry points in `super`: tensor maps `tq`, `tk` (e4m3, boxes
/// `min(d,128) × 128` and `min(d,128) × Bc`, swizzled as [`desc_k8`]) and
/// `tv` (as `tk`); `p` valid with the descale pointers
/// null or holding the scales [`AttnParams::q_descale_ptr`] describes;
/// launched with `HOPPER_FP8_THREADS` threads, `HopperFp8Smem::new(D)`'s
/// request of dynamic shared memory, `ceil(seqlen_q / 128) · batch · nheads` blocks.
#[inline(always)]
pub unsafe fn forward<T: Elem16, const D: usize, const BC: usize, const DN: usize, const BCN: usize, const BCK: usize>(
    tq: u64,
    tk: u64,
    tv: u64,
    p: &AttnParams,
) {
    const { assert!(DN * 8 == D && BCN * 8 == BC && BCK * 32 == BC && (D == 64 || D == 128 || D == 256) && (BC == 64 || BC == 128)) };
    let br = HOPPER_FP8_BR;
    let rb = const { hopper_fp8_panel_bytes(D) };
    let lay = const { HopperFp8Smem::new(D) };
    let q_bytes = (br * D) as u32;
    let kv_bytes = (BC * D) as u32;

    // ---- prologue --------------------------------------------------------------
    let base = (smem_addr(dynamic_smem::<u8>()) + 1023) & !1023;
    let s_q = base + lay.q as u32;
    let s_k = |s: u32| base + lay.k[0] as u32 + s * kv_bytes;
    let s_vt = |s: u32| base + lay.vt[0] as u32 + s * kv_bytes;
    let s_v = |s: u32| base + lay.v[0] as u32 + s * kv_bytes;
    let bar_q = base + lay.bars as u32;
    let ns = HOPPER_FP8_STAGES as u32;
    let bar_k_full = |s: u32| bar_q + 16 + 8 * s;
    let bar_k_empty = |s: u32| bar_q + 16 + 8 * (ns + s);
    let bar_v_full = |s: u32| bar_q + 16 + 8 * (2 * ns + s);
    let bar_vt_full = |s: u32| bar_q + 16 + 8 * (3 * ns + s);
    let bar_vt_empty = |s: u32| bar_q + 16 + 8 * (4 * ns + s);
    // Block `it` uses stage it % S; its barriers' phase flips every S blocks.
    let stage = |it: usize| ((it % HOPPER_FP8_STAGES) as u32, ((it / HOPPER_FP8_STAGES) & 1) as u32);
    let uni = base + lay.uni as u32;
    let num_m = p.seqlen_q.div_ceil(br as u32);

    let tid = sreg::thread_idx_x() as usize;
    if tid == 0 {
        // SAFETY: 8-byte aligned words inside the requested shared memory,
        // used by no one before the barrier below.
        unsafe {
            mbarrier_init(bar_q, 1);
            for s in 0..ns {
                mbarrier_init(bar_k_full(s), 1);
                mbarrier_init(bar_k_empty(s), 256);
                mbarrier_init(bar_v_full(s), 1);
                mbarrier_init(bar_vt_full(s), 1);
                mbarrier_init(bar_vt_empty(s), 256);
            }
            fence_mbarrier_init();
            // SAFETY: host-checked varlen arrays (values clamped inside).
            Tile::new_vw(p, sreg::block_idx_x(), num_m, br, BC).store(uni);
            prefetch_tensormap(tq);
            prefetch_tensormap(tk);
            prefetch_tensormap(tv);
        }
    }
    sync_threads();
    // A Q block past its sequence's end (varlen) or with no visible key
    // block has nothing to load; the consumers still store its rows (O = 0,
    // LSE = −inf) when it is inside the sequence.
    // SAFETY: written before the barrier above.
    if unsafe { Uni::get(uni, Uni::Q0) >= Uni::get(uni, Uni::NQ) } {
        return;
    }

    if tid < 128 {
        // ---- producer warpgroup: copies, and the transpose of V ------------------
        setmaxnreg_dec::<HOPPER_FP8_PRODUCER_REGS>();
        let uni = uni_addr_fresh(lay.uni);
        // SAFETY (uniforms): written before the prologue's barrier.
        let n_blocks = unsafe { Uni::get(uni, Uni::N_BLOCKS) } as usize;
        // Thread 0 issues the copies of block `it` (K and V into stage
        // it % S) during the transpose of block it − 1: K waits for its
        // stage's empty barrier; V's stage was last read by this
        // warpgroup's own transpose of block it − S, finished before the
        // named barrier that ended it.
        let issue = |it: usize| {
            // SAFETY: uniforms as above; every destination is a tile no one
            // reads until its full barrier completes.
            unsafe {
                let (j_first, k_row0, tma_b) = (Uni::get(uni, Uni::J_FIRST) as usize, Uni::get(uni, Uni::K_ROW0) as usize, Uni::get(uni, Uni::TMA_B) as i32);
                let h = Tile::coords(p, sreg::block_idx_x(), num_m, br).h as u32;
                let hk = p.kv_head(h) as i32;
                let j = j_first + n_blocks - 1 - it;
                let row = (k_row0 + j * BC) as i32;
                let (s, phase) = stage(it);
                mbarrier_wait(bar_k_empty(s), phase ^ 1);
                mbarrier_arrive_expect_tx(bar_k_full(s), kv_bytes);
                for pn in 0..D / rb {
                    tma_load_4d(s_k(s) + (pn * BC * rb) as u32, tk, [(rb * pn) as i32, row, hk, tma_b], bar_k_full(s));
                }
                mbarrier_arrive_expect_tx(bar_v_full(s), kv_bytes);
                for pn in 0..D / rb {
                    tma_load_4d(s_v(s) + (pn * BC * rb) as u32, tv, [(rb * pn) as i32, row, hk, tma_b], bar_v_full(s));
                }
            }
        };
        if tid == 0 && n_blocks > 0 {
            // SAFETY: as above.
            unsafe {
                let (q0, q_row0, tma_b) = (Uni::get(uni, Uni::Q0) as usize, Uni::get(uni, Uni::Q_ROW0) as usize, Uni::get(uni, Uni::TMA_B) as i32);
                let h = Tile::coords(p, sreg::block_idx_x(), num_m, br).h as i32;
                mbarrier_arrive_expect_tx(bar_q, q_bytes);
                for pn in 0..D / rb {
                    tma_load_4d(s_q + (pn * br * rb) as u32, tq, [(rb * pn) as i32, (q_row0 + q0) as i32, h, tma_b], bar_q);
                }
            }
            issue(0);
        }
        for it in 0..n_blocks {
            if tid == 0 && it + 1 < n_blocks {
                issue(it + 1);
            }
            let (s, phase) = stage(it);
            // SAFETY: barriers initialized; V of block `it` lands on its full
            // barrier, and the consumers release Vᵀ stage s (read by block
            // it − S) on its empty one; all 128 producer threads run the
            // same iterations.
            unsafe {
                let (nk, j_first) = (Uni::get(uni, Uni::NK) as usize, Uni::get(uni, Uni::J_FIRST) as usize);
                let k0 = (j_first + n_blocks - 1 - it) * BC;
                mbarrier_wait(bar_v_full(s), phase);
                mbarrier_wait(bar_vt_empty(s), phase ^ 1);
                transpose_v::<D, BC>(s_v(s), s_vt(s), nk.saturating_sub(k0), tid);
                fence_proxy_async_shared();
                named_bar_sync(TRANSPOSE_BARRIER, 128);
                if tid == 0 {
                    mbarrier_arrive(bar_vt_full(s));
                }
            }
        }
        return;
    }

    // ---- consumer warpgroups ------------------------------------------------------
    setmaxnreg_inc::<HOPPER_FP8_CONSUMER_REGS>();
    let uni = uni_addr_fresh(lay.uni);
    let cw = tid / 128 - 1;
    let warp = (tid / 32) % 4;
    let lane = tid % 32;
    let (g, t) = (lane / 4, lane % 4);
    let s_q_wg = s_q + (cw * 64 * rb) as u32;
    let tl = Tile::coords(p, sreg::block_idx_x(), num_m, br);
    let Tile { bh, b, h, q0, .. } = tl;
    // The scales of (sequence b, KV head of h), read once: S's folds into
    // the softmax scale, V's into 1/l at the end. (Divisions guarded: a
    // panic path in this region caps its registers.)
    let (q_ds, k_ds, v_ds) = {
        let kvh = p.kv_heads();
        let group = if kvh == 0 { 1 } else { p.nheads / kvh };
        let hk = if group == 0 { h as u32 } else { h as u32 / group };
        let i = (b as u64 * p.descale_batch_stride as u64 + hk as u64 * p.descale_head_stride as u64) as usize;
        // SAFETY: the host checked the scales hold (batch, nheads_k) f32 at
        // these strides (or passed null).
        let ld = |ptr: u64| if ptr == 0 { 1.0 } else { unsafe { *(ptr as *const f32).add(i) } };
        (ld(p.q_descale_ptr), ld(p.k_descale_ptr), ld(p.v_descale_ptr))
    };
    let scale_log2 = p.softmax_scale_log2 * q_ds * k_ds;
    // SAFETY (uniforms): written before the prologue's barrier.
    let n_blocks = unsafe { Uni::get(uni, Uni::N_BLOCKS) } as usize;
    let j_end = || (unsafe { Uni::get(uni, Uni::J_FIRST) } as usize) + n_blocks;
    let mut r_o = [[0f32; 4]; DN];
    let mut st = [[RowState::<f32>::new(); 2]; 1];
    let row0 = q0 + cw * 64 + warp * 16 + g;

    if n_blocks > 0 {
        // SAFETY (waits): barriers armed by the producer for every block.
        unsafe { mbarrier_wait(bar_q, 0) };
        let (s0, phase0) = stage(0);
        unsafe { mbarrier_wait(bar_k_full(s0), phase0) };
        let mut r_s = [[0f32; 4]; BCN];
        issue_qk::<D, BC, BCN>(&mut r_s, s_q_wg, br * rb, s_k(s0));
        wgmma_wait::<0>();
        super::acc_fence(&mut r_s);
        // SAFETY: initialized barrier; the products reading K stage s0 completed.
        unsafe { mbarrier_arrive(bar_k_empty(s0)) };
        // SAFETY: uniforms as above.
        softmax_block_f8::<BC, BCN>(&mut r_s, &mut st, j_end() - 1, unsafe { vw_mask::<BC>(p, uni, j_end() - 1) }, t, scale_log2);
        let mut r_p = pack_p::<BCN, BCK>(&r_s);
        for it in 1..n_blocks {
            let j = j_end() - 1 - it;
            let ((s, phase), (sp, phase_p)) = (stage(it), stage(it - 1));
            let mut r_s_next = [[0f32; 4]; BCN];
            // SAFETY: see above.
            unsafe { mbarrier_wait(bar_k_full(s), phase) };
            issue_qk::<D, BC, BCN>(&mut r_s_next, s_q_wg, br * rb, s_k(s));
            // SAFETY: see above.
            unsafe { mbarrier_wait(bar_vt_full(sp), phase_p) };
            issue_pv::<BC, DN, BCK>(&mut r_o, &r_p, s_vt(sp));
            wgmma_wait::<1>();
            super::acc_fence(&mut r_s_next);
            // SAFETY: initialized barrier; S_i (the products reading K stage s) completed.
            unsafe { mbarrier_arrive(bar_k_empty(s)) };
            // SAFETY: uniforms as above.
            let alpha = softmax_block_f8::<BC, BCN>(&mut r_s_next, &mut st, j, unsafe { vw_mask::<BC>(p, uni, j) }, t, scale_log2);
            // Pin the softmax above the wait (as the 16-bit kernel).
            super::acc_fence(&mut r_s_next);
            wgmma_wait::<0>();
            super::acc_fence(&mut r_o);
            // SAFETY: initialized barrier; the products reading Vᵀ stage sp completed.
            unsafe { mbarrier_arrive(bar_vt_empty(sp)) };
            rescale_o::<DN>(&mut r_o, alpha);
            r_p = pack_p::<BCN, BCK>(&r_s_next);
        }
        let (sl, phase_l) = stage(n_blocks - 1);
        // SAFETY: see above.
        unsafe { mbarrier_wait(bar_vt_full(sl), phase_l) };
        issue_pv::<BC, DN, BCK>(&mut r_o, &r_p, s_vt(sl));
        wgmma_wait::<0>();
        super::acc_fence(&mut r_o);
        // SAFETY: as above (no copy waits for it; kept for symmetry).
        unsafe { mbarrier_arrive(bar_vt_empty(sl)) };
    }

    // ---- epilogue: O · v_descale / l and the logsumexp ----------------------------
    let [os0, os1, os2] = p.o_stride;
    // SAFETY: uniforms as above.
    let (nq, q_row0) = unsafe { (Uni::get(uni, Uni::NQ) as usize, Uni::get(uni, Uni::Q_ROW0) as u64) };
    let lse_base = if p.is_varlen() { h as u64 * p.total_q as u64 + q_row0 } else { bh as u64 * nq as u64 } as usize;
    let g_o = (p.o_ptr as *mut u16).wrapping_add((b as u64 * os0 + q_row0 * os1 + h as u64 * os2) as usize);
    let hd = p.headdim as usize;
    for r in 0..2 {
        let row = row0 + 8 * r;
        st[0][r].l = quad_sum(st[0][r].l);
        let inv_l = st[0][r].inv_l() * v_ds;
        if row < nq {
            let o_row = g_o.wrapping_add(row * os1 as usize);
            // Accumulator blocks 2m, 2m + 1 hold head-dim columns 16m + 4t
            // .. 16m + 4t + 4 as [2m][2r], [2m+1][2r], [2m][2r+1],
            // [2m+1][2r+1] ([`vt_row`]'s order).
            for m in 0..DN / 2 {
                let (a, c) = (&r_o[2 * m], &r_o[2 * m + 1]);
                let lo = pack::<T>(a[2 * r] * inv_l, c[2 * r] * inv_l);
                let hi = pack::<T>(a[2 * r + 1] * inv_l, c[2 * r + 1] * inv_l);
                if m * 16 < hd {
                    // SAFETY: row < nq, columns < headdim (a multiple of
                    // 16); 8-byte aligned (16-byte aligned O, strides
                    // multiples of 8 elements: host-checked).
                    unsafe { *(o_row.wrapping_add(m * 16 + 4 * t) as *mut u64) = lo as u64 | (hi as u64) << 32 };
                }
            }
            if t == 0 && p.lse_ptr != 0 {
                // SAFETY: lse holds batch·nheads·nq f32 (dense) or
                // nheads·total_q (varlen; row < the clamped segment).
                unsafe { *(p.lse_ptr as *mut f32).add(lse_base + row) = st[0][r].lse() };
            }
        }
    }
}

/// The softmax of block `j` (as [`softmax_block`], whose result it
/// returns): blocks without a mask take each row's extreme raw score — a
/// tree over 8 independent chains per row, both rows interleaved, not a
/// chain of `Bc/4` dependent maxima — and `P = exp2(fma(s, scale, −m))`,
/// one FFMA per element where the 16-bit kernel spends a multiply and a
/// subtraction. (The 16-bit kernel scales first so that the maximum gives
/// `exp2(0) = 1` exactly; here the FMA's `2^r`, `|r|` ≤ half an ulp of
/// `m`, is far below P's e4m3 rounding.) Masked blocks (diagonal, window
/// edges, the last block) run [`softmax_block`]. A negative scale (a
/// negative descale) takes the row minimum: `max(scale·s) = scale·min(s)`.
#[inline(always)]
fn softmax_block_f8<const BC: usize, const BCN: usize>(
    r_s: &mut [[f32; 4]; BCN],
    st: &mut [[RowState<f32>; 2]; 1],
    j: usize,
    masking: (bool, [i64; 2], [i64; 2]),
    t: usize,
    scale_log2: f32,
) -> [f32; 2] {
    if masking.0 {
        return softmax_block::<BC, BCN>(r_s, st, j, masking, t, scale_log2);
    }
    let ext = if scale_log2 < 0.0 { row_extremes::<BCN, true>(r_s) } else { row_extremes::<BCN, false>(r_s) };
    let mut alpha = [1f32; 2];
    for r in 0..2 {
        let (a, m_safe) = st[0][r].rescale(quad_max(ext[r] * scale_log2));
        alpha[r] = a;
        let neg_m = -m_safe;
        let mut sum = [0.0f32; 4];
        for n in 0..BCN {
            for e in 0..2 {
                let pe = fma_f32(r_s[n][2 * r + e], scale_log2, neg_m).exp2();
                r_s[n][2 * r + e] = pe;
                sum[(2 * n + e) % 4] += pe;
            }
        }
        st[0][r].accumulate((sum[0] + sum[1]) + (sum[2] + sum[3]));
    }
    alpha
}

/// The thread's maximum (`MIN`: minimum) raw score of each of its two rows:
/// 8 partial extremes per row (element `i` to chain `i % 8`), then a tree.
#[inline(always)]
fn row_extremes<const BCN: usize, const MIN: bool>(r_s: &[[f32; 4]; BCN]) -> [f32; 2] {
    let init = if MIN { f32::INFINITY } else { f32::NEG_INFINITY };
    let pick = |a: f32, b: f32| if MIN { a.min(b) } else { a.max(b) };
    let mut c = [[init; 8]; 2];
    for n in 0..BCN {
        for e in 0..4 {
            let i = (2 * n + (e & 1)) % 8;
            c[e >> 1][i] = pick(c[e >> 1][i], r_s[n][e]);
        }
    }
    let mut out = [init; 2];
    for r in 0..2 {
        let x = c[r];
        out[r] = pick(pick(pick(x[0], x[1]), pick(x[2], x[3])), pick(pick(x[4], x[5]), pick(x[6], x[7])));
    }
    out
}

/// Writes V (`Bc × D` bytes, as the copy left it: 128-byte panels of
/// `rb`-byte rows, swizzled like K) as `Vᵀ` (`D × Bc`, rows of `Bc` bytes,
/// swizzled as the tensor cores read it) with the keys of each 16-key group
/// in the order of [`pack_p`]'s A operand and the head-dim rows in the
/// order of [`vt_row`]; keys `valid..` are written as zeros.
///
/// One warp-wide step moves 16 keys (`16h..16h+16`) × 32 head-dim bytes
/// (chunks `2c`, `2c+1`): `ldmatrix.trans` of four 8 × 8 16-bit blocks
/// (keys `16h + 8(j%2) + r`, chunk `2c + j/2`) gives lane `(g, t)` the
/// bytes `2g, 2g+1` of keys `2t, 2t+1` of each; two `prmt`s per chunk
/// turn a key-half pair into the words of head-dim bytes `2g` and `2g+1`
/// over keys `2t, 2t+1, 8+2t, 9+2t` — positions `4t..4t+4` of the group —
/// and `stmatrix` writes them, 8 consecutive `Vᵀ` rows per matrix (both
/// sides conflict-free). 6 instructions per 16 bytes a thread moves, where
/// 4 × 4 byte blocks through 32-bit loads and stores took 16 and more.
///
/// # Safety
/// `s_v` holds a landed V block no one writes meanwhile; no product reads
/// `s_vt` meanwhile; called by the 128 producer threads (`tp` their index).
#[inline(always)]
unsafe fn transpose_v<const D: usize, const BC: usize>(s_v: u32, s_vt: u32, valid: usize, tp: usize) {
    let rb = hopper_fp8_panel_bytes(D);
    let groups = BC / 16;
    // Derived afresh per call: hoisted out of the K/V loop, the steps'
    // addresses would outlive the producer's 40 registers.
    let tp = opaque::u32_fresh(tp as u32);
    let (warp, lane) = (tp / 32, tp % 32);
    let (j, r) = (lane / 8, lane % 8);
    let t = lane % 4;
    let full = valid >= BC;
    let valid = valid.min(BC) as u32;
    // Warp w takes steps w·S .. (w+1)·S (step u: key group u % groups,
    // chunk pair u / groups), so that within a warp the steps differ by
    // compile-time offsets; at d = 256 the steps interleave (u = w + 4n),
    // whose addresses ptxas keeps in the producer's 40 registers.
    let steps = groups * (D / 32) / 4;
    for n in 0..steps {
        let u = if D == 256 { warp + 4 * n as u32 } else { warp * steps as u32 + n as u32 };
        let (h, c) = (u % groups as u32, u / groups as u32);
        // ldmatrix: lane (j, r) gives row r of block j.
        let key = 16 * h + 8 * (j % 2) + r;
        let col = 32 * c + 16 * (j / 2);
        let panel = col / rb as u32;
        let src = s_v + panel * (BC * rb) as u32 + swizzle(key * rb as u32 + col % rb as u32, rb);
        // SAFETY: inside the landed V tile (caller).
        let x = unsafe { ldmatrix_x4_trans(src) };
        let mut w = [
            prmt(x[0], x[1], 0x6420),
            prmt(x[0], x[1], 0x7531),
            prmt(x[2], x[3], 0x6420),
            prmt(x[2], x[3], 0x7531),
        ];
        if !full {
            // Keys 16h + [2t, 2t+1, 8+2t, 9+2t], one per byte.
            let k0 = 16 * h + 2 * t;
            let keep = |k: u32, sh: u32| if k < valid { 0xFFu32 << sh } else { 0 };
            let m = keep(k0, 0) | keep(k0 + 1, 8) | keep(k0 + 8, 16) | keep(k0 + 9, 24);
            for v in &mut w {
                *v &= m;
            }
        }
        // stmatrix: lane (j, r) gives row r of matrix j — Vᵀ row of
        // head-dim byte 32c + 16(j/2) + 2r + j%2; lane (g, t) writes its
        // word j to row g of matrix j at bytes 4t of group h's chunk.
        let row = vt_row(32 * c + 16 * (j / 2) + 2 * r + j % 2);
        let dst = s_vt + swizzle(row * BC as u32 + 16 * h, BC);
        // SAFETY: inside the Vᵀ tile (row < D, chunk < Bc/16).
        unsafe { stmatrix_x4(dst, w) };
    }
}

/// The `Vᵀ` row (= the column of `O`'s accumulators) that holds head-dim
/// byte `c`: within each 16, the even bytes first (`16m + 2i → 16m + i`,
/// `16m + 2i + 1 → 16m + 8 + i`), so that [`transpose_v`]'s matrices are 8
/// consecutive rows. The epilogue reads the columns back in head-dim order.
#[inline(always)]
const fn vt_row(c: u32) -> u32 {
    (c & !15) | ((c & 1) << 3) | ((c & 15) >> 1)
}

/// Issues `S = Q·Kᵀ` (`D/32` e4m3 products, one commit group).
#[inline(always)]
fn issue_qk<const D: usize, const BC: usize, const BCN: usize>(r_s: &mut [[f32; 4]; BCN], s_q_wg: u32, q_panel_bytes: usize, s_k: u32) {
    let rb = hopper_fp8_panel_bytes(D);
    let kpp = rb / 32;
    wgmma_fence();
    for kk in 0..D / 32 {
        let da = desc_k8(s_q_wg + ((kk / kpp) * q_panel_bytes + (kk % kpp) * 32) as u32, rb);
        let db = desc_k8(s_k + ((kk / kpp) * BC * rb + (kk % kpp) * 32) as u32, rb);
        // SAFETY: Q and K landed (their barriers completed); neither is
        // rewritten before this warpgroup arrives on the empty barrier.
        unsafe { mma_ss_e4m3::<BCN>(r_s, da, db, (kk > 0) as u32) };
    }
    wgmma_commit();
}

/// The probabilities (S accumulator layout, f32, `P ≤ 1`) as the e4m3
/// register A operand of `P·V`, 32-key step `kk` from accumulator blocks
/// `4kk..4kk+4`, in the permuted key order of the module docs:
/// `a0 = P[g][2t, 2t+1, 8+2t, 9+2t]`, `a1` the same of row `g + 8`, `a2`/`a3`
/// those 16 keys on.
#[inline(always)]
fn pack_p<const BCN: usize, const BCK: usize>(r_s: &[[f32; 4]; BCN]) -> [[u32; 4]; BCK] {
    let mut r_p = [[0u32; 4]; BCK];
    let pack4 = |a: &[f32; 4], b: &[f32; 4], r: usize| (pack_e4m3x2(a[2 * r], a[2 * r + 1]) as u32) | ((pack_e4m3x2(b[2 * r], b[2 * r + 1]) as u32) << 16);
    for kk in 0..BCK {
        let s = &r_s[4 * kk..4 * kk + 4];
        r_p[kk] = [pack4(&s[0], &s[1], 0), pack4(&s[0], &s[1], 1), pack4(&s[2], &s[3], 0), pack4(&s[2], &s[3], 1)];
    }
    r_p
}

/// Issues `O += P·V` (`Bc/32` e4m3 products, one commit group), P the
/// register A operand, `Vᵀ` (K-major, `Bc`-byte rows) at `s_vt`.
#[inline(always)]
fn issue_pv<const BC: usize, const DN: usize, const BCK: usize>(r_o: &mut [[f32; 4]; DN], r_p: &[[u32; 4]; BCK], s_vt: u32) {
    wgmma_fence();
    for kk in 0..BCK {
        let db = desc_k8(s_vt + (kk * 32) as u32, BC);
        // SAFETY: Vᵀ written and fenced (its full barrier completed);
        // rewritten only after the empty barrier.
        unsafe { mma_rs_e4m3::<DN>(r_o, r_p[kk], db, 1) };
    }
    wgmma_commit();
}

/// `d (64 × 8·N8) = A·B (+ d)`, e4m3 A and B K-major in shared memory.
///
/// # Safety
/// As `wgmma::wgmma_ss_*`.
#[inline(always)]
unsafe fn mma_ss_e4m3<const N8: usize>(d: &mut [[f32; 4]; N8], da: u64, db: u64, scale_d: u32) {
    const { assert!(N8 == 8 || N8 == 16) };
    // SAFETY: forwarded to the caller.
    unsafe {
        if N8 == 8 {
            wgmma::wgmma_ss_m64n64k32_e4m3(super::acc_as(d), da, db, scale_d)
        } else {
            wgmma::wgmma_ss_m64n128k32_e4m3(super::acc_as(d), da, db, scale_d)
        }
    }
}

/// `d (64 × 8·N8) += A·B`, e4m3 A from registers, B K-major in shared memory.
///
/// # Safety
/// As `wgmma::wgmma_rs_*`.
#[inline(always)]
unsafe fn mma_rs_e4m3<const N8: usize>(d: &mut [[f32; 4]; N8], a: [u32; 4], db: u64, scale_d: u32) {
    const { assert!(N8 == 8 || N8 == 16 || N8 == 32) };
    // SAFETY: forwarded to the caller.
    unsafe {
        match N8 {
            8 => wgmma::wgmma_rs_m64n64k32_e4m3(super::acc_as(d), a, db, scale_d),
            16 => wgmma::wgmma_rs_m64n128k32_e4m3(super::acc_as(d), a, db, scale_d),
            _ => wgmma::wgmma_rs_m64n256k32_e4m3(super::acc_as(d), a, db, scale_d),
        }
    }
}
