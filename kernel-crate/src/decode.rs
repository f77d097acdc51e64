//! Decode helpers around the `fa2d` tensor-core kernels
//! (`tc::fa2`, `DECODE = true`): the combine of split-KV partials and the
//! in-place append of new keys and values to a KV cache.
//!
//! * `combine_splits_{f16,bf16}`: one warp per output row. The partials of
//!   `num_splits` splits (each O already normalized, `LSE_i` natural) are
//!   merged as seed 003 / FlashAttention-2's combine does (the LSEs of up
//!   to 128 splits read by the lanes at once):
//!   `M = max LSE_i` (all −inf → O = 0, LSE = −inf), `LSE = M + ln Σ exp(LSE_i − M)`,
//!   `O = Σ exp(LSE_i − LSE) · O_i`, rounded to the element type once.
//! * `kv_append_u16`: copies `k_new`/`v_new` rows `(batch, s_new, nheads_k, d)`
//!   into the cache at rows `cache_seqlens[b] + i` of cache row
//!   `cache_batch_idx[b]` (or of the pages of `block_table[b]`); rows past
//!   the capacity are skipped (the host checks what it can see; device-side
//!   `cache_seqlens` are clamped, never out of bounds). One tensor per
//!   launch, or K and V together (one launch less per decode step: each is
//!   ~4.7 µs of launch on the H100, decode step 20).

use crate::arch::global::{ld_cg_f32, ld_cg_f32x4};
use crate::arch::shfl::{shfl_idx_f32, shfl_xor_f32};
use crate::arch::sreg;
use crate::tc::{Bf16, Elem16, F16, pack};
use flash_attn_common::{AttnParams, Real};

/// Rows of the lse space of a launch: `batch·nheads·seqlen_q` (dense) or
/// `nheads·total_q` (varlen q).
#[inline(always)]
pub(crate) fn lse_len(p: &AttnParams) -> usize {
    if p.is_varlen() { p.nheads as usize * p.total_q as usize } else { p.batch as usize * p.nheads as usize * p.seqlen_q as usize }
}

/// Offset of O's row `idx` of the lse space (see [`lse_len`]).
#[inline(always)]
fn o_offset(p: &AttnParams, idx: usize) -> usize {
    let [os0, os1, os2] = p.o_stride.map(|x| x as usize);
    if p.is_varlen() {
        let (h, row) = (idx / p.total_q as usize, idx % p.total_q as usize);
        row * os1 + h * os2
    } else {
        let (sq, nh) = (p.seqlen_q as usize, p.nheads as usize);
        let (bh, row) = (idx / sq, idx % sq);
        (bh / nh) * os0 + row * os1 + (bh % nh) * os2
    }
}

/// Splits whose partial rows one lane of the combine kernel loads at once
/// (eight 16-byte loads in flight; 72 registers). The fused combine of the
/// flash-decoding kernels, whose registers are free by then, takes
/// [`FUSED_STEP`].
const KERNEL_STEP: usize = 8;

/// [`KERNEL_STEP`] of the flash-decoding kernels' fused combine: 16 splits (the
/// 8-warp kernel's usual count) in one L2 round trip with the LSEs.
pub(crate) const FUSED_STEP: usize = 16;

/// Warps per block of the combine kernel.
pub const COMBINE_WARPS: u32 = 4;

/// Four f32 at `p` (16-byte aligned), or zeros when `on` is false (not
/// read).
///
/// # Safety
/// For `on`, `p .. p + 4` readable and 16-byte aligned.
#[inline(always)]
unsafe fn ld4(p: *const f32, on: bool) -> [f32; 4] {
    // SAFETY: caller.
    if on { unsafe { ld_cg_f32x4(p) } } else { [0.0; 4] }
}

/// Max over the warp.
#[inline(always)]
fn warp_max(x: f32) -> f32 {
    let x = x.max(shfl_xor_f32(x, 16));
    let x = x.max(shfl_xor_f32(x, 8));
    let x = x.max(shfl_xor_f32(x, 4));
    let x = x.max(shfl_xor_f32(x, 2));
    x.max(shfl_xor_f32(x, 1))
}

/// Sum over the warp.
#[inline(always)]
fn warp_sum(x: f32) -> f32 {
    let x = x + shfl_xor_f32(x, 16);
    let x = x + shfl_xor_f32(x, 8);
    let x = x + shfl_xor_f32(x, 4);
    let x = x + shfl_xor_f32(x, 2);
    x + shfl_xor_f32(x, 1)
}

