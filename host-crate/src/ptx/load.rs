//! Kernels loaded one by one on first use: the kernel's prebuilt cubin
//! ([`super::cubin`]) where one runs on the device, which the driver loads
//! without compiling anything; else the entry's own PTX module
//! ([`super::SplitPtx::module`]), so the driver JIT-compiles only the
//! kernels a process runs (a fraction of a second each) instead of the
//! whole build. A cubin the driver refuses (one of a newer CUDA release than
//! the driver's) turns the cubins off for this `LazyKernels` (one
//! `FlashAttention`): every kernel it loads after that comes from the PTX.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::driver::sys::CUfunction_attribute_enum;
use cudarc::driver::{CudaContext, CudaFunction, DriverError};
use cudarc::nvrtc::Ptx;

use super::cubin::Cubins;
use super::{PtxBuild, SplitPtx};

/// The kernels of one PTX build on one context, each loaded on first use
/// with its dynamic shared-memory limit raised to the device's opt-in
/// maximum. `Send + Sync`: any thread may ask; one loads, the others wait.
#[derive(Debug)]
pub(crate) struct LazyKernels {
    ctx: Arc<CudaContext>,
    split: &'static SplitPtx<'static>,
    /// The dynamic shared-memory limit set on every loaded kernel.
    max_dynamic_smem: i32,
    /// One slot per entry of the build, filled on first use.
    slots: HashMap<&'static str, OnceLock<CudaFunction>>,
    /// The prebuilt cubins in use, or why the kernels come from the PTX
    /// (set at creation, or when the driver refuses a cubin).
    cubins: Mutex<Result<&'static Cubins, String>>,
    /// Kernels loaded from a cubin so far.
    from_cubin: AtomicUsize,
    /// Held while a module loads: each kernel is loaded at most once, and a
    /// failed load is not remembered (the next call tries again).
    loading: Mutex<()>,
}

impl LazyKernels {
    /// The index of `build` (split on first use in the process) and its
    /// cubins where they run on compute capability `cc`; loads nothing.
    pub(crate) fn new(ctx: &Arc<CudaContext>, build: PtxBuild, cc: (i32, i32), max_dynamic_smem: i32) -> Result<Self, String> {
        let split = build.split()?;
        let slots = split.entries().iter().map(|&e| (e, OnceLock::new())).collect();
        let cubins = Mutex::new(Cubins::for_device(build, cc));
        Ok(Self { ctx: ctx.clone(), split, max_dynamic_smem, slots, cubins, from_cubin: AtomicUsize::new(0), loading: Mutex::new(()) })
    }

    /// How many of the loaded kernels came from prebuilt cubins.
    pub(crate) fn loaded_from_cubins(&self) -> usize {
        self.from_cubin.load(Ordering::Relaxed)
    }

    /// Why kernels are JIT-compiled from the PTX rather than loaded from
    /// prebuilt cubins; `Ok` with the `ptxas` release of the cubins in use.
    pub(crate) fn cubin_status(&self) -> Result<&'static str, String> {
        self.cubins.lock().unwrap_or_else(|e| e.into_inner()).as_ref().map(|c| c.ptxas()).map_err(Clone::clone)
    }

    /// Kernel `name` from its cubin, if the cubins are in use and hold it;
    /// a failure turns them off (and says why in [`Self::cubin_status`]).
    fn load_cubin(&self, name: &str) -> Option<CudaFunction> {
        let mut cubins = self.cubins.lock().unwrap_or_else(|e| e.into_inner());
        let c = *cubins.as_ref().ok()?;
        let loaded = c.cubin(name).and_then(|bytes| {
            let Some(bytes) = bytes else { return Ok(None) };
            let module = self.ctx.load_module(Ptx::from_binary(bytes)).map_err(|e| format!("the driver refused the cubin of {name}: {e}"))?;
            module.load_function(name).map(Some).map_err(|e| format!("the cubin of {name} has no such function: {e}"))
        });
        match loaded {
            Ok(f) => f,
            Err(why) => {
                *cubins = Err(why);
                None
            }
        }
    }

    /// Whether the build has kernel `name` (no loading).
    pub(crate) fn contains(&self, name: &str) -> bool {
        self.slots.contains_key(name)
    }

    /// How many kernels are loaded so far.
    pub(crate) fn loaded(&self) -> usize {
        self.slots.values().filter(|s| s.get().is_some()).count()
    }

    /// Kernel `name`, loaded now if it is not yet; `Ok(None)` if the build
    /// has no such kernel.
    pub(crate) fn get(&self, name: &str) -> Result<Option<&CudaFunction>, DriverError> {
        let Some(slot) = self.slots.get(name) else { return Ok(None) };
        if let Some(f) = slot.get() {
            return Ok(Some(f));
        }
        let _guard = self.loading.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(f) = slot.get() {
            return Ok(Some(f));
        }
        let f = match self.load_cubin(name) {
            Some(f) => {
                self.from_cubin.fetch_add(1, Ordering::Relaxed);
                f
            }
            None => {
                let Some(ptx) = self.split.module(name) else { return Ok(None) };
                let module = self.ctx.load_module(Ptx::from_src(ptx))?;
                module.load_function(name)?
            }
        };
        f.set_attribute(CUfunction_attribute_enum::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, self.max_dynamic_smem)?;
        // Only this thread sets the slot (under `loading`), so it is empty.
        Ok(Some(slot.get_or_init(|| f)))
    }
}
