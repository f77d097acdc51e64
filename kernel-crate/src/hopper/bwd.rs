//! The FA2-order backward main kernel on `wgmma` (FA2 paper, Algorithm 2;
//! `../shared/BACKWARD.md`), f16/bf16 with f32 accumulation, sm_90a.
//!
//! The order of work is the tensor-core kernel's (`tc::bwd`): one block per
//! (K/V block `j` of `Bc` = 128 keys, batch, KV head), `blockIdx.x =
//! (b·nheads_k + kvh)·num_n + j`; `K_j`, `V_j` stay in shared memory and
//! `dK_j`, `dV_j` in registers while the block loops over the query heads
//! of the KV head's group and, per head, over the Q blocks `i` that see
//! block `j` (`flash_attn_common::tc_bwd`'s block ranges). Two warpgroups,
//! 64 keys each; everything is computed transposed (keys as the `wgmma` M)
//! so that `Pᵀ` and `dSᵀ` leave the accumulators as register A operands.
//! Per step `(h, i)` (`Br` = 64 queries at d 128, 128 at d 64):
//! 1. wait for `Q_i`, `dO_i`, `LSE_i`, `D_i` (`cp.async`, issued one step
//!    earlier into the swizzled panels `wgmma` reads), barrier, issue the
//!    next step's copies into the other buffers;
//! 2. `Sᵀ = K_w·Q_iᵀ` and `dPᵀ = V_w·dO_iᵀ` (`wgmma` m64n{Br}k16, both
//!    operands K-major in shared memory, two commit groups); scale, mask
//!    (boundary blocks only), `Pᵀ = exp2(Sᵀ − LSE_i·log2 e)` while `dPᵀ`
//!    is still on the tensor cores; `dSᵀ = Pᵀ∘(dPᵀ − D_i)`;
//! 3. `dV_w += Pᵀ·dO_i`, `dK_w += dSᵀ·Q_i` (`wgmma` m64n{d}k16, A from
//!    registers, B MN-major);
//! 4. `dSᵀ` (16-bit) to shared memory in the same swizzled panels; barrier;
//! 5. `dQ_i += scale · dS·K_j`: warpgroup `w` computes one `64 × 64` block
//!    over all 128 keys (d 128: columns `64w..`; d 64: rows `64w..`) with
//!    A = `dS` and B = `K_j` both MN-major (`wgmma` with both transposes),
//!    stages it in
//!    shared memory (f32) and adds it to the f32 accumulator with one bulk
//!    reduction per row (`cp.reduce.async.bulk .add.f32`, 256 bytes each):
//!    no per-element atomics.
//!
//! Epilogue: `dK_j · scale` and `dV_j` in `T` at their strides.
//! Softcap, ALiBi and deterministic mode run on the tensor-core kernel.

use super::{acc_fence, desc_kmajor, desc_mnmajor, mma_rs, mma_ss, mma_tt};
use crate::arch::cp_async::{cp_async_ca_4, cp_async_cg_16, cp_async_commit, cp_async_wait};
use crate::arch::named_barrier::named_bar_sync;
use crate::arch::opaque;
use crate::arch::smem::{dynamic_smem, ld_volatile_shared_u64, smem_addr, st_shared_u32, st_shared_u64};
use crate::arch::sreg;
use crate::arch::sync::sync_threads;
use crate::arch::tma::{bulk_commit_group, bulk_reduce_add_f32, bulk_wait_group, bulk_wait_group_read, fence_proxy_async_shared};
use crate::arch::wgmma::{wgmma_commit, wgmma_fence, wgmma_wait};
use crate::tc::fa2::mask;
use crate::tc::{Elem16, pack};
use flash_attn_common::hopper_bwd::{HOPPER_BWD_BC, HOPPER_BWD_DQ_ROW_BYTES, HOPPER_BWD_THREADS, HOPPER_BWD_UNI_WORDS, HopperBwdSmem};
use flash_attn_common::tc_bwd::{bwd_key_blocks, bwd_query_blocks, bwd_query_range};
use flash_attn_common::{BwdParams, LOG2_E, Real};

/// Bytes per row of a 64-column panel.
const PANEL_ROW: usize = 128;

/// The 128B swizzle of a shared-memory address inside a 1024-byte aligned
/// tile: the 16-byte chunk bits 4–6 XOR the row bits 7–9.
#[inline(always)]
fn swizzle128(a: u32) -> u32 {
    a ^ ((a >> 3) & 0x70)
}

