//! The backward pass on the device (recomputation, seed 000 §3.2;
//! `../shared/BACKWARD.md`): gradients dq, dk, dv of attention from q, k,
//! v, the forward's `out` and row statistics, and `dout`. Data flows one
//! way: front end (this file) → [`validate`] → [`plan`] → [`launch`].
//!
//! * f32: the readable kernels of `kernel-crate/src/bwd/` in the loop order
//!   of `params.forward.loop_order` (FA2: the LSE; FA1: `l`, `m`).
//! * f16/bf16: the tensor-core backward (`tc`); the dtype-generic
//!   preprocess and dQ-convert kernels around it.
//!
//! Scratch ([`BackwardScratch`]): `D` (`delta`), the f32 dQ accumulator
//! and the deterministic mode's semaphores, allocated by the call or handed
//! in (CUDA-graph capture: no allocation inside the call).

pub mod launch;
pub mod plan;
pub(crate) mod tc;
pub mod validate;

use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream, DevicePtr, DevicePtrMut};

use crate::api::{AttnElem, Extras, RowStats, Tensor, TensorLayout, TensorMut};
use crate::device::FlashAttention;
use crate::error::Result;
use crate::params::ForwardParams;

pub use plan::{BackwardPlan, ScratchSizes};
pub use validate::{BackwardShapes, validate_backward};

/// Parameters of a backward call: the forward's, plus `deterministic`
/// (dQ additions in a fixed order: the same bits on every run).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct BackwardParams {
    pub forward: ForwardParams,
    pub deterministic: bool,
}

/// Gradients allocated by [`FlashAttention::backward`], contiguous.
#[derive(Debug)]
pub struct Gradients<T> {
    pub dq: CudaSlice<T>,
    pub dk: CudaSlice<T>,
    pub dv: CudaSlice<T>,
    /// Layouts of dq (q's shape), dk (k's), dv (v's).
    pub layouts: [TensorLayout; 3],
}

/// Caller-owned scratch of a backward call (sizes: [`ScratchSizes`]).
#[derive(Debug)]
pub struct BackwardScratch {
    /// f32 `D_i`, one per query row (the LSE's length).
    pub delta: CudaSlice<f32>,
    /// f32 dQ accumulator, that length × headdim.
    pub dq_accum: CudaSlice<f32>,
    /// u32 semaphores of the deterministic mode (may be empty otherwise).
    pub semaphores: CudaSlice<u32>,
}

impl BackwardScratch {
    /// Allocates scratch of `sizes` on `stream`.
    pub fn new(stream: &Arc<CudaStream>, sizes: ScratchSizes) -> Result<Self> {
        Ok(Self {
            delta: stream.alloc_zeros(sizes.delta.max(1))?,
            dq_accum: stream.alloc_zeros(sizes.dq_accum.max(1))?,
            semaphores: stream.alloc_zeros(sizes.semaphores.max(1))?,
        })
    }
}

impl FlashAttention {
    /// The scratch a backward call with these layouts and parameters needs
    /// (for [`FlashAttention::backward_into`] with caller scratch).
    pub fn backward_scratch_sizes<T: AttnElem>(
        &self,
        q: &TensorLayout,
        k: &TensorLayout,
        params: &BackwardParams,
    ) -> Result<ScratchSizes> {
        let o = TensorLayout::contiguous(q.shape);
        let n = |l: &TensorLayout| l.required_len().unwrap_or(usize::MAX);
        let shapes = BackwardShapes { q: (q, n(q)), k: (k, n(k)), v: (k, n(k)), out: (&o, n(&o)), dout: (&o, n(&o)), dq: (&o, n(&o)), dk: (k, n(k)), dv: (k, n(k)) };
        let problem = validate_backward(&shapes, &params.forward)?;
        Ok(self.plan_backward::<T>(&problem, params)?.scratch)
    }

