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
use candle_core::cuda_backend::cudarc::driver::{CudaStream, CudaView, DevicePtr, DevicePtrMut, DeviceRepr};
use candle_core::{CudaStorage, DType, Layout, Result};
use flash_attn::{
    AlibiShape, AlibiSlopes, AttnElem, BlockTable, DecodeOptions, Extras, FlashAttention, KvCache, KvCacheCall, PagedCache,
    StatsMut, Tensor, TensorLayout, TensorMut, Varlen,
};
use half::{bf16, f16};

use crate::check::{self, Checked, core_err, err};
use crate::kvcache::{KvCacheArgs, KvChecked};
use crate::storage::Held;
use crate::varlen::VarlenIdx;

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

/// The dtypes of q, k and v: one the CUDA path takes, all equal.
pub(crate) fn check_dtypes(q: &CudaStorage, k: &CudaStorage, v: &CudaStorage) -> Result<()> {
    check::check_dtypes(q.dtype(), k.dtype(), v.dtype(), DTYPES, "GPU")
}

/// ALiBi slopes on the GPU: the storage (held for reading), the shape as
/// the core names it, and the start offset.
pub(crate) struct Alibi<'t> {
    held: Held<'t>,
    shape: AlibiShape,
    offset: usize,
}

/// `alibi_slopes` (if given): f32 `(nheads)` or `(batch, nheads)`, contiguous, on the GPU.
pub(crate) fn alibi_storage(t: Option<&candle_core::Tensor>, batch: usize, nheads: usize) -> Result<Option<Alibi<'_>>> {
    let Some(t) = t else { return Ok(None) };
    let (shape, offset) = check::alibi_shape(t, batch, nheads)?;
    let held = Held::new("alibi_slopes", t);
    held.cuda()?;
    Ok(Some(Alibi { held, shape, offset }))
}

/// The slopes as the core's [`Extras`] (a view of candle's buffer).
pub(crate) fn alibi_view<'a>(alibi: Option<&'a Alibi<'_>>) -> Result<Option<(CudaView<'a, f32>, AlibiShape)>> {
    let Some(a) = alibi else { return Ok(None) };
    let slopes = a.held.cuda()?.0.as_cuda_slice::<f32>()?;
    Ok(Some((slopes.slice(a.offset.min(slopes.len())..), a.shape)))
}

pub(crate) fn extras<'a>(alibi: &'a Option<(CudaView<'_, f32>, AlibiShape)>) -> Extras<'a> {
    Extras { alibi_slopes: alibi.as_ref().map(|(s, shape)| AlibiSlopes::new(s, *shape)) }
}

/// candle's buffer from the layout's start offset on, as a cudarc view
/// (no copy; the strides travel in our `TensorLayout`).
pub(crate) fn view<'a, T: CudaDType + DeviceRepr>(s: &'a CudaStorage, l: &Layout) -> Result<CudaView<'a, T>> {
    let slice = s.as_cuda_slice::<T>()?;
    Ok(slice.slice(l.start_offset().min(slice.len())..))
}

/// An index tensor (U32 or I32, contiguous: `check::index_tensor`) read in
/// place as the kernels' i32: u32 and i32 have one size and the same bits
/// below 2³¹, and the kernels clamp every value they read to the buffers.
pub(crate) fn i32_view<'a>(argument: &str, s: &'a CudaStorage, l: &Layout) -> Result<CudaView<'a, i32>> {
    let n = l.shape().elem_count();
    let short = || err(format_args!("`{argument}`: buffer shorter than its shape"));
    match s.dtype() {
        DType::I32 => {
            let v = view::<i32>(s, l)?;
            if v.len() < n {
                return Err(short());
            }
            Ok(v.slice(..n))
        }
        DType::U32 => {
            let v = view::<u32>(s, l)?;
            // SAFETY: u32 → i32, same size and alignment; see above.
            unsafe { v.transmute::<i32>(n) }.ok_or_else(short)
        }
        dt => Err(err(format_args!("dtype mismatch: `{argument}` is {dt:?}, expected U32 or I32"))),
    }
}

/// Every storage on `dev`'s device, or an error naming the first that is not.
pub(crate) fn same_device(dev: &candle_core::CudaDevice, others: &[(&str, &CudaStorage)]) -> Result<()> {
    for &(argument, s) in others {
        if !s.device().same_device(dev) {
            return Err(err(format_args!("device mismatch: `{argument}` is on {:?} but `q` on {:?}", s.device(), dev)));
        }
    }
    Ok(())
}

