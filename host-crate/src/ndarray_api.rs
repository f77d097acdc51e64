//! The `ndarray` API of the dense calls: [`flash_attn_func`] and
//! [`flash_attn_varlen_func`] (their backends are in `flash_attn_func`'s docs).

use std::sync::Arc;

use cudarc::driver::{CudaStream, DevicePtr};
use flash_attn_common::RowState;
use ndarray::{Array2, Array3, Array4, ArrayView3, ArrayView4};

use crate::params::ForwardParams;
use crate::tensor::{AlibiSlopes, AttnElem, Extras, RowStats, Tensor, TensorLayout};
use crate::validate::{Problem, validate};
use crate::reference::HostAlibi;
use crate::tensor::Varlen;
use crate::dispatch;
use crate::types::DType;
use crate::device::FlashAttention;
use crate::open::default_flash_attention;
use crate::error::Result;
use crate::reference;

/// A host array's elements in logical (row-major) order: what the device
/// buffers of the ndarray API hold.
pub(crate) fn host_vec<T: Copy, D: ndarray::Dimension>(a: &ndarray::ArrayView<'_, T, D>) -> Vec<T> {
    a.iter().copied().collect()
}

/// ALiBi slopes copied to the device, with their shape.
pub(crate) struct DeviceSlopes(Option<(cudarc::driver::CudaSlice<f32>, crate::params::AlibiShape)>);

impl DeviceSlopes {
    pub(crate) fn upload(stream: &Arc<CudaStream>, alibi: Option<&HostAlibi<'_>>) -> Result<Self> {
        Ok(Self(alibi.map(|a| stream.clone_htod(a.slopes).map(|d| (d, a.shape))).transpose()?))
    }

    pub(crate) fn extras(&self) -> Extras<'_> {
        Extras { alibi_slopes: self.0.as_ref().map(|(d, shape)| AlibiSlopes::new(d, *shape)) }
    }
}

/// Host prefix sums (and `seqused_k`) copied to the device.
pub(crate) struct DeviceVarlen {
    cu_q: cudarc::driver::CudaSlice<i32>,
    cu_k: cudarc::driver::CudaSlice<i32>,
    used: Option<cudarc::driver::CudaSlice<i32>>,
}

impl DeviceVarlen {
    pub(crate) fn upload(stream: &Arc<CudaStream>, cu_seqlens_q: &[i32], cu_seqlens_k: &[i32], seqused_k: Option<&[i32]>) -> Result<Self> {
        Ok(Self {
            cu_q: stream.clone_htod(cu_seqlens_q)?,
            cu_k: stream.clone_htod(cu_seqlens_k)?,
            used: seqused_k.map(|u| stream.clone_htod(u)).transpose()?,
        })
    }

    pub(crate) fn varlen(&self, (max_seqlen_q, max_seqlen_k): (usize, usize)) -> Varlen<'_> {
        Varlen {
            cu_seqlens_q: &self.cu_q,
            cu_seqlens_k: &self.cu_k,
            max_seqlen_q,
            max_seqlen_k,
            seqused_k: self.used.as_ref().map(|u| u as &dyn DevicePtr<i32>),
        }
    }
}

/// Where [`flash_attn_func`] runs.
#[derive(Clone, Debug)]
pub enum Backend {
    /// The process-wide [`FlashAttention`] on device 0.
    Gpu(Arc<FlashAttention>),
    /// The CPU reference, because no GPU can be used (`reason` says why).
    Cpu {
        /// Why no GPU can be used.
        reason: String,
    },
}

/// The backend of [`flash_attn_func`]; the GPU probe runs once per process.
pub fn default_backend() -> Backend {
    match default_flash_attention() {
        Ok(fa) => Backend::Gpu(fa),
        Err(reason) => Backend::Cpu { reason },
    }
}

