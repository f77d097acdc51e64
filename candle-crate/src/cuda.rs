//! The CUDA path: flash-attn's kernels on candle's buffers, zero copy.
//!
//! * q, k, v: `as_cuda_slice().slice(start_offset..)`, a cudarc `CudaView`
//!   of candle's own allocation, with candle's strides as our
//!   [`TensorLayout`] (one cudarc is shared: candle's types are ours).
//! * Stream: candle's (`CudaDevice::cuda_stream`); the kernels are loaded
//!   once per CUDA context ([`kernels`]) and no stream of ours is created.
//! * Output and logsumexp: allocated on that stream (uninitialized: the
//!   kernel writes every element), the output wrapped with
//!   `CudaStorage::wrap_cuda_slice`. Nothing synchronizes the host.

use std::sync::{Arc, Mutex};

use candle_core::backend::{BackendDevice, BackendStorage};
use candle_core::cuda_backend::CudaDType;
use candle_core::cuda_backend::cudarc::driver::{CudaStream, CudaView};
use candle_core::{CudaStorage, DType, Layout, Result};
use flash_attn::{
    AlibiShape, AlibiSlopes, AttnElem, Extras, FlashAttention, StatsMut, Tensor, TensorLayout, TensorMut, Varlen,
};
use half::{bf16, f16};

use crate::check::{Checked, core_err, err};

/// The dtypes `cuda_fwd` takes.
pub(crate) const DTYPES: &[DType] = &[DType::F32, DType::F16, DType::BF16];

/// The flash-attn kernels loaded in `stream`'s context, loaded on first use
/// (the driver JIT-compiles the PTX once per context).
pub fn kernels(stream: &Arc<CudaStream>) -> Result<Arc<FlashAttention>> {
    static LOADED: Mutex<Vec<(usize, Arc<FlashAttention>)>> = Mutex::new(Vec::new());
    let ctx = stream.context();
    let key = ctx.cu_ctx() as usize;
    let mut loaded = LOADED.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((_, fa)) = loaded.iter().find(|(k, _)| *k == key) {
        return Ok(fa.clone());
    }
    let fa = Arc::new(FlashAttention::new(ctx).map_err(core_err)?);
    loaded.push((key, fa.clone()));
    Ok(fa)
}

#[allow(clippy::too_many_arguments)]
pub(crate) fn forward(
    c: &Checked,
    alibi: Option<(&CudaView<'_, f32>, AlibiShape)>,
    q: &CudaStorage,
    q_l: &Layout,
    k: &CudaStorage,
    k_l: &Layout,
    v: &CudaStorage,
    v_l: &Layout,
) -> Result<(CudaStorage, CudaStorage)> {
    match q.dtype() {
        DType::F32 => run::<f32>(c, alibi, q, q_l, k, k_l, v, v_l),
        DType::F16 => run::<f16>(c, alibi, q, q_l, k, k_l, v, v_l),
        DType::BF16 => run::<bf16>(c, alibi, q, q_l, k, k_l, v, v_l),
        dt => Err(err(format_args!("`q`: dtype {dt:?} is not supported on the GPU (supported: {DTYPES:?})"))),
    }
}

/// candle's buffer from the layout's start offset on, as a cudarc view
/// (no copy; the strides travel in our `TensorLayout`).
fn view<'a, T: CudaDType + candle_core::cuda_backend::cudarc::driver::DeviceRepr>(s: &'a CudaStorage, l: &Layout) -> Result<CudaView<'a, T>> {
    let slice = s.as_cuda_slice::<T>()?;
    Ok(slice.slice(l.start_offset().min(slice.len())..))
}