/// New keys or values as the core's tensor of `dyn DevicePtr`.
pub(crate) fn as_new<'a, T: DeviceRepr>((data, layout): &'a (CudaView<'_, T>, TensorLayout)) -> Tensor<'a, dyn DevicePtr<T> + 'a> {
    Tensor::new(data, *layout).into()
}

pub(crate) fn wrap<T: CudaDType>(s: candle_core::cuda_backend::cudarc::driver::CudaSlice<T>, dev: &candle_core::CudaDevice) -> CudaStorage {
    CudaStorage::wrap_cuda_slice(s, dev.clone())
}

macro_rules! by_dtype {
    ($dt:expr, $f:ident :: <T> ($($arg:expr),* $(,)?)) => {
        match $dt {
            DType::F32 => $f::<f32>($($arg),*),
            DType::F16 => $f::<f16>($($arg),*),
            DType::BF16 => $f::<bf16>($($arg),*),
            dt => Err(err(format_args!("`q`: dtype {dt:?} is not supported on the GPU (supported: {DTYPES:?})"))),
        }
    };
}

/// The fixed-length call; `alibi`'s shape is checked against q's batch and heads.
#[allow(clippy::too_many_arguments)]
pub(crate) fn forward(
    c: &Checked,
    alibi: Option<&candle_core::Tensor>,
    q: &CudaStorage,
    q_l: &Layout,
    k: &CudaStorage,
    k_l: &Layout,
    v: &CudaStorage,
    v_l: &Layout,
) -> Result<(CudaStorage, CudaStorage)> {
    let alibi = alibi_storage(alibi, c.q.batch(), c.q.nheads())?;
    by_dtype!(q.dtype(), run::<T>(c, alibi.as_ref(), q, q_l, k, k_l, v, v_l))
}

#[allow(clippy::too_many_arguments)]
fn run<T: AttnElem + CudaDType>(
    c: &Checked,
    alibi: Option<&Alibi<'_>>,
    q: &CudaStorage,
    q_l: &Layout,
    k: &CudaStorage,
    k_l: &Layout,
    v: &CudaStorage,
    v_l: &Layout,
) -> Result<(CudaStorage, CudaStorage)> {
    let dev = q.device();
    same_device(dev, &[("k", k), ("v", v)])?;
    let stream = dev.cuda_stream();
    let fa = kernels(&stream)?;
    let (qv, kv, vv) = (view::<T>(q, q_l)?, view::<T>(k, k_l)?, view::<T>(v, v_l)?);
    let o_layout = TensorLayout::contiguous(c.q.shape);
    let o_len = o_layout.num_elements().ok_or_else(|| err("`q`: the output's size overflows"))?;
    let (b, h, s) = c.lse_shape();
    // SAFETY: uninitialized device memory; the forward pass writes every
    // element of o and of the logsumexp (rows that see no key: 0 and −inf)
    // before anything reads them, in stream order.
    let mut o = unsafe { stream.alloc::<T>(o_len) }.map_err(err)?;
    let mut lse = unsafe { stream.alloc::<f32>(b * h * s) }.map_err(err)?;
    let alibi = alibi_view(alibi)?;
    fa.forward_into_ext(
        &stream,
        Tensor::new(&qv, c.q),
        Tensor::new(&kv, c.k),
        Tensor::new(&vv, c.v),
        TensorMut::new(&mut o, o_layout),
        StatsMut::LogSumExp(lse.as_view_mut()),
        &c.params,
        &extras(&alibi),
    )
    .map_err(core_err)?;
    Ok((wrap(o, dev), wrap(lse, dev)))
}

/// The index tensors of a varlen call as GPU storages: the prefix sums
/// and, paged, the block table and its `max_blocks` (then k and v are pages).
struct VarlenBufs<'a> {
    seqlens_q: (&'a CudaStorage, &'a Layout),
    seqlens_k: (&'a CudaStorage, &'a Layout),
    max_seqlen: (usize, usize),
    block_table: Option<(&'a CudaStorage, &'a Layout, usize)>,
}

