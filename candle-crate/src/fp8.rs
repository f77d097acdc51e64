//! FP8 (e4m3) attention on candle tensors: q, k and v of dtype
//! [`DType::F8E4M3`] (candle's `float8::F8E4M3`, the bit patterns of
//! PyTorch's `float8_e4m3fn`) with FlashAttention-3's f32 descale factors,
//! O in bf16 or f16 (the caller's choice):
//!
//! `S = softmax_scale · (q_descale·Q₈)(k_descale·K₈)ᵀ`,
//! `O = softmax(S) · (v_descale·V₈)`.
//!
//! * CUDA (feature `cuda`): the core's `forward_fp8_into` on candle's stream
//!   over candle's buffers as they are (offsets, strides), O and the
//!   logsumexp allocated on that stream; needs an H100/H200 and the sm_90a
//!   build (elsewhere the core's `DeviceLacks` error, as a candle error).
//! * CPU: the core's `reference::fp8::attention_fp8`, f64 attention over the
//!   dequantized inputs, O rounded to the output dtype (the GPU also rounds
//!   the probabilities to e4m3 for `P·V`, as FlashAttention-3 does).
//!
//! Forward only (no backward op is recorded, as FlashAttention-3's FP8
//! path); no softcap or ALiBi. Head dims multiples of 16 up to 256 on both
//! paths. The FP8 KV cache of decode: [`crate::flash_attn_with_kvcache_fp8`].

use candle_core::backend::BackendStorage;
use candle_core::op::BackpropOp;
use candle_core::{CpuStorage, DType, Layout, Result, Storage, Tensor};
use flash_attn::reference::fp8::attention_fp8;
use flash_attn::TensorLayout;
use half::{bf16, f16};
use ndarray::{Array4, ArrayView4, ShapeBuilder};

use crate::check::{self, Checked, core_err, err};
use crate::storage::Held;

/// The output dtypes of the FP8 calls.
pub(crate) const OUT_DTYPES: &[DType] = &[DType::BF16, DType::F16];

/// FlashAttention-3's descale factors of an FP8 call (`x = descale ·
/// e4m3(x₈)`): each `None` (1) or an f32 tensor on q's device, contiguous,
/// holding one value (shape `()` or `(1)`) for the whole tensor or one per
/// sequence and KV head, `(batch, nheads_k)` (a query head uses its KV
/// head's). The ones given must have the same shape.
#[derive(Clone, Copy, Debug, Default)]
pub struct Fp8Descales<'a> {
    pub q_descale: Option<&'a Tensor>,
    pub k_descale: Option<&'a Tensor>,
    pub v_descale: Option<&'a Tensor>,
}

impl<'a> Fp8Descales<'a> {
    /// The three scales with their argument names.
    pub(crate) fn named(&self) -> [(&'static str, Option<&'a Tensor>); 3] {
        [("q_descale", self.q_descale), ("k_descale", self.k_descale), ("v_descale", self.v_descale)]
    }
}

/// FP8 attention forward, options as [`crate::FlashAttn`]'s (no ALiBi, no
/// softcap) plus the descale factors and the output dtype.
#[derive(Clone, Debug)]
pub struct FlashAttnFp8 {
    pub softmax_scale: f32,
    /// Window (bottom-right aligned); `(None, Some(0))` is causal.
    pub window_size_left: Option<usize>,
    pub window_size_right: Option<usize>,
    /// f32: `()`/`(1)` or `(batch, nheads_k)`; see [`Fp8Descales`].
    pub q_descale: Option<Tensor>,
    pub k_descale: Option<Tensor>,
    pub v_descale: Option<Tensor>,
    /// O's dtype: `DType::BF16` or `DType::F16`.
    pub out_dtype: DType,
}

/// The checked descale factors: the tensors given and the common number of
/// values (1 or `batch · nheads_k`).
pub(crate) struct Descales<'a> {
    pub given: [(&'static str, Option<&'a Tensor>); 3],
}

