//! The FA2-order backward main kernel on `wgmma` (FA2 paper, Algorithm 2;
//! `../shared/BACKWARD.md`), f16/bf16 with f32 accumulation, sm_90a, in
//! FlashAttention-3's warp-specialized structure.
//!
//! The order of work is the tensor-core kernel's (`tc::bwd`): one block per
//! (K/V block `j` of `Bc` = 128 keys, batch, KV head), `blockIdx.x =
//! (b·nheads_k + kvh)·num_n + j`; `K_j`, `V_j` stay in shared memory and
//! `dK_j`, `dV_j` in registers while the block loops over the query heads
//! of the KV head's group and, per head, over the Q blocks `i` that see
//! block `j` (`flash_attn_common::tc_bwd`'s block ranges): the steps `n`.
//! Everything is computed transposed (keys as the `wgmma` M) so that `Pᵀ`
//! and `dSᵀ` leave the accumulators as register A operands.
//!
//! Three warpgroups (`HOPPER_BWD_THREADS` = 384):
//! * **Producer** (warpgroup 0, `setmaxnreg.dec`): warp 0 loads `K_j`, `V_j`
//!   once and, per step, `Q_i`, `dO_i` by TMA into a two-stage ring of
//!   128B-swizzled panels (full/empty mbarriers), with `LSE_i·log2 e` and
//!   `D_i` stored beside them by its lanes (rows past the sequence get
//!   `LSE = +∞`: `P = 0`); warp 1 adds each step's staged dQ block to the f32
//!   accumulator in HBM with four TMA tensor reductions (`cp.reduce.async.
//!   bulk.tensor … add`; no per-element atomics) and frees the staging
//!   buffer.
//! * **Consumers** (warpgroups 1, 2, `setmaxnreg.inc`), 64 keys each, per
//!   step: wait for the stage; `Sᵀ = K_w·Q_iᵀ` and `dPᵀ = V_w·dO_iᵀ` (`wgmma`
//!   m64n{Br}k16, SS, two commit groups); `Pᵀ = exp2(Sᵀ·scale·log2 e −
//!   LSE_i·log2 e)` while `dPᵀ` is on the tensor cores (masked only on
//!   boundary blocks); `dV_w += Pᵀ·dO_i` (RS; at d 128 issued while `dPᵀ`
//!   finishes); `dSᵀ = Pᵀ∘(dPᵀ − D_i)`; `dK_w += dSᵀ·Q_i` (RS); `dSᵀ`
//!   (16-bit) to shared memory, a named barrier of the two consumers; `dQ_i = scale·dS·K_j`, each warpgroup one `64 × 64` block
//!   over all 128 keys (d 128: a column half; d 64: a row half; both
//!   operands MN-major), waited for; the stage released; the block staged in
//!   f32 for the producer's warp 1 (double-buffered, mbarriers).
//!   The single `dSᵀ` buffer is rewritten only after the other consumer's
//!   `dQ` product of the previous step has read it (a named barrier each
//!   consumer arrives on and the other syncs on).
//!
//! Deterministic mode: warp 1 adds Q block `i`'s dQ only when the
//! semaphore of `(i, b, h)` (the tensor-core kernel's, zeroed by the
//! preprocess) says every K/V block after `j` that sees `i` has, waits for
//! its reductions to complete, and counts itself in: the same additions in
//! the same order on every run. The order is descending `j` — each block
//! walks its Q blocks upwards from the diagonal, so under a causal mask a
//! Q block's last visitor is the one that reaches it first and no block
//! waits for one that starts far behind it (ascending `j` halved the causal
//! speed) — and so the grid numbers the K/V blocks from the end
//! (`blockIdx.x = (b·nheads_k + kvh)·num_n + num_n − 1 − j`): a block waits
//! only for blocks of its (batch, KV head) with a larger `j`, i.e. a
//! smaller `blockIdx.x`, dispatched earlier and so resident or done, which
//! in turn wait only for larger `j` still — no cycle, and the largest
//! waiting `j` of a Q block has its predecessors done (the argument of
//! `tc::bwd::dq_turn`, mirrored).
//!
//! Softcap and ALiBi (the `MODS` kernels, `flash_bwd_hopper_x_*`, Br 64
//! at both head dims): the tensor-core kernel's score function
//! (`tc::bwd::ScoreT`) on `Sᵀ` — the softcap in place ([`softcap_score`]),
//! the ALiBi bias (`slope·|q + shift − key|`, distances from the lane
//! indices at the point of use) in the exp2 pass ([`exp_mods`]), which also
//! packs `Pᵀ` for dV and turns the f32 `Pᵀ` into `Pᵀ∘(1 − tanh²)` with
//! `tanh` = the capped score / `cap·log2 e` at hand: `dSᵀ` is then the plain
//! kernel's `Pᵀ∘(dPᵀ − D_i)` of that, and no `1 − tanh²` array is kept
//! (32 registers). The constants (`softcap_pre`, `cap·log2 e` and its
//! inverse) are uniform words read where used, the slope loaded per step.
//! d 128: `dPᵀ` is issued after the exp2 pass (with dV), not beside `Sᵀ`,
//! so that its accumulators are not live beside the score function's
//! temporaries (ptxas spilled at 240 registers). d 64: Br 64 instead of
//! 128 (Br 128's `Sᵀ`, `dPᵀ` are 64 registers each), `dPᵀ` beside `Sᵀ` as
//! the plain kernel; each consumer's `dQ` block is then the whole `64 × 64`
//! over its own 64 keys, and warp 1 adds both (in deterministic mode the
//! first completes before the second is issued).
//!
//! Epilogue: `dK_j · scale` and `dV_j` in `T` at their strides.
//!
//! d 256 has a kernel of its own (`bwd256`: `Bc` = `Br` = 64, the head dim
//! split between the consumers, no softcap/ALiBi) with this one's prologue,
//! producer protocol and uniform words ([`uni`]).

