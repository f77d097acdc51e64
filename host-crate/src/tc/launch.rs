//! The tensor-core launch helpers, above the device: the kernel parameter
//! block passed by value ([`KernelArg`], shared by every launcher of the
//! crate) and [`TcModule`], the direct launcher of a table entry.

use std::sync::Arc;

use cudarc::driver::{CudaFunction, CudaStream, DeviceRepr, DriverError, LaunchConfig, PushKernelArg};
use flash_attn_common::AttnParams;

use super::table::TcKernel;
use crate::FlashAttention;
use crate::ptx::load::LazyKernels;

/// The kernel parameter block, passed by value (`.param .align 8 .b8 p[..]`).
#[repr(transparent)]
#[derive(Clone, Copy, Debug)]
pub struct KernelArg<P: Copy>(pub P);

// SAFETY: `P` is a `#[repr(C)]` plain-old-data parameter block of the
// kernel crate (only integers and floats), laid out identically on both sides.
unsafe impl<P: Copy> DeviceRepr for KernelArg<P> {}

/// The tensor-core kernels of a [`FlashAttention`], launched directly
/// (benchmarks): each loaded on its first launch, its dynamic shared-memory
/// limit raised to the device's opt-in maximum (at least its
/// configuration's need on any device the configuration fits).
#[derive(Debug, Clone)]
pub struct TcModule {
    kernels: Arc<LazyKernels>,
}

impl TcModule {
    /// The tensor-core kernels of `fa` (shared with it: a kernel either
    /// loads is loaded for both). Loads nothing.
    pub fn new(fa: &FlashAttention) -> Self {
        Self { kernels: fa.lazy_kernels().clone() }
    }

    /// Loads kernel `k` now (its first launch would otherwise), so that a
    /// timed loop does not include the driver's JIT compilation.
    pub fn load(&self, k: &TcKernel) -> Result<(), DriverError> {
        self.function(k).map(|_| ())
    }

    fn function(&self, k: &TcKernel) -> Result<&CudaFunction, DriverError> {
        self.kernels.get(k.name)?.ok_or(DriverError(cudarc::driver::sys::cudaError_enum::CUDA_ERROR_NOT_FOUND))
    }

    /// Launches `k` on `stream` with parameters `p`.
    ///
    /// # Safety
    /// `p` must satisfy the kernel's contract: every pointer valid for the
    /// shapes and strides it states, 16-byte aligned, strides multiples of 8
    /// elements, `p.headdim == k.d`, `p.br`/`p.bc` matching `k`, and for FA1
    /// `o_accum`, `lse` (l) and `m` initialized to 0, 0, −inf.
    pub unsafe fn launch(&self, stream: &CudaStream, k: &TcKernel, p: &AttnParams) -> Result<(), DriverError> {
        let f = self.function(k)?;
        let blocks = k
            .grid_blocks(p.batch as usize, p.nheads as usize, p.seqlen_q as usize)
            .ok_or(DriverError(cudarc::driver::sys::cudaError_enum::CUDA_ERROR_INVALID_VALUE))?;
        let cfg = LaunchConfig { grid_dim: (blocks, 1, 1), block_dim: (k.threads(), 1, 1), shared_mem_bytes: k.smem_bytes() as u32 };
        let arg = KernelArg(*p);
        let mut b = stream.launch_builder(f);
        b.arg(&arg);
        // SAFETY: the kernel takes exactly one `AttnParams` by value; the
        // caller guarantees the buffers it names (see `# Safety`).
        unsafe { b.launch(cfg) }?;
        Ok(())
    }
}
