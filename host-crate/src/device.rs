//! The loaded kernels of one device: [`FlashAttention`].

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use cudarc::driver::sys::CUdevice_attribute;
use cudarc::driver::{CudaContext, CudaFunction, CudaSlice, CudaStream, DevicePtr, LaunchConfig};

use crate::dispatch::{DeviceLimits, Launch};
use crate::error::{FlashAttnError, Result};
use crate::ptx::load::LazyKernels;
use crate::ptx::{self, PtxBuild};

/// Which kernels a [`FlashAttention`] may run on a compute capability 9.0
/// device.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum KernelFamily {
    /// The Hopper-native kernels where they apply (sm_90a PTX on CC 9.0),
    /// the `mma.sync` kernels elsewhere.
    #[default]
    Auto,
    /// Only the `mma.sync` kernels (the sm_80/sm_90 PTX), on every device.
    MmaSync,
}

/// The flash-attn kernels of one CUDA context: the embedded PTX build for
/// the device's compute capability, each kernel loaded on first use (its
/// own PTX module, JIT-compiled by the driver) with its dynamic
/// shared-memory limit raised to the device's opt-in maximum. Cheap to
/// share (`Send + Sync`); launches go to whatever stream of this context
/// the caller passes.
///
/// Its calls: [`forward`](FlashAttention::forward) (and `_into`, `_ext`),
/// [`forward_varlen`](FlashAttention::forward_varlen),
/// [`forward_kvcache`](FlashAttention::forward_kvcache) (decode against a
/// [`KvCache`](crate::KvCache), contiguous or paged),
/// [`forward_varlen_paged`](FlashAttention::forward_varlen_paged),
/// [`backward`](FlashAttention::backward) and
/// [`backward_varlen`](FlashAttention::backward_varlen). One decode step
/// against a paged cache:
///
/// ```no_run
/// use cudarc::driver::CudaContext;
/// use flash_attn::{BlockTable, DecodeOptions, Extras, FlashAttention, ForwardParams, KvCache, Tensor, TensorLayout};
/// use half::f16;
///
/// # fn main() -> Result<(), flash_attn::FlashAttnError> {
/// let ctx = CudaContext::new(0)?;
/// let stream = ctx.default_stream();
/// let fa = FlashAttention::new(&ctx)?;
/// let (batch, nheads, nheads_k, d, page_size, pages_per_seq) = (8, 32, 8, 128, 16, 256);
/// // The pool: (num_pages, page_size, nheads_k, d) for keys and for values.
/// let pool = TensorLayout::contiguous([batch * pages_per_seq, page_size, nheads_k, d]);
/// let mut k_pages = stream.alloc_zeros::<f16>(pool.num_elements().unwrap())?;
/// let mut v_pages = stream.alloc_zeros::<f16>(pool.num_elements().unwrap())?;
/// let table: Vec<i32> = (0..(batch * pages_per_seq) as i32).collect(); // (batch, pages_per_seq)
/// let block_table = stream.clone_htod(&table)?;
/// let cache_seqlens = stream.clone_htod(&vec![1000i32; batch])?; // keys cached per sequence
/// // This step: one query token per sequence, and its key and value appended.
/// let step = TensorLayout::contiguous([batch, 1, nheads, d]);
/// let new = TensorLayout::contiguous([batch, 1, nheads_k, d]);
/// let q = stream.alloc_zeros::<f16>(step.num_elements().unwrap())?;
/// let (k_new, v_new) = (stream.alloc_zeros::<f16>(new.num_elements().unwrap())?, stream.alloc_zeros::<f16>(new.num_elements().unwrap())?);
/// let cache = KvCache::new(&mut k_pages, &mut v_pages, pool, &cache_seqlens)
///     .with_block_table(BlockTable::new(&block_table, pages_per_seq))
///     .with_new(Tensor::new(&k_new, new), Tensor::new(&v_new, new));
/// let params = ForwardParams { causal: true, ..Default::default() };
/// let out = fa.forward_kvcache(&stream, Tensor::new(&q, step), cache, &params, &Extras::default(), DecodeOptions::default())?;
/// let (_o, _lse) = (out.o, out.lse); // (batch, 1, nheads, d) and (batch, nheads, 1), on the device
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct FlashAttention {
    ctx: Arc<CudaContext>,
    build: PtxBuild,
    cc: (i32, i32),
    device_name: String,
    limits: DeviceLimits,
    num_sms: usize,
    /// Peak DRAM bandwidth in bytes/s (memory clock × bus width × 2), where
    /// the driver reports both.
    peak_mem_bandwidth: Option<f64>,
    kernels: Arc<LazyKernels>,
    /// Resident blocks per SM of each launch shape asked so far (the
    /// driver's occupancy calculator costs microseconds per call: decode
    /// calls ask it on every step).
    occupancy: Mutex<HashMap<(&'static str, u32, u32), usize>>,
    /// Split-KV tile counters of the flash-decoding kernels' fused combine,
    /// one buffer per stream (launches on one stream are ordered; every
    /// launch returns its counts to 0), keyed by the stream handle.
    split_counters: Mutex<HashMap<usize, CudaSlice<u32>>>,
}

impl FlashAttention {
    /// The device's attributes and the embedded PTX build for `family`,
    /// indexed (nothing loaded). [`FlashAttention::with_family`] (in
    /// `open`) adds the check that the build holds every kernel of the
    /// host's tables.
    pub(crate) fn load(ctx: &Arc<CudaContext>, family: KernelFamily) -> Result<Self> {
        let (major, minor) = ctx.compute_capability()?;
        let device_name = ctx.name()?;
        let pick = match family {
            KernelFamily::Auto => ptx::for_compute_capability,
            KernelFamily::MmaSync => ptx::portable_for_compute_capability,
        };
        let build = pick(major, minor).ok_or_else(|| FlashAttnError::UnsupportedDevice {
            name: device_name.clone(),
            major,
            minor,
        })?;
        let max_smem = ctx.attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)?;
        let limits = DeviceLimits { max_smem_per_block: max_smem.max(0) as usize };
        let num_sms = ctx.attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?.max(1) as usize;
        let peak_mem_bandwidth = match (
            ctx.attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE),
            ctx.attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH),
        ) {
            // kHz, bits; double data rate.
            (Ok(khz), Ok(bits)) if khz > 0 && bits > 0 => Some(2.0 * khz as f64 * 1e3 * bits as f64 / 8.0),
            _ => None,
        };
        let kernels = LazyKernels::new(ctx, build, (major, minor), max_smem)
            .map_err(|reason| FlashAttnError::Ptx { build: build.arch, reason })?;
        let kernels = Arc::new(kernels);
        Ok(Self { ctx: ctx.clone(), build, cc: (major, minor), device_name, limits, num_sms, peak_mem_bandwidth, kernels, occupancy: Mutex::new(HashMap::new()), split_counters: Mutex::new(HashMap::new()) })
    }

    /// Whether the FP8 (e4m3) KV-cache kernels are loaded: the sm_90 builds
    /// (Hopper and newer); Ampere and Ada run the sm_80 build without them.
    pub fn has_fp8_kv_cache(&self) -> bool {
        build_has_fp8(self.build)
    }

    /// The context the kernels are loaded in.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// Whether the Hopper-native kernels are loaded (the sm_90a build).
    pub fn has_hopper_kernels(&self) -> bool {
        self.build.arch == "sm_90a"
    }

    /// The PTX build in use (`"sm_80"`, `"sm_90"` or `"sm_90a"`).
    pub fn ptx_build(&self) -> PtxBuild {
        self.build
    }

    /// The device's compute capability `(major, minor)`.
    pub fn compute_capability(&self) -> (i32, i32) {
        self.cc
    }

    /// The device's name, as the driver reports it.
    pub fn device_name(&self) -> &str {
        &self.device_name
    }

    /// The device's limits the dispatch plans with (opt-in shared memory per block).
    pub fn limits(&self) -> DeviceLimits {
        self.limits
    }

    /// Streaming multiprocessors of the device (the split-KV heuristic).
    pub fn num_sms(&self) -> usize {
        self.num_sms
    }

    /// The device's peak DRAM bandwidth in bytes/s (memory clock × bus
    /// width × 2: 3.35e12 on an H100 SXM), if the driver reports it; the
    /// split-KV schedule's choice ([`crate::decode::DecodeOptions::deterministic`]).
    pub fn peak_mem_bandwidth(&self) -> Option<f64> {
        self.peak_mem_bandwidth
    }

    /// A kernel by name (for tests and tools: registers, local memory),
    /// loaded now if it is not yet. `None` if the PTX build has no such
    /// kernel, or the driver fails to load it ([`FlashAttention::kernel`]
    /// says why).
    pub fn function(&self, name: &str) -> Option<&CudaFunction> {
        self.kernels.get(name).ok().flatten()
    }

    /// A kernel by name, loaded now if it is not yet: `Ok(None)` if the PTX
    /// build has no such kernel, the driver's error if loading fails.
    pub fn kernel(&self, name: &str) -> Result<Option<&CudaFunction>> {
        Ok(self.kernels.get(name)?)
    }

    /// Whether the PTX build has kernel `name` (loads nothing).
    pub fn has_kernel(&self, name: &str) -> bool {
        self.kernels.contains(name)
    }

    /// How many kernels this `FlashAttention` has loaded so far.
    pub fn loaded_kernels(&self) -> usize {
        self.kernels.loaded()
    }

    /// How many of the loaded kernels came from the prebuilt cubins (the
    /// others were JIT-compiled from their PTX).
    pub fn loaded_cubins(&self) -> usize {
        self.kernels.loaded_from_cubins()
    }

    /// Where kernels come from: `Ok` with the `ptxas` release of the
    /// prebuilt cubins this device loads (no JIT compilation), or `Err`
    /// saying why every kernel is JIT-compiled from its PTX instead
    /// (`FLASH_ATTN_FORCE_PTX=1`; no cubin of this build runs on the
    /// device's compute capability; a build without cubins; or the driver
    /// refused one, e.g. a driver older than CUDA 13.0).
    pub fn cubins(&self) -> std::result::Result<&'static str, String> {
        self.kernels.cubin_status()
    }

    /// The lazily loaded kernels, shared with [`crate::tc::TcModule`].
    pub(crate) fn lazy_kernels(&self) -> &Arc<LazyKernels> {
        &self.kernels
    }

    /// The function and launch configuration of one planned launch.
    /// Resident blocks per SM of a launch (registers, threads and its
    /// shared memory), from the driver's occupancy calculator.
    pub(crate) fn blocks_per_sm(&self, l: &Launch) -> Option<usize> {
        let key = (l.kernel, l.threads, l.smem_bytes);
        if let Some(&n) = self.occupancy.lock().ok()?.get(&key) {
            return Some(n);
        }
        let f = self.kernels.get(l.kernel).ok()??;
        let n = f.occupancy_max_active_blocks_per_multiprocessor(l.threads, l.smem_bytes as usize, None).ok()?;
        let n = (n > 0).then_some(n as usize)?;
        self.occupancy.lock().ok()?.insert(key, n);
        Some(n)
    }

    /// The split-KV tile counters of `stream` (at least `n` u32, zero
    /// between launches), allocated zeroed on first use and grown as
    /// needed. Buffers of streams nobody else holds any more are freed when
    /// a new stream asks (the map keeps each buffer's stream alive).
    pub(crate) fn split_counters(&self, stream: &Arc<CudaStream>, n: usize) -> Result<u64> {
        let mut map = self.split_counters.lock().unwrap_or_else(|e| e.into_inner());
        let key = stream.cu_stream() as usize;
        if !map.contains_key(&key) {
            map.retain(|_, b| Arc::strong_count(b.stream()) > 1);
        }
        if map.get(&key).is_none_or(|b| b.len() < n) {
            // A replaced (smaller) buffer is freed in stream order, after
            // the launches that used it.
            map.insert(key, stream.alloc_zeros::<u32>(n.next_power_of_two().max(1024))?);
        }
        let (ptr, _sync) = map[&key].device_ptr(stream);
        Ok(ptr)
    }

    /// `stream` belongs to this `FlashAttention`'s context (else
    /// [`FlashAttnError::ContextMismatch`] naming `argument`).
    pub(crate) fn check_stream(&self, argument: &'static str, stream: &CudaStream) -> Result<()> {
        let ctx = stream.context();
        if ctx.cu_ctx() != self.context().cu_ctx() {
            return Err(FlashAttnError::ContextMismatch { argument, found: ctx.ordinal(), expected: self.context().ordinal() });
        }
        Ok(())
    }

    pub(crate) fn prepare(&self, l: &Launch) -> Result<(&CudaFunction, LaunchConfig)> {
        let f = self.kernels.get(l.kernel)?.ok_or(FlashAttnError::Unsupported {
            argument: "q",
            dtype: "f32",
            what: "this PTX build (kernel missing)",
        })?;
        let cfg = LaunchConfig { grid_dim: (l.grid, 1, 1), block_dim: (l.threads, 1, 1), shared_mem_bytes: l.smem_bytes };
        Ok((f, cfg))
    }
}

