//! FlashAttention (v1) forward, f32 in, out and accumulation: Algorithm 1 of
//! the paper (seed 002), one thread block per `(batch, head)`. The outer loop
//! loads `K_j`, `V_j` into shared memory; the inner loop loads `Q_i` and
//! reads `O_i`, `l_i`, `m_i` from HBM, updates them with block `j`, and
//! writes them back (lines 5–15). `O_i` is kept normalized (divided by the
//! running `l_i`) after every step, as line 12 says.
//!
//! Departures from the listing, all exact: the statistics are kept in the
//! base-2 domain of [`RowState`] (`m` is the maximum of
//! `softmax_scale·log2(e)·q·k`, `l` is unchanged); under a causal mask a pair
//! `(i, j)` that no row of `Q_i` can see is skipped (merging an empty block
//! is the identity), and only pairs crossing the diagonal are masked. The
//! HBM buffers O (0), l (0) and m (−inf) are initialized by
//! [`fa1_init_f32`] on the same stream, before the main kernel (line 2).
//!
//! Launch (see `host-crate/src/dispatch.rs`): `F32_THREADS` threads,
//! `Fa1Smem::new(br, bc, d).bytes()` of dynamic shared memory; blocks stride
//! over the `batch · nheads` heads.

use crate::arch::{smem::dynamic_smem, sreg, sync::sync_threads};
use crate::tile::{GlobalRows, Operand, SmemTile, block_gemm, rows, tid};
use crate::score::ScoreFn;
use flash_attn_common::smem_layout::{F32_THREADS, Fa1Smem};
use flash_attn_common::{AttnParams, RowState};

/// Shared-memory tiles of one thread block (prefix `s_`).
struct Tiles {
    s_k: SmemTile,
    s_v: SmemTile,
    s_q: SmemTile,
    s_s: SmemTile,
    /// Per query row of `Q_i`: the factors of `O_i` and of `P~_ij V_j` in line 12.
    s_scale_o: SmemTile,
    s_scale_pv: SmemTile,
}

/// `fa1_init_f32(params)`: Algorithm 1, line 2 — `O = 0`, `l = 0`,
/// `m = -inf` in HBM. Any grid of `F32_THREADS`-thread blocks (grid-stride).
///
/// # Safety
/// `o_ptr` valid for `(batch, seqlen_q, nheads, headdim)` with `o_stride`;
/// `lse_ptr` (l) and `m_ptr` (m) f32 buffers of `batch·nheads·seqlen_q`.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn fa1_init_f32(p: AttnParams) {
    let nthreads = sreg::grid_dim_x() as u64 * F32_THREADS as u64;
    let gid = sreg::block_idx_x() as u64 * F32_THREADS as u64 + tid() as u64;
    let (nq, nh, d) = (p.seqlen_q as u64, p.nheads as u64, p.headdim as u64);
    let rows = p.batch as u64 * nq * nh;
    let empty = RowState::<f32>::new();

    let mut idx = gid;
    while idx < rows * d {
        let (row, c) = (idx / d, idx % d);
        let (bi, h) = (row / nh, row % nh);
        let (b, i) = (bi / nq, bi % nq);
        let off = b * p.o_stride[0] + i * p.o_stride[1] + h * p.o_stride[2] + c;
        // SAFETY: (b, i, h, c) is inside O's shape; the host checked its strides.
        unsafe { *(p.o_ptr as *mut f32).add(off as usize) = 0.0 };
        idx += nthreads;
    }
    let mut idx = gid;
    while idx < rows {
        // SAFETY: idx < batch·nheads·seqlen_q, the length of l and m.
        unsafe {
            *(p.lse_ptr as *mut f32).add(idx as usize) = empty.l;
            *(p.m_ptr as *mut f32).add(idx as usize) = empty.m;
        }
        idx += nthreads;
    }
}

/// `fa1_forward_f32(params)`.
///
/// # Safety
/// As [`fa1_init_f32`], with O, l, m initialized by it; q, k, v valid for
/// their shapes and strides; the launch's dynamic shared memory at least
/// `Fa1Smem::new(br, bc, headdim).bytes()` with `F32_THREADS` threads.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn fa1_forward_f32(p: AttnParams) {
    let (br, bc, d) = (p.br as usize, p.bc as usize, p.headdim as usize);
    let lay = Fa1Smem::new(br, bc, d);
    let base = dynamic_smem::<f32>();
    // SAFETY: the host sized the dynamic shared memory to `lay.bytes()`; the
    // regions of `lay` are disjoint and inside it.
    let t = unsafe {
        Tiles {
            s_k: SmemTile::new(base, lay.k, bc, d, lay.d_stride),
            s_v: SmemTile::new(base, lay.v, bc, d, lay.d_stride),
            s_q: SmemTile::new(base, lay.q, br, d, lay.d_stride),
            s_s: SmemTile::new(base, lay.s, br, bc, lay.s_stride),
            s_scale_o: SmemTile::new(base, lay.scale_o, br, 1, 1),
            s_scale_pv: SmemTile::new(base, lay.scale_pv, br, 1, 1),
        }
    };
    let bh = p.batch as u64 * p.nheads as u64;
    let mut w = sreg::block_idx_x() as u64;
    while w < bh {
        let (b, h) = ((w / p.nheads as u64) as usize, (w % p.nheads as u64) as usize);
        // SAFETY: forwarded from this function's contract.
        unsafe { fa1_head(&p, &t, b, h) };
        sync_threads(); // the next head overwrites the tiles
        w += sreg::grid_dim_x() as u64;
    }
}