/// Attention forward: returns `O` `(batch, seqlen_q, nheads, headdim)` and
/// the logsumexp `(batch, nheads, seqlen_q)` (natural log, −inf for a row
/// that sees no key). Runs on the GPU when there is one, else on the CPU
/// (below).
///
/// ```
/// use flash_attn::{ForwardParams, flash_attn_func, reference};
/// use ndarray::Array4;
///
/// let x = |h: usize, seed: f32| Array4::from_shape_fn((2, 64, h, 32), |(b, i, h, d)| ((b + 3 * i + 5 * h + 7 * d) as f32 * seed).sin());
/// let (q, k, v) = (x(8, 0.01), x(2, 0.02), x(2, 0.03)); // GQA: 8 query heads over 2 KV heads
/// let params = ForwardParams { causal: true, window_left: Some(16), ..Default::default() };
/// let (out, lse) = flash_attn_func(q.view(), k.view(), v.view(), &params)?;
/// assert_eq!((out.dim(), lse.dim()), ((2, 64, 8, 32), (2, 8, 64)));
///
/// // The same attention by the definition, in f64.
/// let f64s = |a: &Array4<f32>| a.mapv(f64::from);
/// let want = reference::attention(f64s(&q).view(), f64s(&k).view(), f64s(&v).view(), &params, None)?;
/// assert!(out.iter().zip(want.o.iter()).all(|(a, b)| (*a as f64 - b).abs() < 1e-4));
/// # Ok::<(), flash_attn::FlashAttnError>(())
/// ```
///
/// # Backends
/// `ArrayView4` in, `Array4` out, layout `(batch, seqlen, nheads, headdim)`.
///
/// * On a GPU (sm_80 or newer, found through the CUDA driver), the inputs
///   are copied to the device, run by the kernel of `params.loop_order`, and
///   copied back; the call blocks until the result is on the host. f32 runs
///   the f32 kernels; `half::f16` and `half::bf16` run the tensor-core
///   kernels as they are (head dims multiple of 8 up to 256; FA2 with every
///   feature, FA1 with GQA and windows); other 16-bit problems (standard
///   attention, other head dims, FA1 with softcap/ALiBi) are converted to
///   f32, run by the f32 kernels, and rounded back.
/// * **Without a usable GPU** (no driver, no device, or an older device),
///   [`flash_attn_func`] falls back to the CPU: [`reference::fa2_forward_ext`](crate::reference::fa2_forward_ext)
///   in f32 (half inputs converted to f32), whatever `params.loop_order`
///   says — same results up to rounding, much slower. [`default_backend`]
///   tells which path a call will take, and why.
/// * [`flash_attn_varlen_func`]: packed batches, same backends.
///
/// Both paths validate their arguments identically and return the same
/// typed errors.
pub fn flash_attn_func<T: AttnElem>(
    q: ArrayView4<'_, T>,
    k: ArrayView4<'_, T>,
    v: ArrayView4<'_, T>,
    params: &ForwardParams,
) -> Result<(Array4<T>, Array3<f32>)> {
    flash_attn_func_ext(q, k, v, params, None)
}

/// [`flash_attn_func`] with ALiBi slopes (`(nheads)` or `(batch, nheads)`).
/// k and v may have fewer heads than q (GQA/MQA).
pub fn flash_attn_func_ext<T: AttnElem>(
    q: ArrayView4<'_, T>,
    k: ArrayView4<'_, T>,
    v: ArrayView4<'_, T>,
    params: &ForwardParams,
    alibi: Option<HostAlibi<'_>>,
) -> Result<(Array4<T>, Array3<f32>)> {
    match default_backend() {
        Backend::Gpu(fa) => {
            let stream = fa.context().default_stream();
            flash_attn_func_on_ext(&fa, &stream, q, k, v, params, alibi)
        }
        Backend::Cpu { .. } => flash_attn_func_cpu_ext(q, k, v, params, alibi),
    }
}