/// Merges row `idx` of the lse space (see [`lse_len`]: `n` rows) over the
/// `num_splits` partials (see the module docs) and writes O's row at `o`
/// (16-bit) and, if `lse_out` is not null, the LSE. One warp, every lane
/// calling: lane `l` reads the LSE of split `l` (up to 32 splits; beyond,
/// of splits `l, l + 32, l + 64, l + 96`), keeps their weights
/// `exp(LSE_i − LSE)` (two warp reductions), and sums
/// the partial rows four columns per lane (16-byte loads), `STEP` splits
/// per step ([`KERNEL_STEP`] in the combine kernel, [`FUSED_STEP`] in the
/// fused combine). The loads of a step do not wait for the weights: the first
/// step's partial rows are read together with the LSEs (one L2 round trip
/// for up to `STEP` splits, where a load per weight made three), and a
/// split whose weight is 0 adds nothing (a select, so a row it never wrote
/// cannot turn the sum into NaN). The partials are read from the L2
/// (`ld.global.cg`): the fused combine of the flash-decoding kernels reads
/// rows other blocks of the same launch wrote.
///
/// # Safety
/// `o_accum_ptr`/`lse_accum_ptr` hold `num_splits · n` rows of `headdim` /
/// 1 f32 (the LSEs written, and, within a launch, released, by the decode
/// kernels; a partial row whose LSE is −inf may be stale but is allocated);
/// `o` holds `headdim` elements, `lse_out` one f32 (or is null);
/// `num_splits ≤ 128`, `headdim` a multiple of 8.
#[inline(always)]
pub(crate) unsafe fn combine_row<T: Elem16, const STEP: usize>(p: &AttnParams, n: usize, idx: usize, lane: usize, o: *mut u16, lse_out: *mut f32) {
    // Split counts, head dims and lanes in 32 bits, addresses as a base
    // pointer plus a split stride: the 64-bit index arithmetic of
    // `(s·n + idx)·d + c` per load made ~800 instructions between the LSE
    // and the partial loads of one warp (SASS, decode step 16).
    let (ns, d, lane) = (p.num_splits, p.headdim, lane as u32);
    let lse0 = (p.lse_accum_ptr as *const f32).wrapping_add(idx);
    let rows = Partials { o0: (p.o_accum_ptr as *const f32).wrapping_add(idx * d as usize), split_stride: n * d as usize, ns, d };
    // SAFETY: s < ns, idx < n: inside the accumulator.
    let lse_of = |s: u32| if s < ns { unsafe { ld_cg_f32(lse0.wrapping_add(s as usize * n)) } } else { f32::NEG_INFINITY };
    let ex = |x: f32, m: f32| if x == f32::NEG_INFINITY { 0.0 } else { (x - m).exp() };
    let lse = if ns <= 32 {
        // At most 32 splits (every automatic split count of the
        // flash-decoding kernels): lane `l` reads split `l`'s LSE alone and
        // keeps its own weight; split `u`'s is one shuffle from lane `u`.
        // (The four LSEs per lane below, and the choice among them per
        // split, compiled to four branches around each shuffle: ~90
        // branches in the fused combine's executed code, which every SM
        // fetches cold at the very end; decode step 36.)
        let l = lse_of(lane);
        // SAFETY: as `Partials::load`.
        let x = unsafe { rows.load::<STEP>(0, 4 * lane) };
        let m = warp_max(l);
        let lse = if m == f32::NEG_INFINITY { m } else { m + warp_sum(ex(l, m)).ln() };
        // This lane's split's weight: 0 past ns, for an empty split, or
        // when every split is empty.
        let w = if lse == f32::NEG_INFINITY { 0.0 } else { ex(l, lse) };
        // SAFETY: caller.
        unsafe { rows.sum_into::<T, STEP>(x, lane, |s| shfl_idx_f32(w, s & 31), o) };
        lse
    } else {
        let (l0, l1, l2, l3) = (lse_of(lane), lse_of(lane + 32), lse_of(lane + 64), lse_of(lane + 96));
        // SAFETY: as `Partials::load`.
        let x = unsafe { rows.load::<STEP>(0, 4 * lane) };
        let m = warp_max(l0.max(l1).max(l2.max(l3)));
        let lse = if m == f32::NEG_INFINITY { m } else { m + warp_sum(ex(l0, m) + ex(l1, m) + ex(l2, m) + ex(l3, m)).ln() };
        let (w0, w1, w2, w3) = if lse == f32::NEG_INFINITY { (0.0, 0.0, 0.0, 0.0) } else { (ex(l0, lse), ex(l1, lse), ex(l2, lse), ex(l3, lse)) };
        let weight = |s: u32| -> f32 {
            let x = match s >> 5 {
                0 => w0,
                1 => w1,
                2 => w2,
                _ => w3,
            };
            shfl_idx_f32(x, s & 31)
        };
        // SAFETY: caller.
        unsafe { rows.sum_into::<T, STEP>(x, lane, weight, o) };
        lse
    };
    if lane == 0 && !lse_out.is_null() {
        // SAFETY: caller.
        unsafe { *lse_out = lse };
    }
}