use super::{acc_fence, desc_kmajor, desc_mnmajor, mma_rs, mma_ss, mma_tt};
use crate::arch::mbarrier::{fence_mbarrier_init, mbarrier_arrive, mbarrier_arrive_expect_tx, mbarrier_init, mbarrier_wait};
use crate::arch::named_barrier::{named_bar_arrive, named_bar_sync};
use crate::arch::global::{atom_add_acq_rel_u32_gpu, ld_acquire_u32_gpu};
use crate::arch::opaque;
use crate::arch::setmaxnreg::{setmaxnreg_dec, setmaxnreg_inc};
use crate::arch::smem::{dynamic_smem, ld_volatile_shared_u64, smem_addr, st_shared_u32, st_shared_u64};
use crate::arch::sreg;
use crate::arch::sync::sync_threads;
use crate::arch::tma::{bulk_commit_group, bulk_wait_group, bulk_wait_group_read, fence_proxy_async_global, fence_proxy_async_shared, prefetch_tensormap, tma_load_4d, tma_reduce_add_2d};
use crate::arch::wgmma::{wgmma_commit, wgmma_fence, wgmma_wait};
use crate::tc::fa2::mask;
use crate::tc::{Elem16, pack};
use flash_attn_common::hopper_bwd::{
    HOPPER_BWD_BC, HOPPER_BWD_CONSUMER_REGS, HOPPER_BWD_DQ_PANEL_BYTES, HOPPER_BWD_PRODUCER_REGS, HOPPER_BWD_STAGES, HOPPER_BWD_UNI_WORDS, HopperBwdSmem, hopper_bwd_kernel_br,
};
use flash_attn_common::tc_bwd::{bwd_key_blocks, bwd_query_range, bwd_semaphore_index, bwd_visiting_query_blocks};
use flash_attn_common::{BwdParams, LOG2_E, Real};

/// Bytes per row of a 64-column panel.
pub(super) const PANEL_ROW: usize = 128;

/// The 128B swizzle of a shared-memory address inside a 1024-byte aligned
/// tile: the 16-byte chunk bits 4–6 XOR the row bits 7–9.
#[inline(always)]
pub(super) fn swizzle128(a: u32) -> u32 {
    a ^ ((a >> 3) & 0x70)
}

/// Issues `acc = A·Bᵀ` over the head dim (`D/16` products, one commit
/// group): A = 64 rows of a K/V tile (`Bc` rows) from row `r0`, B = the
/// `Br` rows of a Q/dO tile, both K-major.
#[inline(always)]
fn issue_abt<T: Elem16, const D: usize, const BR: usize, const BRN: usize>(acc: &mut [[f32; 4]; BRN], s_a: u32, r0: usize, s_b: u32) {
    // Bases unknown to LLVM here: the descriptors are built at their use
    // instead of one hoisted 64-bit register each across the loop.
    let (s_a, s_b) = (opaque::u32_fresh(s_a + (r0 * PANEL_ROW) as u32), opaque::u32_fresh(s_b));
    wgmma_fence();
    for kk in 0..D / 16 {
        let da = desc_kmajor(s_a + ((kk / 4) * HOPPER_BWD_BC * PANEL_ROW + (kk % 4) * 32) as u32);
        let db = desc_kmajor(s_b + ((kk / 4) * BR * PANEL_ROW + (kk % 4) * 32) as u32);
        // SAFETY: both tiles landed and a barrier passed; neither is
        // rewritten before this warpgroup waits for the group.
        unsafe { mma_ss::<T, BRN>(acc, da, db, (kk > 0) as u32) };
    }
    wgmma_commit();
}

