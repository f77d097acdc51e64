//! The Hopper (sm_90a) FA2-order backward main kernel
//! (`kernel-crate/src/hopper/bwd.rs`): its compiled head dims, tiles,
//! threads and shared-memory layout, shared by the kernel and the host.
//!
//! One block per (K/V block `j` of [`hopper_bwd_bc`] keys, batch, KV head):
//! a producer warpgroup (TMA copies, dQ reductions) and two consumer
//! warpgroups — at d 64/128 of 64 keys each, at d 256 both on the same 64
//! keys with the head dim split between them (`kernel-crate/src/hopper/bwd256.rs`).
//! Tiles live in shared memory as the forward's: 64-column panels of
//! 128-byte rows, 128B-swizzled, every tile 1024-byte aligned.

/// Keys per block (`Bc`) at d 64/128: two warpgroups of 64 (the `wgmma` M).
pub const HOPPER_BWD_BC: usize = 128;

/// Keys per block at d 256: 64 shared by both consumer warpgroups, each
/// owning `dK`, `dV` for half of the head dim (128 columns: 2 × 64
/// registers; 64 keys × 256 columns each were 2 × 128, over the 240).
pub const HOPPER_BWD_BC_D256: usize = 64;

/// Threads per block: the producer warpgroup and two consumer warpgroups.
pub const HOPPER_BWD_THREADS: usize = 384;

/// Stages of the `Q_i`, `dO_i`, `LSE_i`, `D_i` ring (and dQ staging buffers).
pub const HOPPER_BWD_STAGES: usize = 2;

/// Registers per thread after `setmaxnreg`: the producer warpgroup's and
/// the consumers' (`128·24 + 256·240` = the 168 per thread of a 384-thread
/// launch).
pub const HOPPER_BWD_PRODUCER_REGS: u32 = 24;
pub const HOPPER_BWD_CONSUMER_REGS: u32 = 240;

/// Bytes of a dQ staging panel: 64 rows × 32 f32 (128-byte rows,
/// 128B-swizzled, the box of the accumulator's tensor map).
pub const HOPPER_BWD_DQ_PANEL_BYTES: usize = 64 * 128;

/// u64 words of [`HopperBwdSmem::uni`].
pub const HOPPER_BWD_UNI_WORDS: usize = 29;

/// mbarriers of [`HopperBwdSmem::bars`]: K/V, full and empty per stage, dQ
/// staging full and empty per buffer.
pub const HOPPER_BWD_BARS: usize = 1 + 4 * HOPPER_BWD_STAGES;

/// The compiled head dim that runs a caller's `d` (a multiple of 8): 64 for
/// `d ≤ 64`, 128 for `d ≤ 128`, 256 for `d ≤ 256`; `None` otherwise. The
/// tensor maps keep the caller's `d` as the head axis' extent: the copy
/// engine zero-fills the columns past it (at d ≤ 192 the d 256 kernel's
/// last 64-column panel wholly), the dQ reductions skip them, and the
/// epilogue stores `d` columns.
pub const fn hopper_bwd_head_dim(d: usize) -> Option<usize> {
    if d == 0 || d % 8 != 0 {
        None
    } else if d <= 64 {
        Some(64)
    } else if d <= 128 {
        Some(128)
    } else if d <= 256 {
        Some(256)
    } else {
        None
    }
}

/// Query rows per step (`Br`) of compiled head dim `d`. d 64/128: `Br · d
/// = 8192` (64 at d 128, 128 at d 64: the registers of `Sᵀ`, `dPᵀ`, `dK`,
/// `dV` fill a consumer thread alike), so that each warpgroup's share of
/// `dQ_i = dS·K_j` is one `64 × 64` block over all 128 keys (d 128: a
/// column half; d 64: a row half). d 256: 64 (each consumer's `Sᵀ`, `dPᵀ`
/// are 64 keys × 32 queries, its `dQ` share 64 queries × 128 columns).
pub const fn hopper_bwd_br(d: usize) -> usize {
    if d == 256 { 64 } else { 8192 / d }
}

/// Keys per block (`Bc`) of compiled head dim `d`: [`HOPPER_BWD_BC`], or
/// [`HOPPER_BWD_BC_D256`] at d 256.
pub const fn hopper_bwd_bc(d: usize) -> usize {
    if d == 256 { HOPPER_BWD_BC_D256 } else { HOPPER_BWD_BC }
}

