//! Opening a device: [`FlashAttention::new`] and
//! [`FlashAttention::with_family`], which check that the embedded PTX build
//! holds every kernel of the host's tables (each kernel family's table
//! lives with its planning or launch code, so this module sits above all of
//! them), and the process-wide [`default_flash_attention`].

use std::sync::{Arc, OnceLock};

use cudarc::driver::CudaContext;

use crate::device::{FlashAttention, KernelFamily, try_default_context};
use crate::error::{FlashAttnError, Result};

impl FlashAttention {
    /// The kernels of the PTX build for `ctx`'s device. Loads none: each
    /// kernel is loaded on its first launch.
    ///
    /// # What the first call costs
    /// `new` reads a few device attributes and indexes the embedded PTX
    /// (split per kernel, once per process: a few milliseconds in release
    /// builds). The first launch of each kernel then loads that kernel
    /// alone: its cubin, assembled ahead of time by ptxas and shipped in
    /// the package, where it runs on the device (sm_80 cubins on compute
    /// capability 8.x, sm_90a on 9.0; a driver of CUDA 13.0 or newer) — the
    /// driver compiles nothing, and the library decompresses that one cubin
    /// (about a millisecond). Elsewhere (newer GPUs, older drivers, or
    /// `FLASH_ATTN_FORCE_PTX=1`) the kernel's own PTX module, which the
    /// driver JIT-compiles — 0.1–3 s per kernel on an H100 with an empty JIT
    /// cache (the f32 kernels are small, the flash-decoding kernel the
    /// largest) — and caches on disk (`~/.nv/ComputeCache`), so later
    /// processes pay only milliseconds. [`FlashAttention::cubins`] says which
    /// of the two applies. A call runs one to three kernels (decode: the
    /// kernel and its split combine; paged caches: the page-order kernel).
    ///
    /// Errors: [`FlashAttnError::UnsupportedDevice`] below sm_80,
    /// [`FlashAttnError::Driver`] if the device cannot be queried,
    /// [`FlashAttnError::Ptx`] if the embedded PTX cannot be indexed or
    /// lacks a kernel of the host's tables. A kernel that fails to load is
    /// reported by the call that launches it.
    pub fn new(ctx: &Arc<CudaContext>) -> Result<Self> {
        Self::with_family(ctx, KernelFamily::Auto)
    }

    /// As [`FlashAttention::new`], choosing the kernel family: `Auto` loads
    /// the sm_90a build (with the Hopper-native kernels) on compute
    /// capability 9.0; `MmaSync` keeps the portable build everywhere.
    pub fn with_family(ctx: &Arc<CudaContext>, family: KernelFamily) -> Result<Self> {
        let fa = Self::load(ctx, family)?;
        // Every kernel of the host's tables must be in the build (the old
        // eager load failed here too): a mismatch between the kernel crate
        // and the tables is found at once, not at some later call.
        let dec_names = crate::decode::DEC_KERNELS.iter().flat_map(|k| std::iter::once(k.name).chain(k.compact));
        let tc_names = crate::tc::TC_KERNELS.iter().map(|k| k.name).chain(dec_names);
        let hopper_names: &[&'static str] = if fa.ptx_build().arch == "sm_90a" { crate::hopper::PROBE_KERNELS } else { &[] };
        let hopper_names = hopper_names.iter().copied().chain(
            crate::hopper::HOPPER_KERNELS
                .iter()
                .map(|k| k.name)
                .chain(crate::backward::hopper::HOPPER_BWD_KERNELS.iter().map(|k| k.0))
                .filter(|_| fa.ptx_build().arch == "sm_90a"),
        );
        // The FP8 KV-cache kernels: the sm_90 builds (e4m3 conversions need sm_89+, PTX ISA 7.8).
        let fp8_names = crate::decode::DEC_F8_KERNELS
            .iter()
            .map(|k| k.name)
            .chain(crate::decode::DECODE_FP8_KERNELS.iter().copied())
            .filter(|_| fa.has_fp8_kv_cache());
        let mut names = crate::dispatch::F32_KERNELS
            .iter()
            .chain(crate::backward::plan::BWD_KERNELS)
            .chain(crate::decode::DECODE_KERNELS)
            .chain(crate::page_order::PAGE_ORDER_KERNELS)
            .chain(crate::context_parallel::gpu_merge::RING_KERNELS)
            .copied()
            .chain(tc_names)
            .chain(hopper_names)
            .chain(fp8_names);
        if let Some(missing) = names.find(|n| !fa.has_kernel(n)) {
            return Err(FlashAttnError::Ptx { build: fa.ptx_build().arch, reason: format!("kernel `{missing}` is not in the PTX") });
        }
        Ok(fa)
    }
}

/// The process-wide [`FlashAttention`] on device 0, created on first use;
/// the error says why there is none (kept, so the probe runs once).
pub fn default_flash_attention() -> std::result::Result<Arc<FlashAttention>, String> {
    static DEFAULT: OnceLock<std::result::Result<Arc<FlashAttention>, String>> = OnceLock::new();
    DEFAULT
        .get_or_init(|| {
            let ctx = try_default_context().map_err(|e| e.to_string())?;
            std::panic::catch_unwind(|| FlashAttention::new(&ctx).map(Arc::new).map_err(|e| e.to_string()))
                .unwrap_or_else(|_| Err("the CUDA driver bindings panicked while loading the kernels".into()))
        })
        .clone()
}
