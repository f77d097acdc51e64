//! The one place that decides which kernel runs and how it is launched:
//! `(dtype, headdim, causal, loop order, arch)` → kernel names, block sizes,
//! grid, threads and dynamic shared memory.
//!
//! # The f32 kernels
//! `kernel-crate/src/{fa1,fa2,standard}.rs`: one kernel per loop order, for
//! every head dim 1..=256, causal or not (both are run-time parameters), on
//! every arch from sm_80 (the PTX is JIT-compiled for the device). Blocks
//! of [`F32_THREADS`] = 256 threads; both products of a step run on a 16 × 16
//! thread grid with 4 × 4 register micro-tiles (64 × 64 outputs per pass), so
//! tiles whose sides are multiples of 64 keep every thread busy.
//!
//! Block sizes `(Br, Bc)` per head dim, first candidate that fits the
//! device's opt-in shared memory (227 KB on H100, 163 KB on A100, 99 KB on
//! sm_86/89); sizes from `flash_attn_common::smem_layout`:
//!
//! | loop | headdim | candidates (Br, Bc) → shared memory of the first | why |
//! | --- | --- | --- | --- |
//! | FA2 | ≤ 64 | (64, 64) → 82 KB, (64, 32), (32, 32), (16, 16) | full 64 × 64 chunks in both products; 2 blocks per SM on H100 |
//! | FA2 | ≤ 128 | (64, 32) → 106 KB, (32, 32), (16, 16) | O stays in shared memory: (64, 64) would need 146 KB (1 block per SM) |
//! | FA2 | ≤ 256 | (64, 32) → 202 KB, (32, 32) → 133 KB, (16, 16) | the largest that fits H100; (32, 32) for A100 |
//! | FA1 | ≤ 128 | (64, 64) → 66 / 114 KB, (32, 32), (16, 16) | K_j, V_j, Q_i, S_ij on chip; O_i, l_i, m_i in HBM |
//! | FA1 | ≤ 256 | (64, 32) → 137 KB, (32, 32), (16, 16) | |
//!
//! These are starting points chosen by the shared-memory budget, not yet by
//! measurement; `docs/perf-notes.md` will carry the timings that confirm or
//! replace them. Standard attention uses fixed 64 × 64 tiles (49 KB).
//!
//! # f16 / bf16: the tensor-core kernels
//! `kernel-crate/src/tc/`: `mma.sync.m16n8k16` with f32 accumulation, for
//! head dims [`TC_HEAD_DIMS`] (32, 64, 96, 128, 256), FA2 and FA1 loop
//! orders. The configuration per head dim is the first of
//! [`TcKernel::preferred`] that fits the device's shared memory (its comment
//! gives the measurements behind the order); `block = Some((br, bc))`
//! picks another compiled configuration ([`TC_KERNELS`]). Standard attention
//! and other head dims are f32-only: a typed [`FlashAttnError::Unsupported`]
//! (the ndarray API converts such calls to f32 instead). The kernels copy
//! 16-byte chunks: q, k, v and o must be 16-byte aligned with strides that
//! are multiples of 8 elements ([`FlashAttnError::Misaligned`] otherwise).

use crate::params::LoopOrder;
use crate::error::{FlashAttnError, Result};
use crate::tc::{TC_HEAD_DIMS, TC_KERNELS, TcKernel, TcLoop};
use crate::types::{DType, Dims, Features};
use flash_attn_common::smem_layout::{F32_THREADS, F32_WARPS, Fa1Smem, Fa2Smem, STD_TILE, StdSmem};

/// What the dispatch decision depends on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DispatchKey {
    pub dtype: DType,
    pub headdim: usize,
    pub causal: bool,
    pub loop_order: LoopOrder,
    /// Compute capability `(major, minor)` of the device.
    pub arch: (i32, i32),
    pub features: Features,
}

/// What the device allows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceLimits {
    /// `CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN`, bytes.
    pub max_smem_per_block: usize,
}

/// One kernel launch: a 1-D grid of `grid` blocks of `threads` threads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Launch {
    pub kernel: &'static str,
    pub grid: u32,
    pub threads: u32,
    pub smem_bytes: u32,
}