/// Each descale factor: f32, contiguous, `()`/`(1)` or `(batch, nheads_k)`,
/// all given of one length.
pub(crate) fn check_descales<'a>(d: &Fp8Descales<'a>, batch: usize, nheads_k: usize) -> Result<Descales<'a>> {
    let mut len: Option<(&str, usize)> = None;
    for (argument, t) in d.named() {
        let Some(t) = t else { continue };
        if t.dtype() != DType::F32 {
            return Err(err(format_args!("dtype mismatch: `{argument}` is {:?}, expected F32", t.dtype())));
        }
        let n = match t.dims() {
            [] | [1] => 1,
            &[b, h] if (b, h) == (batch, nheads_k) => b * h,
            dims => {
                return Err(err(format_args!(
                    "shape mismatch: `{argument}` is {dims:?}, expected () or (1) (one scale) or ({batch}, {nheads_k}) (batch, nheads_k)"
                )));
            }
        };
        if !t.is_contiguous() {
            return Err(err(format_args!("`{argument}` must be contiguous, got strides {:?}", t.stride())));
        }
        match len {
            Some((first, l)) if l != n => {
                return Err(err(format_args!(
                    "shape mismatch: `{argument}` holds {n} values but `{first}` {l}: the descale factors given must have the same shape"
                )));
            }
            _ => len = Some((argument, n)),
        }
    }
    Ok(Descales { given: d.named() })
}

/// q, k and v of dtype F8E4M3 and the output dtype one of [`OUT_DTYPES`].
pub(crate) fn check_dtypes(q: DType, k: DType, v: DType, out: DType) -> Result<()> {
    for (argument, dt) in [("q", q), ("k", k), ("v", v)] {
        if dt != DType::F8E4M3 {
            return Err(err(format_args!("dtype mismatch: `{argument}` is {dt:?}, expected F8E4M3 (FP8 attention)")));
        }
    }
    if !OUT_DTYPES.contains(&out) {
        return Err(err(format_args!("`out_dtype`: {out:?} is not supported (FP8 attention writes O in {OUT_DTYPES:?})")));
    }
    Ok(())
}

/// Head dims of the FP8 calls: multiples of 16 up to 256 (the GPU's rule,
/// checked on the CPU too so that a call that runs there runs on the GPU).
pub(crate) fn check_headdim(argument: &str, d: usize) -> Result<()> {
    if d == 0 || !d.is_multiple_of(16) || d > 256 {
        return Err(err(format_args!("`{argument}`: headdim {d} is not supported by FP8 attention (multiples of 16 up to 256)")));
    }
    Ok(())
}

impl FlashAttnFp8 {
    pub(crate) fn descales(&self) -> Fp8Descales<'_> {
        Fp8Descales { q_descale: self.q_descale.as_ref(), k_descale: self.k_descale.as_ref(), v_descale: self.v_descale.as_ref() }
    }

    fn check(&self, q: &Tensor, k: &Tensor, v: &Tensor) -> Result<Checked> {
        let mut all = vec![("q", q), ("k", k), ("v", v)];
        all.extend(self.descales().named().into_iter().filter_map(|(n, t)| t.map(|t| (n, t))));
        crate::check_devices(&all)?;
        check_dtypes(q.dtype(), k.dtype(), v.dtype(), self.out_dtype)?;
        let opts = check::Options {
            softmax_scale: self.softmax_scale,
            window_size_left: self.window_size_left,
            window_size_right: self.window_size_right,
            softcap: None,
        };
        let c = check::check(q.layout(), k.layout(), v.layout(), &opts)?;
        check_headdim("q", c.q.headdim())?;
        Ok(c)
    }

    /// Runs FP8 attention on q, k, v (`(batch, seqlen, nheads, headdim)`,
    /// dtype F8E4M3, any batch/seq/head strides, head dim contiguous; on the
    /// GPU strides in multiples of 16 bytes). Returns O `(batch, seq_len_q,
    /// num_heads_q, head_size)` in [`Self::out_dtype`], contiguous, and the
    /// logsumexp of each row of S, f32 `(batch, num_heads_q, seq_len_q)`.
    /// No backward op is recorded.
    pub fn forward_with_lse(&self, q: &Tensor, k: &Tensor, v: &Tensor) -> Result<(Tensor, Tensor)> {
        let c = self.check(q, k, v)?;
        let descales = self.descales();
        let d = check_descales(&descales, c.q.batch(), c.k.nheads())?;
        let held = [Held::new("q", q), Held::new("k", k), Held::new("v", v)];
        let (o, lse) = match q.device() {
            candle_core::Device::Cpu => {
                let [(qs, ql), (ks, kl), (vs, vl)] = [held[0].cpu()?, held[1].cpu()?, held[2].cpu()?];
                let (o, lse) = cpu_forward(&c, &d, self.out_dtype, (qs, ql), (ks, kl), (vs, vl))?;
                (Storage::Cpu(o), Storage::Cpu(lse))
            }
            #[cfg(feature = "cuda")]
            candle_core::Device::Cuda(_) => {
                let [qs, ks, vs] = [held[0].cuda()?, held[1].cuda()?, held[2].cuda()?];
                let (o, lse) = crate::cuda_fp8::forward(&c, &d, self.out_dtype, qs, ks, vs)?;
                (Storage::Cuda(o), Storage::Cuda(lse))
            }
            dev => return Err(err(format_args!("`q` is on {:?}: FP8 attention runs on the CPU and on CUDA (feature `cuda`)", dev.location()))),
        };
        let [b, s, h, d] = c.q.shape;
        let o = Tensor::from_storage(o, (b, s, h, d), BackpropOp::none(), false);
        let lse = Tensor::from_storage(lse, (b, h, s), BackpropOp::none(), false);
        Ok((o, lse))
    }

    /// [`Self::forward_with_lse`] without the logsumexp.
    pub fn forward(&self, q: &Tensor, k: &Tensor, v: &Tensor) -> Result<Tensor> {
        Ok(self.forward_with_lse(q, k, v)?.0)
    }
}

