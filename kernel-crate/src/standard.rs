//! Standard attention (Algorithm 0 of seed 002), the baseline the papers
//! compare against: `S = softmax_scale · Q Kᵀ` written to HBM, `P =
//! softmax(S)` (masked, row by row) written over it, then `O = P V`. Three
//! kernels, each a plain tiled loop; the `(batch, nheads, seqlen_q,
//! seqlen_k)` f32 scratch matrix at `scratch_ptr` holds S, then P.
//!
//! Launch (see `host-crate/src/dispatch.rs`): `F32_THREADS` threads;
//! `scores` and `pv` take `StdSmem::new().bytes()` of dynamic shared memory;
//! any grid.x (every kernel strides over its work items).

use crate::arch::{smem::dynamic_smem, sreg, sync::sync_threads};
use crate::tile::rows::warp_row_state;
use crate::tile::{GlobalRows, Operand, SmemTile, block_gemm, tid};
use flash_attn_common::smem_layout::{F32_THREADS, F32_WARPS, STD_TILE, StdSmem};
use flash_attn_common::{AttnParams, LOG2_E, Real, RowState, ScoreMod};

/// The three `STD_TILE × STD_TILE` tiles: inputs A, B and the output C.
#[inline(always)]
fn tiles() -> (SmemTile, SmemTile, SmemTile) {
    let lay = StdSmem::new();
    let base = dynamic_smem::<f32>();
    // SAFETY: the host sized the dynamic shared memory to `lay.bytes()`; the
    // three regions are disjoint and inside it.
    unsafe {
        (
            SmemTile::new(base, lay.a, STD_TILE, STD_TILE, lay.stride),
            SmemTile::new(base, lay.b, STD_TILE, STD_TILE, lay.stride),
            SmemTile::new(base, lay.c, STD_TILE, STD_TILE, lay.stride),
        )
    }
}

/// The S/P scratch matrix of head `bhi = b·nheads + h`: `seqlen_q × seqlen_k`.
///
/// # Safety
/// `p.scratch_ptr` must hold `batch·nheads·seqlen_q·seqlen_k` f32.
#[inline(always)]
unsafe fn scratch(p: &AttnParams, bhi: usize) -> GlobalRows {
    let (nq, nk) = (p.seqlen_q as usize, p.seqlen_k as usize);
    // SAFETY: head bhi's matrix lies inside the scratch buffer.
    unsafe { GlobalRows::matrix((p.scratch_ptr as *mut f32).wrapping_add(bhi * nq * nk), nk, nq, nk) }
}

/// Block-wide: `C = Σ_chunks A_chunk · B_chunk` over the reduction in
/// chunks of `STD_TILE`, where `load(k0, kk)` fills A and B with chunk
/// `[k0, k0 + kk)`; then `store(r, c, C[r][c])` for `r < m`, `c < n`,
/// consecutive threads on consecutive columns.
#[inline(always)]
fn tiled_product(
    (s_a, s_b, s_c): (SmemTile, SmemTile, SmemTile),
    b_is_transposed: bool,
    (m, n, kdim): (usize, usize, usize),
    mut load: impl FnMut(&SmemTile, &SmemTile, usize, usize),
    mut store: impl FnMut(usize, usize, f32),
) {
    let b_op = if b_is_transposed { Operand::rows(&s_b) } else { Operand::cols(&s_b) };
    let mut k0 = 0;
    while k0 < kdim {
        let kk = STD_TILE.min(kdim - k0);
        sync_threads(); // previous chunk done with s_a, s_b
        load(&s_a, &s_b, k0, kk);
        sync_threads();
        block_gemm(Operand::rows(&s_a), b_op, m, n, kk, |r, c, acc| {
            // Each element is owned by one thread in every chunk: no barrier needed.
            s_c.set(r, c, if k0 == 0 { acc } else { s_c.get(r, c) + acc });
        });
        k0 += STD_TILE;
    }
    sync_threads(); // s_c complete
    let mut idx = tid();
    while idx < m * n {
        store(idx / n, idx % n, s_c.get(idx / n, idx % n));
        idx += F32_THREADS as usize;
    }
    sync_threads(); // s_c read before the next work item overwrites it
}