fn layout_of<T>(a: &ArrayView4<'_, T>) -> (TensorLayout, usize) {
    let d = a.dim();
    (TensorLayout::contiguous([d.0, d.1, d.2, d.3]), a.len())
}

fn check_arrays<T>(
    q: &ArrayView4<'_, T>,
    k: &ArrayView4<'_, T>,
    v: &ArrayView4<'_, T>,
    params: &ForwardParams,
) -> Result<Problem> {
    let (ql, kl, vl) = (layout_of(q), layout_of(k), layout_of(v));
    validate((&ql.0, ql.1), (&kl.0, kl.1), (&vl.0, vl.1), (&ql.0, ql.1), params)
}

/// [`flash_attn_func`] on an explicit [`FlashAttention`] and stream (the
/// call synchronizes `stream` to copy the result back).
pub fn flash_attn_func_on<T: AttnElem>(
    fa: &FlashAttention,
    stream: &Arc<CudaStream>,
    q: ArrayView4<'_, T>,
    k: ArrayView4<'_, T>,
    v: ArrayView4<'_, T>,
    params: &ForwardParams,
) -> Result<(Array4<T>, Array3<f32>)> {
    flash_attn_func_on_ext(fa, stream, q, k, v, params, None)
}

/// Whether f16/bf16 inputs run as they are on the tensor cores (else the
/// ndarray API converts them to f32 for the f32 kernels).
fn runs_on_tensor_cores<T: AttnElem>(params: &ForwardParams, headdim: usize, mods: bool) -> bool {
    T::DTYPE != DType::F32
        && dispatch::tc_supports(params.loop_order, headdim)
        && (params.loop_order == crate::params::LoopOrder::Fa2 || !mods)
}

/// [`flash_attn_func_on`] with ALiBi slopes.
pub fn flash_attn_func_on_ext<T: AttnElem>(
    fa: &FlashAttention,
    stream: &Arc<CudaStream>,
    q: ArrayView4<'_, T>,
    k: ArrayView4<'_, T>,
    v: ArrayView4<'_, T>,
    params: &ForwardParams,
    alibi: Option<HostAlibi<'_>>,
) -> Result<(Array4<T>, Array3<f32>)> {
    let problem = check_arrays(&q, &k, &v, params)?;
    if let Some(a) = &alibi {
        a.check(problem.dims.batch, problem.dims.nheads)?;
    }
    let mods = alibi.is_some() || problem.opts.softcap > 0.0;
    let (o, lse) = if runs_on_tensor_cores::<T>(params, problem.dims.headdim, mods) {
        // f16/bf16 as they are, on the tensor cores.
        forward_host::<T>(fa, stream, [host_vec(&q), host_vec(&k), host_vec(&v)], [&q, &k, &v], params, alibi)?
    } else {
        // f32, or 16-bit problems the tensor cores do not take (standard
        // attention, FA1 with softcap/ALiBi): through the f32 kernels.
        let to_host = |a: &ArrayView4<'_, T>| a.iter().map(|x| x.to_f32()).collect::<Vec<f32>>();
        let (o, lse) = forward_host::<f32>(fa, stream, [to_host(&q), to_host(&k), to_host(&v)], [&q, &k, &v], params, alibi)?;
        (o.into_iter().map(T::from_f32).collect(), lse)
    };
    let d = problem.dims;
    let o = Array4::from_shape_vec((d.batch, d.seqlen_q, d.nheads, d.headdim), o)?;
    let lse = Array3::from_shape_vec((d.batch, d.nheads, d.seqlen_q), lse)?;
    Ok((o, lse))
}

