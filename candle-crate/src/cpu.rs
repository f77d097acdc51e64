//! The CPU path: flash-attn's CPU reference (`reference::fa2_forward_ext`,
//! the FA2 loop order with GQA, window, softcap and ALiBi) on candle's CPU
//! buffers. f32 and f64 run in their own precision; f16 and bf16 are
//! widened to f32 and the output rounded back (as the kernels accumulate in
//! f32). The logsumexp is f32 `(batch, nheads, seqlen_q)`.

use candle_core::backend::BackendStorage;
use candle_core::{CpuStorage, DType, Layout, Result, Tensor, WithDType};
use flash_attn::common::Real;
use flash_attn::reference::{self, HostAlibi, PagedKv, PagedKvMut};
use flash_attn::{AlibiShape, TensorLayout};
use half::{bf16, f16};
use ndarray::{Array, Array4, ArrayView2, ArrayView4, Dimension, ShapeBuilder, s};

use crate::check::{self, Checked, core_err, err, len_from};
use crate::kvcache::{KvCacheArgs, KvChecked};
use crate::storage::Held;
use crate::varlen::VarlenIdx;

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
    /// The storage's buffer, writable (`None` for another dtype).
    fn slice_mut(s: &mut CpuStorage) -> Option<&mut [Self]>;
}

macro_rules! elem {
    ($t:ty, $f:ty, $variant:ident, $up:expr, $down:expr) => {
        impl Elem for $t {
            type F = $f;
            fn up(self) -> $f {
                $up(self)
            }
            fn down(x: $f) -> Self {
                $down(x)
            }
            fn slice_mut(s: &mut CpuStorage) -> Option<&mut [Self]> {
                match s {
                    CpuStorage::$variant(v) => Some(v),
                    _ => None,
                }
            }
        }
    };
}
elem!(f32, f32, F32, |x| x, |x| x);
elem!(f64, f64, F64, |x| x, |x| x);
elem!(f16, f32, F16, f16::to_f32, f16::from_f32);
elem!(bf16, f32, BF16, bf16::to_f32, bf16::from_f32);

/// An index tensor on the CPU (U32 or I32, checked by
/// `check::index_tensor`) as the core's i32; a u32 value ≥ 2³¹ is an error
/// naming the argument.
pub(crate) fn host_i32(argument: &str, t: &Tensor) -> Result<Vec<i32>> {
    let held = Held::new(argument, t);
    let (st, l) = held.cpu()?;
    index_i32(argument, st, l)
}

/// [`host_i32`] of a storage and its (contiguous) layout.
pub(crate) fn index_i32(argument: &str, st: &CpuStorage, l: &Layout) -> Result<Vec<i32>> {
    let range = l.start_offset()..l.start_offset() + l.shape().elem_count();
    let short = || err(format_args!("`{argument}`: buffer shorter than its shape"));
    match st {
        CpuStorage::I32(v) => Ok(v.get(range).ok_or_else(short)?.to_vec()),
        CpuStorage::U32(v) => v
            .get(range)
            .ok_or_else(short)?
            .iter()
            .map(|&x| i32::try_from(x).map_err(|_| err(format_args!("`{argument}`: {x} exceeds i32::MAX"))))
            .collect(),
        other => Err(err(format_args!("dtype mismatch: `{argument}` is {:?}, expected U32 or I32", other.dtype()))),
    }
}

/// ALiBi slopes on the CPU: a host copy and their shape.
pub(crate) struct Slopes {
    slopes: Vec<f32>,
    shape: AlibiShape,
}

impl Slopes {
    pub(crate) fn host(&self) -> HostAlibi<'_> {
        HostAlibi { slopes: &self.slopes, shape: self.shape }
    }
}

/// `alibi_slopes` (if given) checked against `(batch, nheads)` and copied to the host.
pub(crate) fn host_alibi(t: Option<&Tensor>, batch: usize, nheads: usize) -> Result<Option<Slopes>> {
    let Some(t) = t else { return Ok(None) };
    let (shape, offset) = check::alibi_shape(t, batch, nheads)?;
    let held = Held::new("alibi_slopes", t);
    let slopes = held.cpu()?.0.as_slice::<f32>()?.get(offset..offset + t.elem_count());
    Ok(Some(Slopes { slopes: slopes.ok_or_else(|| err("`alibi_slopes`: buffer shorter than its shape"))?.to_vec(), shape }))
}