/// Varlen on the GPU over candle's buffers: `forward_varlen_into` (packed
/// k/v) or `forward_varlen_paged` (k/v pages and a block table); prefix
/// sums and table read in place as i32 ([`i32_view`]). O `(total_q,
/// nheads, d)`, LSE `(nheads, total_q)`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn forward_varlen(
    c: &Checked,
    idx: &VarlenIdx<'_>,
    alibi: Option<&candle_core::Tensor>,
    q: &CudaStorage,
    q_l: &Layout,
    k: &CudaStorage,
    k_l: &Layout,
    v: &CudaStorage,
    v_l: &Layout,
) -> Result<(CudaStorage, CudaStorage)> {
    let (sq, sk) = (Held::new("seqlens_q", idx.seqlens_q), Held::new("seqlens_k", idx.seqlens_k));
    let bt = idx.block_table.map(|(t, max_blocks)| (Held::new("block_table", t), max_blocks));
    let block_table = match &bt {
        Some((held, max_blocks)) => {
            let (s, l) = held.cuda()?;
            Some((s, l, *max_blocks))
        }
        None => None,
    };
    let bufs = VarlenBufs { seqlens_q: sq.cuda()?, seqlens_k: sk.cuda()?, max_seqlen: idx.max_seqlen, block_table };
    let alibi = alibi_storage(alibi, idx.batch, c.q.nheads())?;
    by_dtype!(q.dtype(), run_varlen::<T>(c, &bufs, alibi.as_ref(), q, q_l, k, k_l, v, v_l))
}

#[allow(clippy::too_many_arguments)]
fn run_varlen<T: AttnElem + CudaDType>(
    c: &Checked,
    idx: &VarlenBufs<'_>,
    alibi: Option<&Alibi<'_>>,
    q: &CudaStorage,
    q_l: &Layout,
    k: &CudaStorage,
    k_l: &Layout,
    v: &CudaStorage,
    v_l: &Layout,
) -> Result<(CudaStorage, CudaStorage)> {
    let dev = q.device();
    same_device(dev, &[("k", k), ("v", v), ("seqlens_q", idx.seqlens_q.0), ("seqlens_k", idx.seqlens_k.0)])?;
    let stream = dev.cuda_stream();
    let fa = kernels(&stream)?;
    let (qv, kv, vv) = (view::<T>(q, q_l)?, view::<T>(k, k_l)?, view::<T>(v, v_l)?);
    let cq = i32_view("seqlens_q", idx.seqlens_q.0, idx.seqlens_q.1)?;
    let ck = i32_view("seqlens_k", idx.seqlens_k.0, idx.seqlens_k.1)?;
    let (max_seqlen_q, max_seqlen_k) = idx.max_seqlen;
    let varlen = Varlen { cu_seqlens_q: &cq, cu_seqlens_k: &ck, max_seqlen_q, max_seqlen_k, seqused_k: None };
    let alibi = alibi_view(alibi)?;
    let ext = extras(&alibi);
    let q_t = Tensor::new(&qv, c.q);
    if let Some((bt, bt_l, max_blocks_per_seq)) = idx.block_table {
        same_device(dev, &[("block_table", bt)])?;
        if c.v.strides != c.k.strides {
            return Err(err(format_args!(
                "`v`: strides {:?} differ from `k`'s {:?} (the paged kernels read k and v pages with one layout)",
                c.v.strides, c.k.strides
            )));
        }
        let table = i32_view("block_table", bt, bt_l)?;
        let cache = PagedCache { k_pages: &kv, v_pages: &vv, layout: c.k, block_table: BlockTable { table: &table, max_blocks_per_seq } };
        let out = fa.forward_varlen_paged(&stream, q_t, cache, &varlen, &c.params, &ext, DecodeOptions::default()).map_err(core_err)?;
        return Ok((wrap(out.o, dev), wrap(out.lse, dev)));
    }
    let [_, total_q, h, d] = c.q.shape;
    let o_layout = TensorLayout::varlen(total_q, h, d);
    // SAFETY: uninitialized; the kernels write every row of o and of the
    // LSE (rows outside every segment are zeroed / −inf by the API).
    let mut o = unsafe { stream.alloc::<T>(total_q * h * d) }.map_err(err)?;
    let mut lse = unsafe { stream.alloc::<f32>(h * total_q) }.map_err(err)?;
    fa.forward_varlen_into(
        &stream,
        q_t,
        Tensor::new(&kv, c.k),
        Tensor::new(&vv, c.v),
        TensorMut::new(&mut o, o_layout),
        &mut lse,
        &varlen,
        &c.params,
        &ext,
    )
    .map_err(core_err)?;
    Ok((wrap(o, dev), wrap(lse, dev)))
}

/// The index tensors of a KV-cache call as GPU storages.
pub(crate) struct KvBufs<'a> {
    pub(crate) cache_seqlens: (&'a CudaStorage, &'a Layout),
    pub(crate) cache_batch_idx: Option<(&'a CudaStorage, &'a Layout)>,
    pub(crate) block_table: Option<(&'a CudaStorage, &'a Layout)>,
}

