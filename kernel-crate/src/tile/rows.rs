//! One warp per row: warp reductions, the online softmax of a whole row
//! (`standard`, `softmax_rows`) and the online-softmax step over a row of a
//! block of scores (`fa1`, `fa2`), written with [`RowState`] — the code the
//! CPU property tests check.

use super::SmemTile;
use crate::arch::{shfl::shfl_xor_f32, sreg};
use flash_attn_common::smem_layout::F32_WARPS;
use flash_attn_common::{Real, RowState};

/// Maximum over the 32 lanes (NaN propagates); every lane gets it.
#[inline(always)]
pub fn warp_max(mut x: f32) -> f32 {
    let mut mask = 16;
    while mask > 0 {
        x = x.max_nan(shfl_xor_f32(x, mask));
        mask >>= 1;
    }
    x
}

/// Sum over the 32 lanes; every lane gets it.
#[inline(always)]
pub fn warp_sum(mut x: f32) -> f32 {
    let mut mask = 16;
    while mask > 0 {
        x = x + shfl_xor_f32(x, mask);
        mask >>= 1;
    }
    x
}

/// Merges the lane states of a warp ([`RowState::merge`], butterfly
/// shuffles); every lane ends with the row's state.
#[inline(always)]
pub fn warp_merge(mut s: RowState<f32>) -> RowState<f32> {
    let mut mask = 16;
    while mask > 0 {
        let other = RowState { m: shfl_xor_f32(s.m, mask), l: shfl_xor_f32(s.l, mask) };
        s = s.merge(other).0;
        mask >>= 1;
    }
    s
}

/// The online softmax of one row of base-2 scores, on all lanes of one warp:
/// each lane runs a [`RowState`] (running maximum and sum together) over its
/// strided columns `lane, lane + 32, …` below `ncols`, reading column `c`
/// with `score(c)`; then the 32 states are merged ([`warp_merge`]). Every
/// lane returns the row's state.
#[inline(always)]
pub fn warp_row_state(ncols: usize, lane: usize, mut score: impl FnMut(usize) -> f32) -> RowState<f32> {
    let mut st = RowState::<f32>::new();
    let mut c = lane;
    while c < ncols {
        let s = score(c);
        let (_, m_safe) = st.rescale(s);
        st.accumulate((s - m_safe).exp2());
        c += 32;
    }
    warp_merge(st)
}

/// Rows `r < nrows` of a tile, one warp each (`warp, warp + 8, …`). The
/// callback runs on all 32 lanes of the owning warp, with the lane index;
/// warps leave the loop together, so shuffles inside stay convergent.
#[inline(always)]
pub fn for_each_row_of_warp(nrows: usize, mut f: impl FnMut(usize, usize)) {
    let lane = sreg::lane_id() as usize;
    let mut r = sreg::warp_id() as usize;
    while r < nrows {
        f(r, lane);
        r += F32_WARPS as usize;
    }
}

/// The softmax step of one row of a block of scores (already in the base-2
/// domain, `-inf` where masked), on all lanes of one warp: raises the row
/// state to the block's maximum (FA2) or starts it there (FA1, with a fresh
/// `RowState::new()`), overwrites the scores `S[r][0..ncols]` with
/// `P = exp2(S - m_safe)` and adds their sum. Returns `alpha`, the factor the
/// row's earlier output must be multiplied by. Every lane returns the same
/// state; lane 0 is the one that should publish it.
#[inline(always)]
pub fn softmax_step(s: &SmemTile, r: usize, ncols: usize, lane: usize, st: &mut RowState<f32>) -> f32 {
    let mut block_max = f32::NEG_INFINITY;
    let mut c = lane;
    while c < ncols {
        block_max = block_max.max_nan(s.get(r, c));
        c += 32;
    }
    let (alpha, m_safe) = st.rescale(warp_max(block_max));
    let mut sum = 0.0f32;
    let mut c = lane;
    while c < ncols {
        let p = (s.get(r, c) - m_safe).exp2();
        s.set(r, c, p);
        sum += p;
        c += 32;
    }
    st.accumulate(warp_sum(sum));
    alpha
}
