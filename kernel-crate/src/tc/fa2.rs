//! FA2 loop order on tensor cores (FA2 paper, Algorithm 1; seed 001).
//!
//! Grid: one block per (Q block of `Br = 16·NW` rows, batch·head), flattened
//! into `blockIdx.x` (Q block fastest, so blocks of one head run together and
//! share K/V in L2; causal blocks are issued longest first). Each warp owns 16
//! query rows: its Q fragments stay in registers (`QREG`, or are re-read
//! from shared memory for d = 256), its S and O accumulators in registers.
//!
//! Per K/V block `j` (`Bc` keys):
//! 1. wait for `K_j` (and `V_j`, unless `SPLIT_WAIT`; both were issued one
//!    iteration earlier), barrier, issue `cp.async` of `K_{j+1}`, `V_{j+1}`
//!    into the other buffers (double buffering: the loads fly during 2–5);
//! 2. `S = Q·K_jᵀ` (`ldmatrix` of K, `mma.m16n8k16`);
//! 3. scale by `softmax_scale·log2(e)`, mask (causal diagonal blocks and the
//!    key tail only);
//! 4. online softmax: row max over the quad (2 shuffles), `RowState::rescale`,
//!    `P = exp2(S − m)`, per-thread partial `l_i`, `O *= alpha`;
//! 5. (`SPLIT_WAIT`: wait for `V_j`, barrier), `O += P·V_j` with P taken
//!    straight from the S accumulators as the A operand and V through
//!    `ldmatrix.trans`.
//!
//! Epilogue: the quad sums `l_i`, `O /= l_i` once, store O and the logsumexp.

use super::tile::{FragTile, SmemTile, tile_bytes};
use super::{Elem16, mma, pack};
use crate::arch::cp_async::{cp_async_commit, cp_async_wait};
use crate::arch::shfl::{shfl_xor_f32, vote_all};
use crate::arch::smem::{dynamic_smem, ld_volatile_shared_u32, smem_addr, st_shared_u32};
use crate::arch::sreg;
use crate::arch::sync::sync_threads;
use flash_attn_common::{AttnParams, Real, RowState};

/// Max over the 4 lanes of a quad (the lanes holding one accumulator row).
#[inline(always)]
pub fn quad_max(x: f32) -> f32 {
    let x = x.max(shfl_xor_f32(x, 1));
    x.max(shfl_xor_f32(x, 2))
}

/// Sum over the 4 lanes of a quad.
#[inline(always)]
pub fn quad_sum(x: f32) -> f32 {
    let x = x + shfl_xor_f32(x, 1);
    x + shfl_xor_f32(x, 2)
}

/// `min(max(x, 0), hi)` for key bounds.
#[inline(always)]
pub fn clamp_keys(x: i64, hi: usize) -> usize {
    if x <= 0 { 0 } else if x as u64 >= hi as u64 { hi } else { x as usize }
}

/// XORs the sign bits of a fragment's 16-bit pairs with `q_sign`
/// (`0x8000_8000` negates exactly, 0 leaves it): a negative softmax scale is
/// applied as `|scale| · (−q)·k`, so the softmax only ever sees scale ≥ 0.
#[inline(always)]
pub fn sign(a: [u32; 4], q_sign: u32) -> [u32; 4] {
    [a[0] ^ q_sign, a[1] ^ q_sign, a[2] ^ q_sign, a[3] ^ q_sign]
}

/// The softmax scale (base 2) as `(q_sign, |scale|)`: a negative scale is
/// applied by negating Q's fragments ([`sign`]).
#[inline(always)]
pub fn scale_sign(scale_log2: f32) -> (u32, f32) {
    (if scale_log2 < 0.0 { 0x8000_8000 } else { 0 }, scale_log2.abs())
}

/// `S = Q·K_jᵀ` for one warp's `MT` m-tiles of 16 rows: `r_s[mt][n]` is the
/// 16×8 accumulator of m-tile `mt` and keys `8n..8n+8` of the block. Each K
/// fragment read from shared memory feeds `MT` products.
#[inline(always)]
pub unsafe fn qk<T: Elem16, const D: usize, const DK: usize, const BCN: usize, const MT: usize, const QREG: bool>(
    r_q: &[[[u32; 4]; DK]; MT],
    s_q: impl FragTile,
    q_row0: usize,
    q_sign: u32,
    s_k: impl FragTile,
    lane: usize,
) -> [[[f32; 4]; BCN]; MT] {
    let mut r_s = [[[0f32; 4]; BCN]; MT];
    for kk in 0..DK {
        let mut a = [[0u32; 4]; MT];
        for mt in 0..MT {
            // SAFETY: tiles were filled and a barrier passed (caller).
            a[mt] = if QREG { r_q[mt][kk] } else { sign(unsafe { s_q.a_frag(q_row0 + 16 * mt, kk * 16, lane) }, q_sign) };
        }
        for np in 0..BCN / 2 {
            // SAFETY: as above.
            let b = unsafe { s_k.bt_frag_x2(np * 16, kk * 16, lane) };
            for mt in 0..MT {
                mma::<T>(&mut r_s[mt][2 * np], &a[mt], &[b[0], b[1]]);
                mma::<T>(&mut r_s[mt][2 * np + 1], &a[mt], &[b[2], b[3]]);
            }
        }
    }
    r_s
}