#[allow(clippy::too_many_arguments)]
fn run<T: AttnElem + CudaDType>(
    c: &Checked,
    alibi: Option<(&CudaView<'_, f32>, AlibiShape)>,
    q: &CudaStorage,
    q_l: &Layout,
    k: &CudaStorage,
    k_l: &Layout,
    v: &CudaStorage,
    v_l: &Layout,
) -> Result<(CudaStorage, CudaStorage)> {
    let dev = q.device();
    for (argument, s) in [("k", k), ("v", v)] {
        if !s.device().same_device(dev) {
            return Err(err(format_args!("device mismatch: `{argument}` is on {:?} but `q` on {:?}", s.device(), dev)));
        }
    }
    let stream = dev.cuda_stream();
    let fa = kernels(&stream)?;
    let (qv, kv, vv) = (view::<T>(q, q_l)?, view::<T>(k, k_l)?, view::<T>(v, v_l)?);
    let o_layout = TensorLayout::contiguous(c.q.shape);
    let o_len = o_layout.num_elements().ok_or_else(|| err("`q`: the output's size overflows"))?;
    let (b, h, s) = c.lse_shape();
    // SAFETY: uninitialized device memory; the forward pass writes every
    // element of o and of the logsumexp (rows that see no key: 0 and −inf)
    // before anything reads them, in stream order.
    let mut o = unsafe { stream.alloc::<T>(o_len) }.map_err(|e| err(e))?;
    let mut lse = unsafe { stream.alloc::<f32>(b * h * s) }.map_err(|e| err(e))?;
    let ext = Extras { alibi_slopes: alibi.map(|(s, shape)| AlibiSlopes::new(s, shape)) };
    fa.forward_into_ext(
        &stream,
        Tensor::new(&qv, c.q),
        Tensor::new(&kv, c.k),
        Tensor::new(&vv, c.v),
        TensorMut::new(&mut o, o_layout),
        StatsMut::LogSumExp(lse.as_view_mut()),
        &c.params,
        &ext,
    )
    .map_err(core_err)?;
    Ok((CudaStorage::wrap_cuda_slice(o, dev.clone()), CudaStorage::wrap_cuda_slice(lse, dev.clone())))
}

/// Varlen on the GPU: `forward_varlen_into` over candle's buffers; the u32
/// prefix sums are read in place as i32 (same bits below 2³¹; the kernels
/// clamp every value to the buffers). O `(total_q, nheads, d)`, LSE
/// `(nheads, total_q)`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn forward_varlen(
    c: &Checked,
    cu: (&CudaStorage, &Layout, &CudaStorage, &Layout),
    max: (usize, usize),
    alibi: Option<(&CudaView<'_, f32>, AlibiShape)>,
    q: &CudaStorage,
    q_l: &Layout,
    k: &CudaStorage,
    k_l: &Layout,
    v: &CudaStorage,
    v_l: &Layout,
) -> Result<(CudaStorage, CudaStorage)> {
    match q.dtype() {
        DType::F32 => run_varlen::<f32>(c, cu, max, alibi, q, q_l, k, k_l, v, v_l),
        DType::F16 => run_varlen::<f16>(c, cu, max, alibi, q, q_l, k, k_l, v, v_l),
        DType::BF16 => run_varlen::<bf16>(c, cu, max, alibi, q, q_l, k, k_l, v, v_l),
        dt => Err(err(format_args!("`q`: dtype {dt:?} is not supported on the GPU (supported: {DTYPES:?})"))),
    }
}

#[allow(clippy::too_many_arguments)]
fn run_varlen<T: AttnElem + CudaDType>(
    c: &Checked,
    cu: (&CudaStorage, &Layout, &CudaStorage, &Layout),
    (max_seqlen_q, max_seqlen_k): (usize, usize),
    alibi: Option<(&CudaView<'_, f32>, AlibiShape)>,
    q: &CudaStorage,
    q_l: &Layout,
    k: &CudaStorage,
    k_l: &Layout,
    v: &CudaStorage,
    v_l: &Layout,
) -> Result<(CudaStorage, CudaStorage)> {
    let dev = q.device();
    for (argument, s) in [("k", k), ("v", v), ("seqlens_q", cu.0), ("seqlens_k", cu.2)] {
        if !s.device().same_device(dev) {
            return Err(err(format_args!("device mismatch: `{argument}` is on {:?} but `q` on {:?}", s.device(), dev)));
        }
    }
    let stream = dev.cuda_stream();
    let fa = kernels(&stream)?;
    let (qv, kv, vv) = (view::<T>(q, q_l)?, view::<T>(k, k_l)?, view::<T>(v, v_l)?);
    let (cq, ck) = (view::<u32>(cu.0, cu.1)?, view::<u32>(cu.2, cu.3)?);
    let (nq, nk) = (cu.1.shape().elem_count(), cu.3.shape().elem_count());
    // SAFETY: u32 and i32 have one size; prefix sums below 2³¹ read the
    // same, and the kernels clamp any value to the buffers.
    let cq = unsafe { cq.transmute::<i32>(nq) }.ok_or_else(|| err("`seqlens_q`: buffer shorter than its shape"))?;
    let ck = unsafe { ck.transmute::<i32>(nk) }.ok_or_else(|| err("`seqlens_k`: buffer shorter than its shape"))?;
    let [_, total_q, h, d] = c.q.shape;
    let o_layout = TensorLayout::varlen(total_q, h, d);
    // SAFETY: uninitialized; the kernels write every row of o and of the
    // LSE (rows outside every segment are zeroed / −inf by the API).
    let mut o = unsafe { stream.alloc::<T>(total_q * h * d) }.map_err(err)?;
    let mut lse = unsafe { stream.alloc::<f32>(h * total_q) }.map_err(err)?;
    let varlen = Varlen { cu_seqlens_q: &cq, cu_seqlens_k: &ck, max_seqlen_q, max_seqlen_k, seqused_k: None };
    let ext = Extras { alibi_slopes: alibi.map(|(s, shape)| AlibiSlopes::new(s, shape)) };
    fa.forward_varlen_into(
        &stream,
        Tensor::new(&qv, c.q),
        Tensor::new(&kv, c.k),
        Tensor::new(&vv, c.v),
        TensorMut::new(&mut o, o_layout),
        StatsMut::LogSumExp(lse.as_view_mut()),
        &varlen,
        &c.params,
        &ext,
    )
    .map_err(core_err)?;
    Ok((CudaStorage::wrap_cuda_slice(o, dev.clone()), CudaStorage::wrap_cuda_slice(lse, dev.clone())))
}
