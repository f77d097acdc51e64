//! The tensor-core FA2-order backward main kernel (f16/bf16, sm_80+,
//! `kernel-crate/src/tc/bwd.rs`): its table, its choice per head dim and
//! device, and its launch. The preprocess (`D_i`, zeroed dQ accumulator
//! and semaphores) and the dQ conversion are launched by the caller
//! (`backward/`).
//!
//! Kernel names are `flash_bwd_tc{,x}_{f16,bf16}_d{D}_w{warps}_br{Br}_bc{Bc}`
//! (`x`: softcap/ALiBi compiled in, chosen when the call sets either); the configurations (shared memory,
//! threads, `Br`, `Bc`) are `flash_attn_common::tc_bwd::TC_BWD_CONFIGS`,
//! shared with the kernels. Grid: `batch · nheads_k · ceil(seqlen_k / Bc)`
//! blocks of `32 · warps` threads.

use std::sync::Arc;

use cudarc::driver::{CudaFunction, CudaStream, LaunchConfig, PushKernelArg};
use flash_attn_common::BwdParams;
use flash_attn_common::tc_bwd::{TcBwdConfig, tc_bwd_config};

use crate::types::DType;
use crate::error::{FlashAttnError, Result};
use crate::tc::KernelArg;

/// One compiled backward kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct TcBwdKernel {
    pub name: &'static str,
    pub bf16: bool,
    /// Softcap and ALiBi compiled in (the kernels without them ignore both).
    pub mods: bool,
    /// Compiled head dim.
    pub d: usize,
}

macro_rules! table {
    ($( $name:ident $bf:literal $mods:literal $d:literal; )*) => {
        /// Every backward kernel compiled into the PTX (mirrors the
        /// `bwd_kernels!` list of `kernel-crate/src/tc/bwd.rs`).
        pub(crate) const TC_BWD_KERNELS: &[TcBwdKernel] = &[$(
            TcBwdKernel { name: stringify!($name), bf16: $bf, mods: $mods, d: $d },
        )*];
    };
}

table! {
    flash_bwd_tc_f16_d32_w8_br64_bc128 false false 32;
    flash_bwd_tc_bf16_d32_w8_br64_bc128 true false 32;
    flash_bwd_tc_f16_d64_w8_br64_bc128 false false 64;
    flash_bwd_tc_bf16_d64_w8_br64_bc128 true false 64;
    flash_bwd_tc_f16_d128_w8_br32_bc128 false false 128;
    flash_bwd_tc_bf16_d128_w8_br32_bc128 true false 128;
    flash_bwd_tc_f16_d192_w8_br32_bc64 false false 192;
    flash_bwd_tc_bf16_d192_w8_br32_bc64 true false 192;
    flash_bwd_tcx_f16_d32_w8_br64_bc128 false true 32;
    flash_bwd_tcx_bf16_d32_w8_br64_bc128 true true 32;
    flash_bwd_tcx_f16_d64_w8_br32_bc128 false true 64;
    flash_bwd_tcx_bf16_d64_w8_br32_bc128 true true 64;
    flash_bwd_tcx_f16_d128_w8_br16_bc128 false true 128;
    flash_bwd_tcx_bf16_d128_w8_br16_bc128 true true 128;
}

/// The opt-in shared memory per block of compute capability `cc`
/// (CUDA programming guide, "Technical specifications"): 163 KB on sm_80 /
/// sm_87, 99 KB on sm_86 / sm_89 / sm_120, 227 KB on sm_90 / sm_100;
/// 99 KB for any other (the smallest of sm_80+).
fn max_smem_optin(cc: (i32, i32)) -> usize {
    match cc {
        (8, 0) | (8, 7) => 163 * 1024,
        (9, 0) | (10, _) => 227 * 1024,
        _ => 99 * 1024,
    }
}

/// The kernel of a configuration (compiled head dim, softcap/ALiBi) and dtype.
fn kernel_for(bf16: bool, cfg: &TcBwdConfig) -> Option<&'static TcBwdKernel> {
    TC_BWD_KERNELS.iter().find(|k| k.bf16 == bf16 && k.mods == cfg.mods && k.d == cfg.d)
}

