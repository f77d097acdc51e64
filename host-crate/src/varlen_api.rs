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

use cudarc::driver::{CudaSlice, CudaStream, DevicePtr, DevicePtrMut, SyncOnDrop};
use flash_attn_common::AttnParams;

use crate::api::{AttnElem, Extras, Problem, StatsMut, Tensor, TensorLayout, TensorMut, validate};
use crate::device::FlashAttention;
use crate::dispatch::Dims;
use crate::error::{FlashAttnError, Result};
use crate::params::ForwardParams;

/// The varlen description of a call (device-side prefix sums).
#[derive(Clone, Copy)]
pub struct Varlen<'a> {
    /// i32 `(batch + 1)`, prefix sums of the query lengths from 0.
    pub cu_seqlens_q: &'a dyn DevicePtr<i32>,
    /// i32 `(batch + 1)`, prefix sums of the key lengths from 0.
    pub cu_seqlens_k: &'a dyn DevicePtr<i32>,
    /// At least every query (key) segment's length; sizes the grid.
    pub max_seqlen_q: usize,
    pub max_seqlen_k: usize,
    /// Optional i32 `(batch)`: keys actually used per sequence (≤ its segment).
    pub seqused_k: Option<&'a dyn DevicePtr<i32>>,
}

impl Varlen<'_> {
    /// The element counts of `cu_seqlens_q`, `cu_seqlens_k` and `seqused_k`,
    /// as the validation's length checks take them.
    pub(crate) fn array_lens(&self) -> (usize, usize, Option<usize>) {
        (self.cu_seqlens_q.len(), self.cu_seqlens_k.len(), self.seqused_k.map(|s| s.len()))
    }
}

impl std::fmt::Debug for Varlen<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Varlen")
            .field("batch", &self.batch())
            .field("max_seqlen_q", &self.max_seqlen_q)
            .field("max_seqlen_k", &self.max_seqlen_k)
            .field("seqused_k", &self.seqused_k.is_some())
            .finish()
    }
}

impl Varlen<'_> {
    /// Number of sequences (`cu_seqlens_q.len() − 1`, 0 if empty).
    pub fn batch(&self) -> usize {
        self.cu_seqlens_q.len().saturating_sub(1)
    }
}

/// Output of [`FlashAttention::forward_varlen`].
#[derive(Debug)]
pub struct VarlenOutput<T> {
    /// `(total_q, nheads, headdim)` contiguous (`o_layout` has batch 1).
    pub o: CudaSlice<T>,
    pub o_layout: TensorLayout,
    /// `(nheads, total_q)`, natural log; −inf for rows that see no key.
    pub lse: CudaSlice<f32>,
}

impl TensorLayout {
    /// A packed `(total, nheads, headdim)` varlen tensor, contiguous, as the
    /// 4-axis layout with batch 1 that the API takes.
    pub fn varlen(total: usize, nheads: usize, headdim: usize) -> Self {
        let c = Self::contiguous([1, total, nheads, headdim]);
        Self { strides: [0, c.strides[1], c.strides[2]], ..c }
    }
}

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

pub(crate) fn packed(argument: &'static str, l: &TensorLayout) -> Result<()> {
    if l.batch() != 1 {
        return Err(FlashAttnError::InvalidArgument {
            argument,
            value: format!("shape {:?}", l.shape),
            reason: "varlen tensors are packed (total, nheads, headdim): use TensorLayout::varlen (batch axis 1)",
        });
    }
    Ok(())
}