/// The warpgroup's `64 × Br` accumulator-layout values (`Pᵀ` or `dSᵀ`)
/// packed as the register A operand: k16 step `kk` takes columns
/// `16kk..16kk+16` (`[kk][0]`: row g, columns 16kk + 2t; `[1]`: row g + 8;
/// `[2]`, `[3]`: the same at columns + 8).
#[inline(always)]
fn pack_a<T: Elem16, const BRN: usize, const BRK: usize>(x: &[[f32; 4]; BRN]) -> [[u32; 4]; BRK] {
    let mut a = [[0u32; 4]; BRK];
    for kk in 0..BRK {
        let (x0, x1) = (&x[2 * kk], &x[2 * kk + 1]);
        a[kk] = [pack::<T>(x0[0], x0[1]), pack::<T>(x0[2], x0[3]), pack::<T>(x1[0], x1[1]), pack::<T>(x1[2], x1[3])];
    }
    a
}

/// Issues `acc += Xᵀ·B` (`Br/16` products, one commit group): `a` the
/// packed register A operand ([`pack_a`]), B the `Br × D` Q/dO tile read
/// MN-major.
#[inline(always)]
fn issue_xb<T: Elem16, const BR: usize, const BRK: usize, const DN: usize>(acc: &mut [[f32; 4]; DN], a: &[[u32; 4]; BRK], s_b: u32) {
    let s_b = opaque::u32_fresh(s_b);
    wgmma_fence();
    for kk in 0..BRK {
        let db = desc_mnmajor(s_b + (kk * 16 * PANEL_ROW) as u32, (BR * PANEL_ROW) as u32);
        // SAFETY: the tile landed and a barrier passed; rewritten only
        // after this warpgroup waited for the group.
        unsafe { mma_rs::<T, DN>(acc, a[kk], db, 1) };
    }
    wgmma_commit();
}

/// Indices of the block's uniform words in shared memory (`uni`, written by
/// thread 0 before the prologue's barrier, read where used: held in
/// registers across the loops they spilled).
pub(super) mod uni {
    /// Row coordinate of the sequence's first query (varlen: its packed row).
    pub const Q_ROW0: u32 = 0;
    /// Batch coordinate of the tensor maps (varlen: 0).
    pub const TMA_B: u32 = 1;
    /// `lse_ptr` and `delta_ptr` at the block's first query head and
    /// sequence (byte addresses).
    pub const LSE: u32 = 2;
    pub const DELTA: u32 = 3;
    /// Row of the dQ accumulator (and LSE index) of the block's first
    /// query head and sequence: the row coordinate of its tensor map.
    pub const LSE_ROW0: u32 = 4;
    /// Elements between two query heads of the LSE (and of `D`).
    pub const LSE_HEAD_STRIDE: u32 = 5;
    /// Query rows every key of the block sees: `[FULL_LO, FULL_HI)`.
    pub const FULL_LO: u32 = 6;
    pub const FULL_HI: u32 = 7;
    /// The first Q block, the Q blocks per head, the steps.
    pub const IA: u32 = 8;
    pub const NI: u32 = 9;
    pub const STEPS: u32 = 10;
    /// Query rows of the sequence.
    pub const NQ: u32 = 11;
    /// The block's first query head.
    pub const H0: u32 = 12;
    /// Key row coordinate of the block's first key, and its KV head.
    pub const K_ROW: u32 = 13;
    pub const KVH: u32 = 14;
    /// The block's first key in its sequence, and the sequence's keys.
    pub const K0: u32 = 15;
    pub const NK: u32 = 16;
    /// dK and dV at the block's sequence and KV head (byte addresses).
    pub const DK: u32 = 17;
    pub const DV: u32 = 18;
    /// The tensor maps of q, dO, k, v and the dQ accumulator (generic
    /// addresses, five words).
    pub const TMAP: u32 = 19;
    /// The block's batch index and K/V block.
    pub const B: u32 = 24;
    pub const J: u32 = 25;
    /// Softcap (`MODS` kernels): `softcap_pre`, `cap·log2 e` and its
    /// inverse, as f32 bits (read where used: hoisted, they spilled).
    pub const CAP_PRE: u32 = 26;
    pub const CAP_POST: u32 = 27;
    pub const INV_CAP: u32 = 28;
    /// Words used: `HOPPER_BWD_UNI_WORDS` (checked at compile time).
    pub const COUNT: usize = 29;
}

