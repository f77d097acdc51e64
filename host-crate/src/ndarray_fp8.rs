//! The `ndarray` API of FP8 (e4m3) attention: [`flash_attn_fp8_func`],
//! [`crate::flash_attn_func`] with q, k and v as e4m3 codes (`u8`) and
//! FlashAttention-3's descale factors.
//!
//! On an H100/H200 (the sm_90a build):
//! [`FlashAttention::forward_fp8`](crate::FlashAttention::forward_fp8), O in
//! `T` (f16/bf16). Otherwise the CPU reference
//! ([`crate::reference::fp8::attention_fp8`]): f64 attention over the
//! dequantized inputs, O rounded to `T` — exact where the GPU rounds the
//! probabilities to e4m3.

use ndarray::{Array3, Array4, ArrayView4};

use crate::device::FlashAttention;
use crate::types::DType;
use crate::error::Result;
use crate::ndarray_api::{Backend, default_backend, host_vec};
use crate::params::ForwardParams;
use crate::prefill_fp8::Fp8Descales;
use crate::reference::fp8::attention_fp8;
use crate::tensor::{AttnElem, Tensor, TensorLayout};

/// FP8 attention on host arrays: q `(batch, seqlen_q, nheads, d)`, k and v
/// `(batch, seqlen_k, nheads_k, d)` as e4m3 codes (the bit patterns of
/// `float8_e4m3fn`), `descales` = `[q_descale, k_descale, v_descale]`,
/// each `None` (1), one f32, or `(batch, nheads_k)` row-major (`x = descale
/// · e4m3(code)`). Returns O `(batch, seqlen_q, nheads, d)` in `T` and the
/// logsumexp `(batch, nheads, seqlen_q)`. Causal and windows as
/// [`crate::flash_attn_func`]; head dims multiples of 16 up to 256 on the
/// GPU.
///
/// ```
/// use flash_attn::reference::fp8::e4m3_from_f32;
/// use flash_attn::{ForwardParams, flash_attn_fp8_func};
/// use ndarray::Array4;
///
/// let q = Array4::from_shape_fn((1, 64, 4, 64), |(_, i, h, e)| e4m3_from_f32(((i + h + e) % 5) as f32 - 2.0));
/// let k = Array4::from_shape_fn((1, 64, 2, 64), |(_, j, h, e)| e4m3_from_f32(((j * 3 + h + e) % 7) as f32 - 3.0));
/// let scale = [0.05f32];
/// let params = ForwardParams { causal: true, ..Default::default() };
/// let (o, lse) = flash_attn_fp8_func::<half::bf16>(q.view(), k.view(), k.view(), [Some(&scale[..]), Some(&scale[..]), None], &params)?;
/// assert_eq!(o.dim(), (1, 64, 4, 64));
/// assert!(lse.iter().all(|x| x.is_finite()));
/// # Ok::<(), flash_attn::FlashAttnError>(())
/// ```
pub fn flash_attn_fp8_func<T: AttnElem>(
    q: ArrayView4<'_, u8>,
    k: ArrayView4<'_, u8>,
    v: ArrayView4<'_, u8>,
    descales: [Option<&[f32]>; 3],
    params: &ForwardParams,
) -> Result<(Array4<T>, Array3<f32>)> {
    match default_backend() {
        Backend::Gpu(fa) if T::DTYPE != DType::F32 && fa.has_hopper_kernels() && fa.compute_capability() == (9, 0) => gpu(&fa, q, k, v, descales, params),
        _ => {
            let r = attention_fp8(q, k, v, descales, params)?;
            Ok((r.o.mapv(|x| T::from_f32(x as f32)), r.lse.mapv(|x| x as f32)))
        }
    }
}

fn gpu<T: AttnElem>(fa: &FlashAttention, q: ArrayView4<'_, u8>, k: ArrayView4<'_, u8>, v: ArrayView4<'_, u8>, descales: [Option<&[f32]>; 3], params: &ForwardParams) -> Result<(Array4<T>, Array3<f32>)> {
    let stream = fa.context().default_stream();
    let (b, sq, h, d) = q.dim();
    let (qd, kd, vd) = (stream.clone_htod(&host_vec(&q))?, stream.clone_htod(&host_vec(&k))?, stream.clone_htod(&host_vec(&v))?);
    let [qs, ks, vs] = descales.map(|s| s.map(|s| stream.clone_htod(s)).transpose());
    let (qs, ks, vs) = (qs?, ks?, vs?);
    let ds = Fp8Descales {
        q_descale: qs.as_ref().map(|s| s as _),
        k_descale: ks.as_ref().map(|s| s as _),
        v_descale: vs.as_ref().map(|s| s as _),
    };
    let (lq, lk) = (TensorLayout::contiguous([b, sq, h, d]), TensorLayout::contiguous(k.dim().into()));
    let out = fa.forward_fp8::<T, _, _, _>(&stream, Tensor::new(&qd, lq), Tensor::new(&kd, lk), Tensor::new(&vd, lk), &ds, params)?;
    let o = Array4::from_shape_vec((b, sq, h, d), stream.clone_dtoh(&out.o)?).map_err(|e| crate::error::FlashAttnError::InvalidArgument { argument: "o", value: e.to_string(), reason: "internal shape" })?;
    let mut l = stream.clone_dtoh(&out.lse)?;
    l.truncate(b * h * sq);
    let lse = Array3::from_shape_vec((b, h, sq), l).map_err(|e| crate::error::FlashAttnError::InvalidArgument { argument: "lse", value: e.to_string(), reason: "internal shape" })?;
    Ok((o, lse))
}