/// One work item of `scores` and `pv`: the `m × n` tile at `(i0, j0)` of
/// the `seqlen_q × ncols` output of head `bhi = b·nheads + h`.
struct OutTile {
    b: usize,
    h: usize,
    bhi: usize,
    i0: usize,
    j0: usize,
    m: usize,
    n: usize,
}

/// Runs `f` on this block's share of the `STD_TILE × STD_TILE` tiles of
/// every head's `seqlen_q × ncols` output: work item `w` is tile column
/// `w % tiles_per_row`, then tile row, then head; blocks stride over them
/// by grid.x.
#[inline(always)]
fn for_each_out_tile(p: &AttnParams, ncols: usize, mut f: impl FnMut(OutTile)) {
    let (nq, nh) = (p.seqlen_q as usize, p.nheads as usize);
    let (tq, tn) = (nq.div_ceil(STD_TILE) as u64, ncols.div_ceil(STD_TILE) as u64);
    let total = p.batch as u64 * nh as u64 * tq * tn;
    let mut w = sreg::block_idx_x() as u64;
    while w < total {
        let (tj, ti, bhi) = ((w % tn) as usize, (w / tn % tq) as usize, (w / tn / tq) as usize);
        let (i0, j0) = (ti * STD_TILE, tj * STD_TILE);
        let (m, n) = (STD_TILE.min(nq - i0), STD_TILE.min(ncols - j0));
        f(OutTile { b: bhi / nh, h: bhi % nh, bhi, i0, j0, m, n });
        w += sreg::grid_dim_x() as u64;
    }
}

/// `standard_scores_f32(params)`: `S[b, h] = softmax_scale · Q[b, :, h] K[b, :, h]ᵀ`,
/// one `STD_TILE × STD_TILE` tile of S per work item.
///
/// # Safety
/// q, k valid for their shapes and strides; `scratch_ptr` holds
/// `batch·nheads·seqlen_q·seqlen_k` f32; dynamic shared memory
/// `StdSmem::new().bytes()`, `F32_THREADS` threads.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn standard_scores_f32(p: AttnParams) {
    let (nq, nk, d) = (p.seqlen_q as usize, p.seqlen_k as usize, p.headdim as usize);
    let shift = nk as i64 - nq as i64;
    for_each_out_tile(&p, nk, |t| {
        // Softcap, then ALiBi (natural domain; the softmax kernel masks).
        let score = ScoreMod {
            softcap: p.softcap,
            // SAFETY: host-checked ALiBi slopes.
            alibi_slope: unsafe { p.alibi_slope(t.b as u32, t.h as u32) },
        };
        // SAFETY: the host checked q, k against their strides and sized the scratch.
        let (g_q, g_k, g_s) = unsafe {
            (
                GlobalRows::head(p.q_ptr, p.q_stride, t.b, t.h, nq, d),
                GlobalRows::head(p.k_ptr, p.k_stride, t.b, p.kv_head(t.h as u32) as usize, nk, d),
                scratch(&p, t.bhi),
            )
        };
        tiled_product(
            tiles(),
            true,
            (t.m, t.n, d),
            |s_a, s_b, k0, kk| {
                s_a.load(&g_q, t.i0, t.m, k0, kk);
                s_b.load(&g_k, t.j0, t.n, k0, kk);
            },
            |r, c, s| {
                let (i, j) = (t.i0 + r, t.j0 + c);
                g_s.set(i, j, score.apply(s * p.softmax_scale, (i as i64) + shift, j as i64));
            },
        );
    });
}