/// The backward main kernel body (see the module docs).
///
/// # Safety
/// As the exported entry points: `p` valid (host-checked shapes, strides,
/// dQ accumulator zeroed, delta computed), `maps` the generic addresses of
/// tensor maps of q, dO (boxes `64 × Br`), k and v (`64 × Bc`) and the f32
/// dQ accumulator (`lse rows × headdim`, boxes `32 × 64`, 128B swizzle)
/// describing `p`'s buffers, launched with [`HOPPER_BWD_THREADS`] threads,
/// `HopperBwdSmem::with_br(D, BR).request_bytes()` of dynamic shared memory and
/// `batch · nheads_k · ceil(seqlen_k / 128)` blocks.
///
/// [`HOPPER_BWD_THREADS`]: flash_attn_common::hopper_bwd::HOPPER_BWD_THREADS
#[inline(always)]
pub unsafe fn backward<T: Elem16, const D: usize, const DN: usize, const BR: usize, const BRN: usize, const BRK: usize, const MODS: bool>(maps: [u64; 5], p: &BwdParams) {
    const { assert!(DN * 8 == D && BRN * 8 == BR && BRK * 16 == BR && BR == hopper_bwd_kernel_br(D, MODS) && (D == 64 || D == 128)) };
    const BC: usize = HOPPER_BWD_BC;
    const { assert!(uni::COUNT == HOPPER_BWD_UNI_WORDS) };
    // d 64 at Br 64 (the MODS kernel): each consumer's dQ block is all
    // `Br × d` over its own 64 keys (warp 1 adds both).
    let key_split = D == 64 && BR == 64;
    let lay = const { HopperBwdSmem::with_br(D, BR) };
    let f = &p.fwd;
    let tid = sreg::thread_idx_x() as usize;

    // ---- shared memory (1024-aligned base) -------------------------------------
    let raw = dynamic_smem::<u8>();
    let base = (smem_addr(raw) + 1023) & !1023;
    let s_k = base + lay.k as u32;
    let s_v = base + lay.v as u32;
    let s_q = |s: usize| base + lay.q[s] as u32;
    let s_do = |s: usize| base + lay.dout[s] as u32;
    let s_ds = base + lay.ds as u32;
    let s_dq = |b: usize| base + lay.dq[b] as u32;
    // LSE_i·log2 e (`rows(s, 0)`) and D_i (`rows(s, 1)`) of stage s.
    let rows = |s: usize, k: usize| base + (lay.rows + (2 * s + k) * BR * 4) as u32;
    let bar = |k: usize| base + (lay.bars + 8 * k) as u32;
    let bar_kv = bar(0);
    let bar_full = |s: usize| bar(1 + s);
    let bar_empty = |s: usize| bar(1 + HOPPER_BWD_STAGES + s);
    let bar_dq_full = |b: usize| bar(1 + 2 * HOPPER_BWD_STAGES + b);
    let bar_dq_empty = |b: usize| bar(3 + 2 * HOPPER_BWD_STAGES + b);
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
        if MODS {
            let cap_post = f.softcap * LOG2_E;
            put(uni::CAP_PRE, f.softcap_pre.to_bits() as u64);
            put(uni::CAP_POST, cap_post.to_bits() as u64);
            put(uni::INV_CAP, if cap_post != 0.0 { (1.0 / cap_post).to_bits() as u64 } else { 0 });
        }
        // SAFETY: 8-byte aligned words inside the requested shared memory,
        // used by no one before the barrier below.
        unsafe {
            mbarrier_init(bar_kv, 1);
            for s in 0..HOPPER_BWD_STAGES {
                // Thread 0's expect_tx and warp 0's 32 row stores.
                mbarrier_init(bar_full(s), 33);
                mbarrier_init(bar_empty(s), 256);
                mbarrier_init(bar_dq_full(s), 256);
                mbarrier_init(bar_dq_empty(s), 1);
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
            // dQ: each staged block added to the accumulator by four TMA
            // reductions (each consumer's 64 × 64 block in two 32-column
            // panels). Rows past the sequence are zero (their P is) and
            // columns past the head dim lie outside the map: skipped.
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
                for w in 0..2u32 {
                    if key_split && det && w == 1 {
                        // Both blocks add to the same elements: the first
                        // completes before the second starts (a fixed order).
                        bulk_commit_group();
                        bulk_wait_group();
                    }
                    for pn in 0..2u32 {
                        let (col, row) = if D == 128 {
                            (64 * w + 32 * pn, row0)
                        } else if key_split {
                            (32 * pn, row0)
                        } else {
                            (32 * pn, row0 + 64 * w as i32)
                        };
                        // SAFETY: the map describes the accumulator (caller);
                        // the panel written, fenced and released by the
                        // consumers' arrivals (waited above), 1024-aligned.
                        unsafe { tma_reduce_add_2d(u(uni::TMAP + 4), [col as i32, row], s_dq(b) + (2 * w + pn) * HOPPER_BWD_DQ_PANEL_BYTES as u32) };
                    }
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
                // SAFETY: the reductions have read the staging buffer.
                unsafe { mbarrier_arrive(bar_dq_empty(b)) };
            }
            bulk_wait_group();
        }
        return;
    }

    // ---- consumer warpgroups ----------------------------------------------------------
    setmaxnreg_inc::<HOPPER_BWD_CONSUMER_REGS>();
    let wg = tid / 128 - 1;
    let wl = tid % 128;
    let (ww, lane) = (wl / 32, tid % 32);
    let (g, t) = (lane / 4, lane % 4);
    let kw = wg * 64 + ww * 16; // this warp's first key, in the block
    let scale = f.softmax_scale;
    let mut r_dk = [[0f32; 4]; DN];
    let mut r_dv = [[0f32; 4]; DN];
    // dQ: each warpgroup one 64 × 64 block of `dS·K_j` over all 128 keys:
    // d 128 (Br 64) its column half (K's panel wg), d 64 (Br 128) its row
    // half (dSᵀ's panel wg).
    // d 64 at Br 64 (`key_split`): all of it over its own 64 keys.
    let (a_panel, b_panel) = if D == 128 { (0, wg) } else if key_split { (0, 0) } else { (wg, 0) };
    if steps > 0 {
        // SAFETY: armed by the producer when there are steps.
        unsafe { mbarrier_wait(bar_kv, 0) };
    }
    for n in 0..steps {
        let (s, phase) = stage(n);
        let q0 = (u(uni::IA) as usize + n % u(uni::NI) as usize) * BR;
        // SAFETY: armed by the producer for every step.
        unsafe { mbarrier_wait(bar_full(s), phase) };

        let mut r_p = [[0f32; 4]; BRN];
        let mut r_ds = [[0f32; 4]; BRN];
        issue_abt::<T, D, BR, BRN>(&mut r_p, s_k, wg * 64, s_q(s));
        // MODS at d 128: dPᵀ after the score function (below), whose
        // temporaries and dPᵀ's accumulators do not fit in the registers
        // together (ptxas spilled); at d 64 (Br 64) they do.
        let late_dp = MODS && D == 128;
        if late_dp {
            wgmma_wait::<0>();
        } else {
            issue_abt::<T, D, BR, BRN>(&mut r_ds, s_v, wg * 64, s_do(s));
            wgmma_wait::<1>();
        }
        acc_fence(&mut r_p);
        if MODS {
            // Softcap (`cap·log2 e · tanh(Sᵀ · softcap_pre)`, as the
            // tensor-core kernel's `ScoreT`; ALiBi in the exp2 pass).
            softcap_score::<BRN>(&mut r_p, f, &u);
        } else {
            for nn in 0..BRN {
                for e in 0..4 {
                    r_p[nn][e] *= f.softmax_scale_log2;
                }
            }
        }
        if !(u(uni::FULL_LO) as i64 <= q0 as i64 && (q0 + BR) as i64 <= u(uni::FULL_HI) as i64) {
            // Boundary block (window, causal diagonal, sequence ends). The
            // rows' query ranges are recomputed here (an opaque key), not
            // held across the loop.
            let nq = u(uni::NQ) as i64;
            let win = f.key_window(nq as u32, u(uni::NK) as u32);
            let k0 = u(uni::K0) as usize;
            let k_row = opaque::u32_fresh((k0 + kw + g) as u32) as i64;
            let r0 = bwd_query_range(&win, k_row, nq);
            let r1 = bwd_query_range(&win, k_row + 8, nq);
            mask::<BRN>(&mut r_p, q0, t, [r0.0, r1.0], [r0.1, r1.1]);
        }
        let lse = rows(s, 0);
        let dlt = rows(s, 1);
        // MODS: Pᵀ packed as it is computed (below), and `r_p` becomes
        // `Pᵀ∘(1 − tanh²)`, the factor of `dSᵀ`.
        let mut a_p = [[0u32; 4]; BRK];
        if MODS {
            // SAFETY: stage s landed (its full barrier); host-checked ALiBi slopes.
            a_p = unsafe { exp_mods::<T, BRN, BRK>(&mut r_p, f, &u, n as u32, lse, q0, t, kw + g) };
        } else {
            for nn in 0..BRN {
                // SAFETY: stage s landed (its full barrier); 8-byte aligned (even column).
                let l = unsafe { ld_shared_f32x2(lse + 4 * (nn * 8 + 2 * t) as u32) };
                for e in 0..4 {
                    r_p[nn][e] = (r_p[nn][e] - l[e & 1]).exp2();
                }
            }
        }
        // Pᵀ leaves the f32 accumulators as packed 16-bit pairs, the A
        // operand of dV. At Br 64 dV is issued while dPᵀ finishes (the
        // tensor cores stay busy through dSᵀ); at Br 128 (d 64) Pᵀ, dPᵀ
        // and the packed Pᵀ do not fit in the registers together: after dSᵀ.
        let early_dv = BR == 64;
        const { assert!(!MODS || BR == 64) };
        if early_dv {
            if late_dp {
                issue_abt::<T, D, BR, BRN>(&mut r_ds, s_v, wg * 64, s_do(s));
            } else if !MODS {
                a_p = pack_a::<T, BRN, BRK>(&r_p);
            }
            issue_xb::<T, BR, BRK, DN>(&mut r_dv, &a_p, s_do(s));
            wgmma_wait::<1>(); // (Sᵀ,) dPᵀ done; dV in flight
        } else {
            wgmma_wait::<0>();
        }
        acc_fence(&mut r_ds);
        for nn in 0..BRN {
            // SAFETY: as above.
            let dv = unsafe { ld_shared_f32x2(dlt + 4 * (nn * 8 + 2 * t) as u32) };
            for e in 0..4 {
                r_ds[nn][e] = r_p[nn][e] * (r_ds[nn][e] - dv[e & 1]);
            }
        }
        if !early_dv {
            a_p = pack_a::<T, BRN, BRK>(&r_p);
            issue_xb::<T, BR, BRK, DN>(&mut r_dv, &a_p, s_do(s));
        }
        // dSᵀ likewise, the A operand of dK; its pairs also go to shared memory.
        let a_ds = pack_a::<T, BRN, BRK>(&r_ds);
        issue_xb::<T, BR, BRK, DN>(&mut r_dk, &a_ds, s_q(s));

        if n > 0 {
            // The other warpgroup's dQ product of step n − 1 has read dSᵀ.
            // SAFETY: barriers 2, 3: 128 arrivals of one consumer warpgroup,
            // 128 syncs of the other, once per step after the first.
            unsafe { named_bar_sync(2 + (1 - wg) as u32, 256) };
        }
        // dSᵀ (keys × queries) into the swizzled panels: row = key, the
        // 16-byte chunk of columns 8c.. at (c%8) ^ (key%8), key%8 = g. The
        // swizzle is applied to each address (`swizzle128`) rather than
        // folded into per-thread constants: 16 of those held across the
        // loop spilled.
        let row0 = opaque::u32_fresh(s_ds + ((kw + g) * PANEL_ROW + 4 * t) as u32);
        for kk in 0..BRK {
            for (e, v) in a_ds[kk].iter().enumerate() {
                let c = 2 * kk + (e >> 1);
                let lin = row0 + ((c / 8) * BC * PANEL_ROW + 8 * (e & 1) * PANEL_ROW + (c % 8) * 16) as u32;
                // SAFETY: inside the dSᵀ tile; read after the barrier below.
                unsafe { st_shared_u32(swizzle128(lin), *v) };
            }
        }
        fence_proxy_async_shared();
        // SAFETY: barrier 1: the 256 consumer threads.
        unsafe { named_bar_sync(1, 256) }; // dSᵀ complete (both warpgroups)

        // dQ_i block += dS·K_j over the 128 keys.
        let mut r_dq = [[0f32; 4]; 8];
        let key0 = if key_split { wg * 64 * PANEL_ROW } else { 0 };
        let (s_dsf, s_kf) = (opaque::u32_fresh(s_ds + (a_panel * BC * PANEL_ROW + key0) as u32), opaque::u32_fresh(s_k + (b_panel * BC * PANEL_ROW + key0) as u32));
        wgmma_fence();
        for kq in 0..BC / 16 / (1 + key_split as usize) {
            let da = desc_mnmajor(s_dsf + (kq * 16 * PANEL_ROW) as u32, (BC * PANEL_ROW) as u32);
            let db = desc_mnmajor(s_kf + (kq * 16 * PANEL_ROW) as u32, (BC * PANEL_ROW) as u32);
            // SAFETY: dSᵀ written (fenced, barrier passed), K_j landed.
            unsafe { mma_tt::<T>(&mut r_dq, da, db, (kq > 0) as u32) };
        }
        wgmma_commit();
        wgmma_wait::<0>();
        acc_fence(&mut r_dq);
        acc_fence(&mut r_dv);
        acc_fence(&mut r_dk);
        // SAFETY: every product reading stage s (Sᵀ, dPᵀ, dV, dK) is
        // complete; this warpgroup is done with dSᵀ.
        unsafe {
            mbarrier_arrive(bar_empty(s));
            if n + 1 < steps {
                named_bar_arrive(2 + wg as u32, 256);
            }
        }
        // The staging buffer of step n − 2 has been read by warp 1's reductions.
        // SAFETY: warp 1 arrives on it after each read.
        unsafe { mbarrier_wait(bar_dq_empty(s), phase ^ 1) };
        // This warpgroup's two panels of 64 rows × 32 columns (128-byte
        // rows, 128B-swizzled as the accumulator's tensor map says): row r
        // = 16·warp + g (+ 8), columns 8nn + 2t, 8nn + 2t + 1 of the block.
        let s_dqf = opaque::u32_fresh(s_dq(s) + (2 * wg * HOPPER_BWD_DQ_PANEL_BYTES + (ww * 16 + g) * PANEL_ROW + 8 * t) as u32);
        for nn in 0..8 {
            for r in 0..2 {
                let lin = s_dqf + ((nn / 4) * HOPPER_BWD_DQ_PANEL_BYTES + 8 * r * PANEL_ROW + (nn % 4) * 32) as u32;
                let v = ((r_dq[nn][2 * r + 1] * scale).to_bits() as u64) << 32 | (r_dq[nn][2 * r] * scale).to_bits() as u64;
                // SAFETY: inside this warpgroup's panels, free (waited above).
                unsafe { st_shared_u64(swizzle128(lin), v) };
            }
        }
        fence_proxy_async_shared();
        // SAFETY: the stores above, released to warp 1 (256 arrivals).
        unsafe { mbarrier_arrive(bar_dq_full(s)) };
    }

    // ---- epilogue: dK_j · scale and dV_j -----------------------------------------
    let (k0, nk, d) = (u(uni::K0) as usize, u(uni::NK) as usize, f.headdim as usize);
    let (dks1, dvs1) = (p.dk_stride[1] as usize, p.dv_stride[1] as usize);
    let (g_dk, g_dv) = (u(uni::DK) as *mut u16, u(uni::DV) as *mut u16);
    for r in 0..2 {
        let key = k0 + kw + g + 8 * r;
        if key < nk {
            for nn in 0..DN {
                let col = nn * 8 + 2 * t;
                if col < d {
                    let vk = pack::<T>(r_dk[nn][2 * r] * scale, r_dk[nn][2 * r + 1] * scale);
                    let vv = pack::<T>(r_dv[nn][2 * r], r_dv[nn][2 * r + 1]);
                    // SAFETY: key < nk, col < d (even: 4-byte aligned, host-checked strides).
                    unsafe {
                        *(g_dk.wrapping_add(key * dks1 + col) as *mut u32) = vk;
                        *(g_dv.wrapping_add(key * dvs1 + col) as *mut u32) = vv;
                    }
                }
            }
        }
    }
}

