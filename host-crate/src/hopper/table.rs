//! The compiled Hopper kernels: their table, the head dims they serve and
//! the probe kernels of the GPU tests. Data only: dispatch plans from it.

use flash_attn_common::hopper::{HopperSmem, hopper_br, hopper_threads};

/// One compiled Hopper kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HopperKernel {
    /// The kernel's PTX entry name.
    pub name: &'static str,
    /// bf16 (else f16).
    pub bf16: bool,
    /// Head dim.
    pub d: usize,
    /// Keys per K/V block.
    pub bc: usize,
    /// Consumer warpgroups (64 query rows each).
    pub wgs: usize,
    /// Persistent: launched with at most one block per SM, each looping
    /// over tiles.
    pub persistent: bool,
    /// Varlen and sliding windows (`_vw`): packed batches (prefix sums on
    /// the device) and window masks, dense or varlen. The dense kernels take
    /// neither (a separate variant keeps their code unchanged).
    pub vw: bool,
}

/// Every Hopper kernel compiled into the sm_90a PTX (mirrors
/// `hopper_kernels!` in `kernel-crate/src/hopper/mod.rs`). The first entry
/// of a (dtype, d) is the default ([`HopperKernel::find`]); the others are
/// the candidates it was measured against (docs/perf-notes.md, Hopper
/// section). Suffixes: `_ov` intra-warpgroup overlap, `_pp` pingpong, `_w3`
/// three consumer warpgroups, `_ps` persistent, `_vw` varlen and sliding
/// windows (the dense default's tile; [`HopperKernel::find_vw`]).
///
/// Defaults, from H100 runs of every candidate (perf notes, Hopper steps
/// 4–5; TFLOP/s at N = 16384 non-causal, f16/bf16): d = 64: three consumer
/// warpgroups (Br = 192), Bc = 128, overlap 452/462, and +8% at N = 4096
/// over Bc = 192 with overlap and pingpong (451/447; overlap only 437/444,
/// Bc = 128 overlap 430/433); d = 128: Bc = 128 with overlap 640/660 (pingpong added
/// 611/633, Bc = 176 + pingpong 640/661 but slower at N = 4096, no overlap
/// 578/581); d = 256: Bc = 64 with overlap 715/764 (no overlap 628/616, with
/// pingpong 734/736); d = 192 (session 18): Bc = 64 with overlap, as d = 256
/// (618 bf16 at N = 4096; 136..184 zero-padded onto it).
pub const HOPPER_KERNELS: &[HopperKernel] = &[
    HopperKernel { name: "flash_fwd_hopper_f16_d64_bc128_ov_w3", bf16: false, d: 64, bc: 128, wgs: 3, persistent: false, vw: false },
    HopperKernel { name: "flash_fwd_hopper_bf16_d64_bc128_ov_w3", bf16: true, d: 64, bc: 128, wgs: 3, persistent: false, vw: false },
    HopperKernel { name: "flash_fwd_hopper_f16_d64_bc192_ov_pp", bf16: false, d: 64, bc: 192, wgs: 2, persistent: false, vw: false },
    HopperKernel { name: "flash_fwd_hopper_bf16_d64_bc192_ov_pp", bf16: true, d: 64, bc: 192, wgs: 2, persistent: false, vw: false },
    HopperKernel { name: "flash_fwd_hopper_f16_d64_bc128_ov", bf16: false, d: 64, bc: 128, wgs: 2, persistent: false, vw: false },
    HopperKernel { name: "flash_fwd_hopper_bf16_d64_bc128_ov", bf16: true, d: 64, bc: 128, wgs: 2, persistent: false, vw: false },
    HopperKernel { name: "flash_fwd_hopper_f16_d64_bc192_ov", bf16: false, d: 64, bc: 192, wgs: 2, persistent: false, vw: false },
    HopperKernel { name: "flash_fwd_hopper_bf16_d64_bc192_ov", bf16: true, d: 64, bc: 192, wgs: 2, persistent: false, vw: false },
    HopperKernel { name: "flash_fwd_hopper_f16_d128_bc128_ov", bf16: false, d: 128, bc: 128, wgs: 2, persistent: false, vw: false },
    HopperKernel { name: "flash_fwd_hopper_bf16_d128_bc128_ov", bf16: true, d: 128, bc: 128, wgs: 2, persistent: false, vw: false },
    HopperKernel { name: "flash_fwd_hopper_f16_d128_bc128", bf16: false, d: 128, bc: 128, wgs: 2, persistent: false, vw: false },
    HopperKernel { name: "flash_fwd_hopper_bf16_d128_bc128", bf16: true, d: 128, bc: 128, wgs: 2, persistent: false, vw: false },
    HopperKernel { name: "flash_fwd_hopper_f16_d128_bc128_ov_pp", bf16: false, d: 128, bc: 128, wgs: 2, persistent: false, vw: false },
    HopperKernel { name: "flash_fwd_hopper_bf16_d128_bc128_ov_pp", bf16: true, d: 128, bc: 128, wgs: 2, persistent: false, vw: false },
    HopperKernel { name: "flash_fwd_hopper_f16_d256_bc64_ov", bf16: false, d: 256, bc: 64, wgs: 2, persistent: false, vw: false },
    HopperKernel { name: "flash_fwd_hopper_bf16_d256_bc64_ov", bf16: true, d: 256, bc: 64, wgs: 2, persistent: false, vw: false },
    HopperKernel { name: "flash_fwd_hopper_f16_d256_bc64", bf16: false, d: 256, bc: 64, wgs: 2, persistent: false, vw: false },
    HopperKernel { name: "flash_fwd_hopper_bf16_d256_bc64", bf16: true, d: 256, bc: 64, wgs: 2, persistent: false, vw: false },
    HopperKernel { name: "flash_fwd_hopper_f16_d64_bc128_ov_w3_ps", bf16: false, d: 64, bc: 128, wgs: 3, persistent: true, vw: false },
    HopperKernel { name: "flash_fwd_hopper_bf16_d64_bc128_ov_w3_ps", bf16: true, d: 64, bc: 128, wgs: 3, persistent: true, vw: false },
    HopperKernel { name: "flash_fwd_hopper_f16_d128_bc128_ov_ps", bf16: false, d: 128, bc: 128, wgs: 2, persistent: true, vw: false },
    HopperKernel { name: "flash_fwd_hopper_bf16_d128_bc128_ov_ps", bf16: true, d: 128, bc: 128, wgs: 2, persistent: true, vw: false },
    HopperKernel { name: "flash_fwd_hopper_f16_d256_bc64_ov_ps", bf16: false, d: 256, bc: 64, wgs: 2, persistent: true, vw: false },
    HopperKernel { name: "flash_fwd_hopper_bf16_d256_bc64_ov_ps", bf16: true, d: 256, bc: 64, wgs: 2, persistent: true, vw: false },
    HopperKernel { name: "flash_fwd_hopper_f16_d64_bc128_ov_w3_vw", bf16: false, d: 64, bc: 128, wgs: 3, persistent: false, vw: true },
    HopperKernel { name: "flash_fwd_hopper_bf16_d64_bc128_ov_w3_vw", bf16: true, d: 64, bc: 128, wgs: 3, persistent: false, vw: true },
    HopperKernel { name: "flash_fwd_hopper_f16_d128_bc128_ov_vw", bf16: false, d: 128, bc: 128, wgs: 2, persistent: false, vw: true },
    HopperKernel { name: "flash_fwd_hopper_bf16_d128_bc128_ov_vw", bf16: true, d: 128, bc: 128, wgs: 2, persistent: false, vw: true },
    HopperKernel { name: "flash_fwd_hopper_f16_d256_bc64_ov_vw", bf16: false, d: 256, bc: 64, wgs: 2, persistent: false, vw: true },
    HopperKernel { name: "flash_fwd_hopper_bf16_d256_bc64_ov_vw", bf16: true, d: 256, bc: 64, wgs: 2, persistent: false, vw: true },
    HopperKernel { name: "flash_fwd_hopper_f16_d192_bc64_ov", bf16: false, d: 192, bc: 64, wgs: 2, persistent: false, vw: false },
    HopperKernel { name: "flash_fwd_hopper_bf16_d192_bc64_ov", bf16: true, d: 192, bc: 64, wgs: 2, persistent: false, vw: false },
    HopperKernel { name: "flash_fwd_hopper_f16_d192_bc64_ov_vw", bf16: false, d: 192, bc: 64, wgs: 2, persistent: false, vw: true },
    HopperKernel { name: "flash_fwd_hopper_bf16_d192_bc64_ov_vw", bf16: true, d: 192, bc: 64, wgs: 2, persistent: false, vw: true },
];