/// What a GPU KV-cache call (16-bit or FP8) checks before it views any
/// buffer: every tensor on `q`'s device (`more`: further ones, checked
/// after `cache_seqlens`), both caches with one layout; then its index
/// tensors viewed as i32 (`cache_seqlens`, `cache_batch_idx`, `block_table`).
#[allow(clippy::type_complexity)]
pub(crate) fn kv_index_views<'a>(
    dev: &candle_core::CudaDevice,
    c: &KvChecked,
    idx: &KvBufs<'a>,
    caches: [&CudaStorage; 2],
    more: &[(&str, &CudaStorage)],
    new: Option<&[(&CudaStorage, &Layout); 2]>,
) -> Result<(CudaView<'a, i32>, Option<CudaView<'a, i32>>, Option<CudaView<'a, i32>>)> {
    same_device(dev, &[("k_cache", caches[0]), ("v_cache", caches[1]), ("cache_seqlens", idx.cache_seqlens.0)])?;
    same_device(dev, more)?;
    for (argument, s) in [("cache_batch_idx", idx.cache_batch_idx), ("block_table", idx.block_table)] {
        if let Some((s, _)) = s {
            same_device(dev, &[(argument, s)])?;
        }
    }
    if let Some([(kn, _), (vn, _)]) = new {
        same_device(dev, &[("k_new", kn), ("v_new", vn)])?;
    }
    if c.v_cache.strides != c.k_cache.strides {
        return Err(err(format_args!(
            "`v_cache`: strides {:?} differ from `k_cache`'s {:?} (the kernels read both caches with one layout)",
            c.v_cache.strides, c.k_cache.strides
        )));
    }
    let lens = i32_view("cache_seqlens", idx.cache_seqlens.0, idx.cache_seqlens.1)?;
    let batch_idx = idx.cache_batch_idx.map(|(s, l)| i32_view("cache_batch_idx", s, l)).transpose()?;
    let table = idx.block_table.map(|(s, l)| i32_view("block_table", s, l)).transpose()?;
    Ok((lens, batch_idx, table))
}

/// A KV-cache call on the GPU: the core's `forward_kvcache` over candle's
/// buffers, which validates everything before it enqueues anything, then
/// appends the new rows in place into both caches and attends (split-KV as
/// the heuristic or `num_splits` says), all on candle's stream. O `(batch,
/// seqlen_q, nheads, d)`, LSE `(batch, nheads, seqlen_q)`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn kvcache(
    c: &KvChecked,
    a: &KvCacheArgs<'_>,
    num_splits: Option<usize>,
    alibi: Option<&candle_core::Tensor>,
    q: &candle_core::Tensor,
    k_cache: (&mut CudaStorage, &Layout),
    v_cache: (&mut CudaStorage, &Layout),
) -> Result<(CudaStorage, CudaStorage)> {
    let q = Held::new("q", q);
    let lens = Held::new("cache_seqlens", a.cache_seqlens);
    let batch_idx = a.cache_batch_idx.map(|t| Held::new("cache_batch_idx", t));
    let table = a.block_table.map(|t| Held::new("block_table", t));
    let new = a.held_new();
    let bufs = KvBufs {
        cache_seqlens: lens.cuda()?,
        cache_batch_idx: batch_idx.as_ref().map(Held::cuda).transpose()?,
        block_table: table.as_ref().map(Held::cuda).transpose()?,
    };
    let new = match &new {
        Some([kn, vn]) => Some([kn.cuda()?, vn.cuda()?]),
        None => None,
    };
    let alibi = alibi_storage(alibi, c.batch, c.q.nheads())?;
    let q = q.cuda()?;
    by_dtype!(q.0.dtype(), run_kv::<T>(c, &bufs, num_splits, alibi.as_ref(), q, k_cache, v_cache, new))
}

