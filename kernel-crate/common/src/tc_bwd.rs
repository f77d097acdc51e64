//! The tensor-core FA2-order backward main kernel (`kernel-crate/src/tc/bwd.rs`):
//! its compiled configurations, their shared memory and threads, and the
//! block-range math the kernel and the host share (written once, tested
//! here on the host).
//!
//! One block per (K/V block `j` of `Bc` keys, batch, KV head). The block's
//! `NW` warps form `NW / DS` key groups of 16 keys (`Bc = 16·NW/DS`) times
//! `DS` column slices of the head dim: a warp recomputes `Sᵀ`, `Pᵀ`, `dPᵀ`
//! and `dSᵀ` for its 16 keys and accumulates `dK_j`, `dV_j` for its
//! `D/DS` columns in registers (`DS = 2` where `dK`, `dV` of the full head
//! dim would not fit 255 registers: d > 128).

use crate::mask::KeyWindow;
use crate::tc::{row_bytes, tile_bytes};

/// One compiled configuration of the backward main kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TcBwdConfig {
    /// Compiled head dim (the caller's `d ≤ D` is zero-padded).
    pub d: usize,
    /// Warps per block.
    pub warps: usize,
    /// Query rows per inner step (`Br`).
    pub br: usize,
    /// Column slices of the head dim per key group (1 or 2).
    pub ds: usize,
    /// Softcap and ALiBi compiled in.
    pub mods: bool,
}

impl TcBwdConfig {
    /// Keys per block (`Bc = 16 · warps / ds`).
    pub const fn bc(&self) -> usize {
        16 * self.warps / self.ds
    }

    /// Threads per block.
    pub const fn threads(&self) -> usize {
        32 * self.warps
    }

    /// Dynamic shared memory: K_j, V_j (`Bc` padded rows each), Q_i and dO_i
    /// double-buffered (`Br` padded rows each), `dSᵀ` (`Bc` padded rows of
    /// `Br` elements), LSE_i and D_i double-buffered (`Br` f32 each).
    pub const fn smem_bytes(&self) -> usize {
        bwd_tc_smem_bytes(self.d, self.br, self.bc())
    }

    /// Columns of `dQ_i` each warp accumulates in the `dS·K_j` step (the
    /// warps split `Br/16` m-tiles times `warps / (Br/16)` column chunks).
    pub const fn dq_cols(&self) -> usize {
        self.d / (self.warps / (self.br / 16))
    }
}

/// See [`TcBwdConfig::smem_bytes`].
pub const fn bwd_tc_smem_bytes(d: usize, br: usize, bc: usize) -> usize {
    2 * tile_bytes(bc, d) + 4 * tile_bytes(br, d) + bwd_ds_bytes(br, bc) + 4 * br * 4
}

/// Bytes of the `dSᵀ` tile (`bc` rows of `br` 16-bit elements, padded).
pub const fn bwd_ds_bytes(br: usize, bc: usize) -> usize {
    bc * row_bytes(br)
}

/// The compiled configurations (f16 and bf16 each), without and with the
/// softcap/ALiBi modifiers (`mods`: the `1 − tanh²` factors cost `Br/2`
/// registers more, so those take smaller `Br`). Chosen so that no kernel
/// spills (ptxas, sm_80 and sm_90): 8 warps; d ≤ 128: `Bc` 128 (one column
/// slice); d 192: two column slices, `Bc` 64 (no softcap/ALiBi variant). `Br` 64 at d ≤ 64, 32 at
/// d 128/192; d 256 is not compiled (at Br 16 it spilled on sm_80: its `dK`, `dV` slices alone take 128
/// registers). Other head dims run on the next compiled one (zero-padded
/// columns): a d = 96 or d = 160 kernel spilled at `Br` 64 and has an odd
/// number of dQ column n-tiles at `Br` 32.
pub const TC_BWD_CONFIGS: &[TcBwdConfig] = &[
    TcBwdConfig { d: 32, warps: 8, br: 64, ds: 1, mods: false },
    TcBwdConfig { d: 64, warps: 8, br: 64, ds: 1, mods: false },
    TcBwdConfig { d: 128, warps: 8, br: 32, ds: 1, mods: false },
    TcBwdConfig { d: 192, warps: 8, br: 32, ds: 2, mods: false },
    TcBwdConfig { d: 32, warps: 8, br: 64, ds: 1, mods: true },
    TcBwdConfig { d: 64, warps: 8, br: 32, ds: 1, mods: true },
    TcBwdConfig { d: 128, warps: 8, br: 16, ds: 1, mods: true },
];