/// The dtypes of q, k and v: one the CPU path takes, all equal.
pub(crate) fn check_dtypes(q: &CpuStorage, k: &CpuStorage, v: &CpuStorage) -> Result<()> {
    check::check_dtypes(q.dtype(), k.dtype(), v.dtype(), DTYPES, "CPU")
}

/// `$f::<T>(args)` with `T` the element type of the dtype `$dt`.
macro_rules! by_dtype {
    ($dt:expr, $f:ident :: <T> ($($arg:expr),* $(,)?)) => {
        match $dt {
            DType::F32 => $f::<f32>($($arg),*),
            DType::F64 => $f::<f64>($($arg),*),
            DType::F16 => $f::<f16>($($arg),*),
            DType::BF16 => $f::<bf16>($($arg),*),
            dt => Err(err(format_args!("`q`: dtype {dt:?} is not supported on the CPU"))),
        }
    };
}

/// The reference's output and logsumexp as candle storages: O in `T`, the LSE f32.
fn storages<T: Elem, D: Dimension, E: Dimension>(o: &Array<T::F, D>, lse: &Array<T::F, E>) -> (CpuStorage, CpuStorage) {
    let o: Vec<T> = o.iter().map(|&x| T::down(x)).collect();
    let lse: Vec<f32> = lse.iter().map(|&x| x.to_f64() as f32).collect();
    (T::to_cpu_storage_owned(o), CpuStorage::F32(lse))
}

/// The fixed-length call; `alibi`'s shape is checked against q's batch and heads.
#[allow(clippy::too_many_arguments)]
pub(crate) fn forward(
    c: &Checked,
    alibi: Option<&Tensor>,
    q: &CpuStorage,
    q_l: &Layout,
    k: &CpuStorage,
    k_l: &Layout,
    v: &CpuStorage,
    v_l: &Layout,
) -> Result<(CpuStorage, CpuStorage)> {
    let alibi = host_alibi(alibi, c.q.batch(), c.q.nheads())?;
    by_dtype!(q.dtype(), run::<T>(c, alibi.as_ref(), [(q, q_l), (k, k_l), (v, v_l)]))
}

fn run<T: Elem>(c: &Checked, alibi: Option<&Slopes>, qkv: [(&CpuStorage, &Layout); 3]) -> Result<(CpuStorage, CpuStorage)> {
    let [(q, q_l), (k, k_l), (v, v_l)] = qkv;
    // The core's own validation, so both paths report the same typed errors.
    let o_layout = TensorLayout::contiguous(c.q.shape);
    let problem = flash_attn::advanced::validate::validate(
        (&c.q, len_from(q.as_slice::<T>()?.len(), q_l)),
        (&c.k, len_from(k.as_slice::<T>()?.len(), k_l)),
        (&c.v, len_from(v.as_slice::<T>()?.len(), v_l)),
        (&o_layout, o_layout.num_elements().unwrap_or(usize::MAX)),
        &c.params,
    )
    .map_err(core_err)?;
    let (q, k, v) = (widen::<T>(q, q_l, &c.q)?, widen::<T>(k, k_l, &c.k)?, widen::<T>(v, v_l, &c.v)?);
    let _ = problem;
    let out = reference::fa2_forward_ext::<T::F>(q.view(), k.view(), v.view(), &c.params, alibi.map(Slopes::host), BLOCK.0, BLOCK.1)
        .map_err(core_err)?;
    Ok(storages::<T, _, _>(&out.o, &out.lse))
}