/// `standard_softmax_f32(params)`: `P = softmax(S)` in place, row by row,
/// keys past the causal limit set to 0, and the row's logsumexp to
/// `lse_ptr`. One warp per row: each lane runs the online softmax
/// ([`RowState`]) over its strided columns, the 32 states are merged, then
/// a second pass writes P. Blocks of `F32_THREADS` threads, any grid.x.
///
/// # Safety
/// `scratch_ptr` holds S as written by `standard_scores_f32`; `lse_ptr`
/// holds `batch·nheads·seqlen_q` f32.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn standard_softmax_f32(p: AttnParams) {
    let (nq, nk) = (p.seqlen_q as usize, p.seqlen_k as usize);
    let rows = p.batch as u64 * p.nheads as u64 * nq as u64;
    let lane = sreg::lane_id() as usize;
    let mut row = sreg::block_idx_x() as u64 * F32_WARPS as u64 + sreg::warp_id() as u64;
    while row < rows {
        let (bhi, i) = ((row / nq as u64) as usize, (row % nq as u64) as usize);
        // SAFETY: the host sized the scratch to batch·nheads·seqlen_q·seqlen_k.
        let g_s = unsafe { scratch(&p, bhi) };
        let win = p.key_window(p.seqlen_q, p.seqlen_k);
        let (lo, hi) = (win.lo(i as i64).clamp(0, nk as i64) as usize, win.hi(i as i64).clamp(0, nk as i64) as usize);
        let hi = hi.max(lo);

        // Pass 1: running max and sum together, over the visible keys.
        let st = warp_row_state(hi - lo, lane, |c| g_s.get(i, lo + c) * LOG2_E);

        // Pass 2: normalize; masked keys get exactly 0.
        let m_safe = RowState::<f32>::safe_max(st.m);
        let inv_l = st.inv_l();
        let mut c = lane;
        while c < nk {
            let p_ic = if c >= lo && c < hi { (g_s.get(i, c) * LOG2_E - m_safe).exp2() * inv_l } else { 0.0 };
            g_s.set(i, c, p_ic);
            c += 32;
        }
        if lane == 0 {
            // SAFETY: row < batch·nheads·seqlen_q, the length of lse.
            unsafe { *(p.lse_ptr as *mut f32).add(row as usize) = st.lse() };
        }
        row += sreg::grid_dim_x() as u64 * F32_WARPS as u64;
    }
}

/// `standard_pv_f32(params)`: `O[b, :, h] = P[b, h] V[b, :, h]`, one
/// `STD_TILE`-row by `STD_TILE`-column tile of O per work item.
///
/// # Safety
/// v, o valid for their shapes and strides; `scratch_ptr` holds P as
/// written by `standard_softmax_f32`; dynamic shared memory
/// `StdSmem::new().bytes()`, `F32_THREADS` threads.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn standard_pv_f32(p: AttnParams) {
    let (nq, nk, d) = (p.seqlen_q as usize, p.seqlen_k as usize, p.headdim as usize);
    for_each_out_tile(&p, d, |t| {
        // SAFETY: the host checked v, o against their strides and sized the
        // scratch; tile (i0, j0) of head (b, h) of O is written by this block only.
        let (g_p, g_v, g_o) = unsafe {
            (
                scratch(&p, t.bhi),
                GlobalRows::head(p.v_ptr, p.v_stride, t.b, p.kv_head(t.h as u32) as usize, nk, d),
                GlobalRows::head(p.o_ptr, p.o_stride, t.b, t.h, nq, d),
            )
        };
        tiled_product(
            tiles(),
            false,
            (t.m, t.n, nk),
            |s_a, s_b, k0, kk| {
                s_a.load(&g_p, t.i0, t.m, k0, kk);
                s_b.load(&g_v, k0, kk, t.j0, t.n);
            },
            |r, c, o| g_o.set(t.i0 + r, t.j0 + c, o),
        );
    });
}