/// The epilogue of the d 256 kernel (`bwd256`; this one's, inline above,
/// is the same code): this thread's `dK_j · scale` and `dV_j` accumulator
/// values (keys `k0 + kr`, `k0 + kr + 8`; columns `c0 + 8nn`, `+1`) in `T`
/// at their strides, keys past the sequence and columns past the head dim
/// skipped. `u` reads the block's uniform words.
#[inline(always)]
pub(super) fn write_dkdv<T: Elem16, const DN: usize>(p: &BwdParams, u: impl Fn(u32) -> u64, r_dk: &[[f32; 4]; DN], r_dv: &[[f32; 4]; DN], kr: usize, c0: usize) {
    let scale = p.fwd.softmax_scale;
    let (k0, nk, d) = (u(uni::K0) as usize, u(uni::NK) as usize, p.fwd.headdim as usize);
    let (dks1, dvs1) = (p.dk_stride[1] as usize, p.dv_stride[1] as usize);
    let (g_dk, g_dv) = (u(uni::DK) as *mut u16, u(uni::DV) as *mut u16);
    for r in 0..2 {
        let key = k0 + kr + 8 * r;
        if key < nk {
            for nn in 0..DN {
                let col = c0 + nn * 8;
                if col < d {
                    let vk = pack::<T>(r_dk[nn][2 * r] * scale, r_dk[nn][2 * r + 1] * scale);
                    let vv = pack::<T>(r_dv[nn][2 * r], r_dv[nn][2 * r + 1]);
                    // SAFETY: key < nk, col < d (even: 4-byte aligned, host-checked strides).
                    unsafe {
                        *(g_dk.wrapping_add(key * dks1 + col) as *mut u32) = vk;
                        *(g_dv.wrapping_add(key * dvs1 + col) as *mut u32) = vv;
                    }
                }
            }
        }
    }
}

