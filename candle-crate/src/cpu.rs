//! The CPU path: flash-attn's CPU reference (`reference::fa2_forward_ext`,
//! the FA2 loop order with GQA, window, softcap and ALiBi) on candle's CPU
//! buffers. f32 and f64 run in their own precision; f16 and bf16 are
//! widened to f32 and the output rounded back (as the kernels accumulate in
//! f32). The logsumexp is f32 `(batch, nheads, seqlen_q)`.

use candle_core::backend::BackendStorage;
use candle_core::{CpuStorage, DType, Layout, Result, WithDType};
use flash_attn::common::Real;
use flash_attn::{AlibiShape, TensorLayout, reference};
use half::{bf16, f16};
use ndarray::{Array4, ArrayView4, ShapeBuilder};

use crate::check::{Checked, core_err, err, len_from};

/// The dtypes `cpu_fwd` takes.
pub(crate) const DTYPES: &[DType] = &[DType::F32, DType::F64, DType::F16, DType::BF16];

/// Query/key block sizes of the reference's FA2 loop (results do not depend
/// on them beyond rounding).
const BLOCK: (usize, usize) = (64, 64);

/// A storage element and the precision the reference runs it in.
pub(crate) trait Elem: WithDType {
    type F: Real;
    fn up(self) -> Self::F;
    fn down(x: Self::F) -> Self;
}

macro_rules! elem {
    ($t:ty, $f:ty, $up:expr, $down:expr) => {
        impl Elem for $t {
            type F = $f;
            fn up(self) -> $f {
                $up(self)
            }
            fn down(x: $f) -> Self {
                $down(x)
            }
        }
    };
}
elem!(f32, f32, |x| x, |x| x);
elem!(f64, f64, |x| x, |x| x);
elem!(f16, f32, f16::to_f32, f16::from_f32);
elem!(bf16, f32, bf16::to_f32, bf16::from_f32);

#[allow(clippy::too_many_arguments)]
pub(crate) fn forward(
    c: &Checked,
    alibi: Option<(&[f32], AlibiShape)>,
    q: &CpuStorage,
    q_l: &Layout,
    k: &CpuStorage,
    k_l: &Layout,
    v: &CpuStorage,
    v_l: &Layout,
) -> Result<(CpuStorage, CpuStorage)> {
    match q {
        CpuStorage::F32(_) => run::<f32>(c, alibi, [(q, q_l), (k, k_l), (v, v_l)]),
        CpuStorage::F64(_) => run::<f64>(c, alibi, [(q, q_l), (k, k_l), (v, v_l)]),
        CpuStorage::F16(_) => run::<f16>(c, alibi, [(q, q_l), (k, k_l), (v, v_l)]),
        CpuStorage::BF16(_) => run::<bf16>(c, alibi, [(q, q_l), (k, k_l), (v, v_l)]),
        other => Err(err(format_args!("`q`: dtype {:?} is not supported on the CPU", other.dtype()))),
    }
}

fn run<T: Elem>(c: &Checked, alibi: Option<(&[f32], AlibiShape)>, qkv: [(&CpuStorage, &Layout); 3]) -> Result<(CpuStorage, CpuStorage)> {
    let [(q, q_l), (k, k_l), (v, v_l)] = qkv;
    let (q, k, v) = (q.as_slice::<T>()?, k.as_slice::<T>()?, v.as_slice::<T>()?);
    // The core's own validation, so both paths report the same typed errors.
    let o_layout = TensorLayout::contiguous(c.q.shape);
    let problem = flash_attn::api::validate(
        (&c.q, len_from(q.len(), q_l)),
        (&c.k, len_from(k.len(), k_l)),
        (&c.v, len_from(v.len(), v_l)),
        (&o_layout, o_layout.num_elements().unwrap_or(usize::MAX)),
        &c.params,
    )
    .map_err(core_err)?;
    let (q, k, v) = (widen::<T>(q, q_l, &c.q)?, widen::<T>(k, k_l, &c.k)?, widen::<T>(v, v_l, &c.v)?);
    let _ = problem;
    let alibi = alibi.map(|(slopes, shape)| reference::HostAlibi { slopes, shape });
    let out = reference::fa2_forward_ext::<T::F>(q.view(), k.view(), v.view(), &c.params, alibi, BLOCK.0, BLOCK.1)
        .map_err(core_err)?;
    let o: Vec<T> = out.o.iter().map(|&x| T::down(x)).collect();
    let lse: Vec<f32> = out.lse.iter().map(|&x| x.to_f64() as f32).collect();
    Ok((T::to_cpu_storage_owned(o), CpuStorage::F32(lse)))
}

