//! Kernels loaded one by one on first use: each entry's own PTX module
//! ([`super::SplitPtx::module`]) is handed to the driver the first time the
//! kernel is asked for, so the driver JIT-compiles only the kernels a
//! process runs (a fraction of a second each) instead of the whole build.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::driver::sys::CUfunction_attribute_enum;
use cudarc::driver::{CudaContext, CudaFunction, DriverError};
use cudarc::nvrtc::Ptx;

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
    /// Held while a module loads: each kernel is loaded at most once, and a
    /// failed load is not remembered (the next call tries again).
    loading: Mutex<()>,
}

impl LazyKernels {
    /// The index of `build` (split on first use in the process); loads nothing.
    pub(crate) fn new(ctx: &Arc<CudaContext>, build: PtxBuild, max_dynamic_smem: i32) -> Result<Self, String> {
        let split = build.split()?;
        let slots = split.entries().iter().map(|&e| (e, OnceLock::new())).collect();
        Ok(Self { ctx: ctx.clone(), split, max_dynamic_smem, slots, loading: Mutex::new(()) })
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
        let Some(ptx) = self.split.module(name) else { return Ok(None) };
        let module = self.ctx.load_module(Ptx::from_src(ptx))?;
        let f = module.load_function(name)?;
        f.set_attribute(CUfunction_attribute_enum::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, self.max_dynamic_smem)?;
        // Only this thread sets the slot (under `loading`), so it is empty.
        Ok(Some(slot.get_or_init(|| f)))
    }
}
