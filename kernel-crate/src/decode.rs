//! Decode helpers around the `fa2d` tensor-core kernels
//! (`tc::fa2`, `DECODE = true`): the combine of split-KV partials and the
//! in-place append of new keys and values to a KV cache.
//!
//! * `combine_splits_{f16,bf16}`: one warp per output row. The partials of
//!   `num_splits` splits (each O already normalized, `LSE_i` natural) are
//!   merged as seed 003 / FlashAttention-2's combine does:
//!   `M = max LSE_i` (all −inf → O = 0, LSE = −inf), `LSE = M + ln Σ exp(LSE_i − M)`,
//!   `O = Σ exp(LSE_i − LSE) · O_i`, rounded to the element type once.
//! * `kv_append_u16`: copies `k_new`/`v_new` rows `(batch, s_new, nheads_k, d)`
//!   into the cache at rows `cache_seqlens[b] + i` of cache row
//!   `cache_batch_idx[b]` (or of the pages of `block_table[b]`); rows past
//!   the capacity are skipped (the host checks what it can see; device-side
//!   `cache_seqlens` are clamped, never out of bounds).

use crate::arch::sreg;
use crate::tc::{Bf16, Elem16, F16, pack};
use flash_attn_common::{AttnParams, Real};

/// Rows of the lse space of a launch: `batch·nheads·seqlen_q` (dense) or
/// `nheads·total_q` (varlen q).
#[inline(always)]
fn lse_len(p: &AttnParams) -> usize {
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

/// Warps per block of the combine kernel.
pub const COMBINE_WARPS: u32 = 4;

/// The combine (see the module docs).
///
/// # Safety
/// `o_accum_ptr`/`lse_accum_ptr` hold `num_splits · lse_len` rows of
/// `headdim` / 1 f32 written by the `fa2d` kernel; `o_ptr` (16-bit) and
/// `lse_ptr` as for the attention launch; `32·COMBINE_WARPS` threads.
#[inline(always)]
unsafe fn combine<T: Elem16>(p: &AttnParams) {
    let (n, ns, d) = (lse_len(p), p.num_splits as usize, p.headdim as usize);
    let lane = sreg::lane_id() as usize;
    let mut idx = sreg::block_idx_x() as usize * COMBINE_WARPS as usize + sreg::warp_id() as usize;
    let lse_acc = p.lse_accum_ptr as *const f32;
    while idx < n {
        // SAFETY: s < ns, idx < n: inside the accumulator.
        let lse_i = |s: usize| unsafe { *lse_acc.add(s * n + idx) };
        let mut m = f32::NEG_INFINITY;
        for s in 0..ns {
            m = m.max(lse_i(s));
        }
        let lse = if m == f32::NEG_INFINITY {
            m
        } else {
            let mut sum = 0f32;
            for s in 0..ns {
                sum += (lse_i(s) - m).exp();
            }
            m + sum.ln()
        };
        let o = (p.o_ptr as *mut u16).wrapping_add(o_offset(p, idx));
        let mut c = 2 * lane;
        while c < d {
            let mut acc = [0f32; 2];
            if lse != f32::NEG_INFINITY {
                for s in 0..ns {
                    let w = (lse_i(s) - lse).exp();
                    if w != 0.0 {
                        // SAFETY: c + 1 < d (d even) inside row (s, idx).
                        let x = unsafe { *((p.o_accum_ptr as *const f32).add((s * n + idx) * d + c) as *const [f32; 2]) };
                        acc[0] += w * x[0];
                        acc[1] += w * x[1];
                    }
                }
            }
            // SAFETY: O's row idx, columns c, c+1 < d; 4-byte aligned (even c, host-checked strides).
            unsafe { *(o.add(c) as *mut u32) = pack::<T>(acc[0], acc[1]) };
            c += 64;
        }
        if lane == 0 {
            // SAFETY: lse holds lse_len f32.
            unsafe { *(p.lse_ptr as *mut f32).add(idx) = lse };
        }
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
/// `cache_seqlens_ptr`, optional `cache_batch_idx_ptr` / block table.
///
/// # Safety
/// Buffers as described, 16-byte aligned, strides multiple of 8 elements
/// (host-checked); `d` a multiple of 8.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn kv_append_u16(p: AttnParams) {
    let (batch, s_new, nh, d) = (p.batch as usize, p.seqlen_q as usize, p.nheads as usize, p.headdim as usize);
    let cpr = d / 8;
    let total = batch * s_new * nh * cpr;
    let mut w = (sreg::block_idx_x() * sreg::block_dim_x() + sreg::thread_idx_x()) as usize;
    while w < total {
        let c = w % cpr;
        let h = w / cpr % nh;
        let i = w / cpr / nh % s_new;
        let b = w / cpr / nh / s_new;
        // SAFETY: b < batch: the host sized cache_seqlens.
        let cached = unsafe { *(p.cache_seqlens_ptr as *const i32).add(b) };
        let t = cached.max(0) as u64 + i as u64;
        if t < p.seqlen_k as u64 {
            let [ss0, ss1, ss2] = p.q_stride;
            let [ds0, ds1, ds2] = p.o_stride;
            let src = (p.q_ptr as *const u16).wrapping_add((b as u64 * ss0 + i as u64 * ss1 + h as u64 * ss2) as usize + 8 * c);
            let row = if p.block_table_ptr != 0 {
                // SAFETY: t < capacity = block_table_stride · page_size.
                let page = unsafe { p.page_of(b as u32, t as u32) } as u64;
                page * ds0 + (t % p.page_size as u64) * ds1
            } else {
                // SAFETY: host-sized cache_batch_idx (clamped).
                let kb = unsafe { p.kv_batch(b as u32) } as u64;
                kb * ds0 + t * ds1
            };
            let dst = (p.o_ptr as *mut u16).wrapping_add((row + h as u64 * ds2) as usize + 8 * c);
            // SAFETY: 16-byte chunks inside the source row and the cache row.
            unsafe { *(dst as *mut [u32; 4]) = *(src as *const [u32; 4]) };
        }
        w += (sreg::grid_dim_x() * sreg::block_dim_x()) as usize;
    }
}