/// Two f32 at a shared-window address (8-byte aligned).
///
/// # Safety
/// `a` inside this block's shared memory, written before a barrier or
/// mbarrier wait that orders it.
#[inline(always)]
pub(super) unsafe fn ld_shared_f32x2(a: u32) -> [f32; 2] {
    // SAFETY: forwarded to the caller.
    let [x, y] = unsafe { crate::arch::smem::ld_shared_v2(a) };
    [f32::from_bits(x), f32::from_bits(y)]
}

/// ALiBi's slope (`· log2 e`) of step `n`'s query head.
///
/// # Safety
/// Host-checked ALiBi slopes (batch `B`, the launch's heads).
#[inline(always)]
unsafe fn alibi_slope(f: &flash_attn_common::AttnParams, u: &impl Fn(u32) -> u64, n: u32) -> f32 {
    let h = (u(uni::H0) as u32) + n / u(uni::NI) as u32;
    // SAFETY: caller.
    unsafe { f.alibi_slope_log2(u(uni::B) as u32, h) }
}

/// ALiBi's signed distance `q + shift − key` of this thread's first
/// element in its `Sᵀ` row `row` (of the block; query `q0 + 2t`, `shift =
/// seqlen_k − seqlen_q`); row `row + 8` subtracts 8, element `(n, e)` adds
/// `8n + (e & 1)`. Recomputed where used (an opaque key, not held across
/// the loop), in 32 bits (sequences are below 2³¹).
#[inline(always)]
fn alibi_rel(f: &flash_attn_common::AttnParams, u: &impl Fn(u32) -> u64, q0: usize, t: usize, row: usize) -> i32 {
    let win = f.key_window(u(uni::NQ) as u32, u(uni::NK) as u32);
    let k = opaque::u32_fresh((u(uni::K0) as usize + row) as u32) as i32;
    (q0 + 2 * t) as i32 + win.shift as i32 - k
}

