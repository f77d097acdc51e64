//! Flash-decoding over an FP8 (e4m3) KV cache: the `F8` variant of
//! [`super::forward`] (`dec_f8_kernels!` in `tc/mod.rs`).
//!
//! Same grid, splits, masks, modifiers and epilogue as the 16-bit kernel,
//! with the cache read as one-byte codes:
//!
//! 1. `S` stages of codes stream in by `cp.async` ([`KvCopy::issue_f8`]:
//!    `Bc·D` bytes per tensor and block, half a 16-bit block's, in rows
//!    whose 16-byte chunks are swizzled or padded so that `ldmatrix` reads
//!    them without bank conflicts: `flash_attn_common::tc::dec_f8_offset`),
//!    the static split schedule only (no tickets), new keys appended before
//!    the launch;
//! 2. after the block's barrier each warp reads the tensor-core fragments of
//!    its `Bcw` keys **straight from the codes** and converts them in
//!    registers (`cvt.rn.f16x2.e4m3x2`, exact; bf16 through an exact bit
//!    move): no 16-bit tile, no second pass through shared memory.
//!    - K ([`qk_f8`]): `ldmatrix` on the codes gives lane `(g, t)` four
//!      consecutive codes `4t..4t+3` of key `g` in each 16-code chunk; they
//!      serve as the B fragment's `k` = `2t, 2t+1, 2t+8, 2t+9`, so the head
//!      dim is permuted within each chunk — Q's A fragments are read in the
//!      same order (two 8-byte loads per chunk, [`q_frag_f8`]).
//!    - V ([`pv_f8`]): `ldmatrix.trans` on 8×8 matrices of code *pairs*
//!      gives lane `(g, t)` codes `2g, 2g+1` of keys `2t, 2t+1`; two `prmt`s
//!      over the matrices of keys 0–7 and 8–15 make the B fragments of
//!      head-dim column `2g` (even n-tile) and `2g + 1` (odd n-tile), keys
//!      in the order P's accumulator layout has them. The output columns
//!      are thus interleaved per 16-dim chunk; the merge stores them back in
//!      order.
//! 3. `k_scale` multiplies the softmax scale (and the softcap's argument),
//!    `v_scale` the normalized output (`AttnParams::k_descale_ptr`, …).
//!
//! Why a function of its own rather than a `const F8` in [`super::forward`]:
//! the same source with the FP8 branches folded away compiled the tuned
//! 16-bit kernels differently (LLVM's inlining inside the larger generic
//! body) and ran them 30–45% slower on the H200 (bf16, d 128, 131k keys;
//! docs/perf-notes.md, FP8 KV cache). The epilogue below is therefore the
//! 16-bit kernel's, written out once more (with the interleaved columns).

use super::super::fa2::{BlockPos, Mods, key_blocks, mask, quad_sum, scale_sign, seq_of, sign, softmax_step, split_of};
use super::super::tile::{SmemTile, tile_bytes};
use super::super::{Elem16, mma, pack};
use super::{BR, KvCopy, Timeline, last_split, merge_stride};
use crate::arch::cp_async::{cp_async_cg_16_pf, cp_async_commit, cp_async_wait};
use crate::arch::cvt::{e4m3x4_to_bf16x2, e4m3x4_to_f16x2_scaled, prmt};
use crate::arch::ldmatrix::{ldmatrix_x2, ldmatrix_x2_trans, ldmatrix_x4, ldmatrix_x4_trans};
use crate::arch::opaque as arch_opaque;
use crate::arch::smem::{dynamic_smem, ld_shared_v2, smem_addr};
use crate::arch::sreg;
use crate::arch::sync::sync_threads;
use flash_attn_common::tc::{dec_f8_offset, dec_f8_row_bytes};
use flash_attn_common::{AttnParams, INTERLEAVE_PAGED, Real, RowState};

