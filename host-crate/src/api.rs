//! The device-level API's dense forward: attention over cudarc buffers, on
//! the caller's stream, with no host synchronization (every call only
//! enqueues work). Validates (`validate`), then plans and launches
//! (`launch`).

use std::sync::Arc;

use cudarc::driver::{CudaStream, DevicePtr, DevicePtrMut};

use crate::device::FlashAttention;
use crate::error::Result;
use crate::params::{ForwardParams, LoopOrder};
use crate::tensor::{AttnElem, Extras, ForwardOutput, RowStats, StatsMut, Tensor, TensorLayout, TensorMut};
use crate::validate::validate;

impl FlashAttention {
    /// Attention forward into freshly allocated outputs (allocated on
    /// `stream`, stream-ordered): O `(batch, seqlen_q, nheads, headdim)`
    /// contiguous and the row statistics of the loop order (FA1: `l`, `m`
    /// initialized to 0 / −inf and updated by Algorithm 1; FA2, Standard:
    /// the logsumexp). Only enqueues work on `stream`.
    ///
    /// Errors: every invalid shape, stride, buffer length or parameter (see
    /// [`FlashAttnError`](crate::FlashAttnError)). f16/bf16 run on the tensor cores (FA2, FA1; head
    /// dims 32, 64, 96, 128, 256; 16-byte aligned, strides multiple of 8);
    /// anything else 16-bit is a typed [`FlashAttnError::Unsupported`](crate::FlashAttnError::Unsupported).
    ///
    /// ```no_run
    /// use std::sync::Arc;
    /// use cudarc::driver::CudaContext;
    /// use flash_attn::{FlashAttention, ForwardParams, Tensor, TensorLayout};
    ///
    /// # fn main() -> Result<(), flash_attn::FlashAttnError> {
    /// let ctx = CudaContext::new(0)?;
    /// let stream = ctx.default_stream();
    /// let fa = FlashAttention::new(&ctx)?;
    /// let shape = [2, 1024, 12, 64]; // (batch, seqlen, nheads, headdim)
    /// let n = shape.iter().product::<usize>();
    /// let q = stream.clone_htod(&vec![0.5f32; n])?;
    /// let k = stream.clone_htod(&vec![0.25f32; n])?;
    /// let v = stream.clone_htod(&vec![1.0f32; n])?;
    /// let layout = TensorLayout::contiguous(shape);
    /// let params = ForwardParams { causal: true, ..Default::default() };
    /// let out = fa.forward(&stream, Tensor::new(&q, layout), Tensor::new(&k, layout), Tensor::new(&v, layout), &params)?;
    /// let o: Vec<f32> = stream.clone_dtoh(&out.o)?; // synchronizes here, not before
    /// if let Some(lse) = out.lse() { let _lse = stream.clone_dtoh(lse)?; } // FA2, Standard; FA1: out.stats
    /// # Ok(()) }
    /// ```
    pub fn forward<T, Q, K, V>(
        &self,
        stream: &Arc<CudaStream>,
        q: Tensor<'_, Q>,
        k: Tensor<'_, K>,
        v: Tensor<'_, V>,
        params: &ForwardParams,
    ) -> Result<ForwardOutput<T>>
    where
        T: AttnElem,
        Q: DevicePtr<T>,
        K: DevicePtr<T>,
        V: DevicePtr<T>,
    {
        self.forward_ext(stream, q, k, v, params, &Extras::default())
    }

    /// Attention forward into caller-owned buffers: `o` (any non-overlapping
    /// strides) and the row statistics of the loop order. Only enqueues work
    /// on `stream` (FA1: an init kernel, then the main kernel; Standard: a
    /// stream-ordered scratch allocation and three kernels; on a device
    /// without memory pools cudarc frees that scratch synchronously).
    #[allow(clippy::too_many_arguments)]
    pub fn forward_into<T, Q, K, V, O>(
        &self,
        stream: &Arc<CudaStream>,
        q: Tensor<'_, Q>,
        k: Tensor<'_, K>,
        v: Tensor<'_, V>,
        o: TensorMut<'_, O>,
        stats: StatsMut<'_>,
        params: &ForwardParams,
    ) -> Result<()>
    where
        T: AttnElem,
        Q: DevicePtr<T>,
        K: DevicePtr<T>,
        V: DevicePtr<T>,
        O: DevicePtrMut<T>,
    {
        self.forward_into_ext(stream, q, k, v, o, stats, params, &Extras::default())
    }

    /// [`FlashAttention::forward`] with the device-side extras (ALiBi slopes).
    pub fn forward_ext<T, Q, K, V>(
        &self,
        stream: &Arc<CudaStream>,
        q: Tensor<'_, Q>,
        k: Tensor<'_, K>,
        v: Tensor<'_, V>,
        params: &ForwardParams,
        ext: &Extras<'_>,
    ) -> Result<ForwardOutput<T>>
    where
        T: AttnElem,
        Q: DevicePtr<T>,
        K: DevicePtr<T>,
        V: DevicePtr<T>,
    {
        let o_layout = TensorLayout::contiguous(q.layout.shape);
        let o_len = o_layout.required_len().unwrap_or(usize::MAX);
        let problem = validate(
            (&q.layout, q.data.len()),
            (&k.layout, k.data.len()),
            (&v.layout, v.data.len()),
            (&o_layout, o_len),
            params,
        )?;
        self.check_stream("stream", stream)?;
        self.plan::<T>(&problem, params, ext.alibi_slopes.is_some(), false)?;
        let mut o = stream.alloc_zeros::<T>(o_len)?;
        let n = problem.stats_len();
        let stats = if params.loop_order == LoopOrder::Fa1 {
            let (mut l, mut m) = (stream.alloc_zeros::<f32>(n)?, stream.alloc_zeros::<f32>(n)?);
            let stats = StatsMut::Fa1 { l: l.as_view_mut(), m: m.as_view_mut() };
            self.forward_into_ext(stream, q, k, v, TensorMut::new(&mut o, o_layout), stats, params, ext)?;
            RowStats::Fa1 { l, m }
        } else {
            let mut lse = stream.alloc_zeros::<f32>(n)?;
            let stats = StatsMut::LogSumExp(lse.as_view_mut());
            self.forward_into_ext(stream, q, k, v, TensorMut::new(&mut o, o_layout), stats, params, ext)?;
            RowStats::LogSumExp(lse)
        };
        Ok(ForwardOutput { o, o_layout, stats })
    }

    /// [`FlashAttention::forward_into`] with the device-side extras (ALiBi slopes).
    #[allow(clippy::too_many_arguments)]
    pub fn forward_into_ext<T, Q, K, V, O>(
        &self,
        stream: &Arc<CudaStream>,
        q: Tensor<'_, Q>,
        k: Tensor<'_, K>,
        v: Tensor<'_, V>,
        o: TensorMut<'_, O>,
        mut stats: StatsMut<'_>,
        params: &ForwardParams,
        ext: &Extras<'_>,
    ) -> Result<()>
    where
        T: AttnElem,
        Q: DevicePtr<T>,
        K: DevicePtr<T>,
        V: DevicePtr<T>,
        O: DevicePtrMut<T>,
    {
        let problem = validate(
            (&q.layout, q.data.len()),
            (&k.layout, k.data.len()),
            (&v.layout, v.data.len()),
            (&o.layout, o.data.len()),
            params,
        )?;
        self.launch_problem(stream, &problem, q, k, v, o, (&mut stats).into(), params, ext, None)
    }
}
