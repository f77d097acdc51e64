//! The merge of context-parallel partials: `ring_merge_{f16,bf16}`, one
//! warp per (batch, head, row) of a partial, four columns per lane (d ≤ 128
//! in one pass, 256 in two). The weights are [`merge_lse`], the one
//! definition the host's CPU simulation runs too; what a launch does is
//! [`RingMergeParams::mode`] (see [`merge_mode`]): merge outputs by their
//! LSEs, round the result, or sum the backward's gradient partials in f32.

use crate::arch::cvt::{bf16_to_f32, f16_to_f32};
use crate::arch::shfl::shfl_idx_f32;
use crate::arch::sreg;
use crate::tc::{Bf16, Elem16, F16, pack};
use flash_attn_common::ring::{RING_MERGE_WARPS, RingMergeParams, merge_lse, merge_mode};

/// One 16-bit element as f32.
#[inline(always)]
fn to_f32<T: Elem16>(x: u16) -> f32 {
    if T::IS_BF16 { bf16_to_f32(x) } else { f16_to_f32(x) }
}

/// The kernel body (see the module docs).
///
/// # Safety
/// The buffers of [`RingMergeParams`] hold their layouts' elements (the
/// partial's for `INIT`/`MERGE`, `out`'s for `FINALIZE`); `headdim` a
/// multiple of 4 (8-byte aligned 16-bit quads); `32·RING_MERGE_WARPS`
/// threads per block.
#[inline(always)]
unsafe fn ring_merge<T: Elem16>(p: &RingMergeParams) {
    let (nh, d) = (p.nheads as usize, p.headdim as usize);
    let n = p.batch as usize * nh * p.rows as usize;
    let lane = sreg::lane_id() as usize;
    let mut idx = sreg::block_idx_x() as usize * RING_MERGE_WARPS as usize + sreg::warp_id() as usize;
    while idx < n {
        // idx = (b·nheads + h)·rows + r: the partial's lse space.
        let (bh, r) = (idx / p.rows as usize, idx % p.rows as usize);
        let (b, h) = (bh / nh, bh % nh);
        let row = p.row0 as usize + r;
        let acc_row = ((b * p.seqlen_acc as usize + row) * nh + h) * d;
        let lse_acc = (p.lse_acc_ptr as *mut f32).wrapping_add(bh * p.seqlen_acc as usize + row);
        let o_acc = (p.o_acc_ptr as *mut f32).wrapping_add(acc_row);
        // Lane 0 reads (and later writes) the row's LSE; the lanes get the
        // weights by shuffle, so no lane reads an LSE another has written.
        let (mut w_acc, mut w_part, mut lse) = (0.0, 0.0, 0.0);
        if p.mode == merge_mode::COPY || p.mode == merge_mode::ADD {
            // Gradient partials: plain sums (COPY: the accumulator's stale rows weigh 0).
            (w_acc, w_part) = (if p.mode == merge_mode::ADD { 1.0 } else { 0.0 }, 1.0);
        } else if p.mode != merge_mode::FINALIZE {
            if lane == 0 {
                // SAFETY: (b, h, r) of the partial's stats and (b, h, row) of the accumulator's.
                let lse_part = unsafe { *(p.lse_part_ptr as *const f32).add(idx) };
                let lse_old = if p.mode == merge_mode::INIT { f32::NEG_INFINITY } else { unsafe { *lse_acc } };
                // INIT: an empty accumulator (weight 0: its stale rows are never read).
                (lse, w_acc, w_part) = merge_lse(lse_old, lse_part);
            }
            w_acc = shfl_idx_f32(w_acc, 0);
            w_part = shfl_idx_f32(w_part, 0);
        }
        let part_row = ((b * p.rows as usize + r) * nh + h) * d;
        let mut c = 4 * lane;
        while c < d {
            let a = o_acc.wrapping_add(c);
            if p.mode == merge_mode::FINALIZE {
                // SAFETY: columns c..c + 4 of the accumulator's row and of out's.
                unsafe {
                    let o = (p.out_ptr as *mut u16).wrapping_add(acc_row + c);
                    *(o as *mut u32) = pack::<T>(*a, *a.add(1));
                    *(o.add(2) as *mut u32) = pack::<T>(*a.add(2), *a.add(3));
                }
            } else {
                let x = (p.o_part_ptr as *const u16).wrapping_add(part_row + c);
                for k in 0..4 {
                    // SAFETY: columns c..c + 4 of the partial's row and of the accumulator's.
                    unsafe {
                        let xp = to_f32::<T>(*x.add(k));
                        let old = if p.mode == merge_mode::INIT || p.mode == merge_mode::COPY { 0.0 } else { *a.add(k) };
                        // A zero weight adds nothing (a select: never 0·NaN of a stale row).
                        let from_acc = if w_acc != 0.0 { w_acc * old } else { 0.0 };
                        let from_part = if w_part != 0.0 { w_part * xp } else { 0.0 };
                        *a.add(k) = from_acc + from_part;
                    }
                }
            }
            c += 128;
        }
        if lane == 0 && merge_mode::uses_lse(p.mode) {
            // SAFETY: the accumulator's (b, h, row), read above by this lane only.
            unsafe { *lse_acc = lse };
        }
        idx += sreg::grid_dim_x() as usize * RING_MERGE_WARPS as usize;
    }
}

/// `ring_merge_f16(p)`.
///
/// # Safety
/// See `ring_merge`.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn ring_merge_f16(p: RingMergeParams) {
    // SAFETY: forwarded.
    unsafe { ring_merge::<F16>(&p) }
}

/// `ring_merge_bf16(p)`.
///
/// # Safety
/// See `ring_merge`.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn ring_merge_bf16(p: RingMergeParams) {
    // SAFETY: forwarded.
    unsafe { ring_merge::<Bf16>(&p) }
}