impl KvCopy {
    /// FP8 caches: issues this thread's copies of block `j`
    /// (`Bc` keys of `D` one-byte codes, `cpr = D/16` 16-byte chunks per
    /// row) into the stages at shared addresses `sk`, `sv` (chunk `c` of row
    /// `r` at `dec_f8_offset(D, r, c)`). Chunk `i = r·cpr + c` goes to thread
    /// `i % nt` (as [`KvCopy::issue_full`] orders them: coalesced). Rows at
    /// or past `nk` and columns at or past `d` (a multiple of 16: host) are
    /// zero-filled; a zero code is +0.
    ///
    /// # Safety
    /// As [`KvCopy::issue`] with byte pointers and strides (one byte per
    /// element); the stages hold `Bc` rows of `dec_f8_row_bytes(D)` each.
    #[inline(always)]
    unsafe fn issue_f8<const D: usize, const BC: usize, const NW: usize, const PF: u32>(&self, p: &AttnParams, sk: u32, sv: u32, j: usize, nk: usize, d: usize) {
        let cpr = D / 16;
        let at = |r: usize, c: usize| dec_f8_offset(D, r as u32, c as u32);
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
                let at = at(r0 + k * rstep, c);
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
                let at = at(r0 + k * rstep, c);
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
                cp_async_cg_16_pf::<PF>(sk + at(r, c), ks, n);
                cp_async_cg_16_pf::<PF>(sv + at(r, c), vs, n);
            }
            i += self.nt;
        }
    }

}

/// A K or V stage of e4m3 codes: `Bc` rows of `D` codes, chunk `c` of row
/// `r` at `dec_f8_offset(D, r, c)` (the 8 rows of an `ldmatrix` matrix in 8
/// bank groups).
#[derive(Clone, Copy)]
struct F8Stage<const D: usize> {
    base: u32,
}

impl<const D: usize> F8Stage<D> {
    #[inline(always)]
    fn addr(&self, row: usize, chunk: usize) -> u32 {
        self.base + dec_f8_offset(D, row as u32, chunk as u32)
    }

    /// K's codes for `S = Q·Kᵀ` through `ldmatrix` (8×8 matrices of code
    /// pairs: lane `(g, t)` gets codes `4t..4t+3` of row `g`): keys
    /// `n0..n0+8` and `n0+8..n0+16` × chunks `c0`, `c0 + 1`, returned as
    /// `[(n0, c0), (n0, c0+1), (n0+8, c0), (n0+8, c0+1)]`.
    ///
    /// # Safety
    /// All 32 lanes call it; the stage landed and a barrier passed.
    #[inline(always)]
    unsafe fn k_codes_x4(&self, n0: usize, c0: usize, lane: usize) -> [u32; 4] {
        let m = lane >> 3;
        // SAFETY: forwarded.
        unsafe { ldmatrix_x4(self.addr(n0 + (m >> 1) * 8 + (lane & 7), c0 + (m & 1))) }
    }

    /// [`F8Stage::k_codes_x4`] for one chunk: `[(n0, c), (n0+8, c)]` (two
    /// registers in flight instead of four: d = 256's accumulators leave no
    /// more room).
    ///
    /// # Safety
    /// As [`F8Stage::k_codes_x4`].
    #[inline(always)]
    unsafe fn k_codes_x2(&self, n0: usize, c: usize, lane: usize) -> [u32; 2] {
        // SAFETY: forwarded (lanes 16–31 repeat lanes 0–15's addresses).
        unsafe { ldmatrix_x2(self.addr(n0 + ((lane >> 3) & 1) * 8 + (lane & 7), c)) }
    }

    /// [`F8Stage::v_codes_trans_x4`] for one chunk: `[(k0, c), (k0+8, c)]`.
    ///
    /// # Safety
    /// As [`F8Stage::k_codes_x4`].
    #[inline(always)]
    unsafe fn v_codes_trans_x2(&self, k0: usize, c: usize, lane: usize) -> [u32; 2] {
        // SAFETY: forwarded.
        unsafe { ldmatrix_x2_trans(self.addr(k0 + ((lane >> 3) & 1) * 8 + (lane & 7), c)) }
    }

