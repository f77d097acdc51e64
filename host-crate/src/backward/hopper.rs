//! The Hopper (sm_90a) FA2-order backward main kernel (f16/bf16, `wgmma`,
//! `kernel-crate/src/hopper/bwd.rs`): its table, when it runs, its launch.
//! The preprocess (`D_i`, zeroed dQ accumulator) and the dQ conversion
//! around it are the tensor-core kernel's (`backward/`).
//!
//! It runs a call when the loaded PTX is the sm_90a build on an sm_90
//! device, the head dim is at most 128, and the call has neither softcap
//! nor ALiBi nor deterministic mode nor an explicit block size (those take
//! the tensor-core kernel, `tc`), and the environment does not set
//! `FLASH_ATTN_BACKWARD_KERNEL=tc` (read once per process: the tensor-core
//! kernel for every call, e.g. to compare the two). Kernel names: `flash_bwd_hopper_{f16,bf16}_d{64,128}`.
//! Grid: `batch · nheads_k · ceil(seqlen_k / 128)` blocks of 256 threads.

use std::sync::Arc;

use cudarc::driver::CudaStream;
use flash_attn_common::BwdParams;
use flash_attn_common::hopper_bwd::{HOPPER_BWD_BC, HOPPER_BWD_THREADS, HopperBwdSmem, hopper_bwd_br, hopper_bwd_head_dim};

use crate::device::FlashAttention;
use crate::types::DType;
use crate::error::Result;

use super::tc::launch_key_blocks;

/// Every Hopper backward kernel compiled into the sm_90a PTX (mirrors the
/// `hopper_bwd_kernels!` list of `kernel-crate/src/hopper/mod.rs`):
/// `(name, bf16, compiled head dim)`.
pub(crate) const HOPPER_BWD_KERNELS: &[(&str, bool, usize)] = &[
    ("flash_bwd_hopper_f16_d64", false, 64),
    ("flash_bwd_hopper_bf16_d64", true, 64),
    ("flash_bwd_hopper_f16_d128", false, 128),
    ("flash_bwd_hopper_bf16_d128", true, 128),
];

/// The Hopper kernel of a call (its table entry: name, bf16, compiled head
/// dim), or `None` when the tensor-core kernel runs it (see the module
/// docs): `sm90a` whether the loaded PTX is the sm_90a build, `cc` the
/// device's compute capability, `mods` softcap or ALiBi.
pub(crate) fn hopper_backward_kernel(sm90a: bool, cc: (i32, i32), dtype: DType, headdim: usize, mods: bool, max_smem: usize) -> Option<&'static (&'static str, bool, usize)> {
    let bf16 = match dtype {
        DType::F16 => false,
        DType::BF16 => true,
        DType::F32 => return None,
    };
    if !sm90a || cc != (9, 0) || mods {
        return None;
    }
    let d = hopper_bwd_head_dim(headdim)?;
    if HopperBwdSmem::new(d).request_bytes() > max_smem {
        return None;
    }
    HOPPER_BWD_KERNELS.iter().find(|k| k.1 == bf16 && k.2 == d)
}

/// Launches the Hopper backward main kernel on `stream` for `p` when it
/// runs the call ([`hopper_backward_kernel`]); `Ok(false)`: it does not
/// (launch the tensor-core kernel instead). `p.br`/`p.bc` are set here.
///
/// # Safety
/// As `tc::launch_tc_backward`: `p` satisfies the kernel's contract (every
/// pointer valid for the shapes and strides it states, 16-byte aligned,
/// element strides multiples of 8, the dq accumulator zeroed and delta
/// computed on `stream` before this launch, `dq_accum_ptr` 16-byte aligned).
pub(crate) unsafe fn launch_hopper_backward(fa: &FlashAttention, stream: &Arc<CudaStream>, p: &BwdParams, dtype: DType) -> Result<bool> {
    static TC_ONLY: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    if *TC_ONLY.get_or_init(|| std::env::var("FLASH_ATTN_BACKWARD_KERNEL").is_ok_and(|v| v == "tc")) {
        return Ok(false);
    }
    let mods = p.fwd.softcap != 0.0 || p.fwd.alibi_ptr != 0;
    let max_smem = fa.limits().max_smem_per_block;
    let Some(&(name, _, d)) = hopper_backward_kernel(fa.has_hopper_kernels(), fa.compute_capability(), dtype, p.fwd.headdim as usize, mods, max_smem) else {
        return Ok(false);
    };
    let Some(f) = fa.kernel(name)? else { return Ok(false) };
    let tiles = (hopper_bwd_br(d), HOPPER_BWD_BC);
    // SAFETY: threads and shared memory are `hopper_bwd`'s for compiled
    // head dim `d` (as the kernel's const generics); `p` is the caller's
    // contract (see `# Safety`).
    unsafe { launch_key_blocks(stream, f, p, tiles, HOPPER_BWD_THREADS, HopperBwdSmem::new(d).request_bytes()) }?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The table names exactly the kernels of `hopper/mod.rs`.
    #[test]
    fn table_mirrors_the_kernel_list() {
        let src = include_str!("../../../kernel-crate/src/hopper/mod.rs");
        let listed: Vec<&str> = src.lines().map(str::trim_start).filter(|l| l.starts_with("flash_bwd_hopper_")).collect();
        assert_eq!(listed.len(), HOPPER_BWD_KERNELS.len());
        for (name, bf16, d) in HOPPER_BWD_KERNELS {
            assert!(listed.iter().any(|l| l.starts_with(&format!("{name}: {}, d = {d};", if *bf16 { "Bf16" } else { "F16" }))), "{name}");
        }
    }

    #[test]
    fn runs_what_it_can() {
        let big = 227 * 1024;
        assert_eq!(hopper_backward_kernel(true, (9, 0), DType::BF16, 128, false, big), Some(&("flash_bwd_hopper_bf16_d128", true, 128)));
        assert_eq!(hopper_backward_kernel(true, (9, 0), DType::F16, 40, false, big), Some(&("flash_bwd_hopper_f16_d64", false, 64)));
        assert_eq!(hopper_backward_kernel(true, (9, 0), DType::F16, 96, false, big), Some(&("flash_bwd_hopper_f16_d128", false, 128)));
        assert_eq!(hopper_backward_kernel(true, (9, 0), DType::F16, 136, false, big), None);
        assert_eq!(hopper_backward_kernel(true, (9, 0), DType::F16, 128, true, big), None, "softcap/ALiBi");
        assert_eq!(hopper_backward_kernel(false, (9, 0), DType::F16, 128, false, big), None, "sm_90 PTX");
        assert_eq!(hopper_backward_kernel(true, (8, 0), DType::F16, 128, false, big), None);
        assert_eq!(hopper_backward_kernel(true, (9, 0), DType::F32, 128, false, big), None);
        assert_eq!(hopper_backward_kernel(true, (9, 0), DType::F16, 128, false, 99 * 1024), None);
    }
}