/// Algorithm 1 for one `(batch, head)`.
///
/// # Safety
/// As [`fa1_forward_f32`].
#[inline(always)]
unsafe fn fa1_head(p: &AttnParams, t: &Tiles, b: usize, h: usize) {
    let (br, bc, d) = (p.br as usize, p.bc as usize, p.headdim as usize);
    let (nq, nk) = (p.seqlen_q as usize, p.seqlen_k as usize);
    // SAFETY: the host checked every buffer against its shape and strides;
    // head (b, h) of O, l and m is touched by this thread block only.
    let (g_q, g_k, g_v, g_o, g_l, g_m) = unsafe {
        let stats = (b * p.nheads as usize + h) * nq;
        (
            GlobalRows::head(p.q_ptr, p.q_stride, b, h, nq, d),
            GlobalRows::head(p.k_ptr, p.k_stride, b, p.kv_head(h as u32) as usize, nk, d),
            GlobalRows::head(p.v_ptr, p.v_stride, b, p.kv_head(h as u32) as usize, nk, d),
            GlobalRows::head(p.o_ptr, p.o_stride, b, h, nq, d),
            GlobalRows::matrix((p.lse_ptr as *mut f32).wrapping_add(stats), 1, nq, 1),
            GlobalRows::matrix((p.m_ptr as *mut f32).wrapping_add(stats), 1, nq, 1),
        )
    };
    let win = p.key_window(p.seqlen_q, p.seqlen_k);
    // SAFETY: host-checked ALiBi slopes.
    let score = unsafe { ScoreFn::new(p, b, h, win.shift) };
    // K/V blocks some row sees (the window's union over all rows).
    let (kv_start, kv_end) = win.block_range(0, nq as i64);
    let tr = nq.div_ceil(br);
    let (j_first, tc) = ((kv_start as usize) / bc, if kv_start < kv_end { (kv_end as usize).div_ceil(bc) } else { 0 });

    // Line 5: for 1 <= j <= Tc.
    for j in j_first..tc {
        let k0 = j * bc;
        let kv_rows = bc.min(nk - k0);
        sync_threads(); // the previous step is done with s_k, s_v
        // Line 6: load K_j, V_j from HBM to SRAM.
        t.s_k.load(&g_k, k0, kv_rows, 0, d);
        t.s_v.load(&g_v, k0, kv_rows, 0, d);

        // Line 7: for 1 <= i <= Tr.
        for i in 0..tr {
            let q0 = i * br;
            let rows = br.min(nq - q0);
            let (r0, r1) = (q0 as i64, (q0 + rows) as i64);
            let (see_start, see_end) = win.block_range(r0, r1);
            if k0 as i64 >= see_end || ((k0 + kv_rows) as i64) <= see_start || see_start >= see_end {
                continue; // causal/window: no row of Q_i sees a key of block j
            }
            let (full_start, full_end) = win.unmasked_range(r0, r1);
            let masked = (k0 as i64) < full_start || (k0 + kv_rows) as i64 > full_end;
            sync_threads(); // the previous step is done with s_q, s_s, s_scale_*
            // Line 8: load Q_i (O_i, l_i, m_i are read below, by the threads
            // that update them).
            t.s_q.load(&g_q, q0, rows, 0, d);
            sync_threads(); // s_q, s_k, s_v complete

            // Line 9: S_ij = the base-2 scores of Q_i K_jᵀ (scale, softcap,
            // ALiBi), -inf where masked.
            block_gemm(Operand::rows(&t.s_q), Operand::rows(&t.s_k), rows, kv_rows, d, |r, c, acc| {
                let (i, jk) = (q0 + r, k0 + c);
                let visible = !masked || win.visible(i as i64, jk as i64);
                t.s_s.set(r, c, if visible { score.apply(acc, i, jk) } else { f32::NEG_INFINITY });
            });
            sync_threads();

            // Lines 10, 11 and 13, one warp per row.
            rows::for_each_row_of_warp(rows, |r, lane| {
                let old = RowState { m: g_m.get(q0 + r, 0), l: g_l.get(q0 + r, 0) };
                // Line 10: m~_ij, P~_ij = exp(S_ij - m~_ij), l~_ij.
                let mut blk = RowState::<f32>::new();
                rows::softmax_step(&t.s_s, r, kv_rows, lane, &mut blk);
                // Line 11: m_new, l_new (and the two factors of line 12).
                let (new, scale_old, scale_blk) = old.merge(blk);
                let inv_l = new.inv_l();
                if lane == 0 {
                    t.s_scale_o.set(r, 0, old.l * scale_old * inv_l);
                    t.s_scale_pv.set(r, 0, scale_blk * inv_l);
                    // Line 13: write l_i, m_i to HBM.
                    g_l.set(q0 + r, 0, new.l);
                    g_m.set(q0 + r, 0, new.m);
                }
            });
            sync_threads();

            // Line 12: O_i = diag(l_new)^-1 (diag(l_i) e^{m_i - m_new} O_i
            //                                + e^{m~_ij - m_new} P~_ij V_j), in HBM.
            block_gemm(Operand::rows(&t.s_s), Operand::cols(&t.s_v), rows, d, kv_rows, |r, c, acc| {
                let o = t.s_scale_o.get(r, 0) * g_o.get(q0 + r, c) + t.s_scale_pv.get(r, 0) * acc;
                g_o.set(q0 + r, c, o);
            });
        }
    }
}