    /// V's codes for `O = P·V` through `ldmatrix.trans`: keys `k0..k0+8`
    /// and `k0+8..k0+16` × chunks `c0`, `c0 + 1`, returned as
    /// `[(k0, c0), (k0+8, c0), (k0, c0+1), (k0+8, c0+1)]`; lane `(g, t)`
    /// gets, of each, the bytes `[V[2t][2g], V[2t][2g+1], V[2t+1][2g],
    /// V[2t+1][2g+1]]` (keys and codes relative to the matrix).
    ///
    /// # Safety
    /// As [`F8Stage::k_codes_x4`].
    #[inline(always)]
    unsafe fn v_codes_trans_x4(&self, k0: usize, c0: usize, lane: usize) -> [u32; 4] {
        let m = lane >> 3;
        // SAFETY: forwarded.
        unsafe { ldmatrix_x4_trans(self.addr(k0 + (m & 1) * 8 + (lane & 7), c0 + (m >> 1))) }
    }
}

/// Four e4m3 codes (byte `i` = code `i`) as a B fragment `[b0, b1]` of
/// `T` by moving bits: codes 0, 2 → `b0`, codes 1, 3 → `b1`. bf16 exactly;
/// f16 times 2⁻⁸ ([`F16_CODE_SCALE`] goes back into the scales).
#[inline(always)]
fn codes_to_b<T: Elem16>(x: u32) -> [u32; 2] {
    if T::IS_BF16 { e4m3x4_to_bf16x2(x) } else { e4m3x4_to_f16x2_scaled(x) }
}

/// What [`codes_to_b`] leaves out of f16 fragments (2⁸; 1 for bf16): the
/// kernel multiplies it into `k_scale` and `v_scale`, exactly.
const F16_CODE_SCALE: f32 = 256.0;

/// Q's A fragment of head-dim chunk `kk` in the order K's codes give the
/// products' `k` ([`F8Stage::k_codes_x4`]): dims `16kk + 4t, +1` are
/// `k = 2t, 2t+1` and dims `16kk + 4t + 2, +3` are `k = 2t+8, 2t+9` — one
/// 8-byte load per row (`g`, `g + 8`).
///
/// # Safety
/// All lanes call it; Q landed and a barrier passed.
#[inline(always)]
unsafe fn q_frag_f8<const D: usize>(s_q: SmemTile<D>, kk: usize, lane: usize) -> [u32; 4] {
    let (g, t) = (lane / 4, lane % 4);
    // SAFETY: rows g, g + 8 < 16 and columns 16kk + 4t + 3 < D of the tile; 8-byte aligned.
    let (lo, hi) = unsafe { (ld_shared_v2(s_q.addr(g, 16 * kk + 4 * t)), ld_shared_v2(s_q.addr(g + 8, 16 * kk + 4 * t))) };
    [lo[0], hi[0], lo[1], hi[1]]
}

/// K's B fragment from the four codes `4t..4t+3` of a key
/// ([`F8Stage::k_codes_x4`]): reordered `[c0, c2, c1, c3]` so that
/// [`codes_to_b`] puts codes 0, 1 in `b0` (`k = 2t, 2t+1`) and 2, 3 in `b1`
/// (`k = 2t+8, 2t+9`), the order [`q_frag_f8`] reads Q's head dims in.
#[inline(always)]
fn k_b<T: Elem16>(x: u32) -> [u32; 2] {
    codes_to_b::<T>(prmt(x, 0, 0x3120))
}