/// The probe kernels (one warpgroup, one 64 × 128 tile at d = 128; see
/// `kernel-crate/src/hopper/probe.rs`), for the GPU tests.
pub const PROBE_KERNELS: &[&str] = &["hopper_probe_f16", "hopper_probe_bf16"];
/// Dynamic shared memory of the probe kernels.
pub const PROBE_SMEM_BYTES: u32 = (64 * 128 * 2 + 2 * 128 * 128 * 2 + 8 + 1024) as u32;

impl HopperKernel {
    /// Query rows per block.
    pub const fn br(&self) -> usize {
        hopper_br(self.wgs)
    }
    /// Threads per block: the consumer warpgroups and the producer, 128 each.
    pub const fn threads(&self) -> u32 {
        hopper_threads(self.wgs) as u32
    }
    /// Dynamic shared memory per block, bytes (tiles, barriers, 1 KB of
    /// alignment slack).
    pub const fn smem_bytes(&self) -> usize {
        HopperSmem::new(self.d, self.bc, self.wgs).request_bytes()
    }
    /// Blocks of the 1-D grid, or `None` past 2³¹ − 1.
    pub fn grid_blocks(&self, batch: usize, nheads: usize, seqlen_q: usize) -> Option<u32> {
        let n = seqlen_q.div_ceil(self.br()).checked_mul(batch.checked_mul(nheads)?)?;
        u32::try_from(n).ok().filter(|&n| n <= i32::MAX as u32 && n > 0)
    }
    /// The default dense kernel for a dtype and head dim, if one is compiled.
    pub fn find(bf16: bool, d: usize) -> Option<&'static HopperKernel> {
        HOPPER_KERNELS.iter().find(|k| k.bf16 == bf16 && k.d == d && !k.vw)
    }

    /// The varlen/window kernel (`_vw`) for a dtype and head dim, if one is
    /// compiled (the dense default's tile and warpgroups).
    pub fn find_vw(bf16: bool, d: usize) -> Option<&'static HopperKernel> {
        HOPPER_KERNELS.iter().find(|k| k.bf16 == bf16 && k.d == d && k.vw)
    }

    /// The kernel for a dtype and head dim whose name ends with
    /// `_d{d}_{variant}` (e.g. `bc128_ov_pp`), if one is compiled.
    pub fn find_variant(bf16: bool, d: usize, variant: &str) -> Option<&'static HopperKernel> {
        let tail = format!("_d{d}_{variant}");
        HOPPER_KERNELS.iter().find(|k| k.bf16 == bf16 && k.d == d && k.name.ends_with(&tail))
    }
}

/// The compiled Hopper head dim that runs a caller's head dim `d`: `d`
/// itself (a head dim of [`HOPPER_KERNELS`]: 64, 128, 192, 256), or for
/// another multiple of 8 in 33..=255 the next of them — the tensor maps
/// keep the caller's `d` as the head axis' extent, so the copy engine
/// zero-fills the columns past it (exact products) and the epilogue stores
/// only `d` columns. At most half of a
/// tile is padding; d ≤ 32 stays on the `mma.sync` kernels (their d = 32
/// tile). Padded tiles beat the `mma.sync` kernels' own (which pad too, to
/// 32/64/96/…/256) on the H100: docs/perf-notes.md, "Hopper: head dims by
/// padding".
pub fn hopper_head_dim(d: usize) -> Option<usize> {
    if d <= 32 || !d.is_multiple_of(8) {
        return None;
    }
    HOPPER_KERNELS.iter().map(|k| k.d).filter(|&k| k >= d).min()
}