/// Query rows per step of the kernel of compiled head dim `d`, `mods` the
/// softcap/ALiBi kernels (`flash_bwd_hopper_x_*`): 64 for those at every
/// head dim (their score pass and `Pᵀ·(1 − tanh²)` need the registers Br 128
/// would fill at d 64; the two consumers' `dQ` blocks then split the keys,
/// each `64 × 64` over its own 64), [`hopper_bwd_br`] otherwise.
pub const fn hopper_bwd_kernel_br(d: usize, mods: bool) -> usize {
    if mods { 64 } else { hopper_bwd_br(d) }
}

/// Shared-memory layout (byte offsets from the 1024-aligned base) of
/// compiled head dim `d`.
///
/// d 256 (`Bc` = `Br` = 64): K, V 64 KB; the two-stage ring 128 KB, each
/// stage `Q_i` then `dO_i` (contiguous); `Pᵀ`, `dSᵀ` 16 KB; no dQ staging
/// of its own: a step's `Br × 256` f32 dQ block (64 KB) is staged in its
/// own stage once both consumers have finished reading it, and the
/// producer's reductions free the stage (a separate double buffer would
/// make 272 KB, over the 227 KB of a block).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HopperBwdSmem {
    pub k: usize,
    pub v: usize,
    /// `Q_i` and `dO_i`, double-buffered.
    pub q: [usize; 2],
    pub dout: [usize; 2],
    /// `dSᵀ` (`Bc` rows of `Br` 16-bit elements, in `Br/64` panels); at d
    /// 256 `Pᵀ` there, `dSᵀ` after it ([`HopperBwdSmem::ds_d256`]) (the d
    /// 64/128 kernel keeps `Pᵀ` in registers).
    pub ds: usize,
    /// dQ staging, double-buffered: per buffer the two consumer
    /// warpgroups' `64 × 64` blocks (d 256: `64 × 128`), two (four)
    /// [`HOPPER_BWD_DQ_PANEL_BYTES`] panels each. At d 256 these are the
    /// stages themselves (`q`).
    pub dq: [usize; 2],
    /// Per stage `s`: `LSE_i·log2 e` (`2s`) then `D_i` (`2s + 1`), `Br` f32 each.
    pub rows: usize,
    /// [`HOPPER_BWD_BARS`] mbarriers (8 bytes each).
    pub bars: usize,
    /// The block's loop-invariant addresses and strides ([`HOPPER_BWD_UNI_WORDS`]
    /// u64), written once, read where used.
    pub uni: usize,
    /// Bytes from the base to the end of the layout.
    pub end: usize,
}

impl HopperBwdSmem {
    /// The layout of compiled head dim `d` at its [`hopper_bwd_br`].
    pub const fn new(d: usize) -> Self {
        if d == 256 {
            return Self::new_d256();
        }
        Self::with_br(d, hopper_bwd_br(d))
    }

    /// The layout of the kernel of compiled head dim `d`, `mods` its
    /// softcap/ALiBi build ([`hopper_bwd_kernel_br`] query rows per step).
    pub const fn for_kernel(d: usize, mods: bool) -> Self {
        if d == 256 { Self::new(256) } else { Self::with_br(d, hopper_bwd_kernel_br(d, mods)) }
    }

    /// The layout of compiled head dim `d` (64 or 128) at `br` query rows
    /// per step ([`hopper_bwd_kernel_br`]: 64, or [`hopper_bwd_br`]).
    pub const fn with_br(d: usize, br: usize) -> Self {
        assert!(d == 64 || d == 128, "d 256 has its own layout (new_d256)");
        let kv = HOPPER_BWD_BC * d * 2;
        let qt = br * d * 2;
        let k = 0;
        let v = k + kv;
        let q = [v + kv, v + kv + qt];
        let dout = [q[1] + qt, q[1] + 2 * qt];
        let ds = dout[1] + qt;
        let dq_bytes = 4 * HOPPER_BWD_DQ_PANEL_BYTES;
        let dq = [ds + HOPPER_BWD_BC * br * 2, ds + HOPPER_BWD_BC * br * 2 + dq_bytes];
        let rows = dq[1] + dq_bytes;
        let bars = rows + 2 * HOPPER_BWD_STAGES * br * 4;
        let uni = bars + 8 * HOPPER_BWD_BARS;
        let end = uni + 8 * HOPPER_BWD_UNI_WORDS;
        Self { k, v, q, dout, ds, dq, rows, bars, uni, end }
    }