/// The lengths of a varlen description's arrays and its maxima; returns
/// the batch. Pure (no GPU needed).
fn check_lens(lens: (usize, usize, Option<usize>), max_seqlen: (usize, usize)) -> Result<usize> {
    let (cu_q, cu_k, seqused) = lens;
    if cu_q < 2 {
        return Err(FlashAttnError::InvalidArgument {
            argument: "cu_seqlens_q",
            value: format!("length {cu_q}"),
            reason: "must hold batch + 1 ≥ 2 prefix sums",
        });
    }
    if cu_k != cu_q {
        return Err(FlashAttnError::InvalidArgument {
            argument: "cu_seqlens_k",
            value: format!("length {cu_k}"),
            reason: "must have the length of cu_seqlens_q (batch + 1)",
        });
    }
    let batch = cu_q - 1;
    if let Some(n) = seqused
        && n != batch
    {
        return Err(FlashAttnError::InvalidArgument {
            argument: "seqused_k",
            value: format!("length {n}"),
            reason: "must hold one i32 per sequence (batch = cu_seqlens_q.len() − 1)",
        });
    }
    let (max_q, max_k) = max_seqlen;
    if max_q == 0 || max_q > crate::api::MAX_DIM {
        return Err(FlashAttnError::InvalidArgument {
            argument: "max_seqlen_q",
            value: max_q.to_string(),
            reason: "must be in 1..=2³¹ − 1 and at least every query segment's length",
        });
    }
    if max_k > crate::api::MAX_DIM {
        return Err(FlashAttnError::InvalidArgument {
            argument: "max_seqlen_k",
            value: max_k.to_string(),
            reason: "must be at most 2³¹ − 1",
        });
    }
    Ok(batch)
}

/// [`check_lens`] of a device varlen description.
pub(crate) fn check_varlen_lens(v: &Varlen<'_>) -> Result<usize> {
    check_lens(
        v.array_lens(),
        (v.max_seqlen_q, v.max_seqlen_k),
    )
}

/// Validates a varlen call: the packed layouts, the prefix-sum lengths and
/// the maxima. Pure (no GPU needed).
pub fn validate_varlen(
    q: (&TensorLayout, usize),
    k: (&TensorLayout, usize),
    v: (&TensorLayout, usize),
    o: (&TensorLayout, usize),
    lens: (usize, usize, Option<usize>),
    max_seqlen: (usize, usize),
    params: &ForwardParams,
) -> Result<Problem> {
    for (name, l) in [("q", q.0), ("k", k.0), ("v", v.0), ("o", o.0)] {
        packed(name, l)?;
    }
    let base = validate(q, k, v, o, params)?;
    let batch = check_lens(lens, max_seqlen)?;
    let (max_q, max_k) = max_seqlen;
    if batch.checked_mul(base.dims.nheads).is_none_or(|x| x > crate::api::MAX_DIM) {
        return Err(FlashAttnError::DimTooLarge { argument: "cu_seqlens_q", axis: "batch·nheads", value: batch, max: crate::api::MAX_DIM });
    }
    let opts = params.resolve(base.dims.headdim, max_k)?;
    let dims = Dims { batch, seqlen_q: max_q, seqlen_k: max_k, ..base.dims };
    Ok(Problem { dims, softmax_scale: opts.softmax_scale, opts })
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
    pub fn forward_varlen<T, Q, K, V>(
        &self,
        stream: &Arc<CudaStream>,
        q: Tensor<'_, Q>,
        k: Tensor<'_, K>,
        v: Tensor<'_, V>,
        varlen: &Varlen<'_>,
        params: &ForwardParams,
        ext: &Extras<'_>,
    ) -> Result<VarlenOutput<T>>
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
        let stats = StatsMut::LogSumExp(lse.as_view_mut());
        self.forward_varlen_into(stream, q, k, v, TensorMut::new(&mut o, o_layout), stats, varlen, params, ext)?;
        Ok(VarlenOutput { o, o_layout, lse })
    }

    /// Varlen attention forward into caller-owned buffers (`o` packed like
    /// q; `stats` a `StatsMut::LogSumExp` of ≥ `nheads·total_q` f32).
    #[allow(clippy::too_many_arguments)]
    pub fn forward_varlen_into<T, Q, K, V, O>(
        &self,
        stream: &Arc<CudaStream>,
        q: Tensor<'_, Q>,
        k: Tensor<'_, K>,
        v: Tensor<'_, V>,
        o: TensorMut<'_, O>,
        stats: StatsMut<'_>,
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
        self.launch_problem(stream, &problem, q, k, v, o, stats, params, ext, Some(&launch))
    }
}