/// FP8 (e4m3) attention, FlashAttention-3's FP8 forward:
/// `softmax(softmax_scale · (q_descale·Q)(k_descale·K)ᵀ) · (v_descale·V)`.
///
/// * `q`: `(batch, seq_len_q, num_heads_q, head_size)`; `k`, `v`: `(batch,
///   seq_len_kv, num_heads_kv, head_size)`, all of dtype `DType::F8E4M3`
///   (e.g. `x.affine(1.0 / scale, 0.0)?.to_dtype(DType::F8E4M3)?`, which
///   rounds to nearest even and saturates to ±448). Head dims multiples of
///   16 up to 256; GQA/MQA when `num_heads_kv` divides `num_heads_q`.
/// * `descales`: [`Fp8Descales`], f32 tensors `()`/`(1)` or `(batch,
///   num_heads_kv)`, or `Fp8Descales::default()` (all 1).
/// * `causal`: bottom-right aligned, as [`crate::flash_attn`].
/// * `out_dtype`: `DType::BF16` or `DType::F16`.
///
/// Returns `(batch, seq_len_q, num_heads_q, head_size)` in `out_dtype`,
/// contiguous. CUDA: H100/H200 (sm_90a) only; CPU: the f64 reference. Bad
/// input (dtypes, shapes, descale shapes, devices) is a candle error naming
/// the argument.
///
/// ```
/// # fn main() -> candle_core::Result<()> {
/// use candle_core::{DType, Device, Tensor};
/// use flash_attn_candle::{Fp8Descales, flash_attn_fp8};
/// let dev = Device::Cpu;
/// let x = Tensor::randn(0f32, 1., (1, 128, 8, 64), &dev)?;
/// let scale = Tensor::new(&[4.0f32 / 448.0], &dev)?; // |x| ≤ 4 mapped onto e4m3's ±448
/// let x8 = (&x * (448.0 / 4.0))?.to_dtype(DType::F8E4M3)?; // e4m3(x / scale), saturating
/// let ds = Fp8Descales { q_descale: Some(&scale), k_descale: Some(&scale), v_descale: Some(&scale) };
/// let o = flash_attn_fp8(&x8, &x8, &x8, 0.125, true, ds, DType::BF16)?;
/// assert_eq!((o.dims4()?, o.dtype()), ((1, 128, 8, 64), DType::BF16));
/// # Ok(()) }
/// ```
pub fn flash_attn_fp8(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    softmax_scale: f32,
    causal: bool,
    descales: Fp8Descales<'_>,
    out_dtype: DType,
) -> Result<Tensor> {
    let (window_size_left, window_size_right) = crate::causal_window(causal);
    flash_attn_fp8_windowed(q, k, v, softmax_scale, window_size_left, window_size_right, descales, out_dtype)
}

