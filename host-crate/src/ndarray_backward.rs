//! The backward pass of the `ndarray` API: [`flash_attn_backward`] and
//! [`flash_attn_varlen_backward`] (their backends are in
//! `flash_attn_backward`'s docs).

use std::sync::Arc;

use cudarc::driver::CudaStream;
use flash_attn_common::LOG2_E;
use ndarray::{ArrayView2, ArrayView3, ArrayView4, Dimension};

use crate::tensor::{AttnElem, RowStats, Tensor, TensorLayout};
use crate::validate::Problem;
use crate::backward::{BackwardParams, BackwardShapes, validate_backward, validate_backward_varlen};
use crate::device::FlashAttention;
use crate::types::DType;
use crate::error::{FlashAttnError, Result};
use crate::ndarray_api::{Backend, DeviceSlopes, DeviceVarlen, default_backend, host_vec};
use crate::params::LoopOrder;
use crate::reference::{self, Grads, HostAlibi, VarlenGrads};

/// The varlen description of an ndarray call: host prefix sums, optional
/// `seqused_k`, `(max_seqlen_q, max_seqlen_k)`.
#[derive(Clone, Copy, Debug)]
pub struct HostVarlen<'a> {
    /// `(batch + 1)` prefix sums of the query lengths, from 0.
    pub cu_seqlens_q: &'a [i32],
    /// `(batch + 1)` prefix sums of the key lengths, from 0.
    pub cu_seqlens_k: &'a [i32],
    /// Optional `(batch)`: keys actually used per sequence (≤ its segment).
    pub seqused_k: Option<&'a [i32]>,
    /// `(max_seqlen_q, max_seqlen_k)`: at least every segment's length.
    pub max_seqlen: (usize, usize),
}

/// The shape of an array as the device API's 4-axis layout (3-axis
/// arrays: packed varlen, batch axis 1).
fn layout<T, D: Dimension>(a: &ndarray::ArrayView<'_, T, D>) -> TensorLayout {
    match *a.shape() {
        [b, s, h, d] => TensorLayout::contiguous([b, s, h, d]),
        [t, h, d] => TensorLayout::varlen(t, h, d),
        _ => unreachable!("the ndarray API takes 3- and 4-axis arrays only"),
    }
}

