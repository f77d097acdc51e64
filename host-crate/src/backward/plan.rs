//! Backward problem → launches: kernel names, block sizes `(Br, Bc)`, grids
//! and scratch sizes.

use flash_attn_common::bwd_params::BwdSmem;
use flash_attn_common::smem_layout::{F32_THREADS, F32_WARPS};

use super::BackwardParams;
use crate::tensor::AttnElem;
use crate::validate::Problem;
use crate::device::FlashAttention;
use crate::dispatch::Launch;
use crate::types::DType;
use crate::error::{FlashAttnError, Result};
use crate::params::LoopOrder;

/// Every backward kernel the host loads from the PTX.
pub const BWD_KERNELS: &[&str] = &[
    "bwd_preprocess_f32",
    "bwd_preprocess_f16",
    "bwd_preprocess_bf16",
    "bwd_dq_convert_f32",
    "bwd_dq_convert_f16",
    "bwd_dq_convert_bf16",
    "bwd_fa2_f32",
    "bwd_fa1_f32",
];

/// f32 `(Br, Bc)` candidates by head dim, in order of preference: the
/// largest tiles whose seven `Bc × d`/`Br × d` tiles fit (d ≤ 64: 64 × 64
/// is 116 KB; d ≤ 128: 64 × 32 is 140 KB; d ≤ 256: 32 × 32 is 206 KB).
const F32_BLOCKS: &[(usize, &[(usize, usize)])] =
    &[(64, &[(64, 64), (32, 32), (16, 16)]), (128, &[(64, 32), (32, 32), (16, 16)]), (256, &[(32, 32), (16, 16)])];

/// Element counts of the scratch buffers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ScratchSizes {
    /// f32 `D`, the LSE's length.
    pub delta: usize,
    /// f32 dQ accumulator: `delta × headdim`.
    pub dq_accum: usize,
    /// u32 semaphores: `ceil(seqlen_q / Br) · batch · nheads` (0 unless deterministic).
    pub semaphores: usize,
}

impl ScratchSizes {
    /// Sizes that serve either call: the larger of each buffer (one
    /// [`BackwardScratch`](crate::BackwardScratch) for backward calls of several shapes).
    pub fn max(self, o: Self) -> Self {
        Self { delta: self.delta.max(o.delta), dq_accum: self.dq_accum.max(o.dq_accum), semaphores: self.semaphores.max(o.semaphores) }
    }
}

/// The launches of one backward call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BackwardPlan {
    pub preprocess: Launch,
    /// The f32 main kernel; `None`: the tensor-core backward (`tc`).
    pub main: Option<Launch>,
    pub convert: Launch,
    pub br: usize,
    pub bc: usize,
    pub scratch: ScratchSizes,
}

fn dtype_suffix(d: DType) -> usize {
    match d {
        DType::F32 => 0,
        DType::F16 => 1,
        DType::BF16 => 2,
    }
}