/// [`flash_attn_fp8`] with a sliding window: query `i` sees key `j` iff
/// `i + sk − sq − left ≤ j ≤ i + sk − sq + right` (`None`: unbounded);
/// `(None, Some(0))` is the causal mask.
#[allow(clippy::too_many_arguments)]
pub fn flash_attn_fp8_windowed(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    softmax_scale: f32,
    window_size_left: Option<usize>,
    window_size_right: Option<usize>,
    descales: Fp8Descales<'_>,
    out_dtype: DType,
) -> Result<Tensor> {
    let op = FlashAttnFp8 {
        softmax_scale,
        window_size_left,
        window_size_right,
        q_descale: descales.q_descale.cloned(),
        k_descale: descales.k_descale.cloned(),
        v_descale: descales.v_descale.cloned(),
        out_dtype,
    };
    op.forward(q, k, v)
}

/// The e4m3 codes of a candle F8E4M3 buffer at a layout (offset and
/// strides as they are), gathered into an array.
pub(crate) fn codes(argument: &str, storage: &CpuStorage, l: &Layout, tl: &TensorLayout) -> Result<Array4<u8>> {
    let CpuStorage::F8E4M3(data) = storage else {
        return Err(err(format_args!("dtype mismatch: `{argument}` is {:?}, expected F8E4M3", storage.dtype())));
    };
    let data = &data[l.start_offset().min(data.len())..];
    let [b, s, h, d] = tl.shape;
    let [sb, ss, sh] = tl.strides;
    if let Ok(view) = ArrayView4::from_shape((b, s, h, d).strides((sb, ss, sh, 1)), data) {
        return Ok(view.mapv(|x| x.to_bits()));
    }
    // Strides ndarray does not take as a view (aliasing zero strides).
    let mut out = Array4::zeros((b, s, h, d));
    for ((ib, is, ih, id), x) in out.indexed_iter_mut() {
        *x = data.get(ib * sb + is * ss + ih * sh + id).ok_or_else(|| err(format_args!("`{argument}`: strides {:?} address past the buffer", tl.strides)))?.to_bits();
    }
    Ok(out)
}

/// A descale tensor on the CPU as a host vector.
pub(crate) fn host_f32(argument: &str, t: &Tensor) -> Result<Vec<f32>> {
    let held = Held::new(argument, t);
    let (s, l) = held.cpu()?;
    let data = s.as_slice::<f32>()?;
    let n = t.elem_count();
    let at = l.start_offset();
    Ok(data.get(at..at + n).ok_or_else(|| err(format_args!("`{argument}`: buffer shorter than its shape")))?.to_vec())
}

/// O `(batch, seqlen_q, nheads, d)` in `out`'s dtype and the f32 logsumexp
/// from the reference's f64 arrays.
pub(crate) fn out_storages<D: ndarray::Dimension, E: ndarray::Dimension>(o: &ndarray::Array<f64, D>, lse: &ndarray::Array<f64, E>, out: DType) -> Result<(CpuStorage, CpuStorage)> {
    let o = match out {
        DType::BF16 => CpuStorage::BF16(o.iter().map(|&x| bf16::from_f64(x)).collect()),
        DType::F16 => CpuStorage::F16(o.iter().map(|&x| f16::from_f64(x)).collect()),
        dt => return Err(err(format_args!("`out_dtype`: {dt:?} is not supported (FP8 attention writes O in {OUT_DTYPES:?})"))),
    };
    Ok((o, CpuStorage::F32(lse.iter().map(|&x| x as f32).collect())))
}

/// The CPU path: `reference::fp8::attention_fp8` on the gathered codes
/// (it checks the descale values: finite and positive).
fn cpu_forward(
    c: &Checked,
    d: &Descales<'_>,
    out: DType,
    (q, q_l): (&CpuStorage, &Layout),
    (k, k_l): (&CpuStorage, &Layout),
    (v, v_l): (&CpuStorage, &Layout),
) -> Result<(CpuStorage, CpuStorage)> {
    let (q8, k8, v8) = (codes("q", q, q_l, &c.q)?, codes("k", k, k_l, &c.k)?, codes("v", v, v_l, &c.v)?);
    let [qs, ks, vs] = d.given.map(|(n, t)| t.map(|t| host_f32(n, t)).transpose());
    let (qs, ks, vs) = (qs?, ks?, vs?);
    let scales = [qs.as_deref(), ks.as_deref(), vs.as_deref()];
    let r = attention_fp8(q8.view(), k8.view(), v8.view(), scales, &c.params).map_err(core_err)?;
    out_storages(&r.o, &r.lse, out)
}
