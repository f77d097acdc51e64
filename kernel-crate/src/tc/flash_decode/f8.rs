//! Flash-decoding over an FP8 (e4m3) KV cache: the `F8` variant of
//! [`super::forward`] (`dec_f8_kernels!` in `tc/mod.rs`).
//!
//! Same grid, splits, masks, modifiers and epilogue as the 16-bit kernel,
//! with the cache read as one-byte codes:
//!
//! 1. `S` stages of codes stream in by `cp.async` ([`KvCopy::issue_f8`]:
//!    `Bc·D` bytes per tensor and block, half a 16-bit block's), the static
//!    split schedule only (no tickets), new keys appended before the launch;
//! 2. after the block's barrier each warp converts **its own** `Bcw` rows
//!    of the staged codes into its rows of one 16-bit K/V tile
//!    ([`convert_f8`]: `cvt.rn.f16x2.e4m3x2`, exact) and reads them with
//!    the 16-bit kernel's fragments after a warp barrier — no block barrier
//!    between conversion and use, so one warp converts while another
//!    multiplies;
//! 3. `k_scale` multiplies the softmax scale (and the softcap's argument),
//!    `v_scale` the normalized output (`AttnParams::k_descale_ptr`, …).
//!
//! Why a function of its own rather than a `const F8` in [`super::forward`]:
//! the same source with the FP8 branches folded away compiled the tuned
//! 16-bit kernels differently (LLVM's inlining inside the larger generic
//! body) and ran them 30–45% slower on the H200 (bf16, d 128, 131k keys;
//! docs/perf-notes.md, FP8 KV cache). The epilogue below is therefore the
//! 16-bit kernel's, written out once more.

use super::super::fa2::{BlockPos, Mods, key_blocks, mask, pv, qk, quad_sum, scale_sign, seq_of, softmax_step, split_of};
use super::super::tile::{FragTile, KvTile, SmemTile, dec_kv_tile_bytes, tile_bytes};
use super::super::{Elem16, pack};
use super::{BR, KvCopy, Timeline, last_split, merge_stride};
use crate::arch::cp_async::{cp_async_cg_16_pf, cp_async_commit, cp_async_wait};
use crate::arch::cvt::{e4m3x2_to_f16x2, f16x2_from_e4m3_to_bf16x2};
use crate::arch::smem::{dynamic_smem, ld_shared_v4, smem_addr, st_shared_v4};
use crate::arch::opaque as arch_opaque;
use crate::arch::sreg;
use crate::arch::sync::{sync_threads, sync_warp};
use flash_attn_common::{AttnParams, INTERLEAVE_PAGED, Real, RowState};

