//! FA2-order backward main kernel on tensor cores (FA2 paper, Algorithm 2;
//! `../shared/BACKWARD.md`), f16/bf16 with f32 accumulation, sm_80+.
//!
//! Grid: one block per (K/V block `j` of `Bc` keys, batch, KV head),
//! `blockIdx.x = (b·nheads_k + kvh)·num_n + j` (`j` fastest). The block keeps
//! `K_j`, `V_j` in shared memory and `dK_j`, `dV_j` in registers, and loops
//! over the query heads of the KV head's group (GQA/MQA: their sums stay on
//! chip) and, per head, over the Q blocks `i` that see block `j`
//! (`flash_attn_common::tc_bwd`; blocks crossing the causal/window
//! boundary or a sequence end are masked per element, the others not).
//!
//! Warps (`flash_attn_common::tc_bwd::TcBwdConfig`): key group `kg = warp %
//! (NW/DS)` owns keys `16·kg..16·kg+16` of the block, slice `sl = warp /
//! (NW/DS)` the head-dim columns `sl·D/DS..`. Everything is computed
//! transposed, keys as the m dimension, so that `Pᵀ` and `dSᵀ` leave the
//! accumulators straight as A operands of `dV += Pᵀ·dO_i` and
//! `dK += dSᵀ·Q_i`. Per step `(h, i)`:
//! 1. wait for `Q_i`, `dO_i`, `LSE_i`, `D_i` (issued one step earlier),
//!    barrier, issue the next step's into the other buffers;
//! 2. `Sᵀ = K_j·Q_iᵀ`; scale (or softcap/ALiBi), mask, `Pᵀ = exp2(Sᵀ −
//!    LSE_i·log2 e)` (a −inf LSE counts as +inf: P = 0, never NaN);
//! 3. `dV_j += Pᵀ·dO_i`; `dPᵀ = V_j·dO_iᵀ`; `dSᵀ = Pᵀ∘(dPᵀ − D_i)`
//!    (softcap: `× (1 − tanh²)`); `dK_j += dSᵀ·Q_i`;
//! 4. slice 0 writes `dSᵀ` (16-bit) to shared memory; barrier;
//! 5. `dQ_i += scale · dS·K_j` (warps split `Br/16` m-tiles × column
//!    chunks) with `red.global.add.f32` into the f32 accumulator;
//!    deterministic mode: behind the semaphore of (i, b, h), see
//!    [`dq_turn`].
//!
//! Epilogue: `dK_j · scale` and `dV_j` in `T` at their strides.

use super::fa2::mask;
use super::tile::{FragTile, SmemTile, tile_bytes};
use super::{Elem16, mma, pack};
use crate::arch::cp_async::{cp_async_ca_4, cp_async_commit, cp_async_wait};
use crate::arch::global::{atom_add_acq_rel_u32_gpu, ld_acquire_u32_gpu, red_add_f32};
use crate::arch::opaque;
use crate::arch::smem::{dynamic_smem, smem_addr, st_shared_u32};
use crate::arch::sreg;
use crate::arch::sync::sync_threads;
use flash_attn_common::tc_bwd::{bwd_ds_bytes, bwd_key_blocks, bwd_query_range, bwd_semaphore_index, bwd_visiting_query_blocks};
use flash_attn_common::{BwdParams, KeyWindow, LOG2_E, Real};

/// The score function of one (sequence, head), transposed (rows = keys,
/// columns = queries), in the base-2 domain: as the forward's `fa2::Mods`.
#[derive(Clone, Copy)]
struct ScoreT {
    scale_log2: f32,
    /// `softcap_pre = scale / cap` (signed) and `cap · log2 e`; 0 = no softcap.
    cap_pre: f32,
    cap_post: f32,
    slope_log2: f32,
}