/// One row of the lse space in the split accumulator: split `s`'s partial
/// row at `o0 + s·split_stride`, `d` f32 each, `ns` splits.
#[derive(Clone, Copy)]
struct Partials {
    o0: *const f32,
    split_stride: usize,
    ns: u32,
    d: u32,
}

impl Partials {
    /// Splits `s0..s0 + STEP` of columns `c..c + 4` (zeros past `ns` or `d`).
    ///
    /// # Safety
    /// Rows `s < ns` of the accumulator hold `d` f32 (16-byte aligned
    /// columns: `d` a multiple of 8).
    #[inline(always)]
    unsafe fn load<const STEP: usize>(&self, s0: u32, c: u32) -> [[f32; 4]; STEP] {
        let mut x = [[0f32; 4]; STEP];
        let mut ps = self.o0.wrapping_add(s0 as usize * self.split_stride + c as usize);
        for (u, xu) in x.iter_mut().enumerate() {
            // SAFETY: row (s0 + u, idx) of the accumulator (s0 + u < ns),
            // columns c..c + 4 ≤ d: 16-byte aligned (d a multiple of 8).
            *xu = unsafe { ld4(ps, s0 + (u as u32) < self.ns && c < self.d) };
            ps = ps.wrapping_add(self.split_stride);
        }
        x
    }

    /// `O = Σ weight(s)·O_s`, four columns per lane, `STEP` splits per step
    /// (`first`: the first step's rows of columns `4·lane..`, loaded by the
    /// caller with its LSEs), rounded to `T` once into `o`. Every lane runs
    /// every step (the weights are shuffled); lanes past the head dim load
    /// and store nothing. `weight(s)` is 0 for splits past `ns` and empty
    /// ones: a zero weight adds nothing (a select, so a row never written
    /// cannot turn the sum into NaN).
    ///
    /// # Safety
    /// As [`Partials::load`]; `o` holds `d` elements (4-byte aligned pairs).
    #[inline(always)]
    unsafe fn sum_into<T: Elem16, const STEP: usize>(&self, first: [[f32; 4]; STEP], lane: u32, weight: impl Fn(u32) -> f32, o: *mut u16) {
        let mut x = first;
        let mut c0 = 0;
        while c0 < self.d {
            let c = c0 + 4 * lane;
            let mut acc = [0f32; 4];
            let mut s = 0;
            loop {
                for (u, xu) in x.iter().enumerate() {
                    let w = weight(s + u as u32);
                    for k in 0..4 {
                        acc[k] += if w != 0.0 { w * xu[k] } else { 0.0 };
                    }
                }
                s += STEP as u32;
                if s >= self.ns {
                    break;
                }
                // SAFETY: caller.
                x = unsafe { self.load::<STEP>(s, c) };
            }
            if c < self.d {
                let oc = o.wrapping_add(c as usize);
                // SAFETY: O's row, columns c..c + 4 ≤ d; 4-byte aligned pairs
                // (even c, host-checked strides).
                unsafe {
                    *(oc as *mut u32) = pack::<T>(acc[0], acc[1]);
                    *(oc.add(2) as *mut u32) = pack::<T>(acc[2], acc[3]);
                }
            }
            c0 += 128;
            if c0 < self.d {
                // SAFETY: caller.
                x = unsafe { self.load::<STEP>(0, c0 + 4 * lane) };
            }
        }
    }
}

/// The combine kernel (see the module docs): one warp per output row.
///
/// # Safety
/// As [`combine_row`] for every row; `o_ptr` (16-bit) and `lse_ptr` as for
/// the attention launch; `32·COMBINE_WARPS` threads.
#[inline(always)]
unsafe fn combine<T: Elem16>(p: &AttnParams) {
    let n = lse_len(p);
    let lane = sreg::lane_id() as usize;
    let mut idx = sreg::block_idx_x() as usize * COMBINE_WARPS as usize + sreg::warp_id() as usize;
    while idx < n {
        let o = (p.o_ptr as *mut u16).wrapping_add(o_offset(p, idx));
        // SAFETY: caller; lse holds lse_len f32.
        unsafe { combine_row::<T, KERNEL_STEP>(p, n, idx, lane, o, (p.lse_ptr as *mut f32).add(idx)) };
        idx += sreg::grid_dim_x() as usize * COMBINE_WARPS as usize;
    }
}