/// `acc += P·V_j` with P (per m-tile 16 × Bc, in the S accumulator layout)
/// converted in registers to A fragments; each V fragment feeds `MT` products.
#[inline(always)]
pub unsafe fn pv<T: Elem16, const D: usize, const DN: usize, const BCN: usize, const BCK: usize, const MT: usize>(
    acc: &mut [[[f32; 4]; DN]; MT],
    r_s: &[[[f32; 4]; BCN]; MT],
    s_v: impl FragTile,
    lane: usize,
) {
    for kk in 0..BCK {
        let mut a = [[0u32; 4]; MT];
        for mt in 0..MT {
            let (s0, s1) = (&r_s[mt][2 * kk], &r_s[mt][2 * kk + 1]);
            a[mt] = [pack::<T>(s0[0], s0[1]), pack::<T>(s0[2], s0[3]), pack::<T>(s1[0], s1[1]), pack::<T>(s1[2], s1[3])];
        }
        for np in 0..DN / 2 {
            // SAFETY: V tile filled and a barrier passed (caller).
            let b = unsafe { s_v.b_frag_trans_x2(kk * 16, np * 16, lane) };
            for mt in 0..MT {
                mma::<T>(&mut acc[mt][2 * np], &a[mt], &[b[0], b[1]]);
                mma::<T>(&mut acc[mt][2 * np + 1], &a[mt], &[b[2], b[3]]);
            }
        }
    }
}

/// Masks (to −inf) the raw scores of keys outside each row's visible range
/// `[lo[r], hi[r])` (for the thread's rows `g` and `g + 8` of the m-tile;
/// [`flash_attn_common::KeyWindow`]).
///
/// The bounds are turned once into 32-bit offsets from the thread's first
/// column (`k0 + 2t`), clamped to `[−1, Bc]`, so each element costs 32-bit
/// compares against constants. (The 64-bit compares this replaced cost
/// enough registers to make d = 64, Bc = 128 spill.)
#[inline(always)]
pub fn mask<const BCN: usize>(r_s: &mut [[f32; 4]; BCN], k0: usize, t: usize, lo: [i64; 2], hi: [i64; 2]) {
    let col0 = (k0 + 2 * t) as i64;
    let bc = (8 * BCN) as i64;
    let rel_lo = [(lo[0] - col0).clamp(-1, bc) as i32, (lo[1] - col0).clamp(-1, bc) as i32];
    let rel_hi = [(hi[0] - col0).clamp(-1, bc) as i32, (hi[1] - col0).clamp(-1, bc) as i32];
    for n in 0..BCN {
        for e in 0..4 {
            let c = (n * 8 + (e & 1)) as i32;
            if c < rel_lo[e >> 1] || c >= rel_hi[e >> 1] {
                r_s[n][e] = f32::NEG_INFINITY;
            }
        }
    }
}

/// The score modifiers of one (sequence, head) in the base-2 domain
/// (`AttnParams::softcap_pre`, ALiBi slope × log2 e): the `MODS` kernels
/// apply them to the raw scores before masking, and then run the softmax
/// with a scale of 1.
#[derive(Clone, Copy)]
pub struct Mods {
    /// `|scale|·log2 e` (no softcap) — the sign is folded into Q.
    pub scale_log2: f32,
    /// Softcap: `cap·log2 e · tanh(|scale|/cap · s)`; `cap_post == 0` = off.
    pub cap_pre: f32,
    pub cap_post: f32,
    /// ALiBi slope × log2 e (0 = off).
    pub slope_log2: f32,
}

