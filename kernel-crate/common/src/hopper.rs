//! Shapes of the Hopper (sm_90a) forward kernels, written once for the
//! kernels (which carve their shared memory with them) and the host (which
//! encodes the tensor-map boxes and requests the shared memory).
//!
//! Block: one producer warpgroup (one thread issues every TMA copy) and
//! `wgs` (2 or 3) consumer warpgroups of 64 query rows each, so
//! `Br = 64·wgs`. Shared memory (from a 1024-byte aligned base, 128B-swizzled
//! tiles stored as 64-column panels of `rows × 128` bytes):
//! `Q (Br × d) | K stage 0, 1 (Bc × d) | V stage 0, 1 (Bc × d) | 10 mbarriers | uniforms`.

/// Query rows per block with `wgs` consumer warpgroups.
pub const fn hopper_br(wgs: usize) -> usize {
    64 * wgs
}
/// Threads per block: the producer warpgroup and the consumers.
pub const fn hopper_threads(wgs: usize) -> usize {
    128 * (1 + wgs)
}
/// K/V pipeline depth.
pub const HOPPER_STAGES: usize = 2;
/// Columns of one 128B-swizzled panel (128 bytes of 16-bit elements): the
/// innermost box extent of every tensor map.
pub const HOPPER_PANEL_COLS: usize = 64;
/// Registers per thread after `setmaxnreg`: producer, consumers, within the
/// 512 registers per lane of a 128-thread quarter of the register file: 2
/// consumer warpgroups 32 + 2·232 = 496, 3: 32 + 3·160 = 512. (Step 5 of
/// the perf notes used 24 / 240; the persistent tile loop needs 32 in the
/// producer, and 232 still fits every default consumer without spills.)
pub const HOPPER_PRODUCER_REGS: u32 = 32;
pub const fn hopper_consumer_regs(wgs: usize) -> u32 {
    if wgs == 3 { 160 } else { 232 }
}

/// Bytes of the tile-uniform area ([`HopperSmem::uni`]).
pub const HOPPER_UNI_BYTES: usize = 48;

/// Byte offsets of the shared-memory carve-up of a `(d, bc)` kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HopperSmem {
    pub q: usize,
    pub k: [usize; HOPPER_STAGES],
    pub v: [usize; HOPPER_STAGES],
    /// The mbarriers: Q full, K full ×2, V full ×2, K empty ×2, V empty ×2,
    /// Q empty (8 bytes each).
    pub bars: usize,
    /// 48 bytes of tile uniforms (the varlen/window kernels: the tile's
    /// sequence, key blocks and window bounds, written once by thread 0).
    pub uni: usize,
    /// Bytes used from the aligned base.
    pub used: usize,
}

impl HopperSmem {
    pub const fn new(d: usize, bc: usize, wgs: usize) -> Self {
        let q_bytes = hopper_br(wgs) * d * 2;
        let kv = bc * d * 2;
        let k = [q_bytes, q_bytes + kv];
        let v = [q_bytes + 2 * kv, q_bytes + 3 * kv];
        let bars = q_bytes + 4 * kv;
        let uni = bars + 8 * 10;
        Self { q: 0, k, v, bars, uni, used: uni + HOPPER_UNI_BYTES }
    }

    /// Dynamic shared memory to request: what is used plus 1 KB of slack to
    /// align the base to 1024 bytes (the 128B swizzle atom).
    pub const fn request_bytes(&self) -> usize {
        self.used + 1024
    }
}

/// Bytes of a `rows × d` 16-bit tile (what one TMA transaction delivers).
pub const fn hopper_tile_bytes(rows: usize, d: usize) -> usize {
    rows * d * 2
}