/// `combine_splits_f16(p)`.
///
/// # Safety
/// See `combine`.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn combine_splits_f16(p: AttnParams) {
    // SAFETY: forwarded.
    unsafe { combine::<F16>(&p) }
}

/// `combine_splits_bf16(p)`.
///
/// # Safety
/// See `combine`.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn combine_splits_bf16(p: AttnParams) {
    // SAFETY: forwarded.
    unsafe { combine::<Bf16>(&p) }
}

/// `kv_append_u16(p)`: the append (see the module docs), 16-byte chunks,
/// grid-stride. Parameters: source `q_ptr`/`q_stride` (`(batch, s_new,
/// nheads_k, d)`, `seqlen_q = s_new`, `nheads = nheads_k`), destination
/// cache `o_ptr`/`o_stride` (contiguous `(batch_c, capacity, nheads_k, d)` or
/// pages `(num_pages, page_size, nheads_k, d)`), capacity `seqlen_k`,
/// `cache_seqlens_ptr`, optional `cache_batch_idx_ptr` / block table; with
/// `v_ptr` set, a second tensor in the same launch: source `k_ptr`/`k_stride`
/// (same shape), destination `v_ptr` with `o_stride` (a cache of the same
/// layout).
///
/// # Safety
/// Buffers as described, 16-byte aligned, strides multiple of 8 elements
/// (host-checked); `d` a multiple of 8.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn kv_append_u16(p: AttnParams) {
    // SAFETY: forwarded.
    unsafe { append(&p) }
}

/// [`kv_append_u16`] taking the compact 184-byte block
/// (`flash_attn_common::decode_params`: a parameter block over 184 bytes
/// costs 0.3–0.85 µs per launch; a decode step with new k/v runs one append
/// unless its flash-decoding kernel appends them itself).
///
/// # Safety
/// As [`kv_append_u16`] for `c.to_attn(0, 0)` (no `cache_batch_idx`).
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn kv_append_u16_c(c: flash_attn_common::DecodeParams) {
    // SAFETY: forwarded.
    unsafe { append(&c.to_attn(0, 0)) }
}

/// The body of [`kv_append_u16`].
///
/// # Safety
/// As [`kv_append_u16`].
#[inline(always)]
unsafe fn append(p: &AttnParams) {
    let (batch, s_new, nh, d) = (p.batch as usize, p.seqlen_q as usize, p.nheads as usize, p.headdim as usize);
    let cpr = d / 8;
    let per = batch * s_new * nh * cpr; // chunks of one tensor
    let total = if p.v_ptr != 0 { 2 * per } else { per };
    let mut w2 = (sreg::block_idx_x() * sreg::block_dim_x() + sreg::thread_idx_x()) as usize;
    while w2 < total {
        // Chunk w of the first tensor (K, or the only one) or of the second.
        let (w, src_ptr, [ss0, ss1, ss2], dst_ptr) = if w2 < per { (w2, p.q_ptr, p.q_stride, p.o_ptr) } else { (w2 - per, p.k_ptr, p.k_stride, p.v_ptr) };
        let c = w % cpr;
        let h = w / cpr % nh;
        let i = w / cpr / nh % s_new;
        let b = w / cpr / nh / s_new;
        // SAFETY: b < batch: the host sized cache_seqlens.
        let cached = unsafe { *(p.cache_seqlens_ptr as *const i32).add(b) };
        let t = cached.max(0) as u64 + i as u64;
        if t < p.seqlen_k as u64 {
            let [ds0, ds1, ds2] = p.o_stride;
            let src = (src_ptr as *const u16).wrapping_add((b as u64 * ss0 + i as u64 * ss1 + h as u64 * ss2) as usize + 8 * c);
            let row = if p.block_table_ptr != 0 {
                // SAFETY: t < capacity = block_table_stride · page_size.
                let page = unsafe { p.page_of(b as u32, t as u32) } as u64;
                page * ds0 + p.page_row(t as u32) as u64 * ds1
            } else {
                // SAFETY: host-sized cache_batch_idx (clamped).
                let kb = unsafe { p.kv_batch(b as u32) } as u64;
                kb * ds0 + t * ds1
            };
            let dst = (dst_ptr as *mut u16).wrapping_add((row + h as u64 * ds2) as usize + 8 * c);
            // SAFETY: 16-byte chunks inside the source row and the cache row.
            unsafe { *(dst as *mut [u32; 4]) = *(src as *const [u32; 4]) };
        }
        w2 += (sreg::grid_dim_x() * sreg::block_dim_x()) as usize;
    }
}

