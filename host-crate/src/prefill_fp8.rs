//! FP8 (e4m3) attention forward on Hopper (FlashAttention-3's FP8 path):
//! q, k and v as one-byte e4m3 codes (`u8`: the bit patterns of PyTorch's
//! `float8_e4m3fn`) with f32 dequantization scales, O in f16 or bf16, the
//! logsumexp in f32:
//!
//! `S = softmax_scale · (q_descale·Q₈)(k_descale·K₈)ᵀ`,
//! `O = softmax(S) · (v_descale·V₈)`,
//!
//! with the scales FA3 takes: f32 of shape `(batch, nheads_k)` (one per
//! sequence and KV head; a query head uses its KV head's), or one f32 for
//! the whole tensor, or none (1). The kernel multiplies e4m3 on the tensor
//! cores (`wgmma … k32 .e4m3`) at twice the bf16 rate and rounds the
//! probabilities to e4m3 for `P·V`, as FA3 does: its error is that of
//! attention computed in FP8, not in bf16 (`docs/fp8.md` has the figures).
//!
//! Causal, sliding windows, GQA/MQA, varlen (packed sequences), any
//! `seqlen_q ≠ seqlen_k`; head dims that are multiples of 16 up to 256 (64,
//! 128 and 256 compiled, others zero-padded to the next). No softcap or
//! ALiBi. Needs the sm_90a build on a compute-capability 9.0 device (H100,
//! H200, GH200): elsewhere [`FlashAttnError::DeviceLacks`]. Every check
//! runs before anything is enqueued.

use std::sync::Arc;

use cudarc::driver::{CudaStream, DevicePtr, DevicePtrMut};
use flash_attn_common::AttnParams;

use crate::device::FlashAttention;
use crate::types::{DType, Dims};
use crate::error::{FlashAttnError, Result};
use crate::hopper::fp8::{self, HopperFp8Kernel};
use crate::params::ForwardParams;
use crate::tensor::{AttnElem, AttnOutput, Tensor, TensorLayout, TensorMut, Varlen};
use crate::validate::{Problem, check_stats, validate, validate_varlen};
use crate::varlen_api::VarlenLaunch;

/// The dequantization scales of an FP8 call (`x = scale · e4m3(x₈)`), f32 on
/// the device: each `None` (scale 1), one value for the tensor, or
/// `(batch, nheads_k)` row-major (FA3's `q_descale`, `k_descale`,
/// `v_descale`). The scales given must have the same length.
#[derive(Clone, Copy, Default)]
pub struct Fp8Descales<'a> {
    /// Scale of q.
    pub q_descale: Option<&'a dyn DevicePtr<f32>>,
    /// Scale of k.
    pub k_descale: Option<&'a dyn DevicePtr<f32>>,
    /// Scale of v.
    pub v_descale: Option<&'a dyn DevicePtr<f32>>,
}

impl std::fmt::Debug for Fp8Descales<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let len = |s: Option<&dyn DevicePtr<f32>>| s.map(|s| s.len());
        f.debug_struct("Fp8Descales").field("q_descale", &len(self.q_descale)).field("k_descale", &len(self.k_descale)).field("v_descale", &len(self.v_descale)).finish()
    }
}

fn invalid(argument: &'static str, value: String, reason: &'static str) -> FlashAttnError {
    FlashAttnError::InvalidArgument { argument, value, reason }
}

