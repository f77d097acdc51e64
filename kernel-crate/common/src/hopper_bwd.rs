//! The Hopper (sm_90a) FA2-order backward main kernel
//! (`kernel-crate/src/hopper/bwd.rs`): its compiled head dims, tiles,
//! threads and shared-memory layout, shared by the kernel and the host.
//!
//! One block per (K/V block `j` of [`HOPPER_BWD_BC`] keys, batch, KV head):
//! a producer warpgroup (TMA copies, dQ reductions) and two consumer
//! warpgroups of 64 keys each. Tiles live in shared memory as the forward's:
//! 64-column panels of 128-byte rows, 128B-swizzled, every tile 1024-byte
//! aligned.

/// Keys per block (`Bc`): two warpgroups of 64 (the `wgmma` M).
pub const HOPPER_BWD_BC: usize = 128;

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
/// `d ≤ 64`, 128 for `d ≤ 128`; `None` above (the tensor-core kernel runs
/// those).
pub const fn hopper_bwd_head_dim(d: usize) -> Option<usize> {
    if d == 0 || d % 8 != 0 {
        None
    } else if d <= 64 {
        Some(64)
    } else if d <= 128 {
        Some(128)
    } else {
        None
    }
}

/// Query rows per step (`Br`) of compiled head dim `d`: `Br · d = 8192`
/// (64 at d 128, 128 at d 64: the registers of `Sᵀ`, `dPᵀ`, `dK`, `dV`
/// fill a consumer thread alike), so that each warpgroup's share of
/// `dQ_i = dS·K_j` is one `64 × 64` block over all 128 keys (d 128: a
/// column half; d 64: a row half).
pub const fn hopper_bwd_br(d: usize) -> usize {
    8192 / d
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
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HopperBwdSmem {
    pub k: usize,
    pub v: usize,
    /// `Q_i` and `dO_i`, double-buffered.
    pub q: [usize; 2],
    pub dout: [usize; 2],
    /// `dSᵀ` (`Bc` rows of `Br` 16-bit elements, in `Br/64` panels).
    pub ds: usize,
    /// dQ staging, double-buffered: per buffer the two consumer
    /// warpgroups' `64 × 64` blocks, two [`HOPPER_BWD_DQ_PANEL_BYTES`]
    /// panels each.
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
        Self::with_br(d, hopper_bwd_br(d))
    }

    /// The layout of compiled head dim `d` at `br` query rows per step
    /// ([`hopper_bwd_kernel_br`]: 64, or [`hopper_bwd_br`]).
    pub const fn with_br(d: usize, br: usize) -> Self {
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
        for (d, br) in [(64, 128), (128, 64), (64, 64)] {
            let l = HopperBwdSmem::with_br(d, br);
            for off in [l.k, l.v, l.q[0], l.q[1], l.dout[0], l.dout[1], l.ds] {
                assert_eq!(off % 1024, 0, "d {d}: swizzled tiles are 1024-byte aligned");
            }
            assert!(l.dq.iter().all(|o| o % 1024 == 0), "d {d}: swizzled staging");
            assert_eq!((l.bars % 8, l.uni % 8), (0, 0));
            assert_eq!(hopper_bwd_kernel_br(d, true), 64);
            assert_eq!(hopper_bwd_kernel_br(d, false) * d, 8192);
            assert!(l.ds + HOPPER_BWD_BC * br * 2 <= l.dq[0]);
            assert!(l.request_bytes() <= 227 * 1024, "d {d}: {} B", l.request_bytes());
        }
        assert_eq!(HopperBwdSmem::new(64), HopperBwdSmem::with_br(64, 128));
        assert_eq!(hopper_bwd_head_dim(8), Some(64));
        assert_eq!(hopper_bwd_head_dim(72), Some(128));
        assert_eq!(hopper_bwd_head_dim(136), None);
        assert_eq!(hopper_bwd_head_dim(60), None);
    }
}