/// `kv_append_e4m3_f16(p)`: [`kv_append_u16`] into an FP8 (e4m3) cache:
/// each new f16 element `x` of KV head `h` is stored as the code
/// `e4m3(x / scale_h)` (round to nearest even, saturating to ±448), `scale`
/// from `k_descale_ptr` for the first tensor and `v_descale_ptr` for the
/// second (`descale_head_stride`: 0 per tensor, 1 per KV head); the cache's
/// strides count bytes.
///
/// # Safety
/// As [`kv_append_u16`] with one-byte cache elements (8-byte aligned rows
/// and strides: host-checked) and the scale arrays set.
#[cfg(fa_ptx74)]
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn kv_append_e4m3_f16(p: AttnParams) {
    // SAFETY: forwarded.
    unsafe { append_e4m3::<F16>(&p) }
}

/// [`kv_append_e4m3_f16`] with bf16 new rows.
///
/// # Safety
/// As [`kv_append_e4m3_f16`].
#[cfg(fa_ptx74)]
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn kv_append_e4m3_bf16(p: AttnParams) {
    // SAFETY: forwarded.
    unsafe { append_e4m3::<Bf16>(&p) }
}

/// The body of the `kv_append_e4m3_*` kernels: [`append`]'s chunks of 8
/// elements, quantized.
///
/// # Safety
/// As [`kv_append_e4m3_f16`].
#[cfg(fa_ptx74)]
#[inline(always)]
unsafe fn append_e4m3<T: Elem16>(p: &AttnParams) {
    use crate::arch::cvt::{bf16_to_f32, f16_to_f32, pack_e4m3x2};
    let (batch, s_new, nh, d) = (p.batch as usize, p.seqlen_q as usize, p.nheads as usize, p.headdim as usize);
    let cpr = d / 8;
    let per = batch * s_new * nh * cpr;
    let total = if p.v_ptr != 0 { 2 * per } else { per };
    let to_f32 = |x: u16| if T::IS_BF16 { bf16_to_f32(x) } else { f16_to_f32(x) };
    let mut w2 = (sreg::block_idx_x() * sreg::block_dim_x() + sreg::thread_idx_x()) as usize;
    while w2 < total {
        let (w, src_ptr, [ss0, ss1, ss2], dst_ptr, scales) =
            if w2 < per { (w2, p.q_ptr, p.q_stride, p.o_ptr, p.k_descale_ptr) } else { (w2 - per, p.k_ptr, p.k_stride, p.v_ptr, p.v_descale_ptr) };
        let c = w % cpr;
        let h = w / cpr % nh;
        let i = w / cpr / nh % s_new;
        let b = w / cpr / nh / s_new;
        // SAFETY: b < batch: the host sized cache_seqlens.
        let cached = unsafe { *(p.cache_seqlens_ptr as *const i32).add(b) };
        let t = cached.max(0) as u64 + i as u64;
        if t < p.seqlen_k as u64 {
            let [ds0, ds1, ds2] = p.o_stride;
            let src = (src_ptr as *const u16).wrapping_add((b as u64 * ss0 + i as u64 * ss1 + h as u64 * ss2) as usize + 8 * c);
            let row = if p.block_table_ptr != 0 {
                // SAFETY: t < capacity = block_table_stride · page_size.
                let page = unsafe { p.page_of(b as u32, t as u32) } as u64;
                page * ds0 + p.page_row(t as u32) as u64 * ds1
            } else {
                // SAFETY: host-sized cache_batch_idx (clamped).
                let kb = unsafe { p.kv_batch(b as u32) } as u64;
                kb * ds0 + t * ds1
            };
            let dst = (dst_ptr as *mut u8).wrapping_add((row + h as u64 * ds2) as usize + 8 * c);
            // SAFETY: the host's scale array holds one f32, or one per KV head.
            let scale = unsafe { *(scales as *const f32).add(h * p.descale_head_stride as usize) };
            // SAFETY: a 16-byte chunk inside the source row.
            let x = unsafe { *(src as *const [u32; 4]) };
            let mut codes = [0u32; 2];
            for (k, code) in codes.iter_mut().enumerate() {
                let q = |w: u32| pack_e4m3x2(to_f32(w as u16) / scale, to_f32((w >> 16) as u16) / scale) as u32;
                *code = q(x[2 * k]) | q(x[2 * k + 1]) << 16;
            }
            // SAFETY: 8 bytes inside the cache row (8-byte aligned: host).
            unsafe { *(dst as *mut [u32; 2]) = codes };
        }
        w2 += (sreg::grid_dim_x() * sreg::block_dim_x()) as usize;
    }
}
