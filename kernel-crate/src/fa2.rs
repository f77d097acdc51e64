//! FlashAttention-2 forward, f32 in, out and accumulation (seed 001): the
//! query blocks are the outer, parallel loop (one thread block per
//! `(Q block, batch·head)`), the K/V blocks the inner loop; `O_i` stays in
//! shared memory across the whole inner loop, is divided by `l_i` once at
//! the end, and the logsumexp is written instead of `l` and `m`. Causal:
//! K/V blocks that no row of the Q block can see are never visited, and
//! only blocks that cross the diagonal (or the end of the keys) are masked.
//!
//! Launch (see `host-crate/src/dispatch.rs`): `F32_THREADS` threads,
//! `Fa2Smem::new(br, bc, d).bytes()` of dynamic shared memory, any grid.x:
//! blocks stride over the `Tr · batch · nheads` work items.

use crate::arch::sync::{sync_threads, sync_warp};
use crate::arch::{smem::dynamic_smem, sreg};
use crate::tile::{GlobalRows, Operand, SmemTile, block_gemm, rows};
use crate::score::ScoreFn;
use flash_attn_common::smem_layout::Fa2Smem;
use flash_attn_common::{AttnParams, RowState};

/// Shared-memory tiles of one thread block (prefix `s_`).
struct Tiles {
    s_q: SmemTile,
    s_k: SmemTile,
    s_v: SmemTile,
    s_s: SmemTile,
    s_o: SmemTile,
    /// Per query row: `m_i`, `l_i` and the rescale factor of the current block.
    s_m: SmemTile,
    s_l: SmemTile,
    s_alpha: SmemTile,
}

/// `fa2_forward_f32(params)`.
///
/// # Safety
/// `params` must come from the host's validated dispatch: q, k, v, o valid
/// for their shapes and strides, `lse_ptr` an f32 buffer of
/// `batch·nheads·seqlen_q`, and the launch's dynamic shared memory at least
/// `Fa2Smem::new(br, bc, headdim).bytes()` with `F32_THREADS` threads.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn fa2_forward_f32(p: AttnParams) {
    let (br, bc, d) = (p.br as usize, p.bc as usize, p.headdim as usize);
    let lay = Fa2Smem::new(br, bc, d);
    let base = dynamic_smem::<f32>();
    // SAFETY: the host sized the dynamic shared memory to `lay.bytes()`; the
    // regions of `lay` are disjoint and inside it.
    let t = unsafe {
        Tiles {
            s_q: SmemTile::new(base, lay.q, br, d, lay.d_stride),
            s_k: SmemTile::new(base, lay.k, bc, d, lay.d_stride),
            s_v: SmemTile::new(base, lay.v, bc, d, lay.d_stride),
            s_s: SmemTile::new(base, lay.s, br, bc, lay.s_stride),
            s_o: SmemTile::new(base, lay.o, br, d, lay.d_stride),
            s_m: SmemTile::new(base, lay.m, br, 1, 1),
            s_l: SmemTile::new(base, lay.l, br, 1, 1),
            s_alpha: SmemTile::new(base, lay.alpha, br, 1, 1),
        }
    };

    // Work item w ↦ (Q block, batch·head). The last Q blocks come first:
    // under a causal mask they see the most keys, so they should start early.
    let bh = p.batch as u64 * p.nheads as u64;
    let tr = (p.seqlen_q as u64).div_ceil(br as u64);
    let total = tr * bh;
    let mut w = sreg::block_idx_x() as u64;
    while w < total {
        let q_block = (tr - 1 - w / bh) as usize;
        let bhi = w % bh;
        let (b, h) = ((bhi / p.nheads as u64) as usize, (bhi % p.nheads as u64) as usize);
        // SAFETY: forwarded from this function's contract.
        unsafe { fa2_block(&p, &t, q_block, b, h) };
        sync_threads(); // the next work item overwrites the tiles
        w += sreg::grid_dim_x() as u64;
    }
}

