//! The backward pass on the device (recomputation, seed 000 §3.2;
//! `../shared/BACKWARD.md`): gradients dq, dk, dv of attention from q, k,
//! v, the forward's `out` and row statistics, and `dout`. Data flows one
//! way: front end (this file) → [`validate`] → [`plan`] → [`launch`].
//!
//! * f32: the readable kernels of `kernel-crate/src/bwd/` in the loop order
//!   of `params.forward.loop_order` (FA2: the LSE; FA1: `l`, `m`).
//! * f16/bf16: the Hopper backward (`hopper`: `wgmma`, sm_90a) where it
//!   applies, else the tensor-core backward (`tc`, sm_80+); the
//!   dtype-generic preprocess and dQ-convert kernels around either.
//!
//! * varlen ([`FlashAttention::backward_varlen`]): packed batches through
//!   `cu_seqlens`, FA2 order, both kernel families.
//!
//! Scratch ([`BackwardScratch`]): `D` (`delta`), the f32 dQ accumulator
//! and the deterministic mode's semaphores, allocated by the call or handed
//! in (CUDA-graph capture: no allocation inside the call).

pub(crate) mod hopper;
pub mod launch;
pub mod plan;
pub(crate) mod tc;
pub mod validate;

use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream, DevicePtr, DevicePtrMut};

use crate::tensor::{AttnElem, Extras, StatsRef, Tensor, TensorLayout, TensorMut, Varlen};
use crate::device::FlashAttention;
use crate::error::Result;
use crate::params::ForwardParams;

pub use plan::{BackwardPlan, ScratchSizes};
pub use validate::{BackwardShapes, validate_backward, validate_backward_varlen};

/// Parameters of a backward call: the forward's, plus `deterministic`
/// (dQ additions in a fixed order: the same bits on every run).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct BackwardParams {
    /// The options of the forward pass whose gradients these are.
    pub forward: ForwardParams,
    /// Bit-identical dK/dV/dQ on every run (a fixed reduction order), at some cost in speed.
    pub deterministic: bool,
}

/// Gradients allocated by [`FlashAttention::backward`], contiguous.
#[derive(Debug)]
pub struct Gradients<T> {
    /// dQ, shaped like q.
    pub dq: CudaSlice<T>,
    /// dK, shaped like k.
    pub dk: CudaSlice<T>,
    /// dV, shaped like v.
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

/// The shapes of a call with contiguous out, dout and gradients over q, k
/// layouts (what the scratch-size queries validate).
fn contiguous_shapes<'a>(q: &'a TensorLayout, k: &'a TensorLayout, o: &'a TensorLayout) -> BackwardShapes<'a> {
    let n = |l: &TensorLayout| l.required_len().unwrap_or(usize::MAX);
    BackwardShapes { q: (q, n(q)), k: (k, n(k)), v: (k, n(k)), out: (o, n(o)), dout: (o, n(o)), dq: (o, n(o)), dk: (k, n(k)), dv: (k, n(k)) }
}

/// Layouts and lengths of the buffers of one call, for validation.
macro_rules! shapes_of {
    ($q:expr, $k:expr, $v:expr, $out:expr, $dout:expr, $dq:expr, $dk:expr, $dv:expr) => {
        BackwardShapes {
            q: (&$q.layout, $q.data.len()),
            k: (&$k.layout, $k.data.len()),
            v: (&$v.layout, $v.data.len()),
            out: (&$out.layout, $out.data.len()),
            dout: (&$dout.layout, $dout.data.len()),
            dq: (&$dq.layout, $dq.data.len()),
            dk: (&$dk.layout, $dk.data.len()),
            dv: (&$dv.layout, $dv.data.len()),
        }
    };
}

