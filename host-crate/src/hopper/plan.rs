//! The dispatch rule of the Hopper kernels (the module docs of `hopper`).

use crate::dispatch::{DispatchKey, Launch, Plan};
use crate::types::{DType, Dims};
use crate::error::{FlashAttnError, Result};
use crate::params::LoopOrder;

use super::table::{HopperKernel, hopper_head_dim};

/// The Hopper plan of a problem, or `None` when the rule in the module docs
/// sends it to the other kernels. `sm90a` says whether the loaded module is
/// the sm_90a build (it holds the Hopper kernels); `windowed`, whether the
/// call has a sliding window (a bounded side other than causal's right 0).
/// Varlen or windowed calls take the `_vw` kernel of the (dtype, d); score
/// modifiers (softcap, ALiBi) and decode never come here.
pub fn plan(
    sm90a: bool,
    key: &DispatchKey,
    windowed: bool,
    dims: &Dims,
    block: Option<(usize, usize)>,
    max_smem_per_block: usize,
) -> Result<Option<Plan>> {
    if !sm90a || key.arch != (9, 0) || key.loop_order != LoopOrder::Fa2 || block.is_some() || key.dtype == DType::F32 {
        return Ok(None);
    }
    if key.features.mods || key.features.decode {
        return Ok(None);
    }
    let bf16 = key.dtype == DType::BF16;
    let Some(d) = hopper_head_dim(key.headdim) else { return Ok(None) };
    let found = if key.features.varlen || windowed { HopperKernel::find_vw(bf16, d) } else { HopperKernel::find(bf16, d) };
    let Some(kernel) = found else { return Ok(None) };
    if kernel.smem_bytes() > max_smem_per_block {
        return Ok(None);
    }
    let blocks = kernel.grid_blocks(dims.batch, dims.nheads, dims.seqlen_q).ok_or(FlashAttnError::DimTooLarge {
        argument: "q",
        axis: "batch·nheads·ceil(seqlen/Br) (grid blocks)",
        value: dims.batch.saturating_mul(dims.nheads).saturating_mul(dims.seqlen_q.div_ceil(kernel.br())),
        max: i32::MAX as usize,
    })?;
    let main = Launch { kernel: kernel.name, grid: blocks, threads: kernel.threads(), smem_bytes: kernel.smem_bytes() as u32 };
    Ok(Some(Plan::Hopper { kernel, main }))
}