    /// The d 256 layout (see the type's docs).
    const fn new_d256() -> Self {
        let (d, br, bc) = (256, hopper_bwd_br(256), HOPPER_BWD_BC_D256);
        let kv = bc * d * 2;
        let qt = br * d * 2;
        let k = 0;
        let v = k + kv;
        let q = [v + kv, v + kv + 2 * qt];
        let dout = [q[0] + qt, q[1] + qt];
        let ds = dout[1] + qt;
        let rows = ds + 2 * bc * br * 2;
        let bars = rows + 2 * HOPPER_BWD_STAGES * br * 4;
        let uni = bars + 8 * HOPPER_BWD_BARS;
        let end = uni + 8 * HOPPER_BWD_UNI_WORDS;
        Self { k, v, q, dout, ds, dq: q, rows, bars, uni, end }
    }

    /// d 256: the offset of `dSᵀ`, after `Pᵀ` (at [`HopperBwdSmem::ds`]).
    pub const fn ds_d256(&self) -> usize {
        self.ds + HOPPER_BWD_BC_D256 * 64 * 2
    }

    /// Dynamic shared memory to request: the layout plus the slack of
    /// aligning the base to 1024 bytes.
    pub const fn request_bytes(&self) -> usize {
        self.end + 1024
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layouts_fit_and_align() {
        for (d, br) in [(64, 128), (128, 64), (64, 64), (256, 64)] {
            let l = if d == 256 { HopperBwdSmem::new(256) } else { HopperBwdSmem::with_br(d, br) };
            for off in [l.k, l.v, l.q[0], l.q[1], l.dout[0], l.dout[1], l.ds, l.ds_d256()] {
                assert_eq!(off % 1024, 0, "d {d}: swizzled tiles are 1024-byte aligned");
            }
            assert!(l.dq.iter().all(|o| o % 1024 == 0), "d {d}: swizzled staging");
            assert_eq!((l.bars % 8, l.uni % 8), (0, 0));
            if d != 256 {
                assert_eq!(hopper_bwd_kernel_br(d, true), 64);
                assert_eq!(hopper_bwd_kernel_br(d, false) * d, 8192);
                assert!(l.ds + HOPPER_BWD_BC * br * 2 <= l.dq[0]);
            }
            assert!(l.request_bytes() <= 227 * 1024, "d {d}: {} B", l.request_bytes());
        }
        assert_eq!(HopperBwdSmem::new(64), HopperBwdSmem::with_br(64, 128));
        assert_eq!(hopper_bwd_head_dim(8), Some(64));
        assert_eq!(hopper_bwd_head_dim(72), Some(128));
        assert_eq!(hopper_bwd_head_dim(136), Some(256));
        assert_eq!(hopper_bwd_head_dim(192), Some(256));
        assert_eq!(hopper_bwd_head_dim(200), Some(256));
        assert_eq!(hopper_bwd_head_dim(256), Some(256));
        assert_eq!(hopper_bwd_head_dim(264), None);
        assert_eq!(hopper_bwd_head_dim(60), None);
    }

    /// d 256: the stages are contiguous `Q_i | dO_i` pairs that hold a
    /// step's `Br × 256` f32 dQ block (eight 64 × 32 panels); the tiles do
    /// not overlap; the d 64/128 layouts are unchanged.
    #[test]
    fn d256_stages_hold_the_dq_block() {
        let l = HopperBwdSmem::new(256);
        let (br, bc) = (hopper_bwd_br(256), hopper_bwd_bc(256));
        assert_eq!((br, bc), (64, 64));
        let qt = br * 256 * 2;
        for s in 0..2 {
            assert_eq!(l.dout[s], l.q[s] + qt);
            assert_eq!(l.dq[s], l.q[s]);
            assert_eq!(8 * HOPPER_BWD_DQ_PANEL_BYTES, 2 * qt, "the dQ block fills the stage");
            assert_eq!(HOPPER_BWD_DQ_PANEL_BYTES, br * 32 * 4);
        }
        let kv = bc * 256 * 2;
        let mut spans = [(l.k, kv), (l.v, kv), (l.q[0], 2 * qt), (l.q[1], 2 * qt), (l.ds, bc * br * 2), (l.ds_d256(), bc * br * 2), (l.rows, 2 * HOPPER_BWD_STAGES * br * 4), (l.bars, 8 * HOPPER_BWD_BARS), (l.uni, 8 * HOPPER_BWD_UNI_WORDS)];
        spans.sort();
        for w in spans.windows(2) {
            assert!(w[0].0 + w[0].1 <= w[1].0, "{w:?}");
        }
        assert_eq!(spans[spans.len() - 1].0 + spans[spans.len() - 1].1, l.end);
        assert_eq!(HopperBwdSmem::new(128).q, [65536, 81920], "d 128 layout unchanged");
    }
}