impl KvCopy {
    /// FP8 caches: issues this thread's copies of block `j`
    /// (`Bc` keys of `D` one-byte codes, `cpr = D/16` 16-byte chunks per
    /// row) into the staging tiles at shared addresses `sk`, `sv`, linear:
    /// chunk `i = row·cpr + c` at byte `16·i`. Chunk `i` goes to thread
    /// `i % nt` (as [`KvCopy::issue_full`] orders them: coalesced). Rows at
    /// or past `nk` and columns at or past `d` (a multiple of 16: host) are
    /// zero-filled; a zero code is +0.
    ///
    /// # Safety
    /// As [`KvCopy::issue`] with byte pointers and strides (one byte per
    /// element); the staging tiles hold `Bc·D` bytes each.
    #[inline(always)]
    unsafe fn issue_f8<const D: usize, const BC: usize, const NW: usize, const PF: u32>(&self, p: &AttnParams, sk: u32, sv: u32, j: usize, nk: usize, d: usize) {
        let cpr = D / 16;
        let j0 = j * BC;
        let (k8, v8) = (self.k as *const u8, self.v as *const u8);
        let one_page = self.one_page::<BC>(p, j0);
        let (kb, vb) = if one_page {
            // SAFETY: j0 < nk (the caller issues blocks with keys).
            let page = unsafe { p.page_of(self.b, j0 as u32) } as u64;
            let r0 = p.page_row(j0 as u32) as u64;
            (k8.wrapping_add((page * self.k_ps + r0 * self.k_rs) as usize), v8.wrapping_add((page * self.v_ps + r0 * self.v_rs) as usize))
        } else if self.paged {
            (k8, v8)
        } else {
            (k8.wrapping_add(j0 * self.k_rs as usize), v8.wrapping_add(j0 * self.v_rs as usize))
        };
        let per_row = self.paged && !one_page;
        if (32 * NW) % cpr == 0 && (BC * cpr) % (32 * NW) == 0 && !per_row && j0 + BC <= nk {
            // A full block of strided rows: this thread copies column chunk
            // `tid % cpr` of rows `tid / cpr + k·(32·NW / cpr)` — chunk
            // `tid + k·nt` — with constant address steps.
            let rstep = 32 * NW / cpr;
            let (r0, c) = (self.tid / cpr, self.tid % cpr);
            let (n, c16) = if c * 16 < d { (16, c * 16) } else { (0, 0) };
            let mut ks = kb.wrapping_add(r0 * self.k_rs as usize + c16);
            let mut vs = vb.wrapping_add(r0 * self.v_rs as usize + c16);
            for k in 0..BC * cpr / (32 * NW) {
                let at = (16 * (self.tid + k * self.nt)) as u32;
                // SAFETY: rows of the block exist (j0 + Bc ≤ nk), columns
                // < d or a zero-size copy.
                unsafe {
                    cp_async_cg_16_pf::<PF>(sk + at, ks, n);
                    cp_async_cg_16_pf::<PF>(sv + at, vs, n);
                }
                ks = ks.wrapping_add(rstep * self.k_rs as usize);
                vs = vs.wrapping_add(rstep * self.v_rs as usize);
            }
            return;
        }
        if (32 * NW) % cpr == 0 && (BC * cpr) % (32 * NW) == 0 && BC * cpr / (32 * NW) <= 4 && per_row && j0 + BC <= nk {
            // A full block over pages smaller than it: this thread's rows
            // `tid / cpr + k·(32·NW / cpr)` look their pages up first
            // (independent loads, one round trip for all), then the copies
            // go out. (At most 4 rows per thread: d = 256's 8 spilled.)
            let rstep = 32 * NW / cpr;
            let (r0, c) = (self.tid / cpr, self.tid % cpr);
            let (n, c16) = if c * 16 < d { (16, c * 16) } else { (0, 0) };
            let steps = BC * cpr / (32 * NW);
            let mut pages = [0u32; 4];
            #[allow(clippy::needless_range_loop)] // constant indices once unrolled: registers
            for k in 0..4 {
                if k < steps {
                    // SAFETY: the row is < nk (a full block).
                    pages[k] = unsafe { p.page_of(self.b, (j0 + r0 + k * rstep) as u32) };
                }
            }
            #[allow(clippy::needless_range_loop)]
            for k in 0..4 {
                if k >= steps {
                    break;
                }
                let pr = p.page_row((j0 + r0 + k * rstep) as u32) as u64;
                let ks = k8.wrapping_add((pages[k] as u64 * self.k_ps + pr * self.k_rs) as usize + c16);
                let vs = v8.wrapping_add((pages[k] as u64 * self.v_ps + pr * self.v_rs) as usize + c16);
                let at = (16 * (self.tid + k * self.nt)) as u32;
                // SAFETY: rows of the block inside their pages; a size of 0 reads nothing.
                unsafe {
                    cp_async_cg_16_pf::<PF>(sk + at, ks, n);
                    cp_async_cg_16_pf::<PF>(sv + at, vs, n);
                }
            }
            return;
        }
        let mut i = self.tid;
        while i < BC * cpr {
            let (r, c) = (i / cpr, i % cpr);
            let t = j0 + r;
            let ok = t < nk && c * 16 < d;
            let (ks, vs) = if !ok {
                (k8, v8)
            } else if per_row {
                // SAFETY: t < nk ≤ the sequence's clamped length (caller).
                let page = unsafe { p.page_of(self.b, t as u32) } as u64;
                let pr = p.page_row(t as u32) as u64;
                (k8.wrapping_add((page * self.k_ps + pr * self.k_rs) as usize + c * 16), v8.wrapping_add((page * self.v_ps + pr * self.v_rs) as usize + c * 16))
            } else {
                (kb.wrapping_add(r * self.k_rs as usize + c * 16), vb.wrapping_add(r * self.v_rs as usize + c * 16))
            };
            let n = if ok { 16 } else { 0 };
            // SAFETY: rows < nk lie in the sequence's (clamped) cache rows,
            // columns < d in the row; a size of 0 reads nothing.
            unsafe {
                cp_async_cg_16_pf::<PF>(sk + (16 * i) as u32, ks, n);
                cp_async_cg_16_pf::<PF>(sv + (16 * i) as u32, vs, n);
            }
            i += self.nt;
        }
    }

}