impl Mods {
    /// # Safety
    /// `p.alibi_ptr`, if set, holds the slopes (host-checked shape).
    #[inline(always)]
    pub unsafe fn new(p: &AttnParams, b: usize, h: usize, scale_log2: f32) -> Self {
        let cap = p.softcap;
        Self {
            scale_log2,
            cap_pre: p.softcap_pre.abs(),
            cap_post: cap * flash_attn_common::LOG2_E,
            // SAFETY: caller.
            slope_log2: unsafe { p.alibi_slope_log2(b as u32, h as u32) },
        }
    }

    /// Whether the call sets a softcap or ALiBi slopes (the decode kernels
    /// carry the modifiers but most calls have none).
    #[inline(always)]
    pub fn active(&self) -> bool {
        self.cap_post != 0.0 || self.slope_log2 != 0.0
    }

    /// Replaces one m-tile's raw scores by the modified base-2 scores.
    /// `pos[r]` is the key position `i + seqlen_k − seqlen_q` of row `g + 8r`.
    #[inline(always)]
    pub fn apply<const BCN: usize>(&self, r_s: &mut [[f32; 4]; BCN], k0: usize, t: usize, pos: [i64; 2]) {
        let rel = [(pos[0] - (k0 + 2 * t) as i64) as i32, (pos[1] - (k0 + 2 * t) as i64) as i32];
        for n in 0..BCN {
            for e in 0..4 {
                let x = r_s[n][e];
                let mut y = if self.cap_post != 0.0 { self.cap_post * (x * self.cap_pre).tanh() } else { x * self.scale_log2 };
                if self.slope_log2 != 0.0 {
                    let dist = rel[e >> 1] - (n * 8 + (e & 1)) as i32;
                    y -= self.slope_log2 * dist.unsigned_abs() as f32;
                }
                r_s[n][e] = y;
            }
        }
    }
}

/// Scales the raw scores of row `r` (0: row g, 1: row g + 8) in place to the
/// base-2 domain, `scale · s`. The scale is never negative: the host's sign
/// is folded into Q ([`sign`]). In `MASKED` blocks a −inf raw score
/// (masked) stays −inf even for a zero scale (never `0 · −inf = NaN`).
///
/// Scaling before the maximum (FMUL, then FADD in [`exp_row`]) rather than
/// one `fma(s, scale, −m)`: the maximum element then gives `exp2(0) = 1`
/// exactly. With the FMA it gives `2^r`, `r` the f32 rounding of
/// `s_max · scale`; at logits ~1e4 that is `1 + 3e-4`, which P rounds away
/// in f16 before P·V but `l_i` keeps, an f16 ulp of error on rows that one
/// key dominates (found by `gpu_half_large_logits_stay_finite`).
#[inline(always)]
pub fn scale_row<const BCN: usize, const MASKED: bool>(r_s: &mut [[f32; 4]; BCN], r: usize, scale_log2: f32) {
    for n in 0..BCN {
        for e in 2 * r..2 * r + 2 {
            let s = r_s[n][e];
            r_s[n][e] = if MASKED && s == f32::NEG_INFINITY { s } else { s * scale_log2 };
        }
    }
}

/// Row maximum (over the quad) of the scaled scores of row `r`.
#[inline(always)]
pub fn row_max<const BCN: usize>(r_s: &[[f32; 4]; BCN], r: usize) -> f32 {
    let mut mx = f32::NEG_INFINITY;
    for n in 0..BCN {
        mx = mx.max(r_s[n][2 * r]).max(r_s[n][2 * r + 1]);
    }
    quad_max(mx)
}

/// Replaces the scaled scores of row `r` by `P = exp2(s − m_safe)` and
/// returns the thread's partial row sum.
///
/// Four independent partial sums (element `i` of the row goes to `i % 4`),
/// then a tree: a dependency chain of `Bc/16 + 2` adds instead of `Bc/4`
/// (ncu showed the softmax stalled on fixed-latency dependencies with two
/// warps per scheduler; docs/perf-notes.md step 8). The same for the row
/// maximum made d = 96, Bc = 96 spill.
#[inline(always)]
pub fn exp_row<const BCN: usize>(r_s: &mut [[f32; 4]; BCN], r: usize, m_safe: f32) -> f32 {
    let mut sum = [0.0f32; 4];
    for n in 0..BCN {
        for e in 0..2 {
            let pe = (r_s[n][2 * r + e] - m_safe).exp2();
            r_s[n][2 * r + e] = pe;
            sum[(2 * n + e) % 4] += pe;
        }
    }
    (sum[0] + sum[1]) + (sum[2] + sum[3])
}