/// candle's strided buffer as an array in the reference's precision: a view
/// of the buffer as it is (offset, strides), widened in one pass.
pub(crate) fn widen<T: Elem>(storage: &CpuStorage, l: &Layout, tl: &TensorLayout) -> Result<Array4<T::F>> {
    let data = storage.as_slice::<T>()?;
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

/// The host copies of a varlen call's index tensors: the prefix sums (i32,
/// as the core takes them) and, paged, the block table `(batch,
/// max_blocks)`, row-major, and `max_blocks` (then k and v are the pages,
/// `c.k` their layout).
struct VarlenArgs {
    cu_q: Vec<i32>,
    cu_k: Vec<i32>,
    max_q: usize,
    max_k: usize,
    block_table: Option<(Vec<i32>, usize)>,
}

/// Varlen on the CPU: `reference::attention_varlen` (FA2's blocked loop per
/// sequence); q, k, v packed `(total, nheads, headdim)` (`c`'s layouts have
/// batch 1), or, with a block table, k and v the pages `(num_blocks,
/// page_size, nheads_k, headdim)` (`reference::attention_varlen_paged`).
/// Returns O `(total_q, nheads, d)` and the LSE `(nheads, total_q)`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn forward_varlen(
    c: &Checked,
    idx: &VarlenIdx<'_>,
    alibi: Option<&Tensor>,
    q: &CpuStorage,
    q_l: &Layout,
    k: &CpuStorage,
    k_l: &Layout,
    v: &CpuStorage,
    v_l: &Layout,
) -> Result<(CpuStorage, CpuStorage)> {
    let block_table = match idx.block_table {
        Some((t, max_blocks)) => Some((host_i32("block_table", t)?, max_blocks)),
        None => None,
    };
    let (max_q, max_k) = idx.max_seqlen;
    let cu_q = host_i32("seqlens_q", idx.seqlens_q)?;
    let args = VarlenArgs { cu_q, cu_k: host_i32("seqlens_k", idx.seqlens_k)?, max_q, max_k, block_table };
    let alibi = host_alibi(alibi, idx.batch, c.q.nheads())?;
    by_dtype!(q.dtype(), run_varlen::<T>(c, &args, alibi.as_ref(), [(q, q_l), (k, k_l), (v, v_l)]))
}

fn run_varlen<T: Elem>(
    c: &Checked,
    args: &VarlenArgs,
    alibi: Option<&Slopes>,
    qkv: [(&CpuStorage, &Layout); 3],
) -> Result<(CpuStorage, CpuStorage)> {
    let [(q, q_l), (k, k_l), (v, v_l)] = qkv;
    let (q, k, v) = (widen::<T>(q, q_l, &c.q)?, widen::<T>(k, k_l, &c.k)?, widen::<T>(v, v_l, &c.v)?);
    let sub = |a: &Array4<T::F>| a.index_axis(ndarray::Axis(0), 0).to_owned();
    let q = sub(&q);
    let alibi = alibi.map(Slopes::host);
    let (cu_q, cu_k, max_q, max_k) = (&args.cu_q, &args.cu_k, args.max_q, args.max_k);
    let out = match &args.block_table {
        None => {
            let (k, v) = (sub(&k), sub(&v));
            reference::attention_varlen::<T::F>(q.view(), k.view(), v.view(), cu_q, cu_k, None, max_q, max_k, &c.params, alibi)
        }
        Some((table, max_blocks)) => {
            let batch = cu_q.len().saturating_sub(1);
            let block_table = ArrayView2::from_shape((batch, *max_blocks), table)
                .map_err(|_| err(format_args!("`block_table`: {} entries, expected ({batch}, {max_blocks})", table.len())))?;
            let pages = PagedKv { k_pages: k.view(), v_pages: v.view(), block_table };
            reference::attention_varlen_paged::<T::F>(q.view(), &pages, cu_q, cu_k, None, max_q, max_k, &c.params, alibi)
        }
    }
    .map_err(core_err)?;
    Ok(storages::<T, _, _>(&out.o, &out.lse))
}

/// The host copies of a KV-cache call's index tensors.
struct KvArgs {
    cache_seqlens: Vec<i32>,
    cache_batch_idx: Option<Vec<i32>>,
    /// Row-major `(batch, max_blocks)` (the max in `KvChecked::max_blocks`).
    block_table: Option<Vec<i32>>,
}