/// Converts this warp's `BCW` rows (`row0..row0 + BCW`) of a staged block
/// (`D` e4m3 codes per row at shared address `src`, linear as
/// [`KvCopy::issue_f8`] lays them out) into the 16-bit stage tile `dst` the
/// warp's tensor-core fragments read, exactly (the scales are applied to
/// the scores and to O, not here). The warp alone reads these rows of
/// `dst`. A lane stores the two 16-byte halves of its chunk in the order
/// `(c / 4) % 2` picks, so that the 8 lanes of a store phase hit 8 distinct
/// bank groups of the swizzled rows.
///
/// # Safety
/// The staged block landed and a barrier passed; this warp is done with
/// the previous block's rows of `dst`.
#[inline(always)]
unsafe fn convert_f8<T: Elem16, const D: usize, const BCW: usize>(src: u32, dst: KvTile<D>, row0: usize, lane: usize) {
    let cpr = D / 16;
    const { assert!((BCW * (D / 16)) % 32 == 0) };
    let half = |w: u32, hi: bool| {
        let x = e4m3x2_to_f16x2(if hi { (w >> 16) as u16 } else { w as u16 });
        if T::IS_BF16 { f16x2_from_e4m3_to_bf16x2(x) } else { x }
    };
    // d = 256 keeps the loop rolled (a trip count LLVM cannot see): its O
    // accumulators leave no room for the unrolled loop's loads in flight
    // (255 registers and a 16-byte spill when unrolled).
    let iters = if D >= 256 { crate::arch::opaque::u32((BCW * cpr / 32) as u32) as usize } else { BCW * cpr / 32 };
    for k in 0..iters {
        let i = row0 * cpr + lane + 32 * k;
        let (r, c) = (i / cpr, i % cpr);
        // SAFETY: chunk i of the warp's rows of the staged block (caller: landed).
        let x = unsafe { ld_shared_v4(src + (16 * i) as u32) };
        let lo = [half(x[0], false), half(x[0], true), half(x[1], false), half(x[1], true)];
        let hi = [half(x[2], false), half(x[2], true), half(x[3], false), half(x[3], true)];
        let (first, second) = if (c / 4) % 2 == 0 { ((0, lo), (8, hi)) } else { ((8, hi), (0, lo)) };
        // SAFETY: row r < Bc, columns 16c..16c + 16 ≤ D of the tile (caller).
        unsafe {
            st_shared_v4(dst.addr(r, 16 * c + first.0), first.1);
            st_shared_v4(dst.addr(r, 16 * c + second.0), second.1);
        }
    }
}