/// Why no GPU can be used, or the first device's context.
///
/// Never panics: cudarc panics when `libcuda` cannot be loaded, so its
/// presence is checked first, and any other panic inside the driver
/// bindings is caught and reported as [`FlashAttnError::NoGpu`].
pub fn try_default_context() -> Result<Arc<CudaContext>> {
    if !driver_library_present() {
        return Err(FlashAttnError::NoGpu { reason: "the CUDA driver library (libcuda) was not found".into() });
    }
    let r = std::panic::catch_unwind(|| -> Result<Arc<CudaContext>> {
        let n =
            CudaContext::device_count().map_err(|e| FlashAttnError::NoGpu { reason: format!("cuInit/cuDeviceGetCount: {e}") })?;
        if n < 1 {
            return Err(FlashAttnError::NoGpu { reason: "the CUDA driver reports no device".into() });
        }
        Ok(CudaContext::new(0)?)
    });
    r.unwrap_or_else(|_| Err(FlashAttnError::NoGpu { reason: "the CUDA driver bindings panicked while starting".into() }))
}

/// Whether the CUDA driver library can be loaded. Our own probe rather than
/// cudarc's `is_culib_present`, which exists only when cudarc loads the
/// driver dynamically: linked into candle (cudarc's `dynamic-linking`), the
/// library is a load-time dependency and this simply finds it.
pub fn driver_library_present() -> bool {
    use std::env::consts::{DLL_PREFIX, DLL_SUFFIX};
    let names = [format!("{DLL_PREFIX}cuda{DLL_SUFFIX}"), format!("{DLL_PREFIX}cuda{DLL_SUFFIX}.1"), "nvcuda.dll".into()];
    // SAFETY: loading the driver library runs its initializers, nothing else;
    // the handle is dropped (the library stays loaded if cudarc holds it too).
    names.iter().any(|n| unsafe { libloading::Library::new(n) }.is_ok())
}

/// Whether a PTX build carries the FP8 KV-cache kernels (the ISA 8.0 builds).
pub(crate) fn build_has_fp8(build: PtxBuild) -> bool {
    build.arch != "sm_80"
}