/// A KV-cache call on the CPU: the reference's `kvcache_attention` /
/// `paged_kvcache_attention` on widened copies of the caches (they check
/// everything, lengths, table entries and overlapping appends included,
/// before they write), then the appended rows written back into candle's
/// cache buffers in place (exact: the widening is lossless). Returns O
/// `(batch, seqlen_q, nheads, d)` and the LSE `(batch, nheads, seqlen_q)`.
pub(crate) fn kvcache(
    c: &KvChecked,
    a: &KvCacheArgs<'_>,
    alibi: Option<&Tensor>,
    q: &Tensor,
    k_cache: (&mut CpuStorage, &Layout),
    v_cache: (&mut CpuStorage, &Layout),
) -> Result<(CpuStorage, CpuStorage)> {
    let args = KvArgs {
        cache_seqlens: host_i32("cache_seqlens", a.cache_seqlens)?,
        cache_batch_idx: a.cache_batch_idx.map(|t| host_i32("cache_batch_idx", t)).transpose()?,
        block_table: a.block_table.map(|t| host_i32("block_table", t)).transpose()?,
    };
    let alibi = host_alibi(alibi, c.batch, c.q.nheads())?;
    let q = Held::new("q", q);
    let new = a.held_new();
    let new = match &new {
        Some([kn, vn]) => Some([kn.cpu()?, vn.cpu()?]),
        None => None,
    };
    let q = q.cpu()?;
    by_dtype!(q.0.dtype(), run_kv::<T>(c, &args, alibi.as_ref(), q, k_cache, v_cache, new))
}

#[allow(clippy::too_many_arguments)]
fn run_kv<T: Elem>(
    c: &KvChecked,
    args: &KvArgs,
    alibi: Option<&Slopes>,
    (q, q_l): (&CpuStorage, &Layout),
    (k_st, k_l): (&mut CpuStorage, &Layout),
    (v_st, v_l): (&mut CpuStorage, &Layout),
    new: Option<[(&CpuStorage, &Layout); 2]>,
) -> Result<(CpuStorage, CpuStorage)> {
    let q = widen::<T>(q, q_l, &c.q)?;
    let mut kc = widen::<T>(k_st, k_l, &c.k_cache)?;
    let mut vc = widen::<T>(v_st, v_l, &c.v_cache)?;
    let new = match (new, &c.new) {
        (Some([(kn, kn_l), (vn, vn_l)]), Some((lk, lv))) => Some((widen::<T>(kn, kn_l, lk)?, widen::<T>(vn, vn_l, lv)?)),
        _ => None,
    };
    let (kn, vn) = (new.as_ref().map(|n| n.0.view()), new.as_ref().map(|n| n.1.view()));
    let alibi = alibi.map(Slopes::host);
    let lens = &args.cache_seqlens;
    let out = match (&args.block_table, c.max_blocks) {
        (Some(table), Some(max_blocks)) => {
            let block_table = ArrayView2::from_shape((c.batch, max_blocks), table)
                .map_err(|_| err(format_args!("`block_table`: {} entries, expected ({}, {max_blocks})", table.len(), c.batch)))?;
            let pages = PagedKvMut { k_pages: kc.view_mut(), v_pages: vc.view_mut(), block_table };
            reference::paged_kvcache_attention::<T::F>(q.view(), pages, lens, kn, vn, &c.params, alibi)
        }
        _ => reference::kvcache_attention::<T::F>(
            q.view(),
            &mut kc,
            &mut vc,
            lens,
            kn,
            vn,
            args.cache_batch_idx.as_deref(),
            &c.params,
            alibi,
        ),
    }
    .map_err(core_err)?;
    if let Some((kn, _)) = &new {
        // The reference checked every slot; write back exactly the appended rows.
        let s_new = kn.dim().1;
        let page = c.k_cache.shape[1];
        for (b, &len) in lens.iter().enumerate() {
            for t in len as usize..len as usize + s_new {
                let (outer, row) = match (&args.block_table, c.max_blocks) {
                    (Some(table), Some(max_blocks)) => (table[b * max_blocks + t / page] as usize, t % page),
                    _ => (args.cache_batch_idx.as_ref().map_or(b, |i| i[b] as usize), t),
                };
                store_row::<T>(k_st, k_l, &c.k_cache, &kc, (outer, row))?;
                store_row::<T>(v_st, v_l, &c.v_cache, &vc, (outer, row))?;
            }
        }
    }
    Ok(storages::<T, _, _>(&out.o, &out.lse))
}

