//! One `(Q block i, K/V block j)` step of the f32 backward kernels, shared
//! by both loop orders (BACKWARD.md "The math"):
//!
//! ```text
//! P_ij  = exp(S_ij − LSE_i)            (recomputed; 0 where masked or LSE = −inf)
//! dV_j += P_ijᵀ dO_i
//! dP_ij = dO_i V_jᵀ
//! dS_ij = P_ij ∘ (dP_ij − D_i)         (softcap: ∘ (1 − tanh²))
//! dQ_i += scale · dS_ij K_j            (atomics, ordered atomics, or HBM read-modify-write)
//! dK_j += dS_ijᵀ Q_i                   (× scale once, at the store)
//! ```
//!
//! Scores come from the forward's [`ScoreFn`] (scale, softcap, ALiBi) and
//! window rule, in the base-2 domain; the LSE is kept base-2 in shared
//! memory (`LSE_i · log2 e`, or FA1's `m_i + log2 l_i`).

use crate::arch::global::{fence_acq_rel_gpu, red_add_f32};
use crate::arch::{smem::dynamic_smem, sync::sync_threads};
use crate::score::ScoreFn;
use crate::tile::{GlobalRows, Operand, SmemTile, block_gemm, tid};
use flash_attn_common::bwd_params::BwdSmem;
use flash_attn_common::smem_layout::F32_THREADS;
use flash_attn_common::{BwdParams, KeyWindow, LOG2_E, Real};

/// Shared-memory tiles of one thread block (prefix `s_`).
pub struct Tiles {
    pub s_k: SmemTile,
    pub s_v: SmemTile,
    pub s_dk: SmemTile,
    pub s_dv: SmemTile,
    pub s_q: SmemTile,
    pub s_do: SmemTile,
    /// `P_ij`, overwritten by `dS_ij`.
    pub s_p: SmemTile,
    /// Softcap: `1 − tanh²` of each score (unused without softcap).
    pub s_cap: SmemTile,
    /// Per query row: base-2 LSE and `D_i`.
    pub s_lse: SmemTile,
    pub s_delta: SmemTile,
}

impl Tiles {
    /// The tiles of [`BwdSmem`] over the dynamic shared memory.
    ///
    /// # Safety
    /// The launch has at least `BwdSmem::new(br, bc, d).bytes()` of dynamic
    /// shared memory.
    #[inline(always)]
    pub unsafe fn new(br: usize, bc: usize, d: usize) -> Self {
        let lay = BwdSmem::new(br, bc, d);
        let base = dynamic_smem::<f32>();
        // SAFETY: caller; the regions of `lay` are disjoint and inside it.
        unsafe {
            Self {
                s_k: SmemTile::new(base, lay.k, bc, d, lay.d_stride),
                s_v: SmemTile::new(base, lay.v, bc, d, lay.d_stride),
                s_dk: SmemTile::new(base, lay.dk, bc, d, lay.d_stride),
                s_dv: SmemTile::new(base, lay.dv, bc, d, lay.d_stride),
                s_q: SmemTile::new(base, lay.q, br, d, lay.d_stride),
                s_do: SmemTile::new(base, lay.do_, br, d, lay.d_stride),
                s_p: SmemTile::new(base, lay.p, br, bc, lay.s_stride),
                s_cap: SmemTile::new(base, lay.cap, br, bc, lay.s_stride),
                s_lse: SmemTile::new(base, lay.lse, br, 1, 1),
                s_delta: SmemTile::new(base, lay.delta, br, 1, 1),
            }
        }
    }
}

/// Where the row statistics come from.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Stats {
    /// FA2: the natural-log LSE at `lse_ptr`.
    Lse,
    /// FA1: `l` at `lse_ptr`, `m` at `m_ptr` (base-2 units of `RowState`).
    Fa1,
}

/// How `dQ_i += scale · dS_ij K_j` reaches the f32 accumulator.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum DqUpdate {
    /// `red.add` in any order (several blocks add to the same rows).
    Atomic,
    /// Plain read-modify-write: this block owns the rows (FA1 order).
    Owned,
}

/// One (sequence, query head) as the steps see it.
pub struct Head<'a> {
    pub p: &'a BwdParams,
    pub b: usize,
    pub h: usize,
    pub win: KeyWindow,
    pub score: ScoreFn,
    /// `SeqInfo::lse_base` of this (sequence, head).
    pub lse_base: usize,
    pub nq: usize,
    pub g_q: GlobalRows,
    pub g_do: GlobalRows,
}

/// Whether K/V block `[k0, k0 + kv_rows)` and Q block `i` (rows `q0..q0+rows`)
/// see each other, and the range `[j_first, j_end)` of K/V blocks Q block `i`
/// sees (the forward's `block_range`): the ordered dQ additions count them.
#[inline(always)]
pub fn kv_blocks_of(win: &KeyWindow, q0: usize, rows: usize, bc: usize) -> (usize, usize) {
    let (kv_start, kv_end) = win.block_range(q0 as i64, (q0 + rows) as i64);
    if kv_start < kv_end { ((kv_start as usize) / bc, (kv_end as usize).div_ceil(bc)) } else { (0, 0) }
}