/// Validates a call (dense or varlen) as the device API does, gradients
/// contiguous like their inputs, and the LSE's shape axis by axis.
fn check<T, D: Dimension, L: Dimension>(
    arrays: [&ndarray::ArrayView<'_, T, D>; 5],
    lse: &ndarray::ArrayView<'_, f32, L>,
    varlen: Option<&HostVarlen<'_>>,
    params: &BackwardParams,
) -> Result<Problem> {
    let [q, k, v, out, dout] = arrays.map(layout);
    let n = |l: &TensorLayout| l.required_len().unwrap_or(usize::MAX);
    let shapes = BackwardShapes { q: (&q, n(&q)), k: (&k, n(&k)), v: (&v, n(&v)), out: (&out, n(&out)), dout: (&dout, n(&dout)), dq: (&q, n(&q)), dk: (&k, n(&k)), dv: (&v, n(&v)) };
    let (problem, want, axes): (_, Vec<usize>, &[&'static str]) = match varlen {
        None => {
            let p = validate_backward(&shapes, &params.forward)?;
            let want = vec![p.dims.batch, p.dims.nheads, p.dims.seqlen_q];
            (p, want, &["batch", "nheads", "seqlen_q"])
        }
        Some(vl) => {
            let lens = (vl.cu_seqlens_q.len(), vl.cu_seqlens_k.len(), vl.seqused_k.map(<[i32]>::len));
            let p = validate_backward_varlen(&shapes, lens, vl.max_seqlen, &params.forward)?;
            crate::varlen::check_varlen(vl.cu_seqlens_q, vl.cu_seqlens_k, vl.seqused_k, q.seqlen(), k.seqlen(), vl.max_seqlen.0, vl.max_seqlen.1)?;
            let want = vec![p.dims.nheads, q.seqlen()];
            (p, want, &["nheads", "total_q"])
        }
    };
    let rule = "softmax_lse of the forward call with these q, k, v";
    if lse.ndim() != want.len() {
        return Err(FlashAttnError::InvalidArgument { argument: "softmax_lse", value: format!("shape {:?}", lse.shape()), reason: rule });
    }
    for ((&actual, expected), &axis) in lse.shape().iter().zip(want).zip(axes) {
        if actual != expected {
            return Err(FlashAttnError::ShapeMismatch { argument: "softmax_lse", axis, actual, expected, rule });
        }
    }
    Ok(problem)
}

/// Gradients of [`crate::flash_attn_func`]: `out` and `softmax_lse`
/// `(batch, nheads, seqlen_q)` are what it returned, `dout` = ∂loss/∂out.
/// dq, dk, dv have the shapes of q, k, v. GPU when there is one, else the
/// CPU reference (below).
///
/// ```
/// use flash_attn::{BackwardParams, ForwardParams, flash_attn_backward, flash_attn_func};
/// use ndarray::Array4;
///
/// let x = |seed: f32| Array4::from_shape_fn((1, 32, 2, 16), |(_, i, h, d)| ((3 * i + 5 * h + 7 * d) as f32 * seed).sin());
/// let (q, k, v) = (x(0.01), x(0.02), x(0.03));
/// let params = ForwardParams { causal: true, ..Default::default() };
/// let (out, lse) = flash_attn_func(q.view(), k.view(), v.view(), &params)?;
/// let dout = Array4::<f32>::ones(out.dim()); // ∂loss/∂out of loss = Σ out
/// let bp = BackwardParams { forward: params, ..Default::default() };
/// let g = flash_attn_backward(q.view(), k.view(), v.view(), out.view(), dout.view(), lse.view(), &bp)?;
/// assert_eq!((g.dq.dim(), g.dk.dim(), g.dv.dim()), (q.dim(), k.dim(), v.dim()));
/// // Each query row's weights sum to 1, so Σ out moves with v one for one:
/// // ∂(Σ out)/∂v sums to the number of (query row, head, column) triples.
/// assert!((g.dv.sum() - (32 * 2 * 16) as f32).abs() < 1e-2);
/// # Ok::<(), flash_attn::FlashAttnError>(())
/// ```
///
/// # Backends
/// FlashAttention-2's names, arguments in the device API's order.
///
/// * On a GPU (the backend of [`default_backend`]): the arrays are copied to
///   the device and run by [`FlashAttention::backward`] /
///   [`FlashAttention::backward_varlen`]; the call blocks until the
///   gradients are on the host. f16/bf16 run as they are on the tensor-core
///   backward (FA2 order, head dims it takes); every other problem (f32,
///   FA1 order, other head dims) runs the f32 kernels, 16-bit inputs
///   converted to f32 and the gradients rounded back. The FA1 order takes
///   the logsumexp as its row statistics (`m = lse·log2 e`, `l = 1`: the
///   same `P`).
/// * Without a GPU: the CPU reference in f32 ([`reference::fa2_backward`],
///   [`reference::varlen_attention_backward`]), whatever the loop order.
///
/// Both paths validate with the device API's rules and return the same
/// typed errors: `dout`/`out` not shaped like q, a `softmax_lse` of another
/// shape (`(batch, nheads, seqlen_q)`; varlen `(nheads, total_q)`), bad
/// prefix sums, the Standard loop order.
///
pub fn flash_attn_backward<T: AttnElem>(
    q: ArrayView4<'_, T>,
    k: ArrayView4<'_, T>,
    v: ArrayView4<'_, T>,
    out: ArrayView4<'_, T>,
    dout: ArrayView4<'_, T>,
    softmax_lse: ArrayView3<'_, f32>,
    params: &BackwardParams,
) -> Result<Grads<T>> {
    flash_attn_backward_ext(q, k, v, out, dout, softmax_lse, params, None)
}

/// [`flash_attn_backward`] with the forward's ALiBi slopes.
#[allow(clippy::too_many_arguments)]
pub fn flash_attn_backward_ext<T: AttnElem>(
    q: ArrayView4<'_, T>,
    k: ArrayView4<'_, T>,
    v: ArrayView4<'_, T>,
    out: ArrayView4<'_, T>,
    dout: ArrayView4<'_, T>,
    softmax_lse: ArrayView3<'_, f32>,
    params: &BackwardParams,
    alibi: Option<HostAlibi<'_>>,
) -> Result<Grads<T>> {
    match default_backend() {
        Backend::Gpu(fa) => {
            let stream = fa.context().default_stream();
            flash_attn_backward_on_ext(&fa, &stream, q, k, v, out, dout, softmax_lse, params, alibi)
        }
        Backend::Cpu { .. } => flash_attn_backward_cpu_ext(q, k, v, out, dout, softmax_lse, params, alibi),
    }
}

/// [`flash_attn_backward_ext`] on an explicit [`FlashAttention`] and
/// stream (synchronizes `stream` to copy the gradients back).
#[allow(clippy::too_many_arguments)]
pub fn flash_attn_backward_on_ext<T: AttnElem>(
    fa: &FlashAttention,
    stream: &Arc<CudaStream>,
    q: ArrayView4<'_, T>,
    k: ArrayView4<'_, T>,
    v: ArrayView4<'_, T>,
    out: ArrayView4<'_, T>,
    dout: ArrayView4<'_, T>,
    softmax_lse: ArrayView3<'_, f32>,
    params: &BackwardParams,
    alibi: Option<HostAlibi<'_>>,
) -> Result<Grads<T>> {
    // One lifetime for the five views (ndarray's views are invariant in it).
    let arrays = [q.view(), k.view(), v.view(), out.view(), dout.view()];
    let problem = check(arrays.each_ref(), &softmax_lse, None, params)?;
    if let Some(a) = &alibi {
        a.check(problem.dims.batch, problem.dims.nheads)?;
    }
    let [dq, dk, dv] = on_device(fa, stream, arrays.each_ref(), host_vec(&softmax_lse), None, params, alibi)?;
    Ok(Grads { dq: shaped(&q, dq)?, dk: shaped(&k, dk)?, dv: shaped(&v, dv)? })
}

/// The CPU path of [`flash_attn_backward_ext`]: [`reference::fa2_backward`]
/// in f32 with blocks `params.forward.block` (default 64 × 64), whatever
/// the loop order; errors as on the GPU.
#[allow(clippy::too_many_arguments)]
pub fn flash_attn_backward_cpu_ext<T: AttnElem>(
    q: ArrayView4<'_, T>,
    k: ArrayView4<'_, T>,
    v: ArrayView4<'_, T>,
    out: ArrayView4<'_, T>,
    dout: ArrayView4<'_, T>,
    softmax_lse: ArrayView3<'_, f32>,
    params: &BackwardParams,
    alibi: Option<HostAlibi<'_>>,
) -> Result<Grads<T>> {
    check([q.view(), k.view(), v.view(), out.view(), dout.view()].each_ref(), &softmax_lse, None, params)?;
    let f = |a: &ArrayView4<'_, T>| a.mapv(|x| x.to_f32());
    let (br, bc) = params.forward.block.unwrap_or(reference::DEFAULT_BLOCK);
    let fwd = &params.forward;
    let g = reference::fa2_backward::<f32>(f(&q).view(), f(&k).view(), f(&v).view(), f(&out).view(), f(&dout).view(), softmax_lse, fwd, alibi, br, bc)?;
    Ok(Grads { dq: g.dq.mapv(T::from_f32), dk: g.dk.mapv(T::from_f32), dv: g.dv.mapv(T::from_f32) })
}

/// Gradients of [`crate::flash_attn_varlen_func`] over packed arrays: q,
/// `out`, `dout` `(total_q, nheads, d)`, k, v `(total_k, nheads_k, d)`,
/// `softmax_lse` `(nheads, total_q)` as the forward returned it, host prefix
/// sums checked completely ([`crate::varlen::check_varlen`]). FA2 loop
/// order. GPU when there is one ([`FlashAttention::backward_varlen`]), else
/// [`reference::varlen_attention_backward`] in f32. Rows no sequence covers
/// get zero gradients.
#[allow(clippy::too_many_arguments)]
pub fn flash_attn_varlen_backward<T: AttnElem>(
    q: ArrayView3<'_, T>,
    k: ArrayView3<'_, T>,
    v: ArrayView3<'_, T>,
    out: ArrayView3<'_, T>,
    dout: ArrayView3<'_, T>,
    softmax_lse: ArrayView2<'_, f32>,
    varlen: &HostVarlen<'_>,
    params: &BackwardParams,
    alibi: Option<HostAlibi<'_>>,
) -> Result<VarlenGrads<T>> {
    let arrays = [q.view(), k.view(), v.view(), out.view(), dout.view()];
    let problem = check(arrays.each_ref(), &softmax_lse, Some(varlen), params)?;
    if let Some(a) = &alibi {
        a.check(problem.dims.batch, problem.dims.nheads)?;
    }
    let fa = match default_backend() {
        Backend::Gpu(fa) => fa,
        Backend::Cpu { .. } => {
            let f = |a: &ArrayView3<'_, T>| a.mapv(|x| x.to_f32());
            let (max_q, max_k) = varlen.max_seqlen;
            let g = reference::varlen_attention_backward::<f32>(
                f(&q).view(),
                f(&k).view(),
                f(&v).view(),
                f(&dout).view(),
                varlen.cu_seqlens_q,
                varlen.cu_seqlens_k,
                varlen.seqused_k,
                max_q,
                max_k,
                &params.forward,
                alibi,
            )?;
            return Ok(VarlenGrads { dq: g.dq.mapv(T::from_f32), dk: g.dk.mapv(T::from_f32), dv: g.dv.mapv(T::from_f32) });
        }
    };
    let stream = fa.context().default_stream();
    let [dq, dk, dv] = on_device(&fa, &stream, arrays.each_ref(), host_vec(&softmax_lse), Some(varlen), params, alibi)?;
    Ok(VarlenGrads { dq: shaped(&q, dq)?, dk: shaped(&k, dk)?, dv: shaped(&v, dv)? })
}

/// A gradient's host elements in the shape of its input.
fn shaped<T, D: Dimension>(like: &ndarray::ArrayView<'_, T, D>, g: Vec<T>) -> Result<ndarray::Array<T, D>> {
    Ok(ndarray::Array::from_shape_vec(like.raw_dim(), g)?)
}

/// Runs a validated call on the device: in `T` on the tensor cores when the
/// tensor-core or the Hopper backward takes it, else in f32 (gradients
/// rounded to `T`).
fn on_device<T: AttnElem, D: Dimension>(
    fa: &FlashAttention,
    stream: &Arc<CudaStream>,
    arrays: [&ndarray::ArrayView<'_, T, D>; 5],
    lse: Vec<f32>,
    varlen: Option<&HostVarlen<'_>>,
    params: &BackwardParams,
    alibi: Option<HostAlibi<'_>>,
) -> Result<[Vec<T>; 3]> {
    let d = arrays[0].shape().last().copied().unwrap_or(0);
    let tc = T::DTYPE != DType::F32
        && params.forward.loop_order == LoopOrder::Fa2
        && (crate::backward::tc::tc_backward_supported(T::DTYPE, d, fa.compute_capability())
            || (alibi.is_none() && crate::backward::hopper::hopper_backward_available(fa, T::DTYPE, d, params)));
    let layouts = arrays.map(layout);
    if tc || T::DTYPE == DType::F32 {
        backward_host::<T>(fa, stream, arrays.map(host_vec), layouts, lse, varlen, params, alibi)
    } else {
        let to_f32 = |a: &ndarray::ArrayView<'_, T, D>| a.iter().map(|x| x.to_f32()).collect::<Vec<f32>>();
        let g = backward_host::<f32>(fa, stream, arrays.map(to_f32), layouts, lse, varlen, params, alibi)?;
        Ok(g.map(|g| g.into_iter().map(T::from_f32).collect()))
    }
}

/// Uploads q, k, v, out, dout (contiguous, `layouts`) and the logsumexp,
/// runs the backward in `E`, copies dq, dk, dv back.
#[allow(clippy::too_many_arguments)]
fn backward_host<E: AttnElem>(
    fa: &FlashAttention,
    stream: &Arc<CudaStream>,
    host: [Vec<E>; 5],
    layouts: [TensorLayout; 5],
    lse: Vec<f32>,
    varlen: Option<&HostVarlen<'_>>,
    params: &BackwardParams,
    alibi: Option<HostAlibi<'_>>,
) -> Result<[Vec<E>; 3]> {
    let [q, k, v, out, dout] = &host;
    let (q, k, v, out, dout) = (stream.clone_htod(q)?, stream.clone_htod(k)?, stream.clone_htod(v)?, stream.clone_htod(out)?, stream.clone_htod(dout)?);
    let stats = if params.forward.loop_order == LoopOrder::Fa1 {
        // The FA1 kernels' statistics with the same P: m = lse·log2 e,
        // l = 1 (l = 0 for a row that sees no key, as the FA1 forward).
        let l: Vec<f32> = lse.iter().map(|&x| if x == f32::NEG_INFINITY { 0.0 } else { 1.0 }).collect();
        let m: Vec<f32> = lse.iter().map(|&x| x * LOG2_E).collect();
        RowStats::Fa1 { l: stream.clone_htod(&l)?, m: stream.clone_htod(&m)? }
    } else {
        RowStats::LogSumExp(stream.clone_htod(&lse)?)
    };
    let slopes = DeviceSlopes::upload(stream, alibi.as_ref())?;
    let ext = slopes.extras();
    let t = |data, i: usize| Tensor::new(data, layouts[i]);
    let g = match varlen {
        None => fa.backward::<E, _, _, _, _, _>(stream, t(&q, 0), t(&k, 1), t(&v, 2), t(&out, 3), t(&dout, 4), &stats, params, &ext)?,
        Some(vl) => {
            let dv = DeviceVarlen::upload(stream, vl.cu_seqlens_q, vl.cu_seqlens_k, vl.seqused_k)?;
            let varlen = dv.varlen(vl.max_seqlen);
            fa.backward_varlen::<E, _, _, _, _, _>(stream, t(&q, 0), t(&k, 1), t(&v, 2), t(&out, 3), t(&dout, 4), &stats, &varlen, params, &ext)?
        }
    };
    Ok([stream.clone_dtoh(&g.dq)?, stream.clone_dtoh(&g.dk)?, stream.clone_dtoh(&g.dv)?])
}