/// The launches of one forward pass, in order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Plan {
    /// `fa1_init_f32` (O = 0, l = 0, m = −inf), then `fa1_forward_f32`.
    Fa1 { init: Launch, main: Launch, br: usize, bc: usize },
    /// `fa2_forward_f32`.
    Fa2 { main: Launch, br: usize, bc: usize },
    /// `standard_scores_f32`, `standard_softmax_f32`, `standard_pv_f32` over
    /// an f32 scratch matrix of `scratch_len` elements.
    Standard { scores: Launch, softmax: Launch, pv: Launch, scratch_len: usize },
    /// f16/bf16 FA2 on tensor cores.
    TcFa2 { kernel: &'static TcKernel, main: Launch },
    /// f16/bf16 FA1 on tensor cores: `fa1_init_f32` sets the f32 running
    /// output (`accum_len` elements, contiguous), l and m to 0, 0, −inf; then
    /// the tensor-core kernel.
    TcFa1 { kernel: &'static TcKernel, init: Launch, main: Launch, accum_len: usize },
    /// f16/bf16 FA2 on the Hopper-native kernels (sm_90a; `crate::hopper`).
    Hopper { kernel: &'static crate::hopper::HopperKernel, main: Launch },
}

/// Every kernel the host loads from the PTX (f32 path).
pub const F32_KERNELS: &[&str] =
    &["fa1_init_f32", "fa1_forward_f32", "fa2_forward_f32", "standard_scores_f32", "standard_softmax_f32", "standard_pv_f32"];

/// One row of the f32 block-size table.
struct F32Entry {
    loop_order: LoopOrder,
    max_headdim: usize,
    /// `(Br, Bc)` in order of preference.
    blocks: &'static [(usize, usize)],
}

/// The f32 block-size table (see the module docs for the reasons).
const F32_TABLE: &[F32Entry] = &[
    F32Entry { loop_order: LoopOrder::Fa2, max_headdim: 64, blocks: &[(64, 64), (64, 32), (32, 32), (16, 16)] },
    F32Entry { loop_order: LoopOrder::Fa2, max_headdim: 128, blocks: &[(64, 32), (32, 32), (16, 16)] },
    F32Entry { loop_order: LoopOrder::Fa2, max_headdim: 256, blocks: &[(64, 32), (32, 32), (16, 16)] },
    F32Entry { loop_order: LoopOrder::Fa1, max_headdim: 128, blocks: &[(64, 64), (32, 32), (16, 16)] },
    F32Entry { loop_order: LoopOrder::Fa1, max_headdim: 256, blocks: &[(64, 32), (32, 32), (16, 16)] },
];

/// Largest block count the kernels are launched with (grid.x ≤ 2³¹ − 1);
/// every kernel strides over its work items, so more work is fine.
const MAX_GRID: u64 = i32::MAX as u64;
/// Cap of the grid of the element-wise `fa1_init_f32`.
const MAX_INIT_GRID: u64 = 1 << 16;

fn grid(work_items: u64) -> u32 {
    work_items.clamp(1, MAX_GRID) as u32
}

/// Dynamic shared memory of the FA1 or FA2 kernel for `(br, bc, d)`, bytes.
pub fn smem_bytes(loop_order: LoopOrder, br: usize, bc: usize, headdim: usize) -> usize {
    match loop_order {
        LoopOrder::Fa1 => Fa1Smem::new(br, bc, headdim).bytes(),
        LoopOrder::Fa2 => Fa2Smem::new(br, bc, headdim).bytes(),
        LoopOrder::Standard => StdSmem::new().bytes(),
    }
}

/// Chooses `(Br, Bc)`: the user's `block` if it fits, else the first table
/// candidate that fits.
pub fn choose_block(
    loop_order: LoopOrder,
    headdim: usize,
    block: Option<(usize, usize)>,
    limits: &DeviceLimits,
) -> Result<(usize, usize)> {
    if let Some((br, bc)) = block {
        if br == 0 || bc == 0 {
            return Err(FlashAttnError::InvalidBlock { br, bc, reason: "block sizes must be at least 1" });
        }
        if br > u32::MAX as usize || bc > u32::MAX as usize {
            return Err(FlashAttnError::InvalidBlock { br, bc, reason: "block sizes must fit in 32 bits" });
        }
        let need = smem_bytes(loop_order, br, bc, headdim);
        if need > limits.max_smem_per_block {
            return Err(FlashAttnError::BlockTooLarge {
                br,
                bc,
                headdim,
                loop_order,
                smem_bytes: need,
                max_smem_bytes: limits.max_smem_per_block,
            });
        }
        return Ok((br, bc));
    }
    let entry = F32_TABLE.iter().find(|e| e.loop_order == loop_order && headdim <= e.max_headdim);
    let candidates = entry.map(|e| e.blocks).unwrap_or(&[(16, 16)]);
    for &(br, bc) in candidates {
        if smem_bytes(loop_order, br, bc, headdim) <= limits.max_smem_per_block {
            return Ok((br, bc));
        }
    }
    let (br, bc) = *candidates.last().unwrap_or(&(16, 16));
    Err(FlashAttnError::BlockTooLarge {
        br,
        bc,
        headdim,
        loop_order,
        smem_bytes: smem_bytes(loop_order, br, bc, headdim),
        max_smem_bytes: limits.max_smem_per_block,
    })
}

/// The compiled tensor-core head dim that runs a caller's head dim `d`: the
/// smallest of [`TC_HEAD_DIMS`] ≥ `d`, for `d` a multiple of 8 in 8..=256
/// (the kernels zero-pad the extra columns, as FlashAttention-2 rounds to
/// 32/64/96/128/160/192/224/256).
pub fn tc_head_dim(d: usize) -> Option<usize> {
    if d == 0 || !d.is_multiple_of(8) {
        return None;
    }
    TC_HEAD_DIMS.iter().copied().find(|&k| k >= d)
}

/// Whether the tensor-core path runs this 16-bit problem (else it is an
/// [`FlashAttnError::Unsupported`] on the device-buffer API).
pub fn tc_supports(loop_order: LoopOrder, headdim: usize) -> bool {
    loop_order != LoopOrder::Standard && tc_head_dim(headdim).is_some()
}

/// The tensor-core plan of an f16/bf16 problem.
fn plan_tc(key: &DispatchKey, dims: &Dims, block: Option<(usize, usize)>, limits: &DeviceLimits) -> Result<Plan> {
    let dtype = key.dtype.name();
    let tc_loop = match key.loop_order {
        LoopOrder::Fa2 => TcLoop::Fa2,
        LoopOrder::Fa1 if key.features.varlen || key.features.mods || key.features.decode => {
            return Err(FlashAttnError::Unsupported {
                argument: "params.loop_order",
                dtype,
                what: "FA1 with varlen, softcap or ALiBi (FA1 takes GQA and windows; use FA2)",
            });
        }
        LoopOrder::Fa1 => TcLoop::Fa1,
        LoopOrder::Standard => {
            return Err(FlashAttnError::Unsupported {
                argument: "params.loop_order",
                dtype,
                what: "LoopOrder::Standard (the f32 baseline; convert to f32, or use Fa1/Fa2)",
            });
        }
    };
    let Some(kd) = tc_head_dim(key.headdim) else {
        return Err(FlashAttnError::Unsupported {
            argument: "q",
            dtype,
            what: "this head dim on the tensor-core path (supported: multiples of 8 in 8..=256; f32 takes any 1..=256)",
        });
    };
    let bf16 = key.dtype == DType::BF16;
    let kernel = match block {
        // The tuned default, or the fastest smaller tile that fits this
        // device's shared memory (falls through to BlockTooLarge below only
        // when none does).
        None => TcKernel::default_fitting(tc_loop, bf16, kd, key.features, limits.max_smem_per_block)
            .or_else(|| TcKernel::default_for(tc_loop, bf16, kd, key.features)),
        Some((br, bc)) => TC_KERNELS
            .iter()
            .find(|k| k.loop_order == tc_loop && k.bf16 == bf16 && k.d == kd && k.serves(key.features) && k.br() == br && k.bc == bc),
    };
    let Some(kernel) = kernel else {
        let (br, bc) = block.unwrap_or((0, 0));
        return Err(FlashAttnError::InvalidBlock {
            br,
            bc,
            reason: "no tensor-core kernel is compiled for this (Br, Bc), dtype and head dim (see flash_attn::advanced::tc::TC_KERNELS)",
        });
    };
    if kernel.smem_bytes() > limits.max_smem_per_block {
        return Err(FlashAttnError::BlockTooLarge {
            br: kernel.br(),
            bc: kernel.bc,
            headdim: key.headdim,
            loop_order: key.loop_order,
            smem_bytes: kernel.smem_bytes(),
            max_smem_bytes: limits.max_smem_per_block,
        });
    }
    let Dims { batch, nheads, seqlen_q, .. } = *dims;
    let blocks = kernel.grid_blocks(batch, nheads, seqlen_q).ok_or(FlashAttnError::DimTooLarge {
        argument: "q",
        axis: "batch·nheads·ceil(seqlen/Br) (grid blocks)",
        value: batch.saturating_mul(nheads).saturating_mul(seqlen_q.div_ceil(kernel.br())),
        max: i32::MAX as usize,
    })?;
    let main = Launch { kernel: kernel.name, grid: blocks, threads: kernel.threads(), smem_bytes: kernel.smem_bytes() as u32 };
    match tc_loop {
        TcLoop::Fa2 => Ok(Plan::TcFa2 { kernel, main }),
        TcLoop::Fa1 => {
            let accum_len = batch
                .checked_mul(nheads)
                .and_then(|x| x.checked_mul(seqlen_q))
                .and_then(|x| x.checked_mul(kd))
                .filter(|&n| n.checked_mul(4).is_some())
                .ok_or_else(|| FlashAttnError::ScratchTooLarge { what: format!("{batch}·{nheads}·{seqlen_q}·{kd} f32") })?;
            let init = Launch {
                kernel: "fa1_init_f32",
                grid: (accum_len as u64).div_ceil(F32_THREADS as u64).clamp(1, MAX_INIT_GRID) as u32,
                threads: F32_THREADS,
                smem_bytes: 0,
            };
            Ok(Plan::TcFa1 { kernel, init, main, accum_len })
        }
    }
}

/// The launches for `key` on a problem of size `dims`.
pub fn plan(key: &DispatchKey, dims: &Dims, block: Option<(usize, usize)>, limits: &DeviceLimits) -> Result<Plan> {
    if key.arch < (8, 0) {
        return Err(FlashAttnError::UnsupportedDevice { name: String::new(), major: key.arch.0, minor: key.arch.1 });
    }
    if key.dtype != DType::F32 {
        return plan_tc(key, dims, block, limits);
    }
    let Dims { batch, nheads, seqlen_q, seqlen_k, headdim, .. } = *dims;
    let bh = batch as u64 * nheads as u64;
    let threads = F32_THREADS;
    if key.features.varlen && key.loop_order != LoopOrder::Fa2 {
        return Err(FlashAttnError::Unsupported {
            argument: "params.loop_order",
            dtype: key.dtype.name(),
            what: "varlen with FA1 or Standard (varlen runs the FA2 loop order)",
        });
    }
    match key.loop_order {
        LoopOrder::Fa2 => {
            let (br, bc) = choose_block(LoopOrder::Fa2, headdim, block, limits)?;
            let tr = seqlen_q.div_ceil(br) as u64;
            let main = Launch {
                kernel: "fa2_forward_f32",
                grid: grid(tr.saturating_mul(bh)),
                threads,
                smem_bytes: smem_bytes(LoopOrder::Fa2, br, bc, headdim) as u32,
            };
            Ok(Plan::Fa2 { main, br, bc })
        }
        LoopOrder::Fa1 => {
            let (br, bc) = choose_block(LoopOrder::Fa1, headdim, block, limits)?;
            let elems = (bh * seqlen_q as u64).saturating_mul(headdim as u64);
            let init = Launch {
                kernel: "fa1_init_f32",
                grid: elems.div_ceil(threads as u64).clamp(1, MAX_INIT_GRID) as u32,
                threads,
                smem_bytes: 0,
            };
            let main = Launch {
                kernel: "fa1_forward_f32",
                grid: grid(bh),
                threads,
                smem_bytes: smem_bytes(LoopOrder::Fa1, br, bc, headdim) as u32,
            };
            Ok(Plan::Fa1 { init, main, br, bc })
        }
        LoopOrder::Standard => {
            let scratch_len = batch
                .checked_mul(nheads)
                .and_then(|x| x.checked_mul(seqlen_q))
                .and_then(|x| x.checked_mul(seqlen_k))
                .filter(|&n| n.checked_mul(4).is_some())
                .ok_or_else(|| FlashAttnError::ScratchTooLarge {
                    what: format!("{batch}·{nheads}·{seqlen_q}·{seqlen_k} f32")
                })?;
            let smem = StdSmem::new().bytes() as u32;
            let tq = seqlen_q.div_ceil(STD_TILE) as u64;
            let tk = seqlen_k.div_ceil(STD_TILE) as u64;
            let td = headdim.div_ceil(STD_TILE) as u64;
            let rows = bh * seqlen_q as u64;
            Ok(Plan::Standard {
                scores: Launch { kernel: "standard_scores_f32", grid: grid(bh * tq * tk), threads, smem_bytes: smem },
                softmax: Launch {
                    kernel: "standard_softmax_f32",
                    grid: grid(rows.div_ceil(F32_WARPS as u64)),
                    threads,
                    smem_bytes: 0,
                },
                pv: Launch { kernel: "standard_pv_f32", grid: grid(bh * tq * td), threads, smem_bytes: smem },
                scratch_len,
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const H100: DeviceLimits = DeviceLimits { max_smem_per_block: 232_448 };
    const A100: DeviceLimits = DeviceLimits { max_smem_per_block: 166_912 };
    const SM89: DeviceLimits = DeviceLimits { max_smem_per_block: 101_376 };

    #[test]
    fn defaults_fit_every_head_dim_on_every_device() {
        for lim in [H100, A100, SM89] {
            for lo in [LoopOrder::Fa1, LoopOrder::Fa2] {
                for d in 1..=256 {
                    let (br, bc) = choose_block(lo, d, None, &lim).unwrap();
                    assert!(smem_bytes(lo, br, bc, d) <= lim.max_smem_per_block, "{lo:?} d={d} {lim:?}");
                }
            }
        }
    }

    #[test]
    fn h100_defaults() {
        assert_eq!(choose_block(LoopOrder::Fa2, 64, None, &H100).unwrap(), (64, 64));
        assert_eq!(choose_block(LoopOrder::Fa2, 128, None, &H100).unwrap(), (64, 32));
        assert_eq!(choose_block(LoopOrder::Fa2, 256, None, &H100).unwrap(), (64, 32));
        assert_eq!(choose_block(LoopOrder::Fa2, 256, None, &A100).unwrap(), (32, 32));
        assert_eq!(choose_block(LoopOrder::Fa1, 256, None, &H100).unwrap(), (64, 32));
    }

    #[test]
    fn tensor_core_defaults_fall_back_to_tiles_that_fit() {
        use crate::tc::{TC_HEAD_DIMS, TcKernel, TcLoop};
        let all = [
            Features::default(),
            Features { varlen: true, mods: false, decode: false },
            Features { varlen: false, mods: true, decode: false },
            Features { varlen: true, mods: true, decode: false },
            Features { varlen: false, mods: false, decode: true },
        ];
        for lo in [TcLoop::Fa2, TcLoop::Fa1] {
            for bf16 in [false, true] {
                for &d in TC_HEAD_DIMS {
                    // FA1 takes neither varlen nor the score modifiers.
                    let features: &[Features] = if lo == TcLoop::Fa1 { &all[..1] } else { &all };
                    for &f in features {
                        let best = TcKernel::default_for(lo, bf16, d, f).unwrap_or_else(|| panic!("{lo:?} d={d} {f:?}"));
                        assert!(best.serves(f));
                        // The H100 gets the tuned default itself.
                        assert_eq!(TcKernel::default_fitting(lo, bf16, d, f, H100.max_smem_per_block), Some(best));
                        for dev in [&A100, &SM89] {
                            let k = TcKernel::default_fitting(lo, bf16, d, f, dev.max_smem_per_block)
                                .unwrap_or_else(|| panic!("{lo:?} d={d} {f:?}: no tile fits {} B", dev.max_smem_per_block));
                            assert!(k.smem_bytes() <= dev.max_smem_per_block && k.serves(f));
                            assert_eq!((k.loop_order, k.bf16, k.d), (lo, bf16, d));
                        }
                    }
                }
            }
        }
        // Dense calls never pay for the variants; varlen takes fa2v, softcap/ALiBi fa2x.
        let dense = TcKernel::default_for(TcLoop::Fa2, true, 128, Features::default()).unwrap();
        assert!(!dense.varlen && !dense.mods && dense.bc == 64);
        assert!(TcKernel::default_for(TcLoop::Fa2, true, 128, all[1]).unwrap().name.contains("fa2v"));
        assert!(TcKernel::default_for(TcLoop::Fa2, true, 128, all[2]).unwrap().name.contains("fa2x"));
        // d = 256: 8 warps × Bc = 64 need 198 KB; the A100 gets 4 warps × Bc = 32.
        let k = TcKernel::default_fitting(TcLoop::Fa2, true, 256, all[0], A100.max_smem_per_block).unwrap();
        assert_eq!((k.warps, k.mt, k.bc), (4, 1, 32));
        // d = 128 on sm_89 (99 KB): Bc = 48 instead of 64.
        let k = TcKernel::default_fitting(TcLoop::Fa2, false, 128, all[0], SM89.max_smem_per_block).unwrap();
        assert_eq!((k.warps, k.mt, k.bc), (4, 2, 48));
    }

    #[test]
    fn user_blocks_are_checked() {
        assert!(matches!(
            choose_block(LoopOrder::Fa2, 64, Some((0, 64)), &H100),
            Err(FlashAttnError::InvalidBlock { br: 0, bc: 64, .. })
        ));
        assert!(matches!(
            choose_block(LoopOrder::Fa1, 64, Some((64, 768)), &H100),
            Err(FlashAttnError::BlockTooLarge { br: 64, bc: 768, .. })
        ));
        assert!(matches!(
            choose_block(LoopOrder::Fa2, 256, Some((usize::MAX, usize::MAX)), &H100),
            Err(FlashAttnError::InvalidBlock { .. })
        ));
        assert_eq!(choose_block(LoopOrder::Fa2, 64, Some((7, 13)), &H100).unwrap(), (7, 13));
    }

    #[test]
    fn grid_is_capped_and_nonzero() {
        let key = DispatchKey {
            dtype: DType::F32,
            headdim: 1,
            causal: false,
            loop_order: LoopOrder::Fa2,
            arch: (9, 0),
            features: Features::default(),
        };
        let dims = Dims { batch: 1 << 20, nheads: 1 << 12, nheads_k: 1 << 12, seqlen_q: 1 << 10, seqlen_k: 1, headdim: 1 };
        let Plan::Fa2 { main, .. } = plan(&key, &dims, None, &H100).unwrap() else { panic!() };
        assert_eq!(main.grid, i32::MAX as u32);
    }

    #[test]
    fn half_types_are_unsupported_here() {
        let key = DispatchKey {
            dtype: DType::BF16,
            headdim: 64,
            causal: true,
            loop_order: LoopOrder::Fa2,
            arch: (9, 0),
            features: Features::default(),
        };
        let dims = Dims { batch: 1, nheads: 1, nheads_k: 1, seqlen_q: 1, seqlen_k: 1, headdim: 64 };
        assert!(matches!(plan(&key, &dims, None, &H100), Ok(Plan::TcFa2 { .. }) | Ok(Plan::TcFa1 { .. }) | Err(FlashAttnError::Unsupported { dtype: "bf16", .. })));
    }

    #[test]
    fn head_dims_round_up_to_compiled_tiles() {
        assert_eq!(tc_head_dim(8), Some(32));
        assert_eq!(tc_head_dim(40), Some(64));
        assert_eq!(tc_head_dim(80), Some(96));
        assert_eq!(tc_head_dim(136), Some(160));
        assert_eq!(tc_head_dim(256), Some(256));
        assert_eq!(tc_head_dim(12), None);
        assert_eq!(tc_head_dim(264), None);
        // FA1 and Standard with the variant-only features are typed errors.
        let key = |lo, features| DispatchKey { dtype: DType::F16, headdim: 80, causal: false, loop_order: lo, arch: (9, 0), features };
        let dims = Dims { batch: 1, nheads: 2, nheads_k: 1, seqlen_q: 5, seqlen_k: 5, headdim: 80 };
        let mods = Features { varlen: false, mods: true, decode: false };
        assert!(matches!(plan(&key(LoopOrder::Fa1, mods), &dims, None, &H100), Err(FlashAttnError::Unsupported { .. })));
        let Ok(Plan::TcFa2 { kernel, .. }) = plan(&key(LoopOrder::Fa2, mods), &dims, None, &H100) else { panic!() };
        assert_eq!((kernel.d, kernel.mods), (96, true));
        let f32_key = DispatchKey { dtype: DType::F32, ..key(LoopOrder::Standard, Features { varlen: true, mods: false, decode: false }) };
        assert!(matches!(plan(&f32_key, &dims, None, &H100), Err(FlashAttnError::Unsupported { .. })));
    }
}