#[allow(clippy::too_many_arguments)]
fn run_kv<T: AttnElem + CudaDType>(
    c: &KvChecked,
    idx: &KvBufs<'_>,
    num_splits: Option<usize>,
    alibi: Option<&Alibi<'_>>,
    (q, q_l): (&CudaStorage, &Layout),
    (k_st, k_l): (&mut CudaStorage, &Layout),
    (v_st, v_l): (&mut CudaStorage, &Layout),
    new: Option<[(&CudaStorage, &Layout); 2]>,
) -> Result<(CudaStorage, CudaStorage)> {
    let dev = q.device().clone();
    let (lens, batch_idx, table) = kv_index_views(&dev, c, idx, [k_st, v_st], &[], new.as_ref())?;
    let stream = dev.cuda_stream();
    let fa = kernels(&stream)?;
    let qv = view::<T>(q, q_l)?;
    let new = match (new, &c.new) {
        (Some([(kn, kn_l), (vn, vn_l)]), Some((lk, lv))) => Some(((view::<T>(kn, kn_l)?, *lk), (view::<T>(vn, vn_l)?, *lv))),
        _ => None,
    };
    let alibi = alibi_view(alibi)?;
    let kc = k_st.as_cuda_slice_mut::<T>()?;
    let mut kc = kc.slice_mut(k_l.start_offset().min(kc.len())..);
    let vc = v_st.as_cuda_slice_mut::<T>()?;
    let mut vc = vc.slice_mut(v_l.start_offset().min(vc.len())..);
    let cache = KvCache {
        k_cache: &mut kc,
        v_cache: &mut vc,
        layout: c.k_cache,
        cache_seqlens: &lens,
        cache_batch_idx: batch_idx.as_ref().map(|b| b as &dyn DevicePtr<i32>),
        block_table: table.as_ref().zip(c.max_blocks).map(|(t, m)| BlockTable { table: t, max_blocks_per_seq: m }),
        k_new: new.as_ref().map(|(k, _)| as_new(k)),
        v_new: new.as_ref().map(|(_, v)| as_new(v)),
    };
    let out = fa
        .forward_kvcache(&stream, Tensor::new(&qv, c.q), cache, &c.params, &extras(&alibi), DecodeOptions { num_splits, ..Default::default() })
        .map_err(core_err)?;
    Ok((wrap(out.o, &dev), wrap(out.lse, &dev)))
}

/// A block table (U32 or I32, contiguous) handed to `f` as the kernels'
/// i32, writable in place ([`i32_view`]'s rule).
fn with_i32_view_mut<R>(
    argument: &str,
    s: &mut CudaStorage,
    l: &Layout,
    f: impl FnOnce(&mut dyn DevicePtrMut<i32>) -> Result<R>,
) -> Result<R> {
    let n = l.shape().elem_count();
    let at = l.start_offset();
    let short = || err(format_args!("`{argument}`: buffer shorter than its shape"));
    match s.dtype() {
        DType::I32 => {
            let v = s.as_cuda_slice_mut::<i32>()?;
            let mut v = v.try_slice_mut(at..at.saturating_add(n)).ok_or_else(short)?;
            f(&mut v)
        }
        DType::U32 => {
            let v = s.as_cuda_slice_mut::<u32>()?;
            let mut v = v.try_slice_mut(at..at.saturating_add(n)).ok_or_else(short)?;
            // SAFETY: u32 → i32, same size and alignment (see i32_view); the
            // sort only permutes entries, so a u32 table keeps its values.
            let mut t = unsafe { v.transmute_mut::<i32>(n) }.ok_or_else(short)?;
            f(&mut t)
        }
        dt => Err(err(format_args!("dtype mismatch: `{argument}` is {dt:?}, expected U32 or I32"))),
    }
}

/// `FlashAttention::order_block_table` on candle's buffers and stream.
pub(crate) fn order_block_table(
    (table, table_l): (&mut CudaStorage, &Layout),
    (lens, lens_l): (&CudaStorage, &Layout),
    max_blocks: usize,
    page: usize,
    call: &KvCacheCall,
) -> Result<()> {
    let dev = table.device().clone();
    same_device(&dev, &[("cache_seqlens", lens)])?;
    let stream = dev.cuda_stream();
    let fa = kernels(&stream)?;
    let lens = i32_view("cache_seqlens", lens, lens_l)?;
    with_i32_view_mut("block_table", table, table_l, |table| {
        fa.order_block_table(&stream, table, max_blocks, page, &lens, call).map_err(core_err)
    })
}