/// One online-softmax step for the warp's `MT` m-tiles (`RowState`: the same
/// code the CPU property tests run): new row maxima, rescale of `l_i` and of
/// the O accumulators, `P = exp2(S − m)`, partial `l_i` (summed over the quad
/// once, at the end).
#[inline(always)]
pub fn softmax_step<const BCN: usize, const DN: usize, const MT: usize, const MASKED: bool>(
    r_s: &mut [[[f32; 4]; BCN]; MT],
    r_o: &mut [[[f32; 4]; DN]; MT],
    st: &mut [[RowState<f32>; 2]; MT],
    scale_log2: f32,
) {
    let mut alpha = [[1f32; 2]; MT];
    let mut unchanged = true;
    for mt in 0..MT {
        for r in 0..2 {
            scale_row::<BCN, MASKED>(&mut r_s[mt], r, scale_log2);
            let (a, m_safe) = st[mt][r].rescale(row_max::<BCN>(&r_s[mt], r));
            alpha[mt][r] = a;
            unchanged &= a == 1.0;
            let sum = exp_row::<BCN>(&mut r_s[mt], r, m_safe);
            st[mt][r].accumulate(sum);
        }
    }
    // Once the row maxima settle, most blocks leave every row's maximum where
    // it was (alpha == 1): the warp then skips the O rescale entirely (one
    // vote instead of 4·DN·MT multiplies per thread).
    if !vote_all(unchanged) {
        for mt in 0..MT {
            for n in 0..DN {
                for e in 0..4 {
                    r_o[mt][n][e] *= alpha[mt][e >> 1];
                }
            }
        }
    }
}

/// Where a thread stands: its block's (batch, head) `bh = b·nheads + h` and
/// Q block `mb` (from `blockIdx.x`, Q blocks fastest, longest first when
/// causal), its warp, lane, quad row `g` and quad lane `t`.
#[derive(Clone, Copy)]
pub struct BlockPos {
    pub bh: usize,
    pub mb: usize,
    pub b: usize,
    pub h: usize,
    pub tid: usize,
    pub warp: usize,
    pub lane: usize,
    pub g: usize,
    pub t: usize,
}

impl BlockPos {
    /// From the block and thread indices; `num_m = ceil(seqlen_q / Br)`.
    #[inline(always)]
    pub fn new(p: &AttnParams, num_m: usize, block_idx: u32, thread_idx: u32) -> Self {
        // 32-bit division: the grid has fewer than 2³¹ blocks (host-checked).
        let (idx, nm) = (block_idx, num_m as u32);
        let bh = idx / nm;
        let mb = if p.causal != 0 { nm - 1 - idx % nm } else { idx % nm };
        let (b, h) = (bh / p.nheads, bh % p.nheads);
        let tid = thread_idx as usize;
        let (warp, lane) = (tid / 32, tid % 32);
        Self { bh: bh as usize, mb: mb as usize, b: b as usize, h: h as usize, tid, warp, lane, g: lane / 4, t: lane % 4 }
    }
}

/// The key window of this thread's sequence and the sequence row of its
/// first accumulator row (`q0 + warp·16·MT + g`), derived afresh from the
/// special registers and the parameters (see the prologue of [`forward`]).
#[inline(always)]
fn fresh_window<const MT: usize, const NW: usize, const VARLEN: bool, const DECODE: bool>(
    p: &AttnParams,
    num_m: usize,
) -> (usize, flash_attn_common::KeyWindow) {
    let (idx, tid) = sreg::block_and_thread_idx_fresh();
    let (idx, _) = split_of::<DECODE>(p, num_m, idx);
    let BlockPos { b, h, mb, warp, g, .. } = BlockPos::new(p, num_m, idx, tid);
    // SAFETY: host-checked varlen arrays (values clamped inside).
    let seq = unsafe { seq_of::<VARLEN, DECODE>(p, b, h) };
    (mb * 16 * MT * NW + warp * 16 * MT + g, p.key_window(seq.seqlen_q, seq.seqlen_k))
}

/// Sequence `b` of head `h`: `VARLEN` kernels read the prefix sums (a
/// separate kernel: holding a sequence's offsets costs the dense tiles
/// their spill-free register budget).
///
/// # Safety
/// As [`AttnParams::seq`].
#[inline(always)]
pub unsafe fn seq_of<const VARLEN: bool, const DECODE: bool>(p: &AttnParams, b: usize, h: usize) -> flash_attn_common::SeqInfo {
    // SAFETY: caller.
    if DECODE {
        unsafe { p.seq_general(b as u32, h as u32) }
    } else if VARLEN {
        unsafe { p.seq(b as u32, h as u32) }
    } else {
        p.dense_seq(b as u32, h as u32)
    }
}