/// The configuration that runs a caller's head dim `d` (a multiple of 8,
/// 8..=256), with or without softcap/ALiBi: the smallest compiled `D ≥ d`.
pub fn tc_bwd_config(d: usize, mods: bool) -> Option<TcBwdConfig> {
    if d == 0 || d % 8 != 0 {
        return None;
    }
    TC_BWD_CONFIGS.iter().copied().find(|c| c.mods == mods && c.d >= d)
}

/// The queries that see key `c` (`c < seqlen_k`) in a sequence of `nq`
/// queries under `win` ([`KeyWindow`]): `[lo, hi)` clamped to `0..=nq`
/// (empty when `lo >= hi`). Query `i` sees `c` iff `lo(i) ≤ c < hi(i)`:
/// `c ≥ i + shift − left ⟺ i ≤ c − shift + left` and
/// `c < i + shift + right + 1 ⟺ i ≥ c − shift − right`.
#[inline(always)]
pub fn bwd_query_range(win: &KeyWindow, c: i64, nq: i64) -> (i64, i64) {
    if c >= win.seqlen_k || c < 0 {
        return (0, 0);
    }
    let lo = if win.right < 0 { 0 } else { (c - win.shift - win.right as i64).max(0) };
    let hi = if win.left < 0 { nq } else { (c - win.shift + win.left as i64 + 1).min(nq) };
    (lo.min(nq), hi.max(0))
}

/// Whether Q block `i` (rows `i·br .. min((i+1)·br, nq)`) has some row that
/// sees some key of K/V block `j` (`bc` keys): the Q side's rule, as the
/// forward's `key_blocks` (`[lo(first row) / bc, ceil(hi(last row) / bc))`).
/// The backward's deterministic mode orders the dQ additions of block `i`
/// by `j − bwd_first_key_block(..)` over exactly these blocks.
#[inline(always)]
pub fn bwd_visits(win: &KeyWindow, i: usize, j: usize, br: usize, bc: usize, nq: usize) -> bool {
    let (first, end) = bwd_key_blocks(win, i, br, bc, nq);
    first <= j && j < end
}

/// The K/V blocks `[first, end)` Q block `i` sees (see [`bwd_visits`]).
#[inline(always)]
pub fn bwd_key_blocks(win: &KeyWindow, i: usize, br: usize, bc: usize, nq: usize) -> (usize, usize) {
    let r0 = (i * br) as i64;
    let r1 = ((i + 1) * br).min(nq) as i64;
    if r0 >= r1 {
        return (0, 0);
    }
    let (start, end) = win.block_range(r0, r1);
    let first = start as usize / bc;
    let end = if start < end { (end as usize).div_ceil(bc) } else { first };
    (first, end)
}

/// The Q blocks `[first, end)` some key of K/V block `j` is seen by, a
/// superset of the `i` with [`bwd_visits`] (`bwd_query_range` of the first
/// and last key; the kernel then narrows it with [`bwd_visits`]).
#[inline(always)]
pub fn bwd_query_blocks(win: &KeyWindow, j: usize, br: usize, bc: usize, nq: usize) -> (usize, usize) {
    let k0 = (j * bc) as i64;
    let k_last = (((j + 1) * bc) as i64).min(win.seqlen_k) - 1;
    if k_last < k0 {
        return (0, 0);
    }
    let (lo, _) = bwd_query_range(win, k0, nq as i64);
    let (_, hi) = bwd_query_range(win, k_last, nq as i64);
    if lo >= hi {
        return (0, 0);
    }
    (lo as usize / br, (hi as usize).div_ceil(br))
}

/// The Q blocks `[first, end)` that see K/V block `j` ([`bwd_visits`]):
/// [`bwd_query_blocks`]' superset trimmed at both ends (the visiting `i`
/// are contiguous, see the tests). The backward kernels' step range.
#[inline(always)]
pub fn bwd_visiting_query_blocks(win: &KeyWindow, j: usize, br: usize, bc: usize, nq: usize) -> (usize, usize) {
    let (mut first, mut end) = bwd_query_blocks(win, j, br, bc, nq);
    while first < end && !bwd_visits(win, first, j, br, bc, nq) {
        first += 1;
    }
    while end > first && !bwd_visits(win, end - 1, j, br, bc, nq) {
        end -= 1;
    }
    (first, end)
}

