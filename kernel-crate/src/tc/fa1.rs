//! FA1 loop order on the same tensor-core tiles (FA1 paper Algorithm 1,
//! lines 5–15; seeds 000 and 002).
//!
//! One block per (batch, head). Outer loop over K/V blocks `j`: the block
//! loads `K_j`, `V_j` into shared memory. Inner loop over Q blocks `i`: each
//! warp takes 16 rows of `Q_i`, computes `S = Q_i·K_jᵀ`, the block statistics
//! `m~_ij`, `P~_ij = exp(S − m~_ij)`, `l~_ij`, reads `O_i`, `l_i`, `m_i` from
//! HBM, and writes back
//! `O_i ← diag(l_new)⁻¹ (diag(l_i) e^{m_i − m_new} O_i + e^{m~_ij − m_new} P~_ij V_j)`
//! with `l_new`, `m_new` from `RowState::merge`. `O` lives in an f32 HBM
//! buffer (`o_accum_ptr`) so that the `Tc` rescalings do not round to 16 bits;
//! a last pass converts it to the output type. `m_i` is stored in the base-2
//! units of `RowState` (see `AttnParams::m_ptr`), as the f32 FA1 kernel does.

use super::fa2::{exp_row, mask, pv, qk, quad_sum, row_max, scale_row, scale_sign};
use super::tile::{SmemTile, tile_bytes};
use super::{Elem16, pack};
use crate::arch::cp_async::{cp_async_commit, cp_async_wait};
use crate::arch::smem::{dynamic_smem, smem_addr};
use crate::arch::sreg;
use crate::arch::sync::{sync_threads, sync_warp};
use flash_attn_common::{AttnParams, Real, RowState};

/// The FA1 forward kernel body (see the module docs).
///
/// # Safety
/// `p` valid (checked by the host) with `o_accum`, `lse` (= l) and `m`
/// initialized to 0, 0 and −inf; launched with `32·NW` threads,
/// `fa1_tc_smem_bytes(D, NW, BC)` of dynamic shared memory, `batch·nheads` blocks.
#[inline(always)]
pub unsafe fn forward<
    T: Elem16,
    const D: usize,
    const DK: usize,
    const DN: usize,
    const NW: usize,
    const MT: usize,
    const BC: usize,
    const BCN: usize,
    const BCK: usize,
    const QREG: bool,
    const SPLIT_WAIT: bool,
    const VARLEN: bool,
    const MODS: bool,
    const DECODE: bool,