impl FlashAttention {
    /// The plan of a validated backward problem on this device;
    /// `varlen_total_q`: the packed query rows of a varlen call (its row
    /// buffers are `(nheads, total_q)`), `None` for a dense call.
    pub fn plan_backward<T: AttnElem>(&self, problem: &Problem, params: &BackwardParams, varlen_total_q: Option<usize>) -> Result<BackwardPlan> {
        let dims = problem.dims;
        let d = dims.headdim;
        let fwd = &params.forward;
        let rows = varlen_total_q.map_or(problem.stats_len(), |t| dims.nheads * t);
        let small = |kernel: &'static str| Launch {
            kernel,
            grid: (rows.div_ceil(F32_WARPS as usize)).clamp(1, 1 << 16) as u32,
            threads: F32_THREADS,
            smem_bytes: 0,
        };
        let s = dtype_suffix(T::DTYPE);
        let (preprocess, convert) = (small(BWD_KERNELS[s]), small(BWD_KERNELS[3 + s]));
        let max_smem = self.limits().max_smem_per_block;
        let (main, br, bc) = if T::DTYPE == DType::F32 {
            let (br, bc) = match fwd.block {
                Some((br, bc)) if br == 0 || bc == 0 || br > 1 << 16 || bc > 1 << 16 => {
                    return Err(FlashAttnError::InvalidBlock { br, bc, reason: "block sizes must be in 1..=65536" });
                }
                Some((br, bc)) => (br, bc),
                None => {
                    let cands = F32_BLOCKS.iter().find(|(m, _)| d <= *m).map_or(&[(16, 16)][..], |(_, c)| c);
                    *cands.iter().find(|&&(br, bc)| BwdSmem::new(br, bc, d).bytes() <= max_smem).unwrap_or(cands.last().unwrap_or(&(16, 16)))
                }
            };
            let smem = BwdSmem::new(br, bc, d).bytes();
            if smem > max_smem {
                return Err(FlashAttnError::BlockTooLarge { br, bc, headdim: d, loop_order: fwd.loop_order, smem_bytes: smem, max_smem_bytes: max_smem });
            }
            let kernel = if fwd.loop_order == LoopOrder::Fa1 { "bwd_fa1_f32" } else { "bwd_fa2_f32" };
            let heads = dims.batch * dims.nheads_k;
            let items = if fwd.loop_order == LoopOrder::Fa1 { heads } else { dims.seqlen_k.div_ceil(bc).saturating_mul(heads) };
            let mut main = Launch { kernel, grid: items.clamp(1, i32::MAX as usize) as u32, threads: F32_THREADS, smem_bytes: smem as u32 };
            if params.deterministic && fwd.loop_order == LoopOrder::Fa2 {
                // No more blocks than are resident at once (the deadlock
                // argument of kernel-crate/src/bwd/fa2.rs).
                let resident = self.blocks_per_sm(&main).unwrap_or(1) * self.num_sms();
                main.grid = main.grid.min(resident.max(1) as u32);
            }
            (Some(main), br, bc)
        } else {
            let tc = super::tc::tc_backward_supported(T::DTYPE, d, self.compute_capability());
            // d 136..=256: only the Hopper kernel (no softcap, ALiBi or
            // block size; ALiBi is refused at launch).
            let hopper = super::hopper::hopper_backward_available(self, T::DTYPE, d, params);
            if fwd.loop_order != LoopOrder::Fa2 || !(tc || hopper) {
                return Err(FlashAttnError::Unsupported {
                    argument: "q",
                    dtype: T::DTYPE.name(),
                    what: "the backward pass with this loop order and head dim (the tensor-core backward runs the FA2 order up to d 128; the Hopper backward up to d 256, with softcap or ALiBi up to 128)",
                });
            }
            // The kernels' own tiles: the semaphores are counted with the
            // smallest query tile of the tensor-core kernel's two
            // configurations for this head dim (with and without
            // softcap/ALiBi) and the Hopper kernels' (64 or 128): an upper
            // bound of what any of them indexes, all of it zeroed by the
            // preprocess kernel.
            let cfg = |mods| flash_attn_common::tc_bwd::tc_bwd_config(d, mods);
            let hopper_br = flash_attn_common::hopper_bwd::hopper_bwd_head_dim(d).map(|hd| {
                use flash_attn_common::hopper_bwd::{hopper_bwd_br, hopper_bwd_kernel_br};
                hopper_bwd_br(hd).min(hopper_bwd_kernel_br(hd, true))
            });
            let br = cfg(false).into_iter().chain(cfg(true)).map(|c| c.br).chain(hopper_br).min().unwrap_or(16);
            (None, br, 64)
        };
        let semaphores = if params.deterministic { dims.seqlen_q.div_ceil(br) * dims.batch * dims.nheads } else { 0 };
        Ok(BackwardPlan { preprocess, main, convert, br, bc, scratch: ScratchSizes { delta: rows, dq_accum: rows * d, semaphores } })
    }
}
