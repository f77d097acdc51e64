//! FlashAttention (v1) backward, f32 (FA1 paper, Algorithm 4): one program
//! per `(batch, KV head)`; the outer loop loads `K_j`, `V_j` and keeps
//! `dK_j`, `dV_j` on chip (line 6–7), the inner loop runs over the query
//! heads of the group and their Q blocks `i` (line 8), recomputes `P_ij`
//! from `l_i`, `m_i` (lines 9–13: the forward's FA1 statistics, base-2
//! units of `RowState`) and read-modify-writes `dQ_i` in HBM (line 21: the
//! f32 accumulator, which this program alone touches for its query heads —
//! no atomics), then writes `dK_j`, `dV_j` (line 24). GQA/MQA: one program
//! owns a KV head and all its query heads, so dK/dV of the KV head are
//! summed on chip and dQ rows have one writer. Between
//! `bwd_preprocess_f32` (D, zeroed accumulator) and `bwd_dq_convert_f32`.
//!
//! Launch: `F32_THREADS` threads, `BwdSmem::new(br, bc, d).bytes()` of
//! dynamic shared memory, any grid (blocks stride over `batch · nheads_k`).

use super::step::{self, DqUpdate, Head, Stats, Tiles, kv_blocks_of};
use crate::arch::{sreg, sync::sync_threads};
use crate::score::ScoreFn;
use crate::tile::GlobalRows;
use flash_attn_common::BwdParams;

/// `bwd_fa1_f32(params)`.
///
/// # Safety
/// As `bwd_fa2_f32`, with `lse_ptr` = FA1's `l` and `m_ptr` = its `m`; dense
/// (no varlen).
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn bwd_fa1_f32(p: BwdParams) {
    let (br, bc, d) = (p.br as usize, p.bc as usize, p.fwd.headdim as usize);
    // SAFETY: the host sized the dynamic shared memory (contract).
    let t = unsafe { Tiles::new(br, bc, d) };
    t.s_dk.fill(bc, d, 0.0);
    t.s_dv.fill(bc, d, 0.0);
    let bh = p.fwd.batch as u64 * p.fwd.kv_heads() as u64;
    let mut w = sreg::block_idx_x() as u64;
    while w < bh {
        let (b, kvh) = ((w / p.fwd.kv_heads() as u64) as usize, (w % p.fwd.kv_heads() as u64) as usize);
        // SAFETY: forwarded from this function's contract.
        unsafe { kv_head(&p, &t, b, kvh) };
        w += sreg::grid_dim_x() as u64;
    }
}

/// Algorithm 4 for one `(batch, KV head)` and its query heads.
///
/// # Safety
/// As [`bwd_fa1_f32`].
#[inline(always)]
unsafe fn kv_head(p: &BwdParams, t: &Tiles, b: usize, kvh: usize) {
    let a = &p.fwd;
    let (br, bc, d) = (p.br as usize, p.bc as usize, a.headdim as usize);
    let (nq, nk) = (a.seqlen_q as usize, a.seqlen_k as usize);
    // SAFETY: the host checked every buffer against its shape and strides;
    // dK, dV of (b, kvh) are written by this program only.
    let (g_k, g_v, g_dk, g_dv) = unsafe {
        (
            GlobalRows::head(a.k_ptr, a.k_stride, b, kvh, nk, d),
            GlobalRows::head(a.v_ptr, a.v_stride, b, kvh, nk, d),
            GlobalRows::head(p.dk_ptr, p.dk_stride, b, kvh, nk, d),
            GlobalRows::head(p.dv_ptr, p.dv_stride, b, kvh, nk, d),
        )
    };
    let win = a.key_window(a.seqlen_q, a.seqlen_k);
    let group = (a.nheads / a.kv_heads()) as usize;
    // Line 5: for 1 <= j <= Tc (every block, so that dK_j, dV_j of keys no
    // query sees are written as 0).
    for j in 0..nk.div_ceil(bc) {
        let k0 = j * bc;
        let kv_rows = bc.min(nk - k0);
        sync_threads(); // the previous step is done with s_k, s_v
        // Line 6: load K_j, V_j (dK_j, dV_j are 0 in s_dk, s_dv).
        t.s_k.load(&g_k, k0, kv_rows, 0, d);
        t.s_v.load(&g_v, k0, kv_rows, 0, d);
        for h in kvh * group..(kvh + 1) * group {
            let seq = a.dense_seq(b as u32, h as u32);
            // SAFETY: host-checked buffers and ALiBi slopes; the dQ rows of
            // (b, h) belong to this program.
            let hd = unsafe {
                Head {
                    p,
                    b,
                    h,
                    win,
                    score: ScoreFn::new(a, b, h, win.shift),
                    lse_base: seq.lse_base as usize,
                    nq,
                    g_q: GlobalRows::head(a.q_ptr, a.q_stride, b, h, nq, d),
                    g_do: GlobalRows::head(p.do_ptr, p.do_stride, b, h, nq, d),
                }
            };
            // Line 8: for 1 <= i <= Tr (pairs no row of Q_i sees skipped).
            for i in 0..nq.div_ceil(br) {
                let q0 = i * br;
                let (j_first, j_end) = kv_blocks_of(&win, q0, br.min(nq - q0), bc);
                if j < j_first || j >= j_end {
                    continue;
                }
                // Lines 9–22.
                // SAFETY: this function's contract; dQ rows owned here.
                unsafe { step::step(t, &hd, Stats::Fa1, DqUpdate::Owned, q0, k0, kv_rows) };
            }
        }
        // Line 24: write dK_j, dV_j to HBM.
        step::store_dkv(t, &g_dk, &g_dv, k0, kv_rows, d, a.softmax_scale);
    }
}
