//! A candle tensor's storage as the backend of a call takes it: held for
//! reading (what views and copies of it borrow from) with its layout, then
//! the CPU or CUDA storage, or a device error naming the argument.

use candle_core::{CpuStorage, Layout, Result, Storage, StorageRef, Tensor};

use crate::check::err;

/// A tensor's storage, held for reading, its layout and the argument it is.
pub(crate) struct Held<'t> {
    argument: &'t str,
    storage: StorageRef<'t>,
    layout: &'t Layout,
}

impl<'t> Held<'t> {
    pub fn new(argument: &'t str, t: &'t Tensor) -> Self {
        let (storage, layout) = t.storage_and_layout();
        Self { argument, storage, layout }
    }

    /// The CPU storage and layout, or a device error naming the argument.
    pub fn cpu(&self) -> Result<(&CpuStorage, &'t Layout)> {
        match &*self.storage {
            Storage::Cpu(s) => Ok((s, self.layout)),
            _ => Err(err(format_args!("device mismatch: `{}` must be on the CPU with `q`", self.argument))),
        }
    }

    /// The CUDA storage and layout, or a device error naming the argument.
    #[cfg(feature = "cuda")]
    pub fn cuda(&self) -> Result<(&candle_core::CudaStorage, &'t Layout)> {
        match &*self.storage {
            Storage::Cuda(s) => Ok((s, self.layout)),
            _ => Err(err(format_args!("device mismatch: `{}` must be on the GPU with `q`", self.argument))),
        }
    }
}