/// Uploads `host` (q, k, v, contiguous), runs [`FlashAttention::forward`] in
/// `E`, and copies O and the logsumexp back (FA1's l, m are turned into it).
fn forward_host<E: AttnElem>(
    fa: &FlashAttention,
    stream: &Arc<CudaStream>,
    host: [Vec<E>; 3],
    arrays: [&dyn HasDim; 3],
    params: &ForwardParams,
    alibi: Option<HostAlibi<'_>>,
) -> Result<(Vec<E>, Vec<f32>)> {
    let [qh, kh, vh] = host;
    let layout = |a: &dyn HasDim| TensorLayout::contiguous(a.shape4());
    let (qd, kd, vd) = (stream.clone_htod(&qh)?, stream.clone_htod(&kh)?, stream.clone_htod(&vh)?);
    let slopes = DeviceSlopes::upload(stream, alibi.as_ref())?;
    let ext = slopes.extras();
    let out = fa.forward_ext::<E, _, _, _>(
        stream,
        Tensor::new(&qd, layout(arrays[0])),
        Tensor::new(&kd, layout(arrays[1])),
        Tensor::new(&vd, layout(arrays[2])),
        params,
        &ext,
    )?;
    let o = stream.clone_dtoh(&out.o)?;
    let lse: Vec<f32> = match &out.stats {
        RowStats::LogSumExp(lse) => stream.clone_dtoh(lse)?,
        RowStats::Fa1 { l, m } => {
            let (l, m) = (stream.clone_dtoh(l)?, stream.clone_dtoh(m)?);
            l.into_iter().zip(m).map(|(l, m)| RowState { m, l }.lse()).collect()
        }
    };
    Ok((o, lse))
}

/// The shape of a 4-D array, whatever its element type.
trait HasDim {
    fn shape4(&self) -> [usize; 4];
}

impl<T> HasDim for ArrayView4<'_, T> {
    fn shape4(&self) -> [usize; 4] {
        let d = self.dim();
        [d.0, d.1, d.2, d.3]
    }
}

/// The CPU path of [`flash_attn_func`]: [`reference::fa2_forward_ext`] in
/// f32, blocks `params.block` (default 64 × 64), for any `params.loop_order`.
pub fn flash_attn_func_cpu<T: AttnElem>(
    q: ArrayView4<'_, T>,
    k: ArrayView4<'_, T>,
    v: ArrayView4<'_, T>,
    params: &ForwardParams,
) -> Result<(Array4<T>, Array3<f32>)> {
    flash_attn_func_cpu_ext(q, k, v, params, None)
}

/// [`flash_attn_func_cpu`] with ALiBi slopes.
pub fn flash_attn_func_cpu_ext<T: AttnElem>(
    q: ArrayView4<'_, T>,
    k: ArrayView4<'_, T>,
    v: ArrayView4<'_, T>,
    params: &ForwardParams,
    alibi: Option<HostAlibi<'_>>,
) -> Result<(Array4<T>, Array3<f32>)> {
    check_arrays(&q, &k, &v, params)?;
    let (q, k, v) = (q.mapv(|x| x.to_f32()), k.mapv(|x| x.to_f32()), v.mapv(|x| x.to_f32()));
    let (br, bc) = params.block.unwrap_or(reference::DEFAULT_BLOCK);
    let out = reference::fa2_forward_ext::<f32>(q.view(), k.view(), v.view(), params, alibi, br, bc)?;
    Ok((out.o.mapv(T::from_f32), out.lse))
}