/// Fresh contiguous gradient buffers shaped like q, k, v (zeroed: rows a
/// varlen call does not cover stay 0).
fn alloc_grads<T: AttnElem>(stream: &Arc<CudaStream>, layouts: [TensorLayout; 3]) -> Result<[CudaSlice<T>; 3]> {
    let len = |l: &TensorLayout| l.required_len().unwrap_or(0).max(1);
    Ok([stream.alloc_zeros::<T>(len(&layouts[0]))?, stream.alloc_zeros::<T>(len(&layouts[1]))?, stream.alloc_zeros::<T>(len(&layouts[2]))?])
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
        let problem = validate_backward(&contiguous_shapes(q, k, &o), &params.forward)?;
        Ok(self.plan_backward::<T>(&problem, params, None)?.scratch)
    }

    /// The scratch a varlen backward call needs (for
    /// [`FlashAttention::backward_varlen_into`] with caller scratch): q, k
    /// packed layouts ([`TensorLayout::varlen`]), `batch` sequences, the
    /// maxima `(max_seqlen_q, max_seqlen_k)` of its [`Varlen`].
    pub fn backward_varlen_scratch_sizes<T: AttnElem>(
        &self,
        q: &TensorLayout,
        k: &TensorLayout,
        batch: usize,
        max_seqlen: (usize, usize),
        params: &BackwardParams,
    ) -> Result<ScratchSizes> {
        let [_, total_q, nheads, d] = q.shape;
        let o = TensorLayout::varlen(total_q, nheads, d);
        let lens = (batch.saturating_add(1), batch.saturating_add(1), None);
        let problem = validate_backward_varlen(&contiguous_shapes(q, k, &o), lens, max_seqlen, &params.forward)?;
        Ok(self.plan_backward::<T>(&problem, params, Some(total_q))?.scratch)
    }

    /// Gradients of attention into freshly allocated, contiguous buffers
    /// (and scratch), on `stream` (only enqueues work). `stats` is what the
    /// forward returned ([`StatsRef`]): `&out.stats`, the logsumexp
    /// (`softmax_lse`) for the FA2 order, [`RowStats::Fa1`](crate::RowStats::Fa1) for FA1.
    ///
    /// ```no_run
    /// use cudarc::driver::CudaContext;
    /// use flash_attn::{BackwardParams, Extras, FlashAttention, ForwardParams, Tensor, TensorLayout};
    /// use half::bf16;
    ///
    /// # fn main() -> Result<(), flash_attn::FlashAttnError> {
    /// let ctx = CudaContext::new(0)?;
    /// let stream = ctx.default_stream();
    /// let fa = FlashAttention::new(&ctx)?;
    /// let layout = TensorLayout::contiguous([4, 2048, 16, 128]); // (batch, seqlen, nheads, headdim)
    /// let n = layout.num_elements().unwrap();
    /// let (q, k, v) = (stream.alloc_zeros::<bf16>(n)?, stream.alloc_zeros::<bf16>(n)?, stream.alloc_zeros::<bf16>(n)?);
    /// let t = |b| Tensor::new(b, layout);
    /// let params = ForwardParams { causal: true, ..Default::default() };
    /// let fwd = fa.forward(&stream, t(&q), t(&k), t(&v), &params)?;
    /// let dout = stream.alloc_zeros::<bf16>(n)?; // ∂loss/∂out, from the layers above
    /// let bp = BackwardParams { forward: params, ..Default::default() };
    /// let g = fa.backward(&stream, t(&q), t(&k), t(&v), t(&fwd.o), t(&dout), &fwd.stats, &bp, &Extras::default())?;
    /// let (_dq, _dk, _dv) = (g.dq, g.dk, g.dv); // on the device, like q, k, v
    /// # Ok(()) }
    /// ```
    #[allow(clippy::too_many_arguments)]
    pub fn backward<'s, T, Q, K, V, O, DO>(
        &self,
        stream: &Arc<CudaStream>,
        q: Tensor<'_, Q>,
        k: Tensor<'_, K>,
        v: Tensor<'_, V>,
        out: Tensor<'_, O>,
        dout: Tensor<'_, DO>,
        stats: impl Into<StatsRef<'s>>,
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
        let [mut dq, mut dk, mut dv] = alloc_grads::<T>(stream, layouts)?;
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
    pub fn backward_into<'s, T, Q, K, V, O, DO, GQ, GK, GV>(
        &self,
        stream: &Arc<CudaStream>,
        q: Tensor<'_, Q>,
        k: Tensor<'_, K>,
        v: Tensor<'_, V>,
        out: Tensor<'_, O>,
        dout: Tensor<'_, DO>,
        stats: impl Into<StatsRef<'s>>,
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
        let problem = validate_backward(&shapes_of!(q, k, v, out, dout, dq, dk, dv), &params.forward)?;
        let plan = self.plan_backward::<T>(&problem, params, None)?;
        let bufs = launch::Buffers { q, k, v, out, dout, stats: stats.into(), dq, dk, dv, scratch, varlen: None };
        self.launch_backward(stream, &problem, &plan, bufs, params, ext)
    }

    /// Varlen gradients (`flash_attn_varlen_func`'s backward) into fresh
    /// packed buffers: dq `(total_q, nheads, d)`, dk, dv `(total_k,
    /// nheads_k, d)`, contiguous, zero in rows no sequence covers. q, k, v,
    /// `out`, `dout` packed as for [`FlashAttention::forward_varlen`];
    /// `stats` the forward's logsumexp (`&out.lse`, `softmax_lse`,
    /// `(nheads, total_q)`); FA2 loop order. Only enqueues work.
    #[allow(clippy::too_many_arguments)]
    pub fn backward_varlen<'s, T, Q, K, V, O, DO>(
        &self,
        stream: &Arc<CudaStream>,
        q: Tensor<'_, Q>,
        k: Tensor<'_, K>,
        v: Tensor<'_, V>,
        out: Tensor<'_, O>,
        dout: Tensor<'_, DO>,
        stats: impl Into<StatsRef<'s>>,
        varlen: &Varlen<'_>,
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
        let layouts = [q.layout, k.layout, v.layout].map(|l| TensorLayout::varlen(l.shape[1], l.shape[2], l.shape[3]));
        // Validate before allocating.
        let contiguous = contiguous_shapes(&q.layout, &k.layout, &layouts[0]);
        let shapes = BackwardShapes { q: (&q.layout, q.data.len()), k: (&k.layout, k.data.len()), v: (&v.layout, v.data.len()), ..contiguous };
        let lens = varlen.array_lens();
        validate_backward_varlen(&shapes, lens, (varlen.max_seqlen_q, varlen.max_seqlen_k), &params.forward)?;
        let [mut dq, mut dk, mut dv] = alloc_grads::<T>(stream, layouts)?;
        self.backward_varlen_into(
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
            varlen,
            params,
            ext,
        )?;
        Ok(Gradients { dq, dk, dv, layouts })
    }

    /// [`FlashAttention::backward_varlen`] into caller buffers (packed,
    /// any strides within a row; rows no sequence covers are not written),
    /// with the caller's scratch if given
    /// ([`FlashAttention::backward_varlen_scratch_sizes`]).
    #[allow(clippy::too_many_arguments)]
    pub fn backward_varlen_into<'s, T, Q, K, V, O, DO, GQ, GK, GV>(
        &self,
        stream: &Arc<CudaStream>,
        q: Tensor<'_, Q>,
        k: Tensor<'_, K>,
        v: Tensor<'_, V>,
        out: Tensor<'_, O>,
        dout: Tensor<'_, DO>,
        stats: impl Into<StatsRef<'s>>,
        dq: TensorMut<'_, GQ>,
        dk: TensorMut<'_, GK>,
        dv: TensorMut<'_, GV>,
        scratch: Option<&mut BackwardScratch>,
        varlen: &Varlen<'_>,
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
        let lens = varlen.array_lens();
        let max_seqlen = (varlen.max_seqlen_q, varlen.max_seqlen_k);
        let problem = validate_backward_varlen(&shapes_of!(q, k, v, out, dout, dq, dk, dv), lens, max_seqlen, &params.forward)?;
        let (total_q, total_k) = (q.layout.seqlen(), k.layout.seqlen());
        let plan = self.plan_backward::<T>(&problem, params, Some(total_q))?;
        let launch = self.varlen_launch(stream, varlen, total_q, total_k)?;
        let bufs = launch::Buffers { q, k, v, out, dout, stats: stats.into(), dq, dk, dv, scratch, varlen: Some(&launch) };
        self.launch_backward(stream, &problem, &plan, bufs, params, ext)
    }
}