/// Whether the tensor-core backward runs `dtype` at `headdim` on a device
/// of compute capability `cc`: f16/bf16, sm_80+, `headdim` a multiple of 8
/// up to 256, and the configuration's shared memory within the device's
/// opt-in limit (sm_86/sm_89: d ≤ 64 only).
pub(crate) fn tc_backward_supported(dtype: DType, headdim: usize, cc: (i32, i32)) -> bool {
    let sixteen_bit = matches!(dtype, DType::F16 | DType::BF16);
    let fits = |mods| tc_bwd_config(headdim, mods).is_some_and(|c| c.smem_bytes() <= max_smem_optin(cc));
    sixteen_bit && cc >= (8, 0) && fits(false) && fits(true)
}

/// The function of `k` (loaded on first use, its dynamic shared-memory
/// limit raised to the device's maximum, which covers `smem`).
fn function(fa: &crate::FlashAttention, k: &TcBwdKernel, smem: usize) -> Result<CudaFunction> {
    match fa.kernel(k.name)? {
        Some(f) => Ok(f.clone()),
        None => Err(crate::error::FlashAttnError::Ptx {
            build: fa.ptx_build().arch,
            reason: format!("backward kernel `{}` ({smem} B of shared memory) is not in this PTX build", k.name),
        }),
    }
}

/// Launches the backward main kernel on `stream` for `p` (its `br`/`bc`
/// are set here from the configuration).
///
/// # Safety
/// `p` satisfies the kernel's contract: every pointer valid for the shapes
/// and strides it states (q, k, v, dO, LSE, delta, dq_accum with
/// `lse index · headdim` f32, dK, dV; varlen arrays; ALiBi slopes),
/// 16-byte aligned, element strides multiples of 8, dq_accum zeroed and, in
/// deterministic mode, `bwd_semaphore_len(batch, nheads, seqlen_q, br)`
/// zeroed u32 at `dq_semaphore_ptr` — all written on `stream` before this
/// launch (the preprocess kernel).
pub(crate) unsafe fn launch_tc_backward(fa: &crate::FlashAttention, stream: &Arc<CudaStream>, p: &BwdParams, dtype: DType) -> Result<()> {
    let what = "the tensor-core backward (f16/bf16, head dims multiple of 8 up to 128)";
    let bf16 = match dtype {
        DType::F16 => false,
        DType::BF16 => true,
        DType::F32 => return Err(FlashAttnError::Unsupported { argument: "q", dtype: dtype.name(), what }),
    };
    let d = p.fwd.headdim as usize;
    let mods = p.fwd.softcap != 0.0 || p.fwd.alibi_ptr != 0;
    let cfg = tc_bwd_config(d, mods).ok_or(FlashAttnError::HeadDimOutOfRange { argument: "q", headdim: d })?;
    let smem = cfg.smem_bytes();
    if smem > fa.limits().max_smem_per_block {
        return Err(FlashAttnError::Unsupported { argument: "q", dtype: dtype.name(), what: "the tensor-core backward at this head dim on this device (shared memory)" });
    }
    let k = kernel_for(bf16, &cfg).ok_or(FlashAttnError::Unsupported { argument: "q", dtype: dtype.name(), what })?;
    let f = function(fa, k, smem)?;

    // SAFETY: threads and shared memory are the configuration's (`tc_bwd`,
    // as the kernel's const generics); `p` is the caller's contract.
    unsafe { launch_key_blocks(stream, &f, p, (cfg.br, cfg.bc()), cfg.threads(), smem) }
}

/// The launch of a backward main kernel of the FA2 order, one block per
/// (K/V block of `bc` keys, batch, KV head) — the grid of the tensor-core
/// and the Hopper kernels: `p` with `p.br`, `p.bc` set to `(br, bc)` and the
/// configuration for `threads` threads and `smem` bytes of dynamic shared
/// memory; `None` when there is no block.
///
/// Errors: [`FlashAttnError::DimTooLarge`] past `i32::MAX` blocks.
pub(crate) fn key_block_launch(p: &BwdParams, (br, bc): (usize, usize), threads: usize, smem: usize) -> Result<Option<(BwdParams, LaunchConfig)>> {
    let blocks = p.fwd.batch as u64 * p.fwd.kv_heads() as u64 * (p.fwd.seqlen_k as u64).div_ceil(bc as u64);
    if blocks == 0 {
        return Ok(None);
    }
    if blocks > i32::MAX as u64 {
        return Err(FlashAttnError::DimTooLarge { argument: "k", axis: "batch · nheads_k · key blocks", value: blocks as usize, max: i32::MAX as usize });
    }
    let mut p = *p;
    p.br = br as u32;
    p.bc = bc as u32;
    Ok(Some((p, LaunchConfig { grid_dim: (blocks as u32, 1, 1), block_dim: (threads as u32, 1, 1), shared_mem_bytes: smem as u32 })))
}