/// What an FP8 call needs beyond the 16-bit call's validation (pure: no
/// GPU): the output type, the head dim, no softcap, the scales' common
/// length (returns their `(batch, head)` strides), byte strides of q, k, v
/// in multiples of 16 and o's in multiples of 8 elements.
pub fn check_fp8_problem(dtype: DType, problem: &Problem, layouts: [&TensorLayout; 4], scale_lens: [Option<usize>; 3]) -> Result<(&'static HopperFp8Kernel, (u32, u32))> {
    if dtype == DType::F32 {
        return Err(FlashAttnError::Unsupported { argument: "o", dtype: "f32", what: "FP8 attention (O in f16 or bf16)" });
    }
    let d = problem.dims.headdim;
    let kernel = HopperFp8Kernel::find(dtype == DType::BF16, d).ok_or_else(|| invalid("q", format!("headdim {d}"), "FP8 attention takes head dims that are multiples of 16 up to 256"))?;
    if problem.opts.softcap > 0.0 {
        return Err(FlashAttnError::Unsupported { argument: "params.softcap", dtype: "e4m3", what: "softcap in FP8 attention" });
    }
    for (name, l) in [("q", layouts[0]), ("k", layouts[1]), ("v", layouts[2])] {
        if let Some(s) = l.strides.iter().zip(&l.shape).find(|&(s, &n)| n > 1 && !s.is_multiple_of(16)).map(|(s, _)| s) {
            return Err(invalid(name, format!("stride {s} in strides {:?}", l.strides), "FP8 inputs are copied by TMA: strides must be multiples of 16 bytes"));
        }
    }
    let o = layouts[3];
    if let Some(s) = o.strides.iter().zip(&o.shape).find(|&(s, &n)| n > 1 && !s.is_multiple_of(8)).map(|(s, _)| s) {
        return Err(invalid("o", format!("stride {s} in strides {:?}", o.strides), "o's strides must be multiples of 8 elements"));
    }
    let Dims { batch, nheads_k, .. } = problem.dims;
    let given: Vec<(&'static str, usize)> = ["q_descale", "k_descale", "v_descale"].into_iter().zip(scale_lens).filter_map(|(n, l)| l.map(|l| (n, l))).collect();
    let strides = match given.first() {
        None => (0, 0),
        Some(&(_, len)) => {
            if let Some(&(name, l)) = given.iter().find(|&&(_, l)| l != len) {
                return Err(invalid(name, format!("length {l}"), "the descale factors given must have the same length"));
            }
            if len == 1 {
                (0, 0)
            } else if len == batch * nheads_k {
                (nheads_k as u32, 1)
            } else {
                return Err(invalid(given[0].0, format!("length {len} (batch {batch}, nheads_k {nheads_k})"), "a descale factor holds one f32 (per tensor) or (batch, nheads_k) f32"));
            }
        }
    };
    Ok((kernel, strides))
}

impl FlashAttention {
    /// Refuses FP8 attention on a device or build without the sm_90a
    /// kernels, naming the device.
    fn check_fp8_prefill_device(&self) -> Result<()> {
        let (major, minor) = self.compute_capability();
        if self.has_hopper_kernels() && (major, minor) == (9, 0) && self.has_kernel(fp8::HOPPER_FP8_KERNELS[0].name) {
            return Ok(());
        }
        Err(FlashAttnError::DeviceLacks {
            name: self.device_name().to_string(),
            major,
            minor,
            what: "FP8 (e4m3) attention, which needs the FP8 tensor cores of sm_90a (H100/H200) and the sm_90a kernel build",
        })
    }

    /// FP8 attention forward into fresh outputs: O `(batch, seqlen_q,
    /// nheads, d)` in `T` (f16 or bf16) and the logsumexp `(batch, nheads,
    /// seqlen_q)` (module docs). q `(batch, seqlen_q, nheads, d)`, k and v
    /// `(batch, seqlen_k, nheads_k, d)`, e4m3 codes at any strides that are
    /// multiples of 16 bytes.
    pub fn forward_fp8<T, Q, K, V>(&self, stream: &Arc<CudaStream>, q: Tensor<'_, Q>, k: Tensor<'_, K>, v: Tensor<'_, V>, descales: &Fp8Descales<'_>, params: &ForwardParams) -> Result<AttnOutput<T>>
    where
        T: AttnElem,
        Q: DevicePtr<u8> + ?Sized,
        K: DevicePtr<u8> + ?Sized,
        V: DevicePtr<u8> + ?Sized,
    {
        let o_layout = TensorLayout::contiguous(q.layout.shape);
        let n = o_layout.num_elements().unwrap_or(0);
        let [b, sq, h, _] = q.layout.shape;
        let mut o = stream.alloc_zeros::<T>(n.max(1))?;
        let mut lse = stream.alloc_zeros::<f32>((b * h * sq).max(1))?;
        self.forward_fp8_into(stream, q, k, v, descales, TensorMut::new(&mut o, o_layout), &mut lse, params)?;
        Ok(AttnOutput { o, o_layout, lse })
    }

    /// [`FlashAttention::forward_fp8`] into caller-owned O (any strides that
    /// are multiples of 8 elements) and logsumexp (`batch · nheads ·
    /// seqlen_q` f32); only enqueues work on `stream` (capturable in a CUDA
    /// graph).
    #[allow(clippy::too_many_arguments)]
    pub fn forward_fp8_into<T, Q, K, V, O>(
        &self,
        stream: &Arc<CudaStream>,
        q: Tensor<'_, Q>,
        k: Tensor<'_, K>,
        v: Tensor<'_, V>,
        descales: &Fp8Descales<'_>,
        o: TensorMut<'_, O>,
        lse: &mut dyn DevicePtrMut<f32>,
        params: &ForwardParams,
    ) -> Result<()>
    where
        T: AttnElem,
        Q: DevicePtr<u8> + ?Sized,
        K: DevicePtr<u8> + ?Sized,
        V: DevicePtr<u8> + ?Sized,
        O: DevicePtrMut<T>,
    {
        let problem = validate((&q.layout, q.data.len()), (&k.layout, k.data.len()), (&v.layout, v.data.len()), (&o.layout, o.data.len()), params)?;
        let Dims { batch, nheads, seqlen_q, .. } = problem.dims;
        check_stats("lse", lse.len(), batch * nheads * seqlen_q)?;
        self.fp8_launch(stream, &problem, (q, k, v), descales, o, lse, params, None)
    }

    /// Varlen FP8 attention into caller-owned buffers: q/o `(total_q,
    /// nheads, d)` and k/v `(total_k, nheads_k, d)` packed as
    /// [`FlashAttention::forward_varlen_into`] takes them (layouts with batch
    /// 1), the unpadded logsumexp `(nheads, total_q)`; descale factors per
    /// (sequence, KV head) index by sequence.
    #[allow(clippy::too_many_arguments)]
    pub fn forward_fp8_varlen_into<T, Q, K, V, O>(
        &self,
        stream: &Arc<CudaStream>,
        q: Tensor<'_, Q>,
        k: Tensor<'_, K>,
        v: Tensor<'_, V>,
        descales: &Fp8Descales<'_>,
        o: TensorMut<'_, O>,
        lse: &mut dyn DevicePtrMut<f32>,
        varlen: &Varlen<'_>,
        params: &ForwardParams,
    ) -> Result<()>
    where
        T: AttnElem,
        Q: DevicePtr<u8> + ?Sized,
        K: DevicePtr<u8> + ?Sized,
        V: DevicePtr<u8> + ?Sized,
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
        check_stats("lse", lse.len(), problem.dims.nheads * q.layout.seqlen())?;
        let launch = self.varlen_launch(stream, varlen, q.layout.seqlen(), k.layout.seqlen())?;
        self.fp8_launch(stream, &problem, (q, k, v), descales, o, lse, params, Some(&launch))
    }

    #[allow(clippy::too_many_arguments)]
    fn fp8_launch<T, Q, K, V, O>(
        &self,
        stream: &Arc<CudaStream>,
        problem: &Problem,
        (q, k, v): (Tensor<'_, Q>, Tensor<'_, K>, Tensor<'_, V>),
        descales: &Fp8Descales<'_>,
        o: TensorMut<'_, O>,
        lse: &mut dyn DevicePtrMut<f32>,
        params: &ForwardParams,
        varlen: Option<&VarlenLaunch<'_>>,
    ) -> Result<()>
    where
        T: AttnElem,
        Q: DevicePtr<u8> + ?Sized,
        K: DevicePtr<u8> + ?Sized,
        V: DevicePtr<u8> + ?Sized,
        O: DevicePtrMut<T>,
    {
        let scale_lens = [descales.q_descale.map(|s| s.len()), descales.k_descale.map(|s| s.len()), descales.v_descale.map(|s| s.len())];
        let (kernel, (batch_stride, head_stride)) = check_fp8_problem(T::DTYPE, problem, [&q.layout, &k.layout, &v.layout, &o.layout], scale_lens)?;
        self.check_fp8_prefill_device()?;
        for (name, s) in [("q", q.data.stream()), ("k", k.data.stream()), ("v", v.data.stream()), ("o", o.data.stream()), ("lse", lse.stream()), ("stream", stream)] {
            self.check_stream(name, s)?;
        }
        for (name, s) in [("q_descale", descales.q_descale), ("k_descale", descales.k_descale), ("v_descale", descales.v_descale)] {
            if let Some(s) = s {
                self.check_stream(name, s.stream())?;
            }
        }
        let (qp, _gq) = q.data.device_ptr(stream);
        let (kp, _gk) = k.data.device_ptr(stream);
        let (vp, _gv) = v.data.device_ptr(stream);
        let (op, _go) = o.data.device_ptr_mut(stream);
        let (lp, _gl) = lse.device_ptr_mut(stream);
        for (name, ptr) in [("q", qp), ("k", kp), ("v", vp), ("o", op)] {
            if !ptr.is_multiple_of(16) {
                return Err(FlashAttnError::Misaligned { argument: name, requirement: "a 16-byte aligned device address", value: ptr });
            }
        }
        let qs = descales.q_descale.map(|s| s.device_ptr(stream));
        let ks = descales.k_descale.map(|s| s.device_ptr(stream));
        let vs = descales.v_descale.map(|s| s.device_ptr(stream));
        let d = problem.dims;
        let st = |s: [usize; 3]| s.map(|x| x as u64);
        let mut p = AttnParams {
            q_ptr: qp,
            k_ptr: kp,
            v_ptr: vp,
            o_ptr: op,
            lse_ptr: lp,
            q_stride: st(q.layout.strides),
            k_stride: st(k.layout.strides),
            v_stride: st(v.layout.strides),
            o_stride: st(o.layout.strides),
            batch: d.batch as u32,
            nheads: d.nheads as u32,
            nheads_k: d.nheads_k as u32,
            seqlen_q: d.seqlen_q as u32,
            seqlen_k: d.seqlen_k as u32,
            headdim: d.headdim as u32,
            causal: params.causal as u32,
            q_descale_ptr: qs.as_ref().map_or(0, |s| s.0),
            k_descale_ptr: ks.as_ref().map_or(0, |s| s.0),
            v_descale_ptr: vs.as_ref().map_or(0, |s| s.0),
            descale_batch_stride: batch_stride,
            descale_head_stride: head_stride,
            ..problem.opts.kernel_params()
        };
        if let Some(launch) = varlen {
            launch.fill(&mut p);
        }
        // SAFETY: validated above: layouts within the buffers (validate),
        // e4m3 strides multiples of 16 bytes and o's of 8 elements, 16-byte
        // aligned pointers, head dim a multiple of 16 ≤ the kernel's, the
        // scales' lengths match the strides; the sm_90a build on a 9.0 device.
        unsafe { fp8::launch(self, stream, kernel, &p) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn problem(b: usize, sq: usize, sk: usize, h: usize, hk: usize, d: usize, params: &ForwardParams) -> (Result<Problem>, [TensorLayout; 4]) {
        let q = TensorLayout::contiguous([b, sq, h, d]);
        let k = TensorLayout::contiguous([b, sk, hk, d]);
        let n = |l: &TensorLayout| l.num_elements().unwrap();
        (validate((&q, n(&q)), (&k, n(&k)), (&k, n(&k)), (&q, n(&q)), params), [q, k, k, q])
    }

    #[test]
    fn fp8_calls_check_dtype_head_dim_softcap_strides_and_scales() {
        let p = ForwardParams::default();
        let (pr, l) = problem(2, 100, 300, 8, 2, 128, &p);
        let pr = pr.unwrap();
        let ls = [&l[0], &l[1], &l[2], &l[3]];
        let (k, strides) = check_fp8_problem(DType::BF16, &pr, ls, [None; 3]).unwrap();
        assert_eq!((k.d, k.bf16, strides), (128, true, (0, 0)));
        assert_eq!(check_fp8_problem(DType::F16, &pr, ls, [Some(1), None, Some(1)]).unwrap().1, (0, 0));
        assert_eq!(check_fp8_problem(DType::F16, &pr, ls, [Some(4), Some(4), Some(4)]).unwrap().1, (2, 1));
        assert!(matches!(check_fp8_problem(DType::F16, &pr, ls, [Some(4), Some(1), None]), Err(FlashAttnError::InvalidArgument { argument: "k_descale", .. })));
        assert!(matches!(check_fp8_problem(DType::F16, &pr, ls, [Some(16), None, None]), Err(FlashAttnError::InvalidArgument { argument: "q_descale", .. })));
        assert!(matches!(check_fp8_problem(DType::F32, &pr, ls, [None; 3]), Err(FlashAttnError::Unsupported { .. })));
        // Head dims: multiples of 16 up to 256.
        let (pr40, l40) = problem(1, 8, 8, 1, 1, 40, &p);
        assert!(matches!(check_fp8_problem(DType::BF16, &pr40.unwrap(), [&l40[0], &l40[1], &l40[2], &l40[3]], [None; 3]), Err(FlashAttnError::InvalidArgument { argument: "q", .. })));
        let (pr48, l48) = problem(1, 8, 8, 1, 1, 48, &p);
        assert_eq!(check_fp8_problem(DType::BF16, &pr48.unwrap(), [&l48[0], &l48[1], &l48[2], &l48[3]], [None; 3]).unwrap().0.d, 64);
        // Softcap is refused.
        let sc = ForwardParams { softcap: Some(30.0), ..Default::default() };
        let (prs, _) = problem(2, 100, 300, 8, 2, 128, &sc);
        assert!(matches!(check_fp8_problem(DType::BF16, &prs.unwrap(), ls, [None; 3]), Err(FlashAttnError::Unsupported { argument: "params.softcap", .. })));
        // Strides: 16-byte multiples for the codes, 8 elements for o.
        let odd = TensorLayout { shape: [2, 100, 8, 128], strides: [100 * 8 * 136, 8 * 136, 136] };
        assert!(matches!(check_fp8_problem(DType::BF16, &pr, [&odd, &l[1], &l[2], &l[3]], [None; 3]), Err(FlashAttnError::InvalidArgument { argument: "q", .. })));
        let o_odd = TensorLayout { shape: [2, 100, 8, 128], strides: [100 * 8 * 132, 8 * 132, 132] };
        assert!(matches!(check_fp8_problem(DType::BF16, &pr, [&l[0], &l[1], &l[2], &o_odd], [None; 3]), Err(FlashAttnError::InvalidArgument { argument: "o", .. })));
    }
}