/// Issues the `cp.async` copies of a `ROWS × D` tile of 16-bit elements
/// (row `r` at `g + r·row_stride`; rows ≥ `rows_valid` and columns ≥
/// `cols_valid` zero-filled) into the 128B-swizzled 64-column panels at
/// `dst`: chunk `c` (8 elements) of row `r` at `(c/8)·ROWS·128 + r·128 +
/// ((c%8) ^ (r%8))·16`, the layout TMA writes for the forward. Thread `tid`
/// copies chunk `tid % (D/8)` of rows `tid / (D/8)` + multiples of
/// `256 / (D/8)` (a multiple of 8: one swizzle for all its rows); its
/// addresses advance row group by row group through [`opaque`] moves, so
/// that no per-row offset is held across the caller's loop.
///
/// # Safety
/// Rows `< rows_valid` are readable for `cols_valid` elements at 16-byte
/// aligned addresses; `dst` is 1024-byte aligned with `ROWS · 2D` bytes of
/// this block's shared memory free until the copies are waited for.
#[inline(always)]
unsafe fn load_panels<const D: usize, const ROWS: usize>(dst: u32, g: *const u16, row_stride: u64, rows_valid: usize, cols_valid: usize, tid: usize) {
    let cpr = const { D / 8 };
    let rstep = const { HOPPER_BWD_THREADS / (D / 8) };
    const { assert!(HOPPER_BWD_THREADS % (D / 8) == 0 && (HOPPER_BWD_THREADS / (D / 8)) % 8 == 0 && ROWS % (HOPPER_BWD_THREADS / (D / 8)) == 0) };
    let (r0, c) = (tid / cpr, tid % cpr);
    let ok_c = c * 8 < cols_valid;
    let s0 = opaque::u32_fresh(dst + ((c / 8) * ROWS * PANEL_ROW + r0 * PANEL_ROW + ((c % 8) ^ (r0 % 8)) * 16) as u32);
    let mut src = g.wrapping_add(r0 * row_stride as usize + c * 8) as u64;
    let step = (rstep as u64 * row_stride) * 2;
    for k in 0..ROWS / rstep {
        let ok = ok_c && r0 + k * rstep < rows_valid;
        // SAFETY: see the function's contract; src_size 0 reads nothing.
        unsafe { cp_async_cg_16(s0 + (k * rstep * PANEL_ROW) as u32, if ok { src as *const u8 } else { g as *const u8 }, if ok { 16 } else { 0 }) };
        src = opaque::u64_fresh(src.wrapping_add(step));
    }
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

/// The backward main kernel body (see the module docs).
///
/// # Safety
/// As the exported entry points: `p` valid (host-checked shapes, strides,
/// dq accumulator zeroed, delta computed), launched with
/// [`HOPPER_BWD_THREADS`] threads, `HopperBwdSmem::new(D).request_bytes()`
/// of dynamic shared memory and `batch · nheads_k · ceil(seqlen_k / 128)`
/// blocks.
#[inline(always)]
pub unsafe fn backward<T: Elem16, const D: usize, const DN: usize, const BR: usize, const BRN: usize, const BRK: usize>(p: &BwdParams) {
    const { assert!(DN * 8 == D && BRN * 8 == BR && BRK * 16 == BR && ((D == 128 && BR == 64) || (D == 64 && BR == 128))) };
    const BC: usize = HOPPER_BWD_BC;
    let lay = const { HopperBwdSmem::new(D) };
    let f = &p.fwd;
    // ---- prologue: who am I, what do I read --------------------------------
    let num_n = (f.seqlen_k as usize).div_ceil(BC);
    let idx = sreg::block_idx_x() as usize;
    let (j, bkh) = (idx % num_n, idx / num_n);
    let nkh = f.kv_heads() as usize;
    let (b, kvh) = (bkh / nkh, bkh % nkh);
    let tid = sreg::thread_idx_x() as usize;
    let (wg, wl) = (tid / 128, tid % 128);
    let (ww, lane) = (wl / 32, tid % 32);
    let (g, t) = (lane / 4, lane % 4);
    let group = f.nheads as usize / nkh;
    let h0 = kvh * group;
    // SAFETY: host-checked varlen arrays (values clamped inside).
    let seq = unsafe { f.seq(b as u32, h0 as u32) };
    let (nq, nk) = (seq.seqlen_q as usize, seq.seqlen_k as usize);
    let k0 = j * BC;
    if k0 >= nk {
        return; // varlen: this K/V block lies past its sequence (block-uniform)
    }
    let d = f.headdim as usize;
    let win = f.key_window(seq.seqlen_q, seq.seqlen_k);
    // The Q blocks that see block j: a contiguous range (tc_bwd tests).
    let (mut ia, mut ib) = bwd_query_blocks(&win, j, BR, BC, nq);
    let visits = |i: usize| {
        let (first, end) = bwd_key_blocks(&win, i, BR, BC, nq);
        first <= j && j < end
    };
    while ia < ib && !visits(ia) {
        ia += 1;
    }
    while ib > ia && !visits(ib - 1) {
        ib -= 1;
    }
    let ni = ib - ia;
    let steps = group * ni;
    // Queries every key of the block sees (a Q block inside needs no mask).
    let k_last = (k0 + BC).min(nk) - 1;
    let (full_lo, full_hi) = if k0 + BC <= nk {
        (bwd_query_range(&win, k_last as i64, nq as i64).0, bwd_query_range(&win, k0 as i64, nq as i64).1)
    } else {
        (1, 0)
    };
    let lse_head_stride = if f.is_varlen() { f.total_q } else { f.seqlen_q } as u64;

    // ---- shared memory (1024-aligned base) ---------------------------------
    let raw = dynamic_smem::<u8>();
    let base = (smem_addr(raw) + 1023) & !1023;
    let base_ptr = raw.wrapping_add((base - smem_addr(raw)) as usize);
    let s_k = base + lay.k as u32;
    let s_v = base + lay.v as u32;
    let s_q = |buf: usize| base + lay.q[buf] as u32;
    let s_do = |buf: usize| base + lay.dout[buf] as u32;
    let s_ds = base + lay.ds as u32;
    let s_dq = base + (lay.dq + wg * 64 * HOPPER_BWD_DQ_ROW_BYTES) as u32;
    let rows_f32 = |k: usize| base_ptr.wrapping_add(lay.rows + k * BR * 4) as *const f32;

    // The step copies' sources from per-(batch, KV head) bases, kept in
    // shared memory (`uni`, written by thread 0, read with volatile loads
    // where used): held in registers across the loop they spilled.
    let uni = base + lay.uni as u32;
    if tid == 0 {
        let [qs0, qs1, qs2] = f.q_stride;
        let [ds0, ds1, ds2] = p.do_stride;
        let words = [
            f.q_ptr + 2 * (b as u64 * qs0 + seq.q_row0 * qs1 + h0 as u64 * qs2),
            p.do_ptr + 2 * (b as u64 * ds0 + seq.q_row0 * ds1 + h0 as u64 * ds2),
            f.lse_ptr + 4 * seq.lse_base,
            p.delta_ptr + 4 * seq.lse_base,
            qs1,
            qs2,
            ds1,
            ds2,
            lse_head_stride,
            p.dq_accum_ptr + 4 * seq.lse_base * d as u64,
            full_lo as u64,
            full_hi as u64,
        ];
        // (An index loop: an array iterator is not unrolled and puts the
        // words in a stack frame.)
        for w in 0..HOPPER_BWD_UNI_WORDS {
            // SAFETY: inside `uni`, read after the barrier below.
            unsafe { st_shared_u64(uni + 8 * w as u32, words[w]) };
        }
    }
    sync_threads();
    // SAFETY: written above, before the barrier.
    let u = |w: u32| unsafe { ld_volatile_shared_u64(uni + 8 * w) };
    // Issue the copies of step `n`: Q_i, dO_i of head h, LSE_i and D_i.
    let load_step = |n: usize| {
        let (hh, i) = (n / ni, ia + n % ni);
        let (q0, buf) = (i * BR, n & 1);
        let valid = (nq - q0).min(BR);
        let (qs1, ds1) = (u(4), u(6));
        let g_q = (u(0) + 2 * (q0 as u64 * qs1 + hh as u64 * u(5))) as *const u16;
        let g_do = (u(1) + 2 * (q0 as u64 * ds1 + hh as u64 * u(7))) as *const u16;
        // SAFETY: rows q0..q0+valid of q and dO exist (host-checked shapes,
        // varlen segments clamped); the tiles lie in the dynamic shared memory.
        unsafe {
            load_panels::<D, BR>(s_q(buf), g_q, qs1, valid, d, tid);
            load_panels::<D, BR>(s_do(buf), g_do, ds1, valid, d, tid);
        }
        if tid < 2 * BR {
            let (k, r) = (tid / BR, tid % BR);
            let src = u(2 + k as u32) as *const f32;
            let ok = r < valid;
            let at = hh * u(8) as usize + q0 + r;
            let dst = smem_addr(rows_f32(2 * k + buf).wrapping_add(r));
            // SAFETY: rows < valid lie in the LSE / delta buffers (indexed
            // like the forward's LSE); src_size 0 reads nothing (zero).
            unsafe { cp_async_ca_4(dst, if ok { src.wrapping_add(at) } else { src } as *const u8, if ok { 4 } else { 0 }) };
        }
        cp_async_commit();
    };

    // K_j, V_j once (rows ≥ nk zero-filled; columns ≥ d too).
    let kvalid = (nk - k0).min(BC);
    let krow = seq.k_row0 + k0 as u64;
    let [ks0, ks1, ks2] = f.k_stride;
    let [vs0, vs1, vs2] = f.v_stride;
    // SAFETY: rows k0..k0+kvalid of k and v exist (host-checked).
    unsafe {
        load_panels::<D, BC>(s_k, (f.k_ptr as *const u16).wrapping_add((b as u64 * ks0 + krow * ks1 + kvh as u64 * ks2) as usize), ks1, kvalid, d, tid);
        load_panels::<D, BC>(s_v, (f.v_ptr as *const u16).wrapping_add((b as u64 * vs0 + krow * vs1 + kvh as u64 * vs2) as usize), vs1, kvalid, d, tid);
    }
    cp_async_commit();
    if steps > 0 {
        load_step(0);
    }

    let mut r_dk = [[0f32; 4]; DN];
    let mut r_dv = [[0f32; 4]; DN];
    let kw = wg * 64 + ww * 16; // this warp's first key, in the block
    let scale = f.softmax_scale;
    // dQ: each warpgroup one 64 × 64 block of `dS·K_j` over all 128 keys:
    // d 128 (Br 64) its column half (K's panel wg), d 64 (Br 128) its row
    // half (dSᵀ's panel wg).
    let (dq_row0, dq_col0) = if D == 128 { (0, 64 * wg) } else { (64 * wg, 0) };
    let (a_panel, b_panel) = if D == 128 { (0, wg) } else { (wg, 0) };

    // ---- main loop over (query head, Q block) --------------------------------
    for n in 0..steps {
        cp_async_wait::<0>();
        fence_proxy_async_shared(); // the copies, before wgmma reads them
        sync_threads(); // step n landed; buffers of step n+1, dSᵀ and the dQ staging are free
        if n + 1 < steps {
            load_step(n + 1);
        }
        let (h, i) = (h0 + n / ni, ia + n % ni);
        let (q0, buf) = (i * BR, n & 1);

        let mut r_p = [[0f32; 4]; BRN];
        let mut r_ds = [[0f32; 4]; BRN];
        issue_abt::<T, D, BR, BRN>(&mut r_p, s_k, wg * 64, s_q(buf));
        issue_abt::<T, D, BR, BRN>(&mut r_ds, s_v, wg * 64, s_do(buf));
        wgmma_wait::<1>();
        acc_fence(&mut r_p);
        for nn in 0..BRN {
            for e in 0..4 {
                r_p[nn][e] *= f.softmax_scale_log2;
            }
        }
        if !(u(10) as i64 <= q0 as i64 && (q0 + BR) as i64 <= u(11) as i64) {
            // Boundary block (window, causal diagonal, sequence ends). The
            // rows' query ranges are recomputed here (an opaque key), not
            // held across the loop.
            let k_row = opaque::u32_fresh((k0 + kw + g) as u32) as i64;
            let key = [k_row, k_row + 8];
            let r0 = bwd_query_range(&win, key[0], nq as i64);
            let r1 = bwd_query_range(&win, key[1], nq as i64);
            mask::<BRN>(&mut r_p, q0, t, [r0.0, r1.0], [r0.1, r1.1]);
        }
        let lse = rows_f32(buf);
        let dlt = rows_f32(2 + buf);
        for nn in 0..BRN {
            // SAFETY: LSE_i landed and a barrier passed; 8-byte aligned (even column).
            let l = unsafe { *(lse.wrapping_add(nn * 8 + 2 * t) as *const [f32; 2]) };
            for e in 0..4 {
                let lv = l[e & 1];
                // A row that sees no key (LSE −inf) has P = 0: never −inf − −inf.
                let l2 = if lv == f32::NEG_INFINITY { f32::INFINITY } else { lv * LOG2_E };
                r_p[nn][e] = (r_p[nn][e] - l2).exp2();
            }
        }
        wgmma_wait::<0>();
        acc_fence(&mut r_ds);
        for nn in 0..BRN {
            // SAFETY: D_i landed and a barrier passed.
            let dv = unsafe { *(dlt.wrapping_add(nn * 8 + 2 * t) as *const [f32; 2]) };
            for e in 0..4 {
                r_ds[nn][e] = r_p[nn][e] * (r_ds[nn][e] - dv[e & 1]);
            }
        }
        // Pᵀ and dSᵀ leave the f32 accumulators as packed 16-bit pairs, the
        // A operands of dV and dK; dSᵀ's pairs also go to shared memory.
        let a_p = pack_a::<T, BRN, BRK>(&r_p);
        issue_xb::<T, BR, BRK, DN>(&mut r_dv, &a_p, s_do(buf));
        let a_ds = pack_a::<T, BRN, BRK>(&r_ds);
        issue_xb::<T, BR, BRK, DN>(&mut r_dk, &a_ds, s_q(buf));

        // dSᵀ (keys × queries) into the swizzled panels: row = key, the
        // 16-byte chunk of columns 8c.. at (c%8) ^ (key%8), key%8 = g.
        // The previous step's dQ reductions have read their staging (the
        // barrier below orders this before the staging is rewritten).
        bulk_wait_group_read();
        // The swizzle is applied to each address (`swizzle128`) rather than
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
        sync_threads(); // dSᵀ complete (both warpgroups)

        // dQ_i block += dS·K_j over the 128 keys.
        let mut r_dq = [[0f32; 4]; 8];
        let (s_dsf, s_kf) = (opaque::u32_fresh(s_ds + (a_panel * BC * PANEL_ROW) as u32), opaque::u32_fresh(s_k + (b_panel * BC * PANEL_ROW) as u32));
        wgmma_fence();
        for kq in 0..BC / 16 {
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
        let s_dqf = opaque::u32_fresh(s_dq + ((ww * 16 + g) * HOPPER_BWD_DQ_ROW_BYTES + 8 * t) as u32);
        for nn in 0..8 {
            for r in 0..2 {
                let at = s_dqf + (8 * r * HOPPER_BWD_DQ_ROW_BYTES + nn * 32) as u32;
                // SAFETY: inside this warpgroup's staging block, whose last
                // reduction finished reading (waited above, barrier since).
                unsafe {
                    st_shared_u32(at, (r_dq[nn][2 * r] * scale).to_bits());
                    st_shared_u32(at + 4, (r_dq[nn][2 * r + 1] * scale).to_bits());
                }
            }
        }
        fence_proxy_async_shared();
        // SAFETY: the 128 threads of this warpgroup (barriers 1, 2).
        unsafe { named_bar_sync(1 + wg as u32, 128) };
        if wl < 64 {
            let (row, col0) = (q0 + dq_row0 + wl, dq_col0);
            if row < nq && col0 < d {
                let lse_row = (h - h0) as u64 * u(8) + row as u64;
                let dst = u(9) + (lse_row * d as u64 + col0 as u64) * 4;
                let bytes = ((d - col0).min(64) * 4) as u32;
                // SAFETY: row < nq and columns col0.. < d of the
                // accumulator (`lse index · d + column`); d a multiple of
                // 8: 16-byte aligned, a multiple of 16 bytes; the staging
                // row written, fenced and behind the barrier above.
                unsafe { bulk_reduce_add_f32(dst, s_dq + (wl * HOPPER_BWD_DQ_ROW_BYTES) as u32, bytes) };
                bulk_commit_group();
            }
        }
    }
    cp_async_wait::<0>();
    bulk_wait_group();

    // ---- epilogue: dK_j · scale and dV_j -----------------------------------------
    let [dks0, dks1, dks2] = p.dk_stride;
    let [dvs0, dvs1, dvs2] = p.dv_stride;
    let g_dk = (p.dk_ptr as *mut u16).wrapping_add((b as u64 * dks0 + seq.k_row0 * dks1 + kvh as u64 * dks2) as usize);
    let g_dv = (p.dv_ptr as *mut u16).wrapping_add((b as u64 * dvs0 + seq.k_row0 * dvs1 + kvh as u64 * dvs2) as usize);
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
                        *(g_dk.wrapping_add(key * dks1 as usize + col) as *mut u32) = vk;
                        *(g_dv.wrapping_add(key * dvs1 as usize + col) as *mut u32) = vv;
                    }
                }
            }
        }
    }
}