/// One work item: query rows `[q0, q0 + rows)` of head `(b, h)` (of sequence
/// `b` for varlen; nothing when the Q block lies past the sequence). GQA,
/// window, softcap and ALiBi as `flash_attn_common::mask` defines them.
///
/// # Safety
/// As [`fa2_forward_f32`].
#[inline(always)]
unsafe fn fa2_block(p: &AttnParams, t: &Tiles, q_block: usize, b: usize, h: usize) {
    let (br, bc, d) = (p.br as usize, p.bc as usize, p.headdim as usize);
    // SAFETY: host-checked varlen arrays (values clamped inside).
    let seq = unsafe { p.seq(b as u32, h as u32) };
    let (nq, nk) = (seq.seqlen_q as usize, seq.seqlen_k as usize);
    let q0 = q_block * br;
    if q0 >= nq {
        return; // varlen: this Q block lies past its sequence
    }
    let kvh = p.kv_head(h as u32) as usize;
    let row_off = |base: u64, stride: [u64; 3], row0: u64| base + 4 * row0 * stride[1];
    // SAFETY: the host checked every buffer against its shape and strides
    // (varlen segments clamped to the buffers), and each (Q block, b, h) is
    // written by this thread block only.
    let (g_q, g_k, g_v, g_o) = unsafe {
        (
            GlobalRows::head(row_off(p.q_ptr, p.q_stride, seq.q_row0), p.q_stride, b, h, nq, d),
            GlobalRows::head(row_off(p.k_ptr, p.k_stride, seq.k_row0), p.k_stride, b, kvh, nk, d),
            GlobalRows::head(row_off(p.v_ptr, p.v_stride, seq.k_row0), p.v_stride, b, kvh, nk, d),
            GlobalRows::head(row_off(p.o_ptr, p.o_stride, seq.q_row0), p.o_stride, b, h, nq, d),
        )
    };
    let rows = br.min(nq - q0);
    let win = p.key_window(seq.seqlen_q, seq.seqlen_k);
    // SAFETY: host-checked ALiBi slopes.
    let score = unsafe { ScoreFn::new(p, b, h, win.shift) };

    // ---- Prologue: Q_i to shared memory, O_i = 0, m_i = -inf, l_i = 0.
    t.s_q.load(&g_q, q0, rows, 0, d);
    t.s_o.fill(rows, d, 0.0);
    rows::for_each_row_of_warp(rows, |r, lane| {
        if lane == 0 {
            let st = RowState::<f32>::new();
            t.s_m.set(r, 0, st.m);
            t.s_l.set(r, 0, st.l);
        }
    });

    // Keys [kv_start, kv_end) are visible to some row of the block, keys
    // [full_start, full_end) to every row: blocks outside the first are
    // skipped, blocks inside the second need no mask.
    let (r0, r1) = (q0 as i64, (q0 + rows) as i64);
    let (kv_start, kv_end) = win.block_range(r0, r1);
    let (full_start, full_end) = win.unmasked_range(r0, r1);
    let (j_first, j_end) = ((kv_start as usize) / bc, if kv_start < kv_end { (kv_end as usize).div_ceil(bc) } else { 0 });

    // ---- Main loop over K/V blocks.
    for j in j_first..j_end {
        let k0 = j * bc;
        let kv_rows = bc.min(nk - k0);
        sync_threads(); // previous step done with s_k, s_v, s_s (and prologue writes visible)
        t.s_k.load(&g_k, k0, kv_rows, 0, d);
        t.s_v.load(&g_v, k0, kv_rows, 0, d);
        sync_threads();

        // S_ij = the base-2 scores of Q_i K_jᵀ (scale, softcap, ALiBi), -inf where masked.
        let masked = (k0 as i64) < full_start || (k0 + kv_rows) as i64 > full_end;
        block_gemm(Operand::rows(&t.s_q), Operand::rows(&t.s_k), rows, kv_rows, d, |r, c, acc| {
            let (i, jk) = (q0 + r, k0 + c);
            let visible = !masked || win.visible(i as i64, jk as i64);
            t.s_s.set(r, c, if visible { score.apply(acc, i, jk) } else { f32::NEG_INFINITY });
        });
        sync_threads();

        // Online softmax: m_i, l_i rescaled, P_ij = exp2(S_ij - m_i).
        rows::for_each_row_of_warp(rows, |r, lane| {
            let mut st = RowState { m: t.s_m.get(r, 0), l: t.s_l.get(r, 0) };
            let alpha = rows::softmax_step(&t.s_s, r, kv_rows, lane, &mut st);
            sync_warp(); // every lane has read s_m, s_l before lane 0 overwrites them
            if lane == 0 {
                t.s_m.set(r, 0, st.m);
                t.s_l.set(r, 0, st.l);
                t.s_alpha.set(r, 0, alpha);
            }
        });
        sync_threads();

        // O_i = diag(alpha) O_i + P_ij V_j.
        block_gemm(Operand::rows(&t.s_s), Operand::cols(&t.s_v), rows, d, kv_rows, |r, c, acc| {
            t.s_o.set(r, c, t.s_alpha.get(r, 0) * t.s_o.get(r, c) + acc);
        });
    }
    sync_threads(); // s_o, s_l complete

    // ---- Epilogue: O_i / l_i to HBM (rows that saw no key get 0), logsumexp.
    store_output(t, &g_o, q0, rows, d);
    rows::for_each_row_of_warp(rows, |r, lane| {
        if lane == 0 {
            let st = RowState { m: t.s_m.get(r, 0), l: t.s_l.get(r, 0) };
            let i = seq.lse_base as usize + q0 + r;
            // SAFETY: i < batch·nheads·seqlen_q (dense) or nheads·total_q (varlen), the length of lse.
            unsafe { *(p.lse_ptr as *mut f32).add(i) = st.lse() };
        }
    });
}

/// Writes `O_i · diag(1 / l_i)` to HBM, consecutive threads on consecutive
/// columns.
#[inline(always)]
fn store_output(t: &Tiles, g_o: &GlobalRows, q0: usize, rows: usize, d: usize) {
    let mut idx = crate::tile::tid();
    while idx < rows * d {
        let (r, c) = (idx / d, idx % d);
        let inv_l = RowState { m: t.s_m.get(r, 0), l: t.s_l.get(r, 0) }.inv_l();
        g_o.set(q0 + r, c, t.s_o.get(r, c) * inv_l);
        idx += flash_attn_common::smem_layout::F32_THREADS as usize;
    }
}
