//! Varlen (packed batches) on the device: `flash_attn_varlen_func`'s
//! semantics. q `(total_q, nheads, d)`, k/v `(total_k, nheads_k, d)`,
//! sequence `b` spanning rows `cu_seqlens_q[b]..cu_seqlens_q[b+1]` of q and
//! `cu_seqlens_k[b]..cu_seqlens_k[b+1]` of k/v; causal and window aligned
//! bottom-right per sequence; LSE unpadded `(nheads, total_q)`.
//!
//! The prefix sums live on the device, where the host cannot read them
//! without a synchronization: the host checks their lengths, the kernels
//! clamp every value to the buffers (`AttnParams::seq`), so bad contents can
//! never make a kernel read or write out of bounds. A segment longer than
//! `max_seqlen_q`/`max_seqlen_k` is cut to that length (rows past it are not
//! written), as in FlashAttention-2. [`crate::varlen::check_varlen`]
//! validates host copies of the prefix sums completely when the caller has
//! them (the ndarray API does).

use std::sync::Arc;

use cudarc::driver::{CudaStream, DevicePtr, DevicePtrMut, SyncOnDrop};
use flash_attn_common::AttnParams;

use crate::device::FlashAttention;
use crate::error::Result;
use crate::params::ForwardParams;
use crate::tensor::{AttnElem, AttnOutput, Extras, StatsOut, Tensor, TensorLayout, TensorMut, Varlen};
use crate::validate::validate_varlen;

/// Device pointers of a varlen launch, their stream guards held until the
/// launch is enqueued.
pub(crate) struct VarlenLaunch<'s> {
    cu_q: (u64, SyncOnDrop<'s>),
    cu_k: (u64, SyncOnDrop<'s>),
    seqused_k: Option<(u64, SyncOnDrop<'s>)>,
    pub(crate) total_q: usize,
    total_k: usize,
}

impl VarlenLaunch<'_> {
    /// Sets the varlen fields (the batch strides are unused: 0).
    pub(crate) fn fill(&self, p: &mut AttnParams) {
        p.cu_seqlens_q_ptr = self.cu_q.0;
        p.cu_seqlens_k_ptr = self.cu_k.0;
        p.seqused_k_ptr = self.seqused_k.as_ref().map_or(0, |s| s.0);
        p.total_q = self.total_q as u32;
        p.total_k = self.total_k as u32;
        for s in [&mut p.q_stride, &mut p.k_stride, &mut p.v_stride, &mut p.o_stride] {
            s[0] = 0;
        }
    }
}

impl FlashAttention {
    /// The device pointers of `varlen`'s arrays on `stream` (each checked to
    /// belong to this context), for a launch over `total_q` query rows and
    /// `total_k` key rows.
    pub(crate) fn varlen_launch<'s>(
        &self,
        stream: &'s Arc<CudaStream>,
        varlen: &'s Varlen<'s>,
        total_q: usize,
        total_k: usize,
    ) -> Result<VarlenLaunch<'s>> {
        for (name, s) in [("cu_seqlens_q", varlen.cu_seqlens_q.stream()), ("cu_seqlens_k", varlen.cu_seqlens_k.stream())] {
            self.check_stream(name, s)?;
        }
        if let Some(s) = varlen.seqused_k {
            self.check_stream("seqused_k", s.stream())?;
        }
        Ok(VarlenLaunch {
            cu_q: varlen.cu_seqlens_q.device_ptr(stream),
            cu_k: varlen.cu_seqlens_k.device_ptr(stream),
            seqused_k: varlen.seqused_k.map(|s| s.device_ptr(stream)),
            total_q,
            total_k,
        })
    }

    /// Varlen attention forward into fresh outputs: O `(total_q, nheads, d)`
    /// and the unpadded LSE `(nheads, total_q)`. FA2 loop order (f32 kernel,
    /// or tensor cores for f16/bf16). GQA, window, softcap and ALiBi
    /// (`ext`; slopes `(batch, nheads)` index by sequence) as for
    /// [`FlashAttention::forward`].
    #[allow(clippy::too_many_arguments)]
    pub fn forward_varlen<T, Q, K, V>(
        &self,
        stream: &Arc<CudaStream>,
        q: Tensor<'_, Q>,
        k: Tensor<'_, K>,
        v: Tensor<'_, V>,
        varlen: &Varlen<'_>,
        params: &ForwardParams,
        ext: &Extras<'_>,
    ) -> Result<AttnOutput<T>>
    where
        T: AttnElem,
        Q: DevicePtr<T>,
        K: DevicePtr<T>,
        V: DevicePtr<T>,
    {
        let [_, total_q, nheads, d] = q.layout.shape;
        let o_layout = TensorLayout::varlen(total_q, nheads, d);
        let o_len = o_layout.required_len().unwrap_or(usize::MAX);
        // Validate before allocating.
        validate_varlen(
            (&q.layout, q.data.len()),
            (&k.layout, k.data.len()),
            (&v.layout, v.data.len()),
            (&o_layout, o_len),
            varlen.array_lens(),
            (varlen.max_seqlen_q, varlen.max_seqlen_k),
            params,
        )?;
        let mut o = stream.alloc_zeros::<T>(o_len)?;
        let mut lse = stream.alloc_zeros::<f32>(nheads * total_q)?;
        self.forward_varlen_into(stream, q, k, v, TensorMut::new(&mut o, o_layout), &mut lse, varlen, params, ext)?;
        Ok(AttnOutput { o, o_layout, lse })
    }

    /// [`FlashAttention::forward_varlen`] into caller-owned buffers: O `o`
    /// (`(total_q, nheads, d)`, packed like q) and the logsumexp `lse`
    /// (`(nheads, total_q)` f32, unpadded: ≥ `nheads·total_q` elements).
    /// Validated before anything is enqueued, as the allocating call.
    #[allow(clippy::too_many_arguments)]
    pub fn forward_varlen_into<T, Q, K, V, O>(
        &self,
        stream: &Arc<CudaStream>,
        q: Tensor<'_, Q>,
        k: Tensor<'_, K>,
        v: Tensor<'_, V>,
        o: TensorMut<'_, O>,
        lse: &mut dyn DevicePtrMut<f32>,
        varlen: &Varlen<'_>,
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
        let problem = validate_varlen(
            (&q.layout, q.data.len()),
            (&k.layout, k.data.len()),
            (&v.layout, v.data.len()),
            (&o.layout, o.data.len()),
            varlen.array_lens(),
            (varlen.max_seqlen_q, varlen.max_seqlen_k),
            params,
        )?;
        let launch = self.varlen_launch(stream, varlen, q.layout.seqlen(), k.layout.seqlen())?;
        self.launch_problem(stream, &problem, q, k, v, o, StatsOut::LogSumExp(lse), params, ext, Some(&launch))
    }
}