/// `S = Q·K_jᵀ` for this warp's keys `row0..row0 + 8·BCWN` of the stage:
/// `r_s[n]` is the 16×8 accumulator of keys `row0 + 8n..`, in key order.
///
/// # Safety
/// All lanes call it; Q and the stage landed and a barrier passed.
#[inline(always)]
unsafe fn qk_f8<T: Elem16, const D: usize, const DK: usize, const BCWN: usize>(s_q: SmemTile<D>, q_sign: u32, sk: F8Stage<D>, row0: usize, lane: usize) -> [[f32; 4]; BCWN] {
    const { assert!(DK % 2 == 0 && BCWN % 2 == 0) };
    let mut r_s = [[0f32; 4]; BCWN];
    if D >= 256 {
        // One chunk at a time (registers: see `k_codes_x2`).
        for kk in 0..DK {
            // SAFETY: forwarded.
            let a = sign(unsafe { q_frag_f8(s_q, kk, lane) }, q_sign);
            for np in 0..BCWN / 2 {
                // SAFETY: forwarded.
                let x = unsafe { sk.k_codes_x2(row0 + 16 * np, kk, lane) };
                mma::<T>(&mut r_s[2 * np], &a, &k_b::<T>(x[0]));
                mma::<T>(&mut r_s[2 * np + 1], &a, &k_b::<T>(x[1]));
            }
        }
        return r_s;
    }
    for kp in 0..DK / 2 {
        // SAFETY: forwarded.
        let a = unsafe { [sign(q_frag_f8(s_q, 2 * kp, lane), q_sign), sign(q_frag_f8(s_q, 2 * kp + 1, lane), q_sign)] };
        for np in 0..BCWN / 2 {
            // SAFETY: forwarded.
            let x = unsafe { sk.k_codes_x4(row0 + 16 * np, 2 * kp, lane) };
            mma::<T>(&mut r_s[2 * np], &a[0], &k_b::<T>(x[0]));
            mma::<T>(&mut r_s[2 * np], &a[1], &k_b::<T>(x[1]));
            mma::<T>(&mut r_s[2 * np + 1], &a[0], &k_b::<T>(x[2]));
            mma::<T>(&mut r_s[2 * np + 1], &a[1], &k_b::<T>(x[3]));
        }
    }
    r_s
}

/// `prmt` selectors over V's two transposed code matrices (`lo`: keys
/// 0–7, bytes `[V[2t][2g], V[2t][2g+1], V[2t+1][2g], V[2t+1][2g+1]]`; `hi`:
/// keys 8–15, the same) giving, for head dim `2g` (even) or `2g + 1` (odd),
/// `[V[2t], V[2t+8], V[2t+1], V[2t+9]]`: [`codes_to_b`] then puts keys
/// `2t, 2t+1` in `b0` and `2t+8, 2t+9` in `b1`, P's accumulator order.
const V_EVEN: u32 = 0x6240;
const V_ODD: u32 = 0x7351;