/// ALiBi's `slope · |distance|` of element `(n, e)` ([`alibi_rel`]).
#[inline(always)]
fn alibi_bias(slope: f32, rel: i32, n: usize, e: usize) -> f32 {
    let dist = rel - 8 * (e >> 1) as i32 + (n * 8 + (e & 1)) as i32;
    slope * dist.unsigned_abs() as f32
}

/// The softcap of the score (`MODS` kernels; as the tensor-core kernel's
/// `tc::bwd::ScoreT::apply`): the raw `Sᵀ` becomes `cap·log2 e ·
/// tanh(Sᵀ · softcap_pre)`, or without softcap `Sᵀ · scale · log2 e`
/// (constants read here; ALiBi follows in [`exp_mods`]).
#[inline(always)]
fn softcap_score<const BRN: usize>(r: &mut [[f32; 4]; BRN], f: &flash_attn_common::AttnParams, u: &impl Fn(u32) -> u64) {
    let cap_post = f32::from_bits(u(uni::CAP_POST) as u32);
    if cap_post != 0.0 {
        let cap_pre = f32::from_bits(u(uni::CAP_PRE) as u32);
        for nn in 0..BRN {
            for e in 0..4 {
                r[nn][e] = cap_post * (r[nn][e] * cap_pre).tanh();
            }
        }
    } else {
        for nn in 0..BRN {
            for e in 0..4 {
                r[nn][e] *= f.softmax_scale_log2;
            }
        }
    }
}

