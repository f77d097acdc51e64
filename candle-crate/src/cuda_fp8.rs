//! The CUDA path of the FP8 (e4m3) calls: the core's `forward_fp8_into`
//! and `forward_kvcache_fp8` on candle's stream over candle's buffers, zero
//! copy (as `crate::cuda` does for the 16-bit calls). candle's F8E4M3
//! storage (`float8::F8E4M3`, one byte, `repr(transparent)` over `u8`) is
//! read in place as the core's `u8` codes.

use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::CudaStorageSlice;
use candle_core::cuda_backend::cudarc::driver::{CudaView, DevicePtr};
use candle_core::{CudaStorage, DType, Layout, Result};
use flash_attn::{AttnElem, BlockTable, DecodeOptions, KvCacheFp8, Tensor, TensorLayout, TensorMut, Varlen};
use half::{bf16, f16};

use crate::check::{Checked, core_err, err};
use crate::cuda::{KvBufs, alibi_storage, alibi_view, as_new, extras, i32_view, kernels, kv_index_views, same_device, view, wrap};
use crate::fp8::Descales;
use crate::kvcache::{KvCacheArgs, KvChecked};
use crate::kvcache_fp8::KvScales;
use crate::storage::Held;
use crate::varlen::VarlenIdx;

/// candle's F8E4M3 buffer from the layout's start offset on, as the core's
/// `u8` codes (no copy).
fn codes<'a>(argument: &str, s: &'a CudaStorage, l: &Layout) -> Result<CudaView<'a, u8>> {
    let CudaStorageSlice::F8E4M3(slice) = &s.slice else {
        return Err(err(format_args!("dtype mismatch: `{argument}` is {:?}, expected F8E4M3", s.dtype())));
    };
    let v = slice.slice(l.start_offset().min(slice.len())..);
    let n = v.len();
    // SAFETY: float8::F8E4M3 is `repr(transparent)` over u8: same size,
    // alignment and bits.
    unsafe { v.transmute::<u8>(n) }.ok_or_else(|| err(format_args!("`{argument}`: cannot view the buffer as bytes")))
}

/// An f32 scale tensor (checked: contiguous, its length) as a device view.
fn scale_view<'a>(argument: &str, s: &'a CudaStorage, l: &Layout) -> Result<CudaView<'a, f32>> {
    let n = l.shape().elem_count();
    let v = view::<f32>(s, l)?;
    if v.len() < n {
        return Err(err(format_args!("`{argument}`: buffer shorter than its shape")));
    }
    Ok(v.slice(..n))
}

/// FP8 attention on the GPU: O `(batch, seqlen_q, nheads, d)` in `out`,
/// the LSE `(batch, nheads, seqlen_q)`, both allocated on candle's stream.
pub(crate) fn forward(
    c: &Checked,
    d: &Descales<'_>,
    out: DType,
    q: (&CudaStorage, &Layout),
    k: (&CudaStorage, &Layout),
    v: (&CudaStorage, &Layout),
) -> Result<(CudaStorage, CudaStorage)> {
    let held = d.given.map(|(n, t)| t.map(|t| (n, Held::new(n, t))));
    let mut scales = Vec::new();
    for (n, h) in held.iter().flatten() {
        let (s, l) = h.cuda()?;
        scales.push((*n, s, l));
    }
    match out {
        DType::BF16 => run::<bf16>(c, &scales, q, k, v),
        DType::F16 => run::<f16>(c, &scales, q, k, v),
        dt => Err(err(format_args!("`out_dtype`: {dt:?} is not supported (FP8 attention writes O in {:?})", crate::fp8::OUT_DTYPES))),
    }
}

type Scale<'a> = (&'static str, &'a CudaStorage, &'a Layout);