/// Writes row `(outer, row)` (all heads) of `a` into candle's buffer at
/// `l`'s offset with `tl`'s strides.
fn store_row<T: Elem>(dst: &mut CpuStorage, l: &Layout, tl: &TensorLayout, a: &Array4<T::F>, (outer, row): (usize, usize)) -> Result<()> {
    let data = T::slice_mut(dst).ok_or_else(|| err("`k_cache`/`v_cache`: dtype differs from `q`"))?;
    let [sb, ss, sh] = tl.strides;
    let base = l.start_offset() + outer * sb + row * ss;
    for ((h, d), &x) in a.slice(s![outer, row, .., ..]).indexed_iter() {
        *data.get_mut(base + h * sh + d).ok_or_else(|| err("a cache's strides address past its buffer"))? = T::down(x);
    }
    Ok(())
}

/// The backward pass on the CPU (`crate::backward`): the reference's
/// `fa2_backward` (dense) or `varlen_attention_backward` (packed, each
/// sequence alone) in f64 for f64 tensors, f32 otherwise; the gradients in
/// q's dtype, contiguous.
pub(crate) fn backward(c: &Checked, idx: Option<&VarlenIdx<'_>>, alibi: Option<&Tensor>, t: crate::backward::Six<'_>) -> Result<[Tensor; 3]> {
    let batch = idx.map_or(c.q.batch(), |i| i.batch);
    let alibi = host_alibi(alibi, batch, c.q.nheads())?;
    let varlen = match idx {
        Some(i) => Some((host_i32("seqlens_q", i.seqlens_q)?, host_i32("seqlens_k", i.seqlens_k)?, i.max_seqlen)),
        None => None,
    };
    let alibi = alibi.as_ref().map(Slopes::host);
    match t[0].dtype() {
        DType::F64 => grads::<f64>(c, varlen.as_ref(), alibi, t),
        _ => grads::<f32>(c, varlen.as_ref(), alibi, t),
    }
}

type HostVarlen = (Vec<i32>, Vec<i32>, (usize, usize));

fn grads<F: Real + WithDType>(c: &Checked, varlen: Option<&HostVarlen>, alibi: Option<HostAlibi<'_>>, t: crate::backward::Six<'_>) -> Result<[Tensor; 3]> {
    let host = |x: &Tensor| -> Result<ndarray::ArrayD<F>> {
        let v = x.to_dtype(F::DTYPE)?.flatten_all()?.to_vec1::<F>()?;
        ndarray::ArrayD::from_shape_vec(x.dims(), v).map_err(|e| err(format_args!("{e}")))
    };
    let four = |x: &Tensor| host(x)?.into_dimensionality::<ndarray::Ix4>().map_err(|e| err(format_args!("{e}")));
    let three = |x: &Tensor| host(x)?.into_dimensionality::<ndarray::Ix3>().map_err(|e| err(format_args!("{e}")));
    let [q, k, v, out, dout, lse] = t;
    let (dq, dk, dv): (Vec<F>, Vec<F>, Vec<F>) = match varlen {
        None => {
            let g = reference::fa2_backward::<F>(
                four(q)?.view(),
                four(k)?.view(),
                four(v)?.view(),
                four(out)?.view(),
                four(dout)?.view(),
                three(lse)?.view(),
                &c.params,
                alibi,
                BLOCK.0,
                BLOCK.1,
            )
            .map_err(core_err)?;
            (g.dq.into_iter().collect(), g.dk.into_iter().collect(), g.dv.into_iter().collect())
        }
        Some((cu_q, cu_k, (max_q, max_k))) => {
            let g = reference::varlen_attention_backward::<F>(
                three(q)?.view(),
                three(k)?.view(),
                three(v)?.view(),
                three(dout)?.view(),
                cu_q,
                cu_k,
                None,
                *max_q,
                *max_k,
                &c.params,
                alibi,
            )
            .map_err(core_err)?;
            (g.dq.into_iter().collect(), g.dk.into_iter().collect(), g.dv.into_iter().collect())
        }
    };
    let back = |g: Vec<F>, like: &Tensor| Tensor::from_vec(g, like.shape(), &candle_core::Device::Cpu)?.to_dtype(like.dtype());
    Ok([back(dq, q)?, back(dk, k)?, back(dv, v)?])
}