/// Step `(i, j)` for head `hd`: K_j, V_j are in `s_k`, `s_v` (synchronized),
/// `dK_j`, `dV_j` accumulate in `s_dk`, `s_dv`. Block-wide.
///
/// # Safety
/// `p`'s buffers as the kernels' contracts state; `dq_accum` rows of this
/// Q block written concurrently only through `DqUpdate::Atomic`.
#[inline(always)]
pub unsafe fn step(t: &Tiles, hd: &Head, stats: Stats, dq: DqUpdate, q0: usize, k0: usize, kv_rows: usize) {
    let p = hd.p;
    let (br, d) = (p.br as usize, p.fwd.headdim as usize);
    let rows = br.min(hd.nq - q0);
    let scale = p.fwd.softmax_scale;
    let softcap = p.fwd.softcap != 0.0;

    sync_threads(); // the previous step is done with s_q, s_do, s_p, s_cap, s_lse, s_delta
    t.s_q.load(&hd.g_q, q0, rows, 0, d);
    t.s_do.load(&hd.g_do, q0, rows, 0, d);
    let mut r = tid();
    while r < rows {
        let li = hd.lse_base + q0 + r;
        // SAFETY: li < the LSE's length (host-checked), as are l, m and delta.
        let (lse2, delta) = unsafe {
            let lse2 = match stats {
                Stats::Lse => *(p.fwd.lse_ptr as *const f32).add(li) * LOG2_E,
                Stats::Fa1 => {
                    // log2 of Σ 2^(s − m) · 2^m; l = 0: the row saw no key.
                    let (l, m) = (*(p.fwd.lse_ptr as *const f32).add(li), *(p.fwd.m_ptr as *const f32).add(li));
                    if l == 0.0 { f32::NEG_INFINITY } else { m + l.log2() }
                }
            };
            (lse2, *(p.delta_ptr as *const f32).add(li))
        };
        t.s_lse.set(r, 0, lse2);
        t.s_delta.set(r, 0, delta);
        r += F32_THREADS as usize;
    }
    sync_threads();

    // P_ij = exp2(S_ij − LSE_i) (base 2); 0 where masked and for rows that
    // saw no key (LSE = −inf: never exp2(−inf − −inf) = NaN).
    let (r0, r1) = (q0 as i64, (q0 + rows) as i64);
    let (full_start, full_end) = hd.win.unmasked_range(r0, r1);
    let masked = (k0 as i64) < full_start || (k0 + kv_rows) as i64 > full_end;
    block_gemm(Operand::rows(&t.s_q), Operand::rows(&t.s_k), rows, kv_rows, d, |r, c, acc| {
        let (i, jk) = (q0 + r, k0 + c);
        let lse2 = t.s_lse.get(r, 0);
        let visible = (!masked || hd.win.visible(i as i64, jk as i64)) && lse2 != f32::NEG_INFINITY;
        let pv = if visible { (hd.score.apply(acc, i, jk) - lse2).exp2() } else { 0.0 };
        t.s_p.set(r, c, pv);
        if softcap {
            let th = (acc * hd.score.cap_pre).tanh();
            t.s_cap.set(r, c, 1.0 - th * th);
        }
    });
    sync_threads();

    // dV_j += P_ijᵀ dO_i.
    block_gemm(Operand::cols(&t.s_p), Operand::cols(&t.s_do), kv_rows, d, rows, |c, col, acc| {
        t.s_dv.set(c, col, t.s_dv.get(c, col) + acc);
    });
    sync_threads(); // P read by everyone before dS overwrites it

    // dP_ij = dO_i V_jᵀ; dS_ij = P_ij ∘ (dP_ij − D_i) (∘ softcap factor), in place of P.
    block_gemm(Operand::rows(&t.s_do), Operand::rows(&t.s_v), rows, kv_rows, d, |r, c, acc| {
        let mut ds = t.s_p.get(r, c) * (acc - t.s_delta.get(r, 0));
        if softcap {
            ds *= t.s_cap.get(r, c);
        }
        t.s_p.set(r, c, ds);
    });
    sync_threads();

    // dK_j += dS_ijᵀ Q_i (scaled at the store).
    block_gemm(Operand::cols(&t.s_p), Operand::cols(&t.s_q), kv_rows, d, rows, |c, col, acc| {
        t.s_dk.set(c, col, t.s_dk.get(c, col) + acc);
    });

    // dQ_i += scale · dS_ij K_j into the f32 accumulator.
    let acc_base = (p.dq_accum_ptr as *mut f32).wrapping_add((hd.lse_base + q0) * d);
    block_gemm(Operand::rows(&t.s_p), Operand::cols(&t.s_k), rows, d, kv_rows, |r, col, acc| {
        let a = acc_base.wrapping_add(r * d + col);
        // SAFETY: row lse_base + q0 + r < the LSE's length, col < d: inside
        // the accumulator; `Owned` rows are touched by this block only.
        unsafe {
            match dq {
                DqUpdate::Atomic => red_add_f32(a, scale * acc),
                DqUpdate::Owned => *a += scale * acc,
            }
        }
    });
}

/// Block-wide: `dK_j · scale`, `dV_j` (f32 accumulators) to HBM rows
/// `k0..k0 + kv_rows`, and the accumulators back to 0.
#[inline(always)]
pub fn store_dkv(t: &Tiles, g_dk: &GlobalRows, g_dv: &GlobalRows, k0: usize, kv_rows: usize, d: usize, scale: f32) {
    sync_threads(); // every step's products are in s_dk, s_dv
    let mut idx = tid();
    while idx < kv_rows * d {
        let (r, c) = (idx / d, idx % d);
        g_dk.set(k0 + r, c, scale * t.s_dk.get(r, c));
        g_dv.set(k0 + r, c, t.s_dv.get(r, c));
        t.s_dk.set(r, c, 0.0);
        t.s_dv.set(r, c, 0.0);
        idx += F32_THREADS as usize;
    }
}

/// Release of this block's dQ additions: every thread's writes ordered
/// before the signal that the caller sends after a `sync_threads`.
#[inline(always)]
pub fn release_dq() {
    fence_acq_rel_gpu();
    sync_threads();
}