/// `Pᵀ = exp2(score − slope·log2 e · |q + shift − key| − LSE_i·log2 e)`
/// (`MODS` kernels) from the (soft-capped, masked) base-2 score `y` in
/// `r`, packed as the A operand of dV ([`pack_a`]'s layout, returned), and
/// `r` becomes `Pᵀ∘(1 − tanh²)` with `tanh = y / (cap·log2 e)` (the score
/// at hand: no `1 − tanh²` kept from the score pass, no `lg2` of P); `Pᵀ`
/// without softcap. A masked score (`−∞`) gives `P = 0` and the factor 0
/// (`1 − ∞`, never NaN).
///
/// # Safety
/// `lse` the stage's `LSE·log2 e` row (landed, ordered by its full
/// barrier); host-checked ALiBi slopes.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn exp_mods<T: Elem16, const BRN: usize, const BRK: usize>(
    r: &mut [[f32; 4]; BRN],
    f: &flash_attn_common::AttnParams,
    u: &impl Fn(u32) -> u64,
    n: u32,
    lse: u32,
    q0: usize,
    t: usize,
    row: usize,
) -> [[u32; 4]; BRK] {
    let inv_cap = f32::from_bits(u(uni::INV_CAP) as u32);
    // SAFETY: caller.
    let slope = unsafe { alibi_slope(f, u, n) };
    // SAFETY (each): caller.
    match (inv_cap != 0.0, slope != 0.0) {
        (true, true) => unsafe { exp_pack::<T, BRN, BRK, true, true>(r, inv_cap, slope, alibi_rel(f, u, q0, t, row), lse, t) },
        (true, false) => unsafe { exp_pack::<T, BRN, BRK, true, false>(r, inv_cap, 0.0, 0, lse, t) },
        (false, true) => unsafe { exp_pack::<T, BRN, BRK, false, true>(r, 0.0, slope, alibi_rel(f, u, q0, t, row), lse, t) },
        (false, false) => unsafe { exp_pack::<T, BRN, BRK, false, false>(r, 0.0, 0.0, 0, lse, t) },
    }
}

/// [`exp_mods`]'s elementwise pass (`CAP`: softcap, `ALIBI`: the bias).
///
/// # Safety
/// As [`exp_mods`].
#[inline(always)]
unsafe fn exp_pack<T: Elem16, const BRN: usize, const BRK: usize, const CAP: bool, const ALIBI: bool>(
    r: &mut [[f32; 4]; BRN],
    inv_cap: f32,
    slope: f32,
    rel: i32,
    lse: u32,
    t: usize,
) -> [[u32; 4]; BRK] {
    let mut a = [[0u32; 4]; BRK];
    for nn in 0..BRN {
        // SAFETY: caller; 8-byte aligned (even column).
        let l = unsafe { ld_shared_f32x2(lse + 4 * (nn * 8 + 2 * t) as u32) };
        let mut p = [0f32; 4];
        for e in 0..4 {
            let y = r[nn][e];
            let score = if ALIBI { y - alibi_bias(slope, rel, nn, e) } else { y };
            p[e] = (score - l[e & 1]).exp2();
            r[nn][e] = if CAP {
                let th = y * inv_cap;
                let dt = 1.0 - th * th;
                // `dt > 0` is false for a masked −∞ (and a rounding past ±1).
                p[e] * if dt > 0.0 { dt } else { 0.0 }
            } else {
                p[e]
            };
        }
        a[nn / 2][2 * (nn % 2)] = pack::<T>(p[0], p[1]);
        a[nn / 2][2 * (nn % 2) + 1] = pack::<T>(p[2], p[3]);
    }
    a
}