fn run<T: AttnElem + candle_core::cuda_backend::CudaDType>(
    c: &Checked,
    scales: &[Scale<'_>],
    (q, q_l): (&CudaStorage, &Layout),
    (k, k_l): (&CudaStorage, &Layout),
    (v, v_l): (&CudaStorage, &Layout),
) -> Result<(CudaStorage, CudaStorage)> {
    let dev = q.device();
    same_device(dev, &[("k", k), ("v", v)])?;
    for &(n, s, _) in scales {
        same_device(dev, &[(n, s)])?;
    }
    let stream = dev.cuda_stream();
    let fa = kernels(&stream)?;
    let (qv, kv, vv) = (codes("q", q, q_l)?, codes("k", k, k_l)?, codes("v", v, v_l)?);
    let views = scales.iter().map(|&(n, s, l)| Ok((n, scale_view(n, s, l)?))).collect::<Result<Vec<_>>>()?;
    let pick = |name: &str| views.iter().find(|(n, _)| *n == name).map(|(_, v)| v as &dyn DevicePtr<f32>);
    let ds = flash_attn::Fp8Descales { q_descale: pick("q_descale"), k_descale: pick("k_descale"), v_descale: pick("v_descale") };
    let o_layout = TensorLayout::contiguous(c.q.shape);
    let o_len = o_layout.num_elements().ok_or_else(|| err("`q`: the output's size overflows"))?;
    let (b, h, s) = c.lse_shape();
    // SAFETY: uninitialized device memory; the FP8 forward writes every
    // element of o and of the logsumexp before anything reads them, in
    // stream order.
    let mut o = unsafe { stream.alloc::<T>(o_len) }.map_err(err)?;
    let mut lse = unsafe { stream.alloc::<f32>(b * h * s) }.map_err(err)?;
    fa.forward_fp8_into::<T, _, _, _, _>(
        &stream,
        Tensor::new(&qv, c.q),
        Tensor::new(&kv, c.k),
        Tensor::new(&vv, c.v),
        &ds,
        TensorMut::new(&mut o, o_layout),
        &mut lse,
        &c.params,
    )
    .map_err(core_err)?;
    Ok((wrap(o, dev), wrap(lse, dev)))
}

/// Varlen FP8 attention on the GPU: `forward_fp8_varlen_into` over
/// candle's buffers, prefix sums read in place as i32. O `(total_q, nheads,
/// d)`, LSE `(nheads, total_q)`.
pub(crate) fn forward_varlen(
    c: &Checked,
    idx: &VarlenIdx<'_>,
    d: &Descales<'_>,
    out: DType,
    qkv: [(&CudaStorage, &Layout); 3],
) -> Result<(CudaStorage, CudaStorage)> {
    let held = d.given.map(|(n, t)| t.map(|t| (n, Held::new(n, t))));
    let mut scales = Vec::new();
    for (n, h) in held.iter().flatten() {
        let (s, l) = h.cuda()?;
        scales.push((*n, s, l));
    }
    let (sq, sk) = (Held::new("seqlens_q", idx.seqlens_q), Held::new("seqlens_k", idx.seqlens_k));
    let seqlens = [sq.cuda()?, sk.cuda()?];
    match out {
        DType::BF16 => run_varlen::<bf16>(c, idx.max_seqlen, seqlens, &scales, qkv),
        DType::F16 => run_varlen::<f16>(c, idx.max_seqlen, seqlens, &scales, qkv),
        dt => Err(err(format_args!("`out_dtype`: {dt:?} is not supported (FP8 attention writes O in {:?})", crate::fp8::OUT_DTYPES))),
    }
}

fn run_varlen<T: AttnElem + candle_core::cuda_backend::CudaDType>(
    c: &Checked,
    (max_seqlen_q, max_seqlen_k): (usize, usize),
    [(sq, sq_l), (sk, sk_l)]: [(&CudaStorage, &Layout); 2],
    scales: &[Scale<'_>],
    [(q, q_l), (k, k_l), (v, v_l)]: [(&CudaStorage, &Layout); 3],
) -> Result<(CudaStorage, CudaStorage)> {
    let dev = q.device();
    same_device(dev, &[("k", k), ("v", v), ("seqlens_q", sq), ("seqlens_k", sk)])?;
    for &(n, s, _) in scales {
        same_device(dev, &[(n, s)])?;
    }
    let stream = dev.cuda_stream();
    let fa = kernels(&stream)?;
    let (qv, kv, vv) = (codes("q", q, q_l)?, codes("k", k, k_l)?, codes("v", v, v_l)?);
    let (cq, ck) = (i32_view("seqlens_q", sq, sq_l)?, i32_view("seqlens_k", sk, sk_l)?);
    let varlen = Varlen { cu_seqlens_q: &cq, cu_seqlens_k: &ck, max_seqlen_q, max_seqlen_k, seqused_k: None };
    let views = scales.iter().map(|&(n, s, l)| Ok((n, scale_view(n, s, l)?))).collect::<Result<Vec<_>>>()?;
    let pick = |name: &str| views.iter().find(|(n, _)| *n == name).map(|(_, v)| v as &dyn DevicePtr<f32>);
    let ds = flash_attn::Fp8Descales { q_descale: pick("q_descale"), k_descale: pick("k_descale"), v_descale: pick("v_descale") };
    let [_, total_q, h, d] = c.q.shape;
    let o_layout = TensorLayout::varlen(total_q, h, d);
    // SAFETY: uninitialized; the kernel writes every row of o and of the
    // LSE (rows outside every segment are zeroed / −inf by the API).
    let mut o = unsafe { stream.alloc::<T>(total_q * h * d) }.map_err(err)?;
    let mut lse = unsafe { stream.alloc::<f32>(h * total_q) }.map_err(err)?;
    fa.forward_fp8_varlen_into::<T, _, _, _, _>(
        &stream,
        Tensor::new(&qv, c.q),
        Tensor::new(&kv, c.k),
        Tensor::new(&vv, c.v),
        &ds,
        TensorMut::new(&mut o, o_layout),
        &mut lse,
        &varlen,
        &c.params,
    )
    .map_err(core_err)?;
    Ok((wrap(o, dev), wrap(lse, dev)))
}

/// An FP8 KV-cache call on the GPU: the core's `forward_kvcache_fp8` over
/// candle's buffers (it validates everything before it enqueues the
/// quantizing appends and the attention), on candle's stream. O `(batch,
/// seqlen_q, nheads, d)` in q's dtype, LSE `(batch, nheads, seqlen_q)`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn kvcache(
    c: &KvChecked,
    a: &KvCacheArgs<'_>,
    sc: &KvScales<'_>,
    num_splits: Option<usize>,
    alibi: Option<&candle_core::Tensor>,
    q: &candle_core::Tensor,
    k_cache: (&mut CudaStorage, &Layout),
    v_cache: (&mut CudaStorage, &Layout),
) -> Result<(CudaStorage, CudaStorage)> {
    let q = Held::new("q", q);
    let idx = [
        Some(Held::new("cache_seqlens", a.cache_seqlens)),
        a.cache_batch_idx.map(|t| Held::new("cache_batch_idx", t)),
        a.block_table.map(|t| Held::new("block_table", t)),
    ];
    let scales = [Held::new("k_scale", sc.k_scale), Held::new("v_scale", sc.v_scale)];
    let new = a.held_new();
    let new = match &new {
        Some([kn, vn]) => Some([kn.cuda()?, vn.cuda()?]),
        None => None,
    };
    let idx = idx.iter().map(|h| h.as_ref().map(Held::cuda).transpose()).collect::<Result<Vec<_>>>()?;
    let scales = [scales[0].cuda()?, scales[1].cuda()?];
    let alibi = alibi_storage(alibi, c.batch, c.q.nheads())?;
    let q = q.cuda()?;
    let bufs = KvBufs { cache_seqlens: idx[0].ok_or_else(|| err("`cache_seqlens` is required"))?, cache_batch_idx: idx[1], block_table: idx[2] };
    match q.0.dtype() {
        DType::BF16 => run_kv::<bf16>(c, &bufs, scales, num_splits, alibi.as_ref(), q, k_cache, v_cache, new),
        DType::F16 => run_kv::<f16>(c, &bufs, scales, num_splits, alibi.as_ref(), q, k_cache, v_cache, new),
        dt => Err(err(format_args!("`q`: dtype {dt:?} is not supported with an FP8 KV cache (supported: {:?})", crate::fp8::OUT_DTYPES))),
    }
}


#[allow(clippy::too_many_arguments)]
fn run_kv<T: AttnElem + candle_core::cuda_backend::CudaDType>(
    c: &KvChecked,
    idx: &KvBufs<'_>,
    scales: [(&CudaStorage, &Layout); 2],
    num_splits: Option<usize>,
    alibi: Option<&crate::cuda::Alibi<'_>>,
    (q, q_l): (&CudaStorage, &Layout),
    (k_st, k_l): (&mut CudaStorage, &Layout),
    (v_st, v_l): (&mut CudaStorage, &Layout),
    new: Option<[(&CudaStorage, &Layout); 2]>,
) -> Result<(CudaStorage, CudaStorage)> {
    let dev = q.device().clone();
    let (lens, batch_idx, table) = kv_index_views(&dev, c, idx, [k_st, v_st], &[("k_scale", scales[0].0), ("v_scale", scales[1].0)], new.as_ref())?;
    let stream = dev.cuda_stream();
    let fa = kernels(&stream)?;
    let qv = view::<T>(q, q_l)?;
    let ks = scale_view("k_scale", scales[0].0, scales[0].1)?;
    let vs = scale_view("v_scale", scales[1].0, scales[1].1)?;
    let new = match (new, &c.new) {
        (Some([(kn, kn_l), (vn, vn_l)]), Some((lk, lv))) => Some(((view::<T>(kn, kn_l)?, *lk), (view::<T>(vn, vn_l)?, *lv))),
        _ => None,
    };
    let alibi = alibi_view(alibi)?;
    let (CudaStorageSlice::F8E4M3(kc), CudaStorageSlice::F8E4M3(vc)) = (&mut k_st.slice, &mut v_st.slice) else {
        return Err(err("dtype mismatch: `k_cache` and `v_cache` must be F8E4M3"));
    };
    let (kn_all, vn_all) = (kc.len(), vc.len());
    // SAFETY: float8::F8E4M3 is `repr(transparent)` over u8 (see `codes`).
    let mut kc = unsafe { kc.transmute_mut::<u8>(kn_all) }.ok_or_else(|| err("`k_cache`: cannot view the buffer as bytes"))?;
    let mut vc = unsafe { vc.transmute_mut::<u8>(vn_all) }.ok_or_else(|| err("`v_cache`: cannot view the buffer as bytes"))?;
    let mut kc = kc.slice_mut(k_l.start_offset().min(kn_all)..);
    let mut vc = vc.slice_mut(v_l.start_offset().min(vn_all)..);
    let cache = KvCacheFp8 {
        k_cache: &mut kc,
        v_cache: &mut vc,
        layout: c.k_cache,
        k_scale: &ks,
        v_scale: &vs,
        cache_seqlens: &lens,
        cache_batch_idx: batch_idx.as_ref().map(|b| b as &dyn DevicePtr<i32>),
        block_table: table.as_ref().zip(c.max_blocks).map(|(t, m)| BlockTable { table: t, max_blocks_per_seq: m }),
        k_new: new.as_ref().map(|(k, _)| as_new(k)),
        v_new: new.as_ref().map(|(_, v)| as_new(v)),
    };
    let out = fa
        .forward_kvcache_fp8(&stream, Tensor::new(&qv, c.q), cache, &c.params, &extras(&alibi), DecodeOptions { num_splits, ..Default::default() })
        .map_err(core_err)?;
    Ok((wrap(out.o, &dev), wrap(out.lse, &dev)))
}