/// The FP8-cache decode kernel body (see the module docs).
///
/// # Safety
/// As [`super::forward`], with one-byte cache elements (16-byte aligned
/// rows and strides, `d` a multiple of 16: host-checked), the scale arrays
/// set, and `flash_attn_common::tc::dec_f8_smem_bytes` of dynamic shared
/// memory.
#[inline(always)]
pub unsafe fn forward_f8<
    T: Elem16,
    const D: usize,
    const DK: usize,
    const DN: usize,
    const NW: usize,
    const BC: usize,
    const BCW: usize,
    const BCWN: usize,
    const BCWK: usize,
    const S: usize,
    const PF: u32,
>(
    p: &AttnParams,
) {
    const { assert!(BCW * NW == BC && BCWN * 8 == BCW && BCWK * 16 == BCW && DK * 16 == D && DN * 8 == D && DN % 2 == 0 && BCWN % 2 == 0) };
    const { assert!(S >= 2 && S <= 4 && D % 16 == 0) };
    let nt = 32 * NW;
    let num_m = (p.seqlen_q as usize).div_ceil(BR);
    let (idx, split) = split_of::<true>(p, num_m, sreg::block_idx_x());
    let BlockPos { b, h, mb, tid, lane, g, t, .. } = BlockPos::new(p, num_m, idx, sreg::thread_idx_x());
    let warp = tid / 32;
    let tl = Timeline::new(p, tid);
    tl.stamp(0);
    // SAFETY: host-checked KV-cache/varlen arrays (values clamped inside).
    let seq = unsafe { seq_of::<true, true>(p, b, h) };
    let (nq, nk) = (seq.seqlen_q as usize, seq.seqlen_k as usize);
    let q0 = mb * BR;
    if q0 >= nq {
        return; // past this sequence's queries (block-uniform)
    }
    let d = p.headdim as usize;
    let win = p.key_window(seq.seqlen_q, seq.seqlen_k);
    let (j_first, j_end, full_start, full_end) = key_blocks::<BC>(p, &win, q0, (q0 + BR).min(nq), nk, None);
    let (full_start, full_end) = (full_start as usize, full_end as usize);

    // ---- addresses (bytes: one per code) ------------------------------------
    let group = arch_opaque::u32(p.nheads) / arch_opaque::u32(p.kv_heads());
    let kvh = (h as u32 / group) as u64;
    let [qs0, qs1, qs2] = p.q_stride;
    let g_q = (p.q_ptr as *const u16).wrapping_add((b as u64 * qs0 + (seq.q_row0 + q0 as u64) * qs1 + h as u64 * qs2) as usize);
    let paged = p.block_table_ptr != 0;
    let rc = {
        let k_head = (p.k_ptr as *const u8).wrapping_add((kvh * p.k_stride[2]) as usize);
        let v_head = (p.v_ptr as *const u8).wrapping_add((kvh * p.v_stride[2]) as usize);
        let (k, v) = if paged {
            (k_head, v_head)
        } else {
            // SAFETY: host-sized cache_batch_idx (clamped).
            let kb = unsafe { p.kv_batch(b as u32) } as u64;
            (k_head.wrapping_add((kb * p.k_stride[0] + seq.k_row0 * p.k_stride[1]) as usize), v_head.wrapping_add((kb * p.v_stride[0] + seq.k_row0 * p.v_stride[1]) as usize))
        };
        KvCopy {
            k: k as *const u16,
            v: v as *const u16,
            k_rs: p.k_stride[1],
            v_rs: p.v_stride[1],
            k_ps: p.k_stride[0],
            v_ps: p.v_stride[0],
            paged,
            b: b as u32,
            tid,
            nt,
            kn: core::ptr::null(),
            vn: core::ptr::null(),
            kn_rs: 0,
            vn_rs: 0,
            cached: usize::MAX,
            writer: false,
        }
    };

    // ---- shared memory: Q, one 16-bit K/V tile pair, S stages of codes ------
    let base = smem_addr(dynamic_smem::<u8>());
    let s_q = SmemTile::<D> { base };
    let kv_base = base + tile_bytes(BR, D) as u32;
    let kv_bytes = dec_kv_tile_bytes(BC, D) as u32;
    let s_k = KvTile::<D> { base: kv_base };
    let s_v = KvTile::<D> { base: kv_base + kv_bytes };
    let f8_bytes = (BC * D) as u32;
    let f8_k = |s: usize| kv_base + 2 * kv_bytes + 2 * s as u32 * f8_bytes;
    let f8_v = |s: usize| f8_k(s) + f8_bytes;
    let w_off = (warp * BCW) as u32 * KvTile::<D>::RB;
    let issue = |j: usize, stage: usize| {
        // SAFETY: j < j_end: rows < nk exist.
        unsafe { rc.issue_f8::<D, BC, NW, PF>(p, f8_k(stage), f8_v(stage), j, nk, d) }
    };

    // The static schedule: as the 16-bit kernel's without tickets.
    const NONE: usize = usize::MAX;
    let ns = p.num_splits as usize;
    let (s_first, s_step, s_end) = if !paged || p.split_tickets & INTERLEAVE_PAGED != 0 {
        (j_first + split as usize, ns, j_end)
    } else {
        let per = (j_end - j_first).div_ceil(ns);
        let first = (j_first + split as usize * per).min(j_end);
        (first, 1, (first + per).min(j_end))
    };
    let fixed = |i: usize| {
        let j = s_first + i * s_step;
        if j < s_end { j } else { NONE }
    };

    // ---- prologue: Q and the first S − 1 blocks -------------------------------
    // SAFETY: rows q0..min(q0 + 16, nq) of Q exist.
    unsafe { s_q.load_async(g_q, qs1, BR, (nq - q0).min(BR), d, tid, nt) };
    for s in 0..S - 1 {
        if fixed(s) != NONE {
            issue(fixed(s), s);
        }
        cp_async_commit();
    }

    tl.stamp(1);
    let mut r_o = [[[0f32; 4]; DN]; 1];
    let mut st = [[RowState::<f32>::new(); 2]; 1];
    let r_q = [[[0u32; 4]; DK]; 1];
    // The dequantization scales of this KV head: K's multiplies the scores
    // (softmax scale and softcap), V's the output.
    let i_scale = kvh as usize * p.descale_head_stride as usize;
    // SAFETY: host-checked scale arrays (one per tensor, or nheads_k).
    let (k_scale, v_scale) = unsafe { (*(p.k_descale_ptr as *const f32).add(i_scale), *(p.v_descale_ptr as *const f32).add(i_scale)) };
    let (q_sign, scale_log2) = scale_sign(p.softmax_scale_log2 * k_scale);
    // SAFETY: host-checked ALiBi slopes.
    let mut mods = unsafe { Mods::new(p, b, h, scale_log2) };
    mods.cap_pre = (p.softcap_pre * k_scale).abs();
    let soft_scale = if mods.active() { 1.0 } else { scale_log2 };
    let row0 = (q0 + g) as i64;

    // ---- main loop ----------------------------------------------------------------
    let mut i = 0;
    loop {
        let j = fixed(i);
        if j == NONE {
            break; // block-uniform
        }
        // Block j landed (this thread's copies; S − 2 later groups may fly),
        // then everyone's (barrier), which also frees stage (i − 1) % S.
        if S == 2 {
            cp_async_wait::<0>();
        } else if S == 3 {
            cp_async_wait::<1>();
        } else {
            cp_async_wait::<2>();
        }
        sync_threads();
        let jn = fixed(i + S - 1);
        if jn != NONE {
            issue(jn, (i + S - 1) % S);
        }
        cp_async_commit();
        // This warp's rows of the codes into its rows of the 16-bit tiles
        // (it finished the previous block's), visible to its lanes after a
        // warp barrier.
        // SAFETY: block j landed, a barrier passed.
        unsafe {
            convert_f8::<T, D, BCW>(f8_k(i % S), s_k, warp * BCW, lane);
            convert_f8::<T, D, BCW>(f8_v(i % S), s_v, warp * BCW, lane);
        }
        sync_warp();
        let sk = KvTile::<D> { base: s_k.base + w_off };
        let sv = KvTile::<D> { base: s_v.base + w_off };
        // SAFETY: the warp's rows converted above, Q landed (first barrier).
        let mut r_s = unsafe { qk::<T, D, DK, BCWN, 1, false>(&r_q, s_q, 0, q_sign, sk, lane) };
        let k0 = j * BC + warp * BCW;
        if mods.active() {
            mods.apply(&mut r_s[0], k0, t, [row0 + win.shift, row0 + 8 + win.shift]);
        }
        if k0 < full_start || k0 + BCW > full_end {
            mask(&mut r_s[0], k0, t, [win.lo(row0), win.lo(row0 + 8)], [win.hi(row0), win.hi(row0 + 8)]);
            softmax_step::<BCWN, DN, 1, true>(&mut r_s, &mut r_o, &mut st, soft_scale);
        } else {
            softmax_step::<BCWN, DN, 1, false>(&mut r_s, &mut r_o, &mut st, soft_scale);
        }
        // SAFETY: as above.
        unsafe { pv::<T, D, DN, BCWN, BCWK, 1>(&mut r_o, &r_s, sv, lane) };
        i += 1;
    }
    cp_async_wait::<0>();
    sync_threads(); // every warp done with the stages: the merge reuses them
    tl.stamp(2);

    // ---- merge the warps' states ------------------------------------------------------
    // Only the tile's live rows (`rows` of 16: one for a token of MHA, the
    // g packed query heads for GQA) go through shared memory, and the
    // merge spreads the block's threads over them (decode step 16: a
    // quarter of the stores and 4× fewer column pairs per thread for
    // GQA 32/8 than merging all 16 rows).
    let rows = (nq - q0).min(BR);
    let ms = merge_stride(D);
    let o_w = dynamic_smem::<u8>().wrapping_add(tile_bytes(BR, D)) as *mut f32;
    let ml = o_w.wrapping_add(NW * BR * ms);
    for r in 0..2 {
        let row = g + 8 * r;
        let l = quad_sum(st[0][r].l);
        if row >= rows {
            continue; // dead rows: nothing to merge (the shuffle above is done)
        }
        let dst = o_w.wrapping_add((warp * BR + row) * ms);
        for n in 0..DN {
            let col = n * 8 + 2 * t;
            // SAFETY: inside this warp's partial tile (row < 16, col + 1 < D + 8).
            unsafe { *(dst.add(col) as *mut [f32; 2]) = [r_o[0][n][2 * r], r_o[0][n][2 * r + 1]] };
        }
        if t == 0 {
            // SAFETY: NW·16 (m, l) pairs after the tiles.
            unsafe { *(ml.add(2 * (warp * BR + row)) as *mut [f32; 2]) = [st[0][r].m, l] };
        }
    }
    sync_threads();

    // Thread tid merges row tid / tpr, column pairs (tid % tpr) + k·tpr,
    // with tpr = nt / (rows rounded up to a power of two). Rows past the
    // sequence's queries store nothing (no early return: the fused combine
    // below has barriers).
    let tpr = nt >> rows.next_power_of_two().trailing_zeros();
    let row = tid / tpr;
    let live = row < rows;
    let mut m_all = f32::NEG_INFINITY;
    for w in 0..NW {
        // SAFETY: written above, a barrier passed.
        m_all = m_all.max(unsafe { *ml.add(2 * (w * BR + row)) });
    }
    let mut wgt = [0f32; NW];
    let mut l_all = 0f32;
    for w in 0..NW {
        // SAFETY: as above.
        let [m_w, l_w] = unsafe { *(ml.add(2 * (w * BR + row)) as *const [f32; 2]) };
        wgt[w] = if m_w == f32::NEG_INFINITY { 0.0 } else { (m_w - m_all).exp2() };
        l_all += wgt[w] * l_w;
    }
    let state = RowState { m: m_all, l: l_all };
    let inv_l = state.inv_l() * v_scale;
    let merged = |col: usize| -> [f32; 2] {
        let mut acc = [0f32; 2];
        for w in 0..NW {
            // SAFETY: as above; col + 1 < D.
            let x = unsafe { *(o_w.add((w * BR + row) * ms + col) as *const [f32; 2]) };
            acc[0] += wgt[w] * x[0];
            acc[1] += wgt[w] * x[1];
        }
        [acc[0] * inv_l, acc[1] * inv_l]
    };
    let lane_r = tid % tpr;
    let [os0, os1, os2] = p.o_stride;
    let o_row_of = |r: usize| (p.o_ptr as *mut u16).wrapping_add((b as u64 * os0 + (seq.q_row0 + (q0 + r) as u64) * os1 + h as u64 * os2) as usize);
    let lse_of = |r: usize| if p.lse_ptr != 0 { (p.lse_ptr as *mut f32).wrapping_add(seq.lse_base as usize + q0 + r) } else { core::ptr::null_mut() };
    if p.num_splits > 1 {
        // Split-KV partial: normalized O and LSE in f32 for the combine.
        let lse_len = crate::decode::lse_len(p);
        if live {
            let idx = split as usize * lse_len + seq.lse_base as usize + q0 + row;
            let o_row = (p.o_accum_ptr as *mut f32).wrapping_add(idx * d);
            let mut col = 2 * lane_r;
            while col < d {
                // SAFETY: (split, row) inside the host's accumulator of
                // splits·lse_len rows of d f32; col + 1 < d (d even).
                unsafe { *(o_row.add(col) as *mut [f32; 2]) = merged(col) };
                col += 2 * tpr;
            }
            if lane_r == 0 {
                // SAFETY: splits·lse_len f32.
                unsafe { *(p.lse_accum_ptr as *mut f32).add(idx) = state.lse() };
            }
        }
        tl.stamp(3);
        if p.split_counter_ptr == 0 {
            tl.meta(split, false);
            return;
        }
        // Fused combine: the last split of this tile to finish merges the
        // tile's rows (one warp per row), no combine launch.
        // SAFETY: the host's counters hold one u32 per tile (idx < grid /
        // num_splits); the Q tile's first word is free (Q is not read again).
        let last = unsafe { last_split(p, idx as usize, base, tid) };
        tl.stamp(4);
        tl.meta(split, last);
        if last {
            let mut r = warp;
            while r < rows {
                // SAFETY: every split of the tile wrote its partial rows and
                // released them (last_split); O's row r and its LSE exist.
                unsafe { crate::decode::combine_row::<T, { crate::decode::FUSED_STEP }>(p, lse_len, seq.lse_base as usize + q0 + r, lane, o_row_of(r), lse_of(r)) };
                r += NW;
            }
            if p.scratch_ptr != 0 {
                sync_threads(); // the block's end: every warp's rows stored
            }
            tl.stamp(5);
        }
        return;
    }
    if !live {
        return;
    }
    let o_row = o_row_of(row);
    let mut col = 2 * lane_r;
    while col < d {
        let [x, y] = merged(col);
        // SAFETY: row < nq, col + 1 < d; 4-byte aligned (even col, host-checked strides).
        unsafe { *(o_row.add(col) as *mut u32) = pack::<T>(x, y) };
        col += 2 * tpr;
    }
    if lane_r == 0 && p.lse_ptr != 0 {
        // SAFETY: lse holds the rows of the lse space (dense or varlen).
        unsafe { *lse_of(row) = state.lse() };
    }
    tl.stamp(3);
    tl.meta(0, false);
}