/// The K/V blocks of the query rows `q0..q_end` of a sequence with `nk`
/// keys under `win`: blocks `j_first..j_end` of `Bc` keys that some row
/// sees — with `split` and more than one split, this split's share of them
/// (maybe none) — and the key range every row sees (no mask), clamped to
/// `0..=nk`: `(j_first, j_end, full_start, full_end)`.
#[inline(always)]
pub fn key_blocks<const BC: usize>(p: &AttnParams, win: &flash_attn_common::KeyWindow, q0: usize, q_end: usize, nk: usize, split: Option<u32>) -> (usize, usize, u32, u32) {
    let (kv_start, kv_end) = win.block_range(q0 as i64, q_end as i64);
    let (full_start, full_end) = win.unmasked_range(q0 as i64, q_end as i64);
    let (full_start, full_end) = (full_start.clamp(0, nk as i64) as u32, full_end.clamp(0, nk as i64) as u32);
    let j_first = kv_start as usize / BC;
    let j_end = if kv_start < kv_end { (kv_end as usize).div_ceil(BC) } else { j_first };
    match split {
        Some(s) if p.num_splits > 1 => {
            // (The flash-decoding kernel's contiguous share is the same
            // three lines, kept apart: decode step 39, review.)
            let per = (j_end - j_first).div_ceil(p.num_splits as usize);
            let first = (j_first + s as usize * per).min(j_end);
            (first, (first + per).min(j_end), full_start, full_end)
        }
        _ => (j_first, j_end, full_start, full_end),
    }
}

/// Split-KV: `blockIdx.x = ((bh · splits) + split) · num_m + m`. Returns the
/// block index without the split (as [`BlockPos::new`] reads it) and the
/// split; `(idx, 0)` unless `DECODE` with more than one split.
#[inline(always)]
pub fn split_of<const DECODE: bool>(p: &AttnParams, num_m: usize, idx: u32) -> (u32, u32) {
    if !DECODE || p.num_splits <= 1 {
        return (idx, 0);
    }
    let (nm, ns) = (num_m as u32, p.num_splits);
    let rest = idx / nm;
    ((rest / ns) * nm + idx % nm, rest % ns)
}

/// Where the K (or V) rows of one (sequence, KV head) live: one strided
/// matrix (dense, varlen, contiguous KV cache) or pages (paged KV cache).
#[derive(Clone, Copy)]
pub struct KvRows {
    /// Row 0 (dense), or the head's offset inside a page (paged).
    base: *const u16,
    row_stride: u64,
    page_stride: u64,
    b: u32,
    paged: bool,
}

impl KvRows {
    /// # Safety
    /// As [`AttnParams::seq`] / [`AttnParams::kv_batch`].
    #[inline(always)]
    pub unsafe fn new<const DECODE: bool>(p: &AttnParams, ptr: u64, stride: [u64; 3], b: usize, kvh: u64, k_row0: u64) -> Self {
        let head = (ptr as *const u16).wrapping_add((kvh * stride[2]) as usize);
        if DECODE && p.block_table_ptr != 0 {
            return Self { base: head, row_stride: stride[1], page_stride: stride[0], b: b as u32, paged: true };
        }
        // SAFETY: caller.
        let kb = if DECODE { unsafe { p.kv_batch(b as u32) } } else { b as u32 } as u64;
        let base = head.wrapping_add((kb * stride[0] + k_row0 * stride[1]) as usize);
        Self { base, row_stride: stride[1], page_stride: 0, b: b as u32, paged: false }
    }

    /// `cp.async` of key rows `k0..k0 + rows` into `tile` (rows `≥ valid`
    /// and columns `≥ d` zero-filled).
    ///
    /// # Safety
    /// `k0 + valid` at most the sequence's (clamped) length; as
    /// [`SmemTile::load_async`].
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn load<const D: usize>(&self, p: &AttnParams, tile: SmemTile<D>, k0: usize, rows: usize, valid: usize, d: usize, tid: usize, nt: usize) {
        if self.paged {
            // SAFETY: forwarded; rows < valid lie in the sequence.
            unsafe { tile.load_rows_async(self.base, |r| self.row(p, k0 + r), rows, valid, d, tid, nt) }
        } else {
            // SAFETY: forwarded.
            unsafe { tile.load_async(self.base.wrapping_add(k0 * self.row_stride as usize), self.row_stride, rows, valid, d, tid, nt) }
        }
    }