    /// Gradients of attention into freshly allocated, contiguous buffers
    /// (and scratch), on `stream` (only enqueues work). `stats` is what the
    /// forward returned: [`RowStats::LogSumExp`] (`softmax_lse`) for the FA2
    /// order, [`RowStats::Fa1`] for FA1.
    #[allow(clippy::too_many_arguments)]
    pub fn backward<T, Q, K, V, O, DO>(
        &self,
        stream: &Arc<CudaStream>,
        q: Tensor<'_, Q>,
        k: Tensor<'_, K>,
        v: Tensor<'_, V>,
        out: Tensor<'_, O>,
        dout: Tensor<'_, DO>,
        stats: &RowStats,
        params: &BackwardParams,
        ext: &Extras<'_>,
    ) -> Result<Gradients<T>>
    where
        T: AttnElem,
        Q: DevicePtr<T>,
        K: DevicePtr<T>,
        V: DevicePtr<T>,
        O: DevicePtr<T>,
        DO: DevicePtr<T>,
    {
        let layouts = [q.layout, k.layout, v.layout].map(|l| TensorLayout::contiguous(l.shape));
        let len = |l: &TensorLayout| l.required_len().unwrap_or(0).max(1);
        let mut dq = stream.alloc_zeros::<T>(len(&layouts[0]))?;
        let mut dk = stream.alloc_zeros::<T>(len(&layouts[1]))?;
        let mut dv = stream.alloc_zeros::<T>(len(&layouts[2]))?;
        self.backward_into(
            stream,
            q,
            k,
            v,
            out,
            dout,
            stats,
            TensorMut::new(&mut dq, layouts[0]),
            TensorMut::new(&mut dk, layouts[1]),
            TensorMut::new(&mut dv, layouts[2]),
            None,
            params,
            ext,
        )?;
        Ok(Gradients { dq, dk, dv, layouts })
    }

    /// Gradients into caller buffers `dq`, `dk`, `dv` (any strides, no two
    /// elements at one address, no two gradients sharing memory), with the
    /// caller's scratch if given (else allocated on `stream`). Only
    /// enqueues work: preprocess, the main kernel, the dQ cast.
    #[allow(clippy::too_many_arguments)]
    pub fn backward_into<T, Q, K, V, O, DO, GQ, GK, GV>(
        &self,
        stream: &Arc<CudaStream>,
        q: Tensor<'_, Q>,
        k: Tensor<'_, K>,
        v: Tensor<'_, V>,
        out: Tensor<'_, O>,
        dout: Tensor<'_, DO>,
        stats: &RowStats,
        dq: TensorMut<'_, GQ>,
        dk: TensorMut<'_, GK>,
        dv: TensorMut<'_, GV>,
        scratch: Option<&mut BackwardScratch>,
        params: &BackwardParams,
        ext: &Extras<'_>,
    ) -> Result<()>
    where
        T: AttnElem,
        Q: DevicePtr<T>,
        K: DevicePtr<T>,
        V: DevicePtr<T>,
        O: DevicePtr<T>,
        DO: DevicePtr<T>,
        GQ: DevicePtrMut<T>,
        GK: DevicePtrMut<T>,
        GV: DevicePtrMut<T>,
    {
        let shapes = BackwardShapes {
            q: (&q.layout, q.data.len()),
            k: (&k.layout, k.data.len()),
            v: (&v.layout, v.data.len()),
            out: (&out.layout, out.data.len()),
            dout: (&dout.layout, dout.data.len()),
            dq: (&dq.layout, dq.data.len()),
            dk: (&dk.layout, dk.data.len()),
            dv: (&dv.layout, dv.data.len()),
        };
        let problem = validate_backward(&shapes, &params.forward)?;
        let plan = self.plan_backward::<T>(&problem, params)?;
        let bufs = launch::Buffers { q, k, v, out, dout, stats, dq, dk, dv, scratch };
        self.launch_backward(stream, &problem, &plan, bufs, params, ext)
    }
}