/// candle's strided buffer as an array in the reference's precision: a view
/// of the buffer as it is (offset, strides), widened in one pass.
pub(crate) fn widen<T: Elem>(data: &[T], l: &Layout, tl: &TensorLayout) -> Result<Array4<T::F>> {
    let [b, s, h, d] = tl.shape;
    let [sb, ss, sh] = tl.strides;
    let data = &data[l.start_offset().min(data.len())..];
    match ArrayView4::from_shape((b, s, h, d).strides((sb, ss, sh, 1)), data) {
        Ok(view) => Ok(view.mapv(T::up)),
        // Strides ndarray does not take as a view (e.g. aliasing zero
        // strides of a broadcast tensor): gather through candle's index.
        Err(_) => {
            let at = |(ib, is, ih, id): (usize, usize, usize, usize)| data.get(ib * sb + is * ss + ih * sh + id);
            let mut out = Array4::from_elem((b, s, h, d), <T::F as Real>::from_f32(0.0));
            for (ix, x) in out.indexed_iter_mut() {
                *x = at(ix).ok_or_else(|| err(format_args!("strides {:?} address past the buffer", tl.strides)))?.up();
            }
            Ok(out)
        }
    }
}

/// The device-independent part of a varlen call on the CPU: host copies of
/// the prefix sums (i32, as the core takes them) and the maxima.
pub(crate) struct VarlenArgs {
    pub cu_q: Vec<i32>,
    pub cu_k: Vec<i32>,
    pub max_q: usize,
    pub max_k: usize,
}

/// Varlen on the CPU: `reference::attention_varlen` (FA2's blocked loop per
/// sequence); q, k, v packed `(total, nheads, headdim)` (`c`'s layouts have
/// batch 1). Returns O `(total_q, nheads, d)` and the LSE `(nheads, total_q)`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn forward_varlen(
    c: &Checked,
    args: &VarlenArgs,
    alibi: Option<(&[f32], AlibiShape)>,
    q: &CpuStorage,
    q_l: &Layout,
    k: &CpuStorage,
    k_l: &Layout,
    v: &CpuStorage,
    v_l: &Layout,
) -> Result<(CpuStorage, CpuStorage)> {
    let qkv = [(q, q_l), (k, k_l), (v, v_l)];
    match q {
        CpuStorage::F32(_) => run_varlen::<f32>(c, args, alibi, qkv),
        CpuStorage::F64(_) => run_varlen::<f64>(c, args, alibi, qkv),
        CpuStorage::F16(_) => run_varlen::<f16>(c, args, alibi, qkv),
        CpuStorage::BF16(_) => run_varlen::<bf16>(c, args, alibi, qkv),
        other => Err(err(format_args!("`q`: dtype {:?} is not supported on the CPU", other.dtype()))),
    }
}

fn run_varlen<T: Elem>(
    c: &Checked,
    args: &VarlenArgs,
    alibi: Option<(&[f32], AlibiShape)>,
    qkv: [(&CpuStorage, &Layout); 3],
) -> Result<(CpuStorage, CpuStorage)> {
    let [(q, q_l), (k, k_l), (v, v_l)] = qkv;
    let (q, k, v) = (q.as_slice::<T>()?, k.as_slice::<T>()?, v.as_slice::<T>()?);
    let (q, k, v) = (widen::<T>(q, q_l, &c.q)?, widen::<T>(k, k_l, &c.k)?, widen::<T>(v, v_l, &c.v)?);
    let sub = |a: &Array4<T::F>| a.index_axis(ndarray::Axis(0), 0).to_owned();
    let (q, k, v) = (sub(&q), sub(&k), sub(&v));
    let alibi = alibi.map(|(slopes, shape)| reference::HostAlibi { slopes, shape });
    let out = reference::attention_varlen::<T::F>(
        q.view(),
        k.view(),
        v.view(),
        &args.cu_q,
        &args.cu_k,
        None,
        args.max_q,
        args.max_k,
        &c.params,
        alibi,
    )
    .map_err(core_err)?;
    let o: Vec<T> = out.o.iter().map(|&x| T::down(x)).collect();
    let lse: Vec<f32> = out.lse.iter().map(|&x| x.to_f64() as f32).collect();
    Ok((T::to_cpu_storage_owned(o), CpuStorage::F32(lse)))
}