/// Varlen attention over packed arrays (`flash_attn_varlen_func`): q
/// `(total_q, nheads, d)`, k/v `(total_k, nheads_k, d)`, host prefix sums
/// (checked completely: [`crate::varlen::check_varlen`]). Returns O
/// `(total_q, nheads, d)` and the unpadded logsumexp `(nheads, total_q)`.
/// On the GPU: the FA2 kernels (f16/bf16 on the tensor cores); without one,
/// [`reference::attention_varlen`] in f32.
#[allow(clippy::too_many_arguments)]
pub fn flash_attn_varlen_func<T: AttnElem>(
    q: ArrayView3<'_, T>,
    k: ArrayView3<'_, T>,
    v: ArrayView3<'_, T>,
    cu_seqlens_q: &[i32],
    cu_seqlens_k: &[i32],
    seqused_k: Option<&[i32]>,
    max_seqlen: (usize, usize),
    params: &ForwardParams,
    alibi: Option<HostAlibi<'_>>,
) -> Result<(Array3<T>, Array2<f32>)> {
    let (max_q, max_k) = max_seqlen;
    let (tq, h, d) = q.dim();
    let tk = k.dim().0;
    crate::varlen::check_varlen(cu_seqlens_q, cu_seqlens_k, seqused_k, tq, tk, max_q, max_k)?;
    let fa = match default_backend() {
        Backend::Gpu(fa) => fa,
        Backend::Cpu { .. } => {
            let f = |a: &ArrayView3<'_, T>| a.mapv(|x| x.to_f32());
            let out = reference::attention_varlen::<f32>(
                f(&q).view(),
                f(&k).view(),
                f(&v).view(),
                cu_seqlens_q,
                cu_seqlens_k,
                seqused_k,
                max_q,
                max_k,
                params,
                alibi,
            )?;
            return Ok((out.o.mapv(T::from_f32), out.lse));
        }
    };
    let stream = fa.context().default_stream();
    let lay = |a: &ArrayView3<'_, T>| {
        let (t, h, d) = a.dim();
        TensorLayout::varlen(t, h, d)
    };
    let (qd, kd, vd) = (stream.clone_htod(&host_vec(&q))?, stream.clone_htod(&host_vec(&k))?, stream.clone_htod(&host_vec(&v))?);
    let dv = DeviceVarlen::upload(&stream, cu_seqlens_q, cu_seqlens_k, seqused_k)?;
    let slopes = DeviceSlopes::upload(&stream, alibi.as_ref())?;
    let (ext, varlen) = (slopes.extras(), dv.varlen((max_q, max_k)));
    let out = fa.forward_varlen::<T, _, _, _>(&stream, Tensor::new(&qd, lay(&q)), Tensor::new(&kd, lay(&k)), Tensor::new(&vd, lay(&v)), &varlen, params, &ext)?;
    let o = Array3::from_shape_vec((tq, h, d), stream.clone_dtoh(&out.o)?)?;
    let lse = Array2::from_shape_vec((h, tq), stream.clone_dtoh(&out.lse)?)?;
    Ok((o, lse))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::FlashAttnError;

    #[test]
    fn cpu_path_matches_reference_and_converts_halves() {
        let shape = (1, 3, 2, 4);
        let q = Array4::from_shape_fn(shape, |(_, i, h, c)| (i as f32 * 0.3 - h as f32 * 0.2 + c as f32 * 0.1).sin());
        let k = q.mapv(|x| x * 0.5 + 0.1);
        let v = q.mapv(|x| x.cos());
        let p = ForwardParams { causal: true, ..Default::default() };
        let (o, lse) = flash_attn_func_cpu(q.view(), k.view(), v.view(), &p).unwrap();
        let r = reference::fa2_forward::<f32>(q.view(), k.view(), v.view(), true, None, 64, 64).unwrap();
        assert_eq!(o, r.o);
        assert_eq!(lse, r.lse);
        let qh = q.mapv(half::bf16::from_f32);
        let (kh, vh) = (k.mapv(half::bf16::from_f32), v.mapv(half::bf16::from_f32));
        let (oh, _) = flash_attn_func_cpu(qh.view(), kh.view(), vh.view(), &p).unwrap();
        assert_eq!(oh.dim(), shape);
    }

    #[test]
    fn cpu_path_reports_typed_errors() {
        let q = Array4::<f32>::zeros((1, 3, 2, 4));
        let k = Array4::<f32>::zeros((1, 5, 3, 4));
        let e = flash_attn_func_cpu(q.view(), k.view(), k.view(), &ForwardParams::default()).unwrap_err();
        assert!(matches!(e, FlashAttnError::InvalidArgument { argument: "nheads_k", .. }), "{e}");
    }
}