/// `acc += P·V_j` for this warp's keys `row0..row0 + 16·BCWK` of the stage,
/// P from the S accumulators (key order). The output columns come
/// interleaved: `acc[2c]` holds head dims `16c + 2j` (column `j` of the
/// n-tile), `acc[2c + 1]` dims `16c + 2j + 1`.
///
/// # Safety
/// As [`qk_f8`].
#[inline(always)]
unsafe fn pv_f8<T: Elem16, const D: usize, const DN: usize, const BCWN: usize, const BCWK: usize>(acc: &mut [[f32; 4]; DN], r_s: &[[f32; 4]; BCWN], sv: F8Stage<D>, row0: usize, lane: usize) {
    const { assert!(DN % 4 == 0 && 2 * BCWK == BCWN) };
    for kk in 0..BCWK {
        let (s0, s1) = (&r_s[2 * kk], &r_s[2 * kk + 1]);
        let a = [pack::<T>(s0[0], s0[1]), pack::<T>(s0[2], s0[3]), pack::<T>(s1[0], s1[1]), pack::<T>(s1[2], s1[3])];
        if D >= 256 {
            for c in 0..DN / 2 {
                // SAFETY: forwarded.
                let [k_lo, k_hi] = unsafe { sv.v_codes_trans_x2(row0 + 16 * kk, c, lane) };
                mma::<T>(&mut acc[2 * c], &a, &codes_to_b::<T>(prmt(k_lo, k_hi, V_EVEN)));
                mma::<T>(&mut acc[2 * c + 1], &a, &codes_to_b::<T>(prmt(k_lo, k_hi, V_ODD)));
            }
            continue;
        }
        for cp in 0..DN / 4 {
            // SAFETY: forwarded.
            let x = unsafe { sv.v_codes_trans_x4(row0 + 16 * kk, 2 * cp, lane) };
            for h in 0..2 {
                let (k_lo, k_hi) = (x[2 * h], x[2 * h + 1]);
                let c = 2 * cp + h;
                mma::<T>(&mut acc[2 * c], &a, &codes_to_b::<T>(prmt(k_lo, k_hi, V_EVEN)));
                mma::<T>(&mut acc[2 * c + 1], &a, &codes_to_b::<T>(prmt(k_lo, k_hi, V_ODD)));
            }
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
    const { assert!(S >= 2 && S <= 6 && D % 16 == 0) };
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

    // ---- shared memory: Q, then S stages of K and V codes ------------------------
    let base = smem_addr(dynamic_smem::<u8>());
    let s_q = SmemTile::<D> { base };
    let kv_base = base + tile_bytes(BR, D) as u32;
    let f8_bytes = (BC * dec_f8_row_bytes(D)) as u32;
    let f8_k = |s: usize| kv_base + 2 * s as u32 * f8_bytes;
    let f8_v = |s: usize| f8_k(s) + f8_bytes;
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
    // The dequantization scales of this KV head: K's multiplies the scores
    // (softmax scale and softcap), V's the output.
    let i_scale = kvh as usize * p.descale_head_stride as usize;
    // SAFETY: host-checked scale arrays (one per tensor, or nheads_k).
    let (k_scale, v_scale) = unsafe { (*(p.k_descale_ptr as *const f32).add(i_scale), *(p.v_descale_ptr as *const f32).add(i_scale)) };
    // f16 fragments hold the codes times 2⁻⁸ (`codes_to_b`): both scales
    // take the 2⁸ back (exact).
    let code_scale = if T::IS_BF16 { 1.0 } else { F16_CODE_SCALE };
    let (k_scale, v_scale) = (k_scale * code_scale, v_scale * code_scale);
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
        match S {
            2 => cp_async_wait::<0>(),
            3 => cp_async_wait::<1>(),
            4 => cp_async_wait::<2>(),
            5 => cp_async_wait::<3>(),
            _ => cp_async_wait::<4>(),
        }
        sync_threads();
        let jn = fixed(i + S - 1);
        if jn != NONE {
            issue(jn, (i + S - 1) % S);
        }
        cp_async_commit();
        // This warp's keys, read straight from the codes.
        let (sk, sv) = (F8Stage::<D> { base: f8_k(i % S) }, F8Stage::<D> { base: f8_v(i % S) });
        // SAFETY: block j landed, a barrier passed (Q's too).
        let mut r_s = [unsafe { qk_f8::<T, D, DK, BCWN>(s_q, q_sign, sk, warp * BCW, lane) }];
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
        unsafe { pv_f8::<T, D, DN, BCWN, BCWK>(&mut r_o[0], &r_s[0], sv, warp * BCW, lane) };
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
        for c in 0..DN / 2 {
            // The interleaved columns of P·V (`pv_f8`) back in order: dims
            // 16c + 4t .. 16c + 4t + 4.
            let (e, o) = (&r_o[0][2 * c], &r_o[0][2 * c + 1]);
            // SAFETY: inside this warp's partial tile (row < 16, 16c + 4t + 3 < D);
            // 16-byte aligned (the area and the row stride d + 8 floats are).
            unsafe { *(dst.add(16 * c + 4 * t) as *mut [f32; 4]) = [e[2 * r], o[2 * r], e[2 * r + 1], o[2 * r + 1]] };
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