/// Deterministic mode: index of the u32 semaphore of (Q block `i`, batch
/// `b`, query head `h`) in `BwdParams::dq_semaphore_ptr`; the buffer holds
/// [`bwd_semaphore_len`] zeroed u32.
#[inline(always)]
pub fn bwd_semaphore_index(b: usize, h: usize, i: usize, nheads: usize, num_m: usize) -> usize {
    (b * nheads + h) * num_m + i
}

/// u32 semaphores the deterministic mode needs: `batch · nheads ·
/// ceil(seqlen_q / br)` (`seqlen_q` the maximum for varlen).
pub const fn bwd_semaphore_len(batch: usize, nheads: usize, seqlen_q: usize, br: usize) -> usize {
    batch * nheads * seqlen_q.div_ceil(br)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn windows(nq: u32, nk: u32) -> Vec<KeyWindow> {
        let mut w = vec![];
        for (l, r) in [(-1, -1), (-1, 0), (0, 0), (3, 0), (5, 2), (-1, 7), (40, -1), (1, 1), (17, 70)] {
            w.push(KeyWindow::new(nq, nk, l, r));
        }
        w
    }

    #[test]
    fn query_range_is_the_transposed_window() {
        for (nq, nk) in [(1u32, 1u32), (7, 33), (33, 7), (64, 64), (100, 37), (5, 130)] {
            for win in windows(nq, nk) {
                for c in 0..nk as i64 + 3 {
                    let (lo, hi) = bwd_query_range(&win, c, nq as i64);
                    for i in 0..nq as i64 {
                        let vis = c < nk as i64 && win.visible(i, c);
                        assert_eq!(vis, lo <= i && i < hi, "nq {nq} nk {nk} {win:?} key {c} query {i}");
                    }
                }
            }
        }
    }

    /// The kernel's loop over `bwd_query_blocks(j)` narrowed by
    /// `bwd_visits` meets every Q block whose rule counts `j` (else the
    /// deterministic mode would wait forever), and every (i, j) with a
    /// visible pair is visited (else a gradient term is lost); the visited
    /// `i` of one `j` are contiguous.
    #[test]
    fn key_block_loop_covers_every_visiting_q_block() {
        for (nq, nk) in [(1usize, 1usize), (7, 33), (33, 7), (64, 64), (100, 37), (5, 130), (300, 200), (129, 257)] {
            for win in windows(nq as u32, nk as u32) {
                for (br, bc) in [(64, 128), (64, 64), (32, 64), (16, 16)] {
                    for j in 0..nk.div_ceil(bc) {
                        let (a, b) = bwd_query_blocks(&win, j, br, bc, nq);
                        let mut seen = vec![];
                        for i in 0..nq.div_ceil(br) {
                            let any = (i * br..((i + 1) * br).min(nq))
                                .any(|q| (j * bc..((j + 1) * bc).min(nk)).any(|c| win.visible(q as i64, c as i64)));
                            let v = bwd_visits(&win, i, j, br, bc, nq);
                            assert!(!any || v, "pair lost: {win:?} i {i} j {j}");
                            if v {
                                assert!(a <= i && i < b, "{win:?} nq {nq} nk {nk} br {br} bc {bc}: i {i} j {j} outside {a}..{b}");
                                seen.push(i);
                            }
                        }
                        assert!(seen.windows(2).all(|w| w[1] == w[0] + 1), "not contiguous: {seen:?}");
                        let (ia, ib) = bwd_visiting_query_blocks(&win, j, br, bc, nq);
                        assert_eq!((ia..ib).collect::<Vec<_>>(), if seen.is_empty() { vec![] } else { seen.clone() }, "{win:?} j {j}");
                    }
                }
            }
        }
    }

    #[test]
    fn configs_fit_their_devices() {
        for c in TC_BWD_CONFIGS {
            assert_eq!(c.d % 16, 0);
            assert_eq!((c.d / c.ds / 8) % 2, 0, "d {}: slice n-tiles even", c.d);
            assert_eq!(c.warps % (c.br / 16), 0);
            assert_eq!((c.dq_cols() / 8) % 2, 0, "d {}: dQ chunk n-tiles even", c.d);
            assert!(2 * c.br <= c.threads());
            assert!(c.smem_bytes() <= 163 * 1024, "d {}: {} B over A100's 163 KB", c.d, c.smem_bytes());
        }
        for mods in [false, true] {
            assert!(tc_bwd_config(200, mods).is_none(), "d > 192: not compiled (d 256 spilled on sm_80)");
            assert_eq!(tc_bwd_config(8, mods).unwrap().d, 32);
            assert!(tc_bwd_config(264, mods).is_none() && tc_bwd_config(12, mods).is_none());
        }
    }
}