    /// Address of key row `t` of the sequence.
    ///
    /// # Safety
    /// `t` below the sequence's (clamped) length.
    #[inline(always)]
    pub unsafe fn row(&self, p: &AttnParams, t: usize) -> *const u16 {
        if self.paged {
            // SAFETY: caller.
            let page = unsafe { p.page_of(self.b, t as u32) } as u64;
            let r = p.page_row(t as u32) as u64;
            self.base.wrapping_add((page * self.page_stride + r * self.row_stride) as usize)
        } else {
            self.base.wrapping_add(t * self.row_stride as usize)
        }
    }
}

/// The FA2 forward kernel body (see the module docs). Each warp owns `MT`
/// m-tiles of 16 query rows: `Br = 16·MT·NW`. GQA, varlen, window and head
/// dims below `D` (zero-padded columns) are run-time parameters of every
/// kernel; softcap and ALiBi need `MODS` (per-element work in the softmax).
///
/// # Safety
/// As the exported entry points: `p` valid (checked by the host), launched
/// with `32·NW` threads, `fa2_tc_smem_bytes(D, MT·NW, BC)` of dynamic shared
/// memory and `ceil(seqlen_q / Br) · batch · nheads` blocks.
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
    const { assert!(DK * 16 == D && DN * 8 == D && BCN * 8 == BC && BCK * 16 == BC && DN % 2 == 0 && BCN % 2 == 0) };
    // ---- prologue: who am I, what do I read --------------------------------
    let br = 16 * MT * NW;
    let nt = 32 * NW;
    let num_m = (p.seqlen_q as usize).div_ceil(br);
    let (idx, split) = split_of::<DECODE>(p, num_m, sreg::block_idx_x());
    let BlockPos { b, h, mb, tid, warp, lane, g, t, .. } = BlockPos::new(p, num_m, idx, sreg::thread_idx_x());
    // SAFETY: host-checked varlen/KV-cache arrays (values clamped inside).
    let seq = unsafe { seq_of::<VARLEN, DECODE>(p, b, h) };
    let (nq, nk) = (seq.seqlen_q as usize, seq.seqlen_k as usize);
    let q0 = mb * br;
    if q0 >= nq {
        return; // varlen: this Q block lies past its sequence (block-uniform)
    }
    let d = p.headdim as usize;
    let w_row0 = warp * 16 * MT; // first row of this warp's m-tiles, in the block

    // Keys some row of the block sees, and keys every row sees (no mask).
    // Only the block indices and the no-mask range stay live across the
    // K/V loop (32-bit); masked blocks derive the window again
    // ([`fresh_window`]): at d = 128, Bc = 64 those registers decide
    // between a spill and none.
    let win = p.key_window(seq.seqlen_q, seq.seqlen_k);
    let (j_first, j_end, full_start, full_end) = key_blocks::<BC>(p, &win, q0, (q0 + br).min(nq), nk, DECODE.then_some(split));

    let kvh = p.kv_head(h as u32) as u64;
    let [qs0, qs1, qs2] = p.q_stride;
    let g_q = (p.q_ptr as *const u16).wrapping_add((b as u64 * qs0 + (seq.q_row0 + q0 as u64) * qs1 + h as u64 * qs2) as usize);
    // SAFETY: host-checked KV-cache arrays (values clamped inside).
    let g_k = unsafe { KvRows::new::<DECODE>(p, p.k_ptr, p.k_stride, b, kvh, seq.k_row0) };
    let g_v = unsafe { KvRows::new::<DECODE>(p, p.v_ptr, p.v_stride, b, kvh, seq.k_row0) };

    let base = smem_addr(dynamic_smem::<u8>());
    let s_q = SmemTile::<D> { base };
    let k_base = base + tile_bytes(br, D) as u32;
    let kv_bytes = tile_bytes(BC, D) as u32;
    let s_k = |buf: usize| SmemTile::<D> { base: k_base + buf as u32 * kv_bytes };
    let s_v = |buf: usize| SmemTile::<D> { base: k_base + (2 + buf) as u32 * kv_bytes };
    // Varlen and decode kernels keep the sequence's key count and the loop
    // bounds in shared memory (read where used: no registers held across
    // the loop), dense kernels in registers (theirs come from the parameter
    // space).
    const UNI_K: u32 = 0;
    const UNI_J_END: u32 = 4;
    const UNI_FULL_START: u32 = 8;
    const UNI_FULL_END: u32 = 12;
    // The 16 padding bytes of Q's row 0 (never read by ldmatrix, never
    // written by the loads: they cover columns < D only).
    let uni_addr = base + 2 * D as u32;
    let in_smem = VARLEN || DECODE;
    if in_smem && tid == 0 {
        // SAFETY: Q row 0's padding (row_bytes = 2·D + 16); read after the
        // loop's first barrier.
        unsafe {
            st_shared_u32(uni_addr + UNI_K, nk as u32);
            st_shared_u32(uni_addr + UNI_J_END, j_end as u32);
            st_shared_u32(uni_addr + UNI_FULL_START, full_start);
            st_shared_u32(uni_addr + UNI_FULL_END, full_end);
        }
    }
    // SAFETY: as above (only called after a barrier when `in_smem`).
    let uni = |off: u32, reg: u32| if in_smem { unsafe { ld_volatile_shared_u32(uni_addr + off) } } else { reg };
    let load_kv = |j: usize, nk: usize| {
        let k0 = j * BC;
        let valid = (nk - k0).min(BC);
        // SAFETY: rows k0..k0+valid of K and V exist (host-checked shapes,
        // varlen segments clamped to the buffers).
        unsafe {
            g_k.load(p, s_k(j & 1), k0, BC, valid, d, tid, nt);
            cp_async_commit();
            g_v.load(p, s_v(j & 1), k0, BC, valid, d, tid, nt);
            cp_async_commit();
        }
    };

    // SAFETY: rows q0..min(q0+br, nq) of Q exist.
    unsafe { s_q.load_async(g_q, qs1, br, (nq - q0).min(br), d, tid, nt) };
    cp_async_commit();
    if j_first < j_end {
        load_kv(j_first, nk);
    }

    let mut r_o = [[[0f32; 4]; DN]; MT];
    let mut st = [[RowState::<f32>::new(); 2]; MT];
    let mut r_q = [[[0u32; 4]; DK]; MT];
    let (q_sign, scale_log2) = scale_sign(p.softmax_scale_log2);
    // SAFETY: host-checked ALiBi slopes.
    let mods = if MODS { unsafe { Mods::new(p, b, h, scale_log2) } } else { Mods { scale_log2, cap_pre: 0.0, cap_post: 0.0, slope_log2: 0.0 } };
    // With the modifiers applied the scores arrive scaled (base 2); without
    // (none set, or not compiled in) the softmax scales them.
    let soft_scale = if MODS && mods.active() { 1.0 } else { scale_log2 };

    // ---- main loop over K/V blocks -----------------------------------------
    // The first bound check reads the register (no barrier passed yet); the
    // loop's barrier comes before every later read of the uniforms.
    let mut j = j_first;
    let mut go = j_first < j_end;
    while go {
        // K_j and V_j were issued together one iteration ago (or in the
        // prologue). One barrier makes what landed visible to every warp and
        // frees buffers (j+1)&1 (last read in iteration j−1) for the prefetch
        // below. `SPLIT_WAIT` waits here for K_j only and for V_j just before
        // P·V (a second barrier); else for both here (docs/perf-notes.md,
        // step 5: d = 128 prefers the split, d = 256 the single barrier).
        if SPLIT_WAIT {
            cp_async_wait::<1>();
        } else {
            cp_async_wait::<0>();
        }
        sync_threads();
        if QREG && j == j_first {
            for mt in 0..MT {
                for kk in 0..DK {
                    // SAFETY: Q landed and a barrier passed.
                    r_q[mt][kk] = sign(unsafe { s_q.a_frag(w_row0 + 16 * mt, kk * 16, lane) }, q_sign);
                }
            }
        }
        let more = j + 1 < uni(UNI_J_END, j_end as u32) as usize;
        if more {
            load_kv(j + 1, uni(UNI_K, nk as u32) as usize);
        }

        // SAFETY: K_j landed and a barrier passed.
        let mut r_s = unsafe { qk::<T, D, DK, BCN, MT, QREG>(&r_q, s_q, w_row0, q_sign, s_k(j & 1), lane) };
        let k0 = j * BC;
        if MODS && mods.active() {
            let (row0, win) = fresh_window::<MT, NW, VARLEN, DECODE>(p, num_m);
            for mt in 0..MT {
                let r0 = (row0 + 16 * mt) as i64 + win.shift;
                mods.apply(&mut r_s[mt], k0, t, [r0, r0 + 8]);
            }
        }
        if (k0 as u32) < uni(UNI_FULL_START, full_start) || (k0 + BC) as u32 > uni(UNI_FULL_END, full_end) {
            // Window edge, diagonal (causal) or tail block: mask per element.
            let (row0, win) = fresh_window::<MT, NW, VARLEN, DECODE>(p, num_m);
            for mt in 0..MT {
                let r0 = (row0 + 16 * mt) as i64;
                mask(&mut r_s[mt], k0, t, [win.lo(r0), win.lo(r0 + 8)], [win.hi(r0), win.hi(r0 + 8)]);
            }
            softmax_step::<BCN, DN, MT, true>(&mut r_s, &mut r_o, &mut st, soft_scale);
        } else {
            softmax_step::<BCN, DN, MT, false>(&mut r_s, &mut r_o, &mut st, soft_scale);
        }

        if SPLIT_WAIT {
            if more {
                cp_async_wait::<2>(); // V_j landed (K_{j+1}, V_{j+1} may fly)
            } else {
                cp_async_wait::<0>();
            }
            sync_threads();
        }
        // SAFETY: V_j landed and a barrier passed.
        unsafe { pv::<T, D, DN, BCN, BCK, MT>(&mut r_o, &r_s, s_v(j & 1), lane) };
        go = more;
        j += 1;
    }
    // Never leave with copies in flight (the Q copy when no key block ran;
    // a no-op otherwise: the last block waited for everything).
    cp_async_wait::<0>();

    // ---- epilogue: one 1/l, store O and the logsumexp -----------------------
    // Block coordinates derived again from the special registers (and the
    // sequence again from its prefix sums) rather than kept live across the
    // K/V loop: at d = 128, Bc = 64 that register is the difference between
    // a spill and none.
    let (idx, tid) = sreg::block_and_thread_idx_fresh();
    let (idx, split) = split_of::<DECODE>(p, num_m, idx);
    let BlockPos { b, h, mb, warp, g, t, .. } = BlockPos::new(p, num_m, idx, tid);
    // SAFETY: as in the prologue.
    let seq = unsafe { seq_of::<VARLEN, DECODE>(p, b, h) };
    if DECODE && p.num_splits > 1 {
        // Split-KV partial: normalized O and LSE in f32 for the combine.
        let d = p.headdim as usize;
        let lse_len = crate::decode::lse_len(p);
        let base = split as usize * lse_len + seq.lse_base as usize;
        let row_base = mb * br + warp * 16 * MT + g;
        for mt in 0..MT {
            for r in 0..2 {
                let row = row_base + 16 * mt + 8 * r;
                st[mt][r].l = quad_sum(st[mt][r].l);
                let inv_l = st[mt][r].inv_l();
                if row < seq.seqlen_q as usize {
                    let o_row = (p.o_accum_ptr as *mut f32).wrapping_add((base + row) * d);
                    for n in 0..DN {
                        let col = n * 8 + 2 * t;
                        if col < d {
                            // SAFETY: (split, row) inside the host's accumulator of
                            // splits·lse_len rows of d f32; col + 1 < d (d even).
                            unsafe { *(o_row.add(col) as *mut [f32; 2]) = [r_o[mt][n][2 * r] * inv_l, r_o[mt][n][2 * r + 1] * inv_l] };
                        }
                    }
                    if t == 0 {
                        // SAFETY: splits·lse_len f32.
                        unsafe { *(p.lse_accum_ptr as *mut f32).add(base + row) = st[mt][r].lse() };
                    }
                }
            }
        }
        return;
    }
    let nq = seq.seqlen_q as usize;
    let d = p.headdim as usize;
    let row_base = (mb * br + warp * 16 * MT + g) as u32;
    let [os0, os1, os2] = p.o_stride;
    let g_o = (p.o_ptr as *mut u16).wrapping_add((b as u64 * os0 + seq.q_row0 * os1 + h as u64 * os2) as usize);
    for mt in 0..MT {
        for r in 0..2 {
            let row = (row_base + (16 * mt + 8 * r) as u32) as usize;
            st[mt][r].l = quad_sum(st[mt][r].l);
            let inv_l = st[mt][r].inv_l();
            if row < nq {
                let o_row = g_o.wrapping_add(row * os1 as usize);
                for n in 0..DN {
                    let col = n * 8 + 2 * t;
                    if col < d {
                        let v = pack::<T>(r_o[mt][n][2 * r] * inv_l, r_o[mt][n][2 * r + 1] * inv_l);
                        // SAFETY: row < nq, col < d; 4-byte aligned (even col, host-checked strides).
                        unsafe { *(o_row.wrapping_add(col) as *mut u32) = v };
                    }
                }
                if t == 0 && p.lse_ptr != 0 {
                    // SAFETY: lse holds batch·nheads·nq (dense) or nheads·total_q (varlen) f32.
                    unsafe { *(p.lse_ptr as *mut f32).add(seq.lse_base as usize + row) = st[mt][r].lse() };
                }
            }
        }
    }
}