/// The backward pass on the GPU (`crate::backward`): the core's `backward`
/// (dense) or `backward_varlen` (packed; prefix sums read in place) on
/// candle's stream; q, k, v at their strides, out and dout contiguous, the
/// logsumexp copied into the core's row statistics (one small device copy).
pub(crate) fn backward(
    c: &Checked,
    idx: Option<&VarlenIdx<'_>>,
    alibi: Option<&candle_core::Tensor>,
    t: crate::backward::Six<'_>,
) -> Result<[candle_core::Tensor; 3]> {
    let names = ["q", "k", "v", "out", "dout", "softmax_lse"];
    let held: Vec<Held<'_>> = names.iter().zip(t).map(|(n, x)| Held::new(n, x)).collect();
    let idx_held = idx.map(|i| (Held::new("seqlens_q", i.seqlens_q), Held::new("seqlens_k", i.seqlens_k), i.max_seqlen));
    let bufs = held.iter().map(Held::cuda).collect::<Result<Vec<_>>>()?;
    let batch = idx.map_or(c.q.batch(), |i| i.batch);
    let alibi = alibi_storage(alibi, batch, c.q.nheads())?;
    let grads = by_dtype!(bufs[0].0.dtype(), run_bwd::<T>(c, &bufs, idx_held.as_ref(), alibi.as_ref()))?;
    let shapes = [t[0].shape().clone(), t[1].shape().clone(), t[2].shape().clone()];
    let [dq, dk, dv] = grads;
    let [sq, sk, sv] = shapes;
    Ok([
        crate::backward::tensor(candle_core::Storage::Cuda(dq), sq),
        crate::backward::tensor(candle_core::Storage::Cuda(dk), sk),
        crate::backward::tensor(candle_core::Storage::Cuda(dv), sv),
    ])
}

type HeldVarlen<'t> = (Held<'t>, Held<'t>, (usize, usize));

fn run_bwd<T: AttnElem + CudaDType>(
    c: &Checked,
    bufs: &[(&CudaStorage, &Layout)],
    idx: Option<&HeldVarlen<'_>>,
    alibi: Option<&Alibi<'_>>,
) -> Result<[CudaStorage; 3]> {
    let [(q, q_l), (k, k_l), (v, v_l), (out, out_l), (dout, dout_l), (lse, lse_l)] = bufs else {
        return Err(err("the backward pass takes q, k, v, out, dout and the logsumexp"));
    };
    let dev = q.device();
    same_device(dev, &[("k", k), ("v", v), ("out", out), ("dout", dout), ("softmax_lse", lse)])?;
    let stream = dev.cuda_stream();
    let fa = kernels(&stream)?;
    let (qv, kv, vv) = (view::<T>(q, q_l)?, view::<T>(k, k_l)?, view::<T>(v, v_l)?);
    let (ov, dov) = (view::<T>(out, out_l)?, view::<T>(dout, dout_l)?);
    let [b, s, h, d] = c.q.shape;
    // out and dout were made contiguous (`crate::backward::grads`).
    let o_layout = if idx.is_some() { TensorLayout::varlen(s, h, d) } else { TensorLayout::contiguous(c.q.shape) };
    let n = b * h * s;
    let lse_v = view::<f32>(lse, lse_l)?;
    if lse_v.len() < n {
        return Err(err(format_args!("`softmax_lse`: {} values, expected {n}", lse_v.len())));
    }
    let stats = lse_v.slice(..n);
    let alibi = alibi_view(alibi)?;
    let ext = extras(&alibi);
    let params = flash_attn::BackwardParams { forward: c.params, deterministic: false };
    let (q_t, k_t, v_t) = (Tensor::new(&qv, c.q), Tensor::new(&kv, c.k), Tensor::new(&vv, c.v));
    let (o_t, do_t) = (Tensor::new(&ov, o_layout), Tensor::new(&dov, o_layout));
    let g = match idx {
        None => fa.backward::<T, _, _, _, _, _>(&stream, q_t, k_t, v_t, o_t, do_t, &stats, &params, &ext),
        Some((sq, sk, (max_seqlen_q, max_seqlen_k))) => {
            let (sq, sk) = (sq.cuda()?, sk.cuda()?);
            same_device(dev, &[("seqlens_q", sq.0), ("seqlens_k", sk.0)])?;
            let (cq, ck) = (i32_view("seqlens_q", sq.0, sq.1)?, i32_view("seqlens_k", sk.0, sk.1)?);
            let varlen = Varlen { cu_seqlens_q: &cq, cu_seqlens_k: &ck, max_seqlen_q: *max_seqlen_q, max_seqlen_k: *max_seqlen_k, seqused_k: None };
            fa.backward_varlen::<T, _, _, _, _, _>(&stream, q_t, k_t, v_t, o_t, do_t, &stats, &varlen, &params, &ext)
        }
    }
    .map_err(core_err)?;
    Ok([wrap(g.dq, dev), wrap(g.dk, dev), wrap(g.dv, dev)])
}