>(
    p: &AttnParams,
) {
    const { assert!(!MODS && !VARLEN && !DECODE, "FA1 takes GQA and windows; varlen, softcap, ALiBi and decode are FA2's") };
    const { assert!(MT == 1 && !QREG, "FA1 re-reads Q per inner step: one m-tile per warp, Q from shared memory") };
    // ---- prologue ------------------------------------------------------------
    let br = 16 * NW;
    let nt = 32 * NW;
    let tid = sreg::thread_idx_x() as usize;
    let (warp, lane) = (tid / 32, tid % 32);
    let (g, t) = (lane / 4, lane % 4);
    let (nq, nk, d) = (p.seqlen_q as usize, p.seqlen_k as usize, p.headdim as usize);
    let bh = sreg::block_idx_x() as usize;
    let (b, h) = (bh / p.nheads as usize, bh % p.nheads as usize);
    let kvh = p.kv_head(h as u32) as u64;
    let win = p.key_window(p.seqlen_q, p.seqlen_k);
    // K/V blocks some query row sees (the window's union over all rows).
    let (kv_start, kv_end) = win.block_range(0, nq as i64);
    let (j_first, tc) = (kv_start as usize / BC, if kv_start < kv_end { (kv_end as usize).div_ceil(BC) } else { 0 });
    let tr = nq.div_ceil(br);

    let [qs0, qs1, qs2] = p.q_stride;
    let [ks0, ks1, ks2] = p.k_stride;
    let [vs0, vs1, vs2] = p.v_stride;
    let [os0, os1, os2] = p.o_stride;
    let g_q = (p.q_ptr as *const u16).wrapping_add((b as u64 * qs0 + h as u64 * qs2) as usize);
    let g_k = (p.k_ptr as *const u16).wrapping_add((b as u64 * ks0 + kvh * ks2) as usize);
    let g_v = (p.v_ptr as *const u16).wrapping_add((b as u64 * vs0 + kvh * vs2) as usize);
    // O accumulator: contiguous (batch, nq, nheads, D) f32.
    let acc_row = |row: usize| (p.o_accum_ptr as *mut f32).wrapping_add(((b * nq + row) * p.nheads as usize + h) * D);
    let g_l = (p.lse_ptr as *mut f32).wrapping_add(bh * nq);
    let g_m = (p.m_ptr as *mut f32).wrapping_add(bh * nq);

    let base = smem_addr(dynamic_smem::<u8>());
    let s_k = SmemTile::<D> { base };
    let s_v = SmemTile::<D> { base: base + tile_bytes(BC, D) as u32 };
    let s_q = SmemTile::<D> { base: base + 2 * tile_bytes(BC, D) as u32 + (warp * tile_bytes(16, D)) as u32 };
    let r_q_unused = [[[0u32; 4]; DK]; 1];
    let (q_sign, scale_log2) = scale_sign(p.softmax_scale_log2);

    // ---- outer loop over K/V blocks ----------------------------------------
    for j in j_first..tc {
        let k0 = j * BC;
        let valid = (nk - k0).min(BC);
        sync_threads(); // every warp is done with K_{j-1}, V_{j-1}
        // SAFETY: rows k0..k0+valid of K, V exist (host-checked shapes).
        unsafe {
            s_k.load_async(g_k.wrapping_add(k0 * ks1 as usize), ks1, BC, valid, d, tid, nt);
            s_v.load_async(g_v.wrapping_add(k0 * vs1 as usize), vs1, BC, valid, d, tid, nt);
        }
        cp_async_commit();
        cp_async_wait::<0>();
        sync_threads();

        // ---- inner loop over Q blocks: this warp's 16 rows of each -----------
        for i in 0..tr {
            let q_row0 = i * br + warp * 16;
            if q_row0 >= nq {
                continue;
            }
            let row = [q_row0 + g, q_row0 + g + 8];
            let rows_end = (q_row0 + 16).min(nq) as i64;
            let (see_start, see_end) = win.block_range(q_row0 as i64, rows_end);
            if k0 as i64 >= see_end || ((k0 + BC) as i64) <= see_start || see_start >= see_end {
                continue; // causal/window: block j is fully masked for these rows
            }
            let (full_start, full_end) = win.unmasked_range(q_row0 as i64, rows_end);
            // SAFETY: rows q_row0..q_row0+16 (those < nq) of Q exist; the
            // warp's own 16-row region of shared memory.
            unsafe { s_q.load_async(g_q.wrapping_add(q_row0 * qs1 as usize), qs1, 16, (nq - q_row0).min(16), d, lane, 32) };
            cp_async_commit();
            cp_async_wait::<0>();
            sync_warp(); // the warp's Q rows are visible to all its lanes

            // SAFETY: K_j and this warp's Q rows are in shared memory.
            let [mut r_s] = unsafe { qk::<T, D, DK, BCN, 1, false>(&r_q_unused, s_q, 0, q_sign, s_k, lane) };
            let masked = (k0 as i64) < full_start || (k0 + BC) as i64 > full_end;
            if masked {
                let (r0, r1) = (row[0] as i64, row[1] as i64);
                mask(&mut r_s, k0, t, [win.lo(r0), win.lo(r1)], [win.hi(r0), win.hi(r1)]);
            }

            // Block statistics m~_ij, P~_ij, l~_ij (base-2 domain).
            let mut blk = [RowState::<f32>::new(); 2];
            for r in 0..2 {
                if masked {
                    scale_row::<BCN, true>(&mut r_s, r, scale_log2);
                } else {
                    scale_row::<BCN, false>(&mut r_s, r, scale_log2);
                }
                let m = row_max::<BCN>(&r_s, r);
                let sum = exp_row::<BCN>(&mut r_s, r, RowState::<f32>::safe_max(m));
                blk[r] = RowState { m, l: quad_sum(sum) };
            }
            let mut r_pv = [[[0f32; 4]; DN]; 1];
            // SAFETY: V_j in shared memory, barrier passed.
            unsafe { pv::<T, D, DN, BCN, BCK, 1>(&mut r_pv, &[r_s], s_v, lane) };
            let [r_pv] = r_pv;
            sync_warp(); // all lanes are done reading this warp's Q rows

            // Read O_i, l_i, m_i; merge; write back (FA1 update).
            for r in 0..2 {
                if row[r] >= nq {
                    continue;
                }
                // SAFETY: l, m hold batch·nheads·nq f32; row < nq.
                let (l_old, m_old) = unsafe { (*g_l.add(row[r]), *g_m.add(row[r])) };
                let old = RowState { m: m_old, l: l_old };
                let (new, a, bc) = old.merge(blk[r]);
                let inv_new = new.inv_l();
                let (c_old, c_new) = (old.l * a * inv_new, bc * inv_new);
                let o = acc_row(row[r]);
                for n in 0..DN {
                    let col = n * 8 + 2 * t;
                    // SAFETY: row < nq, col + 1 < D inside the accumulator row.
                    unsafe {
                        let po = o.add(col) as *mut [f32; 2];
                        let [o0, o1] = *po;
                        *po = [c_old * o0 + c_new * r_pv[n][2 * r], c_old * o1 + c_new * r_pv[n][2 * r + 1]];
                    }
                }
                if t == 0 {
                    // SAFETY: as above.
                    unsafe {
                        *g_l.add(row[r]) = new.l;
                        *g_m.add(row[r]) = new.m;
                    }
                }
            }
        }
    }

    // ---- epilogue: O (f32, normalized) → output type --------------------------
    let g_o = (p.o_ptr as *mut u16).wrapping_add((b as u64 * os0 + h as u64 * os2) as usize);
    for i in 0..tr {
        for r in 0..2 {
            let rw = i * br + warp * 16 + g + 8 * r;
            if rw >= nq {
                continue;
            }
            let o = acc_row(rw);
            let o_row = g_o.wrapping_add(rw * os1 as usize);
            for n in 0..DN {
                let col = n * 8 + 2 * t;
                if col >= d {
                    continue; // zero-padded head-dim columns
                }
                // SAFETY: rw < nq, col + 1 < d ≤ D; this thread wrote these elements.
                unsafe {
                    let [o0, o1] = *(o.add(col) as *const [f32; 2]);
                    *(o_row.wrapping_add(col) as *mut u32) = pack::<T>(o0, o1);
                }
            }
        }
    }
}