impl ScoreT {
    /// Replaces the raw `Sᵀ` (keys `key[r]` of rows `g + 8r`, queries
    /// `q0 + 8n + 2t + e`) by the modified base-2 scores; `dt` gets
    /// `1 − tanh²` (softcap) or 1.
    #[inline(always)]
    fn apply<const BRN: usize>(&self, s: &mut [[f32; 4]; BRN], dt: &mut [[f32; 4]; BRN], q0: usize, t: usize, key: [i64; 2], shift: i64) {
        for n in 0..BRN {
            for e in 0..4 {
                let x = s[n][e];
                let (mut y, d) = if self.cap_post != 0.0 {
                    let th = (x * self.cap_pre).tanh();
                    (self.cap_post * th, 1.0 - th * th)
                } else {
                    (x * self.scale_log2, 1.0)
                };
                if self.slope_log2 != 0.0 {
                    let q = (q0 + n * 8 + 2 * t + (e & 1)) as i64;
                    y -= self.slope_log2 * (q + shift - key[e >> 1]).unsigned_abs() as f32;
                }
                s[n][e] = y;
                dt[n][e] = d;
            }
        }
    }
}

/// `acc += Aᵀ_frag · B` over `BRK` k-steps of 16 queries: `a` (16 keys ×
/// `Br` queries, accumulator layout) converted in registers to A fragments
/// (as the forward's P·V), `B` = rows of `s_b` (queries × head dim) from
/// column `c0`, through `ldmatrix.trans`.
#[inline(always)]
unsafe fn acc_at_b<T: Elem16, const BRN: usize, const BRK: usize, const DSN: usize>(acc: &mut [[f32; 4]; DSN], a: &[[f32; 4]; BRN], s_b: impl FragTile, c0: usize, lane: usize) {
    for kk in 0..BRK {
        let (x0, x1) = (&a[2 * kk], &a[2 * kk + 1]);
        let fa = [pack::<T>(x0[0], x0[1]), pack::<T>(x0[2], x0[3]), pack::<T>(x1[0], x1[1]), pack::<T>(x1[2], x1[3])];
        for np in 0..DSN / 2 {
            // SAFETY: the tile landed and a barrier passed (caller).
            let b = unsafe { s_b.b_frag_trans_x2(kk * 16, c0 + np * 16, lane) };
            mma::<T>(&mut acc[2 * np], &fa, &[b[0], b[1]]);
            mma::<T>(&mut acc[2 * np + 1], &fa, &[b[2], b[3]]);
        }
    }
}

/// `X_w·Bᵀ` (16 rows `r0..` of `s_a` × `Br` rows of `s_b`, over the full
/// head dim): `Sᵀ = K_j·Q_iᵀ` and `dPᵀ = V_j·dO_iᵀ`.
#[inline(always)]
unsafe fn rows_bt<T: Elem16, const DK: usize, const BRN: usize>(s_a: impl FragTile, r0: usize, s_b: impl FragTile, lane: usize) -> [[f32; 4]; BRN] {
    let mut acc = [[0f32; 4]; BRN];
    for kk in 0..DK {
        // SAFETY: tiles landed and a barrier passed (caller).
        let a = unsafe { s_a.a_frag(r0, kk * 16, lane) };
        for np in 0..BRN / 2 {
            // SAFETY: as above.
            let b = unsafe { s_b.bt_frag_x2(np * 16, kk * 16, lane) };
            mma::<T>(&mut acc[2 * np], &a, &[b[0], b[1]]);
            mma::<T>(&mut acc[2 * np + 1], &a, &[b[2], b[3]]);
        }
    }
    acc
}

/// Deterministic mode: thread 0 waits until the dQ additions of Q block `i`
/// by every K/V block before `j` are done (the semaphore counts them:
/// block `j` is the `(j − first)`-th to add, `first` the Q block's first
/// key block), then a barrier lets the block add.
///
/// No deadlock: a block waits only for blocks of the same (batch, KV head)
/// with a smaller `j`, i.e. a smaller `blockIdx.x`; blocks are dispatched in
/// increasing index, so each awaited block is resident or done, and it in
/// turn waits only for smaller `j` (the wait graph follows strictly
/// decreasing `j`: no cycle); the smallest waiting `j` of a Q block has all
/// its predecessors done. A block adds for `i` only where
/// [`flash_attn_common::tc_bwd::bwd_visits`] says so, the same rule
/// that counts the predecessors (`bwd_key_blocks`).
///
/// # Safety
/// `sem` points to the (zeroed at launch) semaphore of `(i, b, h)`; all
/// threads of the block call it.
#[inline(always)]
unsafe fn dq_turn(sem: *const u32, turn: u32, tid: usize) {
    if tid == 0 {
        // SAFETY: caller.
        while unsafe { ld_acquire_u32_gpu(sem) } != turn {}
    }
    sync_threads();
}

