//! Shapes of the Hopper (sm_90a) FP8 (e4m3) forward kernels, written once
//! for the kernels (which carve their shared memory with them) and the host
//! (which encodes the tensor-map boxes and requests the shared memory).
//!
//! Block: one producer warpgroup and two consumer warpgroups of 64 query
//! rows (`Br = 128`). Q and K tiles are K-major e4m3 rows (one byte per
//! element) in panels of `min(d, 128)` bytes with the matching swizzle
//! (128B, or 64B at d = 64); V arrives the same way (`Bc × d`) and the
//! producer warpgroup transposes it into `Vᵀ` (`d × Bc`, keys contiguous,
//! `Bc`-byte swizzled rows): 8-bit `wgmma` takes both operands K-major
//! only. Shared memory (from a 1024-byte aligned base), [`HOPPER_FP8_STAGES`]
//! stages: `Q | K stages | Vᵀ stages | V stages | mbarriers | uniforms`.

/// Query rows per block (two consumer warpgroups of 64).
pub const HOPPER_FP8_BR: usize = 128;
/// Threads per block: the producer warpgroup and two consumers.
pub const HOPPER_FP8_THREADS: usize = 384;
/// Registers per thread after `setmaxnreg`: the producer (which transposes
/// V) and the consumers, 40 + 2 · 232 = 504 of the 512 per lane.
pub const HOPPER_FP8_PRODUCER_REGS: u32 = 40;
pub const HOPPER_FP8_CONSUMER_REGS: u32 = 232;

/// K/V pipeline stages. Two: the producer's transpose of block `i + 1`
/// waits for both consumers to finish `P·V` of block `i − 1`, yet three
/// measured 5% slower at d = 128 (docs/perf-notes.md, FP8 prefill attempt 5).
pub const HOPPER_FP8_STAGES: usize = 2;

/// Keys per K/V block of the d-`d` kernel: 128, or 64 at d = 256 (the O
/// accumulator takes 128 registers there).
pub const fn hopper_fp8_bc(d: usize) -> usize {
    if d > 128 { 64 } else { 128 }
}

/// Bytes per row of one Q/K panel (and the box's inner extent): `min(d, 128)`.
pub const fn hopper_fp8_panel_bytes(d: usize) -> usize {
    if d < 128 { d } else { 128 }
}

/// Bytes of the tile-uniform area ([`HopperFp8Smem::uni`]), as the 16-bit
/// kernels' ([`crate::hopper::HOPPER_UNI_BYTES`]).
pub const HOPPER_FP8_UNI_BYTES: usize = crate::hopper::HOPPER_UNI_BYTES;

/// Byte offsets of the shared-memory carve-up of a d-`d` kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HopperFp8Smem {
    pub q: usize,
    pub k: [usize; HOPPER_FP8_STAGES],
    /// `Vᵀ` (`d × Bc`), what `P·V` reads.
    pub vt: [usize; HOPPER_FP8_STAGES],
    /// V as copied (`Bc × d`, panels as K), what the transpose reads.
    pub v: [usize; HOPPER_FP8_STAGES],
    /// The mbarriers (8 bytes each): Q full, Q empty, then per stage K full,
    /// K empty, V full (the copies), Vᵀ full, Vᵀ empty (5 groups of
    /// [`HOPPER_FP8_STAGES`]), then two spare.
    pub bars: usize,
    pub uni: usize,
    pub used: usize,
}

impl HopperFp8Smem {
    pub const fn new(d: usize) -> Self {
        let bc = hopper_fp8_bc(d);
        let q_bytes = HOPPER_FP8_BR * d;
        let kv = bc * d;
        let n = HOPPER_FP8_STAGES;
        let (mut k, mut vt, mut v) = ([0; HOPPER_FP8_STAGES], [0; HOPPER_FP8_STAGES], [0; HOPPER_FP8_STAGES]);
        let mut i = 0;
        while i < n {
            k[i] = q_bytes + i * kv;
            vt[i] = q_bytes + (n + i) * kv;
            v[i] = q_bytes + (2 * n + i) * kv;
            i += 1;
        }
        let bars = q_bytes + 3 * n * kv;
        let uni = bars + 8 * (2 + 5 * n + 2);
        Self { q: 0, k, vt, v, bars, uni, used: uni + HOPPER_FP8_UNI_BYTES }
    }

    /// Dynamic shared memory to request: what is used plus 1 KB of slack to
    /// align the base to 1024 bytes (the swizzle atom).
    pub const fn request_bytes(&self) -> usize {
        self.used + 1024
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_fp8_kernel_fits_hopper_shared_memory() {
        for d in [64, 128, 256] {
            let s = HopperFp8Smem::new(d);
            assert!(s.request_bytes() <= 227 * 1024, "d = {d}: {}", s.request_bytes());
            // Every tile starts on a 1024-byte swizzle atom.
            for off in [[s.q].as_slice(), &s.k, &s.vt, &s.v].concat() {
                assert_eq!(off % 1024, 0, "d = {d}");
            }
            // Tiles, then barriers, then the uniforms, without overlap.
            assert!(s.v[HOPPER_FP8_STAGES - 1] + hopper_fp8_bc(d) * d <= s.bars && s.bars + 8 * (2 + 5 * HOPPER_FP8_STAGES) < s.uni, "d = {d}");
        }
    }
}