/// Launches the tensor-core kernel `f` on [`key_block_launch`]'s grid.
///
/// # Safety
/// `f` takes exactly one [`BwdParams`] by value and runs with `threads`
/// threads and `smem` bytes of dynamic shared memory at tiles `(br, bc)`;
/// `p` satisfies its contract (as [`launch_tc_backward`]'s).
unsafe fn launch_key_blocks(stream: &Arc<CudaStream>, f: &CudaFunction, p: &BwdParams, tiles: (usize, usize), threads: usize, smem: usize) -> Result<()> {
    let Some((p, cfg)) = key_block_launch(p, tiles, threads, smem)? else { return Ok(()) };
    let arg = KernelArg(p);
    let mut b = stream.launch_builder(f);
    b.arg(&arg);
    // SAFETY: `f` takes exactly one `BwdParams` by value (`arg`,
    // `#[repr(C)]` on both sides); threads, shared memory and the buffers
    // it names are the caller's contract (see `# Safety`).
    unsafe { b.launch(cfg) }?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use flash_attn_common::tc_bwd::TC_BWD_CONFIGS;

    /// The table names exactly the kernels of `bwd.rs`, each with its
    /// configuration's warps, `Br` and `Bc` in the name.
    #[test]
    fn table_mirrors_the_kernel_list() {
        let src = include_str!("../../../kernel-crate/src/tc/bwd.rs");
        let listed = src.lines().filter(|l| l.trim_start().starts_with("flash_bwd_tc")).count();
        assert_eq!(listed, TC_BWD_KERNELS.len());
        for k in TC_BWD_KERNELS {
            let cfg = TC_BWD_CONFIGS.iter().find(|c| c.d == k.d && c.mods == k.mods).expect("a configuration per kernel");
            let name = format!(
                "flash_bwd_tc{}_{}_d{}_w{}_br{}_bc{}",
                if k.mods { "x" } else { "" },
                if k.bf16 { "bf16" } else { "f16" },
                cfg.d,
                cfg.warps,
                cfg.br,
                cfg.bc()
            );
            assert_eq!(k.name, name);
            assert!(src.contains(&format!("{name}: {}", if k.bf16 { "Bf16" } else { "F16" })), "{name} not in bwd.rs");
        }
        assert_eq!(TC_BWD_KERNELS.len(), 2 * TC_BWD_CONFIGS.len());
        for c in TC_BWD_CONFIGS {
            for bf16 in [false, true] {
                assert!(kernel_for(bf16, c).is_some());
            }
        }
    }

    #[test]
    fn supported_head_dims_and_devices() {
        for d in (8..=128).step_by(8) {
            assert!(tc_backward_supported(DType::BF16, d, (9, 0)), "d {d} on H100");
            assert!(tc_backward_supported(DType::F16, d, (8, 0)), "d {d} on A100");
        }
        // d 136..=256: the softcap/ALiBi kernels stop at 128 and no d = 256
        // kernel is compiled (it spilled on sm_80): a typed error for now.
        for d in (136..=256).step_by(8) {
            assert!(!tc_backward_supported(DType::BF16, d, (9, 0)), "d {d}");
        }
        assert!(!tc_backward_supported(DType::F32, 64, (9, 0)));
        assert!(!tc_backward_supported(DType::F16, 64, (7, 5)));
        assert!(!tc_backward_supported(DType::F16, 100, (9, 0)));
        assert!(!tc_backward_supported(DType::F16, 264, (9, 0)));
        assert!(tc_backward_supported(DType::F16, 64, (8, 6)) && !tc_backward_supported(DType::F16, 128, (8, 6)));
    }
}