/// `t` with its base recomputed at the point of use ([`opaque::u32_fresh`]):
/// the fragment addresses of one product stay local to it instead of
/// hundreds of loop-invariant registers.
#[inline(always)]
fn fresh<const D: usize>(t: SmemTile<D>) -> SmemTile<D> {
    SmemTile { base: opaque::u32_fresh(t.base) }
}

/// The backward main kernel body (see the module docs).
///
/// # Safety
/// As the exported entry points: `p` valid (host-checked shapes, strides,
/// dq accumulator, delta, semaphores), launched with `32·NW` threads,
/// `bwd_tc_smem_bytes(D, BR, BC)` of dynamic shared memory and
/// `batch · nheads_k · ceil(seqlen_k / BC)` blocks.
#[inline(always)]
pub unsafe fn backward<
    T: Elem16,
    const D: usize,
    const DK: usize,
    const NW: usize,
    const DS: usize,
    const BR: usize,
    const BRN: usize,
    const BRK: usize,
    const BC: usize,
    const BCK: usize,
    const DSN: usize,
    const QCN: usize,
    const MODS: bool,
>(
    p: &BwdParams,
) {
    const {
        assert!(DK * 16 == D && BRN * 8 == BR && BRK * 16 == BR && BC * DS == 16 * NW && BCK * 16 == BC);
        assert!(DSN * 8 * DS == D && DSN % 2 == 0 && QCN % 2 == 0 && QCN * 8 * (NW / BRK) == D && 2 * BR <= 32 * NW)
    };
    let f = &p.fwd;
    // ---- prologue: who am I, what do I read --------------------------------
    let nt = 32 * NW;
    let num_n = (f.seqlen_k as usize).div_ceil(BC);
    let idx = sreg::block_idx_x() as usize;
    let (j, bkh) = (idx % num_n, idx / num_n);
    let nkh = f.kv_heads() as usize;
    let (b, kvh) = (bkh / nkh, bkh % nkh);
    let tid = sreg::thread_idx_x() as usize;
    let (warp, lane) = (tid / 32, tid % 32);
    let (g, t) = (lane / 4, lane % 4);
    let (kg, sl) = (warp % (NW / DS), warp / (NW / DS));
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
    // The Q blocks that see block j (a contiguous range).
    let (ia, ib) = bwd_visiting_query_blocks(&win, j, BR, BC, nq);
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

    // ---- shared memory --------------------------------------------------------
    let base_ptr = dynamic_smem::<u8>();
    let base = smem_addr(base_ptr);
    let kv_bytes = tile_bytes(BC, D) as u32;
    let q_bytes = tile_bytes(BR, D) as u32;
    let s_k = SmemTile::<D> { base };
    let s_v = SmemTile::<D> { base: base + kv_bytes };
    let s_q = |buf: usize| SmemTile::<D> { base: base + 2 * kv_bytes + buf as u32 * q_bytes };
    let s_do = |buf: usize| SmemTile::<D> { base: base + 2 * kv_bytes + (2 + buf) as u32 * q_bytes };
    let ds_off = 2 * kv_bytes + 4 * q_bytes;
    let s_ds = SmemTile::<BR> { base: base + ds_off };
    // LSE_i (buffers 0, 1) then D_i (buffers 2, 3), BR f32 each.
    let row_off = ds_off + bwd_ds_bytes(BR, BC) as u32;
    let rows_f32 = |k: usize| base_ptr.wrapping_add((row_off + (k * BR * 4) as u32) as usize) as *const f32;

    let [qs0, qs1, qs2] = f.q_stride;
    let [ds0, ds1, ds2] = p.do_stride;
    // Issue the copies of step `n`: Q_i, dO_i of head h, LSE_i and D_i.
    let load_step = |n: usize| {
        let (h, i) = (h0 + n / ni, ia + n % ni);
        let (q0, buf) = (i * BR, n & 1);
        let valid = (nq - q0).min(BR);
        let row = seq.q_row0 + q0 as u64;
        let g_q = (f.q_ptr as *const u16).wrapping_add((b as u64 * qs0 + row * qs1 + h as u64 * qs2) as usize);
        let g_do = (p.do_ptr as *const u16).wrapping_add((b as u64 * ds0 + row * ds1 + h as u64 * ds2) as usize);
        // SAFETY: rows q0..q0+valid of q and dO exist (host-checked shapes,
        // varlen segments clamped); the tiles lie in the dynamic shared memory.
        unsafe {
            s_q(buf).load_async(g_q, qs1, BR, valid, d, tid, nt);
            s_do(buf).load_async(g_do, ds1, BR, valid, d, tid, nt);
        }
        if tid < 2 * BR {
            let (k, r) = (tid / BR, tid % BR);
            let src = if k == 0 { f.lse_ptr } else { p.delta_ptr } as *const f32;
            let ok = r < valid;
            let at = seq.lse_base + (h - h0) as u64 * lse_head_stride + (q0 + r) as u64;
            let dst = smem_addr(rows_f32(2 * k + buf).wrapping_add(r));
            // SAFETY: rows < valid lie in the LSE / delta buffers (indexed
            // like the forward's LSE); src_size 0 reads nothing.
            unsafe { cp_async_ca_4(dst, if ok { src.wrapping_add(at as usize) } else { src } as *const u8, if ok { 4 } else { 0 }) };
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
        s_k.load_async((f.k_ptr as *const u16).wrapping_add((b as u64 * ks0 + krow * ks1 + kvh as u64 * ks2) as usize), ks1, BC, kvalid, d, tid, nt);
        s_v.load_async((f.v_ptr as *const u16).wrapping_add((b as u64 * vs0 + krow * vs1 + kvh as u64 * vs2) as usize), vs1, BC, kvalid, d, tid, nt);
    }
    cp_async_commit();
    if steps > 0 {
        load_step(0);
    }

    let mut r_dk = [[0f32; 4]; DSN];
    let mut r_dv = [[0f32; 4]; DSN];
    let kw = kg * 16; // this warp's first key, in the block
    let c0 = sl * (D / DS); // this warp's first dK/dV column
    let (mq, qc0) = (warp % BRK, (warp / BRK) * QCN * 8); // dQ: m-tile, first column
    let num_m = (f.seqlen_q as usize).div_ceil(BR);
    let dq_stride = d; // dq_accum: lse index · headdim + column
    let scale = f.softmax_scale;

    // ---- main loop over (query head, Q block) --------------------------------
    for n in 0..steps {
        cp_async_wait::<0>();
        sync_threads(); // step n landed; buffers of step n+1 and dSᵀ are free
        if n + 1 < steps {
            load_step(n + 1);
        }
        let (h, i) = (h0 + n / ni, ia + n % ni);
        let (q0, buf) = (i * BR, n & 1);

        // SAFETY: K_j and Q_i landed and a barrier passed.
        let mut r_p = unsafe { rows_bt::<T, DK, BRN>(fresh(s_k), kw, fresh(s_q(buf)), lane) };
        let mut r_dt = [[1f32; 4]; BRN];
        let key = [(k0 + kw + g) as i64, (k0 + kw + g + 8) as i64];
        // SAFETY: host-checked ALiBi slopes.
        let slope_log2 = if MODS { unsafe { f.alibi_slope_log2(b as u32, h as u32) } } else { 0.0 };
        let sc = ScoreT {
            scale_log2: f.softmax_scale_log2,
            cap_pre: if MODS { f.softcap_pre } else { 0.0 },
            cap_post: if MODS { f.softcap * LOG2_E } else { 0.0 },
            slope_log2,
        };
        if MODS && (sc.cap_post != 0.0 || sc.slope_log2 != 0.0) {
            sc.apply::<BRN>(&mut r_p, &mut r_dt, q0, t, key, win.shift);
        } else {
            // (Index loops: a `flatten` iterator is not unrolled and sends
            // the accumulators to local memory.)
            for nn in 0..BRN {
                for e in 0..4 {
                    r_p[nn][e] *= sc.scale_log2;
                }
            }
        }
        if !(full_lo <= q0 as i64 && (q0 + BR) as i64 <= full_hi) {
            // Boundary block (window, causal diagonal, sequence ends).
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
        // SAFETY: dO_i landed and a barrier passed.
        unsafe { acc_at_b::<T, BRN, BRK, DSN>(&mut r_dv, &r_p, fresh(s_do(buf)), c0, lane) };
        // SAFETY: V_j, dO_i landed and a barrier passed.
        let mut r_ds = unsafe { rows_bt::<T, DK, BRN>(fresh(s_v), kw, fresh(s_do(buf)), lane) };
        for nn in 0..BRN {
            // SAFETY: D_i landed and a barrier passed.
            let dv = unsafe { *(dlt.wrapping_add(nn * 8 + 2 * t) as *const [f32; 2]) };
            for e in 0..4 {
                r_ds[nn][e] = r_p[nn][e] * (r_ds[nn][e] - dv[e & 1]) * r_dt[nn][e];
            }
        }
        // SAFETY: Q_i landed and a barrier passed.
        unsafe { acc_at_b::<T, BRN, BRK, DSN>(&mut r_dk, &r_ds, fresh(s_q(buf)), c0, lane) };
        if sl == 0 {
            for nn in 0..BRN {
                for r in 0..2 {
                    let v = pack::<T>(r_ds[nn][2 * r], r_ds[nn][2 * r + 1]);
                    // SAFETY: inside the dSᵀ tile; read after the barrier below.
                    unsafe { st_shared_u32(s_ds.addr(kw + g + 8 * r, nn * 8 + 2 * t), v) };
                }
            }
        }
        sync_threads(); // dSᵀ complete

        // dQ_i += scale · dS·K_j: this warp's 16 queries × QCN·8 columns.
        let mut r_dq = [[0f32; 4]; QCN];
        let (s_dsf, s_kf) = (fresh(s_ds), fresh(s_k));
        for kk in 0..BCK {
            // SAFETY: dSᵀ and K_j written/landed and a barrier passed.
            let a = unsafe { s_dsf.a_frag_trans(kk * 16, mq * 16, lane) };
            for np in 0..QCN / 2 {
                // SAFETY: as above.
                let bb = unsafe { s_kf.b_frag_trans_x2(kk * 16, qc0 + np * 16, lane) };
                mma::<T>(&mut r_dq[2 * np], &a, &[bb[0], bb[1]]);
                mma::<T>(&mut r_dq[2 * np + 1], &a, &[bb[2], bb[3]]);
            }
        }
        let lse_row0 = seq.lse_base + (h - h0) as u64 * lse_head_stride + q0 as u64;
        let det = p.deterministic != 0;
        let sem = || (p.dq_semaphore_ptr as *mut u32).wrapping_add(bwd_semaphore_index(b, h, i, f.nheads as usize, num_m));
        if det {
            let first = bwd_key_blocks(&win, i, BR, BC, nq).0;
            // SAFETY: the semaphore of (i, b, h) (host-sized buffer).
            unsafe { dq_turn(sem(), (j - first) as u32, tid) };
        }
        for r in 0..2 {
            let row = mq * 16 + g + 8 * r;
            if q0 + row < nq {
                let acc_row = (p.dq_accum_ptr as *mut f32).wrapping_add(((lse_row0 + row as u64) as usize) * dq_stride);
                for nn in 0..QCN {
                    for e in 0..2 {
                        let col = qc0 + nn * 8 + 2 * t + e;
                        if col < d {
                            // SAFETY: row < nq, col < d: inside the accumulator.
                            unsafe { red_add_f32(acc_row.wrapping_add(col), r_dq[nn][2 * r + e] * scale) };
                        }
                    }
                }
            }
        }
        if det {
            sync_threads(); // every thread's additions precede the release
            if tid == 0 {
                // SAFETY: as above; release (cumulative over the barrier).
                unsafe { atom_add_acq_rel_u32_gpu(sem(), 1) };
            }
        }
    }
    cp_async_wait::<0>();

    // ---- epilogue: dK_j · scale and dV_j -----------------------------------------
    let [dks0, dks1, dks2] = p.dk_stride;
    let [dvs0, dvs1, dvs2] = p.dv_stride;
    let g_dk = (p.dk_ptr as *mut u16).wrapping_add((b as u64 * dks0 + seq.k_row0 * dks1 + kvh as u64 * dks2) as usize);
    let g_dv = (p.dv_ptr as *mut u16).wrapping_add((b as u64 * dvs0 + seq.k_row0 * dvs1 + kvh as u64 * dvs2) as usize);
    for r in 0..2 {
        let key = k0 + kw + g + 8 * r;
        if key < nk {
            for nn in 0..DSN {
                let col = c0 + nn * 8 + 2 * t;
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

/// Kernel entry points: one per (dtype, head dim, score modifiers).
macro_rules! bwd_kernels {
    ($( $name:ident : $t:ty, d = $d:literal, w = $w:literal, ds = $ds:literal, br = $br:literal, bc = $bc:literal, mods = $mods:literal; )*) => {$(
        /// Tensor-core backward main kernel (`tc::bwd`); grid and shared
        /// memory as `flash_attn_common::tc_bwd` computes them.
        ///
        /// # Safety
        /// `p` describes valid device buffers for the shapes and strides it
        /// states (host-checked), 16-byte aligned, strides multiples of 8
        /// elements, dq_accum zeroed (and the semaphores, deterministic);
        /// launched with `32 * w` threads.
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $name(p: BwdParams) {
            // SAFETY: forwarded to the caller (the host's launch).
            unsafe {
                backward::<$t, $d, { $d / 16 }, $w, $ds, $br, { $br / 8 }, { $br / 16 }, $bc, { $bc / 16 }, { $d / $ds / 8 }, { $d / ($w / ($br / 16)) / 8 }, $mods>(&p)
            }
        }
    )*};
}

use super::{Bf16, F16};

bwd_kernels! {
    flash_bwd_tc_f16_d32_w8_br64_bc128: F16, d = 32, w = 8, ds = 1, br = 64, bc = 128, mods = false;
    flash_bwd_tc_bf16_d32_w8_br64_bc128: Bf16, d = 32, w = 8, ds = 1, br = 64, bc = 128, mods = false;
    flash_bwd_tc_f16_d64_w8_br64_bc128: F16, d = 64, w = 8, ds = 1, br = 64, bc = 128, mods = false;
    flash_bwd_tc_bf16_d64_w8_br64_bc128: Bf16, d = 64, w = 8, ds = 1, br = 64, bc = 128, mods = false;
    flash_bwd_tc_f16_d128_w8_br32_bc128: F16, d = 128, w = 8, ds = 1, br = 32, bc = 128, mods = false;
    flash_bwd_tc_bf16_d128_w8_br32_bc128: Bf16, d = 128, w = 8, ds = 1, br = 32, bc = 128, mods = false;
    flash_bwd_tc_f16_d192_w8_br32_bc64: F16, d = 192, w = 8, ds = 2, br = 32, bc = 64, mods = false;
    flash_bwd_tc_bf16_d192_w8_br32_bc64: Bf16, d = 192, w = 8, ds = 2, br = 32, bc = 64, mods = false;
    flash_bwd_tcx_f16_d32_w8_br64_bc128: F16, d = 32, w = 8, ds = 1, br = 64, bc = 128, mods = true;
    flash_bwd_tcx_bf16_d32_w8_br64_bc128: Bf16, d = 32, w = 8, ds = 1, br = 64, bc = 128, mods = true;
    flash_bwd_tcx_f16_d64_w8_br32_bc128: F16, d = 64, w = 8, ds = 1, br = 32, bc = 128, mods = true;
    flash_bwd_tcx_bf16_d64_w8_br32_bc128: Bf16, d = 64, w = 8, ds = 1, br = 32, bc = 128, mods = true;
    flash_bwd_tcx_f16_d128_w8_br16_bc128: F16, d = 128, w = 8, ds = 1, br = 16, bc = 128, mods = true;
    flash_bwd_tcx_bf16_d128_w8_br16_bc128: Bf16, d = 128, w = 8, ds = 1, br = 16, bc = 128, mods = true;
}
