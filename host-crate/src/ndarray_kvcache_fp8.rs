//! The `ndarray` API of decode over an FP8 (e4m3) KV cache:
//! [`flash_attn_with_kvcache_fp8`], [`flash_attn_with_kvcache`] with the
//! cache arrays holding e4m3 codes (`u8`) and their f32 scales.
//!
//! On a GPU with the FP8 kernels (sm_90 and newer; f16/bf16 q):
//! [`FlashAttention::forward_kvcache_fp8`](crate::FlashAttention::forward_kvcache_fp8).
//! Otherwise the CPU path: the new rows quantized into the cache the same
//! way (`reference::fp8::e4m3_from_f32(x / scale)`), then the f32 reference
//! over the dequantized cache.

use ndarray::{Array3, Array4, ArrayView4, s};

use crate::tensor::{AttnElem, Tensor, TensorLayout};
use crate::decode::{BlockTable, DecodeOptions, KvCacheFp8};
use crate::types::DType;
use crate::error::{FlashAttnError, Result};
use crate::ndarray_api::{Backend, DeviceSlopes, default_backend, host_vec};
use crate::ndarray_kvcache::{HostKvCache, check_splits, dims};
use crate::params::ForwardParams;
use crate::reference::decode::{CacheShape, check_kvcache_call};
use crate::reference::fp8::{e4m3_from_f32, e4m3_to_f32};
use crate::reference::{self, HostAlibi, PagedKvMut};

fn invalid(argument: &'static str, value: String, reason: &'static str) -> FlashAttnError {
    FlashAttnError::InvalidArgument { argument, value, reason }
}

/// The scale of KV head `h` (one per tensor, or one per KV head).
fn head_scale(scales: &[f32], h: usize) -> f32 {
    if scales.len() == 1 { scales[0] } else { scales[h] }
}

/// [`crate::flash_attn_with_kvcache`] over an FP8 (e4m3) cache: `cache`
/// holds the codes (`u8`, the bit patterns of `float8_e4m3fn`), `k_scale`
/// and `v_scale` one f32 each or one per KV head (`k = k_scale ·
/// e4m3(code)`); `k_new`/`v_new` (in `T`) are quantized into the cache at
/// rows `cache_seqlens[b]..` first (`e4m3(x / scale)`, round to nearest
/// even, saturating to ±448). Returns O and the logsumexp of attention over
/// the dequantized cache; head dims multiples of 16. GPU: f16/bf16 on
/// devices with the FP8 kernels; otherwise the CPU reference in f32.
///
/// ```
/// use flash_attn::{ForwardParams, HostKvCache, flash_attn_with_kvcache_fp8};
/// use flash_attn::reference::fp8::e4m3_from_f32;
/// use ndarray::Array4;
///
/// let (batch, cap, hk, d) = (1, 64, 2, 64);
/// let scale = 0.01f32;
/// let mut k = Array4::from_shape_fn((batch, cap, hk, d), |(_, t, h, e)| e4m3_from_f32(((t + h + e) % 7) as f32 * 0.01 / scale));
/// let mut v = k.clone();
/// let q = Array4::from_elem((batch, 1, 4, d), half::bf16::from_f32(0.5));
/// let cache = HostKvCache::Contiguous { k_cache: &mut k, v_cache: &mut v, cache_batch_idx: None };
/// let (o, lse) = flash_attn_with_kvcache_fp8(q.view(), cache, &[scale], &[scale], &[32], None, None, &ForwardParams::default(), None, None)?;
/// assert_eq!(o.dim(), (1, 1, 4, 64));
/// assert!(lse.iter().all(|x| x.is_finite()));
/// # Ok::<(), flash_attn::FlashAttnError>(())
/// ```
#[allow(clippy::too_many_arguments)]
pub fn flash_attn_with_kvcache_fp8<T: AttnElem>(
    q: ArrayView4<'_, T>,
    cache: HostKvCache<'_, u8>,
    k_scale: &[f32],
    v_scale: &[f32],
    cache_seqlens: &[i32],
    k_new: Option<ArrayView4<'_, T>>,
    v_new: Option<ArrayView4<'_, T>>,
    params: &ForwardParams,
    alibi: Option<HostAlibi<'_>>,
    num_splits: Option<usize>,
) -> Result<(Array4<T>, Array3<f32>)> {
    check_splits(num_splits)?;
    let shape = match &cache {
        HostKvCache::Contiguous { k_cache, v_cache, cache_batch_idx } => CacheShape::Contiguous { k: dims(&k_cache.view()), v: dims(&v_cache.view()), cache_batch_idx: *cache_batch_idx },
        HostKvCache::Paged { k_pages, v_pages, block_table } => CacheShape::Paged { k: dims(&k_pages.view()), v: dims(&v_pages.view()), block_table: *block_table },
    };
    let store = match &shape {
        CacheShape::Contiguous { k, .. } | CacheShape::Paged { k, .. } => *k,
    };
    let new = (k_new.as_ref().map(dims), v_new.as_ref().map(dims));
    check_kvcache_call(dims(&q), shape, cache_seqlens, new, params, alibi.as_ref())?;
    let (hk, d) = (store[2], store[3]);
    if !d.is_multiple_of(16) {
        return Err(invalid("k_cache", format!("headdim {d}"), "an FP8 cache needs a head dim that is a multiple of 16"));
    }
    for (name, sc) in [("k_scale", k_scale), ("v_scale", v_scale)] {
        if sc.len() != 1 && sc.len() != hk {
            return Err(invalid(name, format!("length {}", sc.len()), "must hold one f32 (per tensor) or nheads_k (per KV head)"));
        }
        if let Some(x) = sc.iter().find(|x| !x.is_finite() || **x <= 0.0) {
            return Err(invalid(name, x.to_string(), "scales must be positive and finite"));
        }
    }
    if k_scale.len() != v_scale.len() {
        return Err(invalid("v_scale", format!("length {}", v_scale.len()), "must have k_scale's length"));
    }
    match default_backend() {
        Backend::Gpu(fa) if T::DTYPE != DType::F32 && fa.has_fp8_kv_cache() => {
            gpu(&fa, q, cache, (k_scale, v_scale), cache_seqlens, (k_new, v_new), params, alibi, num_splits)
        }
        _ => cpu(q, cache, (k_scale, v_scale), cache_seqlens, (k_new, v_new), params, alibi),
    }
}

#[allow(clippy::too_many_arguments)]
fn gpu<T: AttnElem>(
    fa: &crate::FlashAttention,
    q: ArrayView4<'_, T>,
    cache: HostKvCache<'_, u8>,
    (k_scale, v_scale): (&[f32], &[f32]),
    cache_seqlens: &[i32],
    (k_new, v_new): (Option<ArrayView4<'_, T>>, Option<ArrayView4<'_, T>>),
    params: &ForwardParams,
    alibi: Option<HostAlibi<'_>>,
    num_splits: Option<usize>,
) -> Result<(Array4<T>, Array3<f32>)> {
    let stream = fa.context().default_stream();
    let (batch, sq, nheads, d) = q.dim();
    let qd = stream.clone_htod(&host_vec(&q))?;
    let kn = k_new.as_ref().map(|a| stream.clone_htod(&host_vec(a))).transpose()?;
    let vn = v_new.as_ref().map(|a| stream.clone_htod(&host_vec(a))).transpose()?;
    let new_layout = k_new.as_ref().map(|a| TensorLayout::contiguous(dims(a)));
    let seqlens = stream.clone_htod(cache_seqlens)?;
    let (ks, vs) = (stream.clone_htod(k_scale)?, stream.clone_htod(v_scale)?);
    let slopes = DeviceSlopes::upload(&stream, alibi.as_ref())?;
    let ext = slopes.extras();
    let (k_host, v_host, idx, table) = match cache {
        HostKvCache::Contiguous { k_cache, v_cache, cache_batch_idx } => (k_cache, v_cache, cache_batch_idx, None),
        HostKvCache::Paged { k_pages, v_pages, block_table } => (k_pages, v_pages, None, Some(block_table)),
    };
    let layout = TensorLayout::contiguous(dims(&k_host.view()));
    let mut kc = stream.clone_htod(&host_vec(&k_host.view()))?;
    let mut vc = stream.clone_htod(&host_vec(&v_host.view()))?;
    let idx_d = idx.map(|i| stream.clone_htod(i)).transpose()?;
    let table_d = table.as_ref().map(|t| stream.clone_htod(&host_vec(t))).transpose()?;
    let out = fa.forward_kvcache_fp8::<T, _>(
        &stream,
        Tensor::new(&qd, TensorLayout::contiguous([batch, sq, nheads, d])),
        KvCacheFp8 {
            k_cache: &mut kc,
            v_cache: &mut vc,
            layout,
            k_scale: &ks,
            v_scale: &vs,
            cache_seqlens: &seqlens,
            cache_batch_idx: idx_d.as_ref().map(|i| i as _),
            block_table: table_d.as_ref().zip(table.as_ref()).map(|(t, h)| BlockTable::new(t, h.dim().1)),
            k_new: kn.as_ref().zip(new_layout).map(|(k, l)| Tensor::new(k, l).into()),
            v_new: vn.as_ref().zip(new_layout).map(|(v, l)| Tensor::new(v, l).into()),
        },
        params,
        &ext,
        DecodeOptions { num_splits, ..Default::default() },
    )?;
    let o = Array4::from_shape_vec((batch, sq, nheads, d), stream.clone_dtoh(&out.o)?)?;
    let lse = Array3::from_shape_vec((batch, nheads, sq), stream.clone_dtoh(&out.lse)?)?;
    for (host, dev) in [(k_host, &kc), (v_host, &vc)] {
        let shape = host.raw_dim();
        *host = Array4::from_shape_vec(shape, stream.clone_dtoh(dev)?)?;
    }
    Ok((o, lse))
}

/// The CPU path: the new rows' codes written where the GPU writes them,
/// then the f32 reference over the dequantized cache with every sequence
/// `cache_seqlens[b] + s_new` keys long (the same attention: nothing is
/// appended a second time).
fn cpu<T: AttnElem>(
    q: ArrayView4<'_, T>,
    cache: HostKvCache<'_, u8>,
    (k_scale, v_scale): (&[f32], &[f32]),
    cache_seqlens: &[i32],
    (k_new, v_new): (Option<ArrayView4<'_, T>>, Option<ArrayView4<'_, T>>),
    params: &ForwardParams,
    alibi: Option<HostAlibi<'_>>,
) -> Result<(Array4<T>, Array3<f32>)> {
    let s_new = k_new.as_ref().map_or(0, |a| a.dim().1);
    let quant = |a: &ArrayView4<'_, T>, sc: &[f32]| Array4::from_shape_fn(a.dim(), |(b, i, h, e)| e4m3_from_f32(a[(b, i, h, e)].to_f32() / head_scale(sc, h)));
    let deq = |a: &Array4<u8>, sc: &[f32]| Array4::from_shape_fn(a.dim(), |(r, t, h, e)| e4m3_to_f32(a[(r, t, h, e)]) * head_scale(sc, h));
    let qf = q.mapv(|x| x.to_f32());
    let lens: Vec<i32> = cache_seqlens.iter().map(|&c| c.max(0) + s_new as i32).collect();
    let out = match cache {
        HostKvCache::Contiguous { k_cache, v_cache, cache_batch_idx } => {
            if let (Some(kn), Some(vn)) = (&k_new, &v_new) {
                let (kq, vq) = (quant(kn, k_scale), quant(vn, v_scale));
                for (b, &c) in cache_seqlens.iter().enumerate() {
                    let row = cache_batch_idx.map_or(b, |i| i[b] as usize);
                    let t0 = c.max(0) as usize;
                    k_cache.slice_mut(s![row, t0..t0 + s_new, .., ..]).assign(&kq.slice(s![b, .., .., ..]));
                    v_cache.slice_mut(s![row, t0..t0 + s_new, .., ..]).assign(&vq.slice(s![b, .., .., ..]));
                }
            }
            let (mut kf, mut vf) = (deq(k_cache, k_scale), deq(v_cache, v_scale));
            reference::kvcache_attention::<f32>(qf.view(), &mut kf, &mut vf, &lens, None, None, cache_batch_idx, params, alibi)?
        }
        HostKvCache::Paged { k_pages, v_pages, block_table } => {
            let ps = k_pages.dim().1;
            if let (Some(kn), Some(vn)) = (&k_new, &v_new) {
                let (kq, vq) = (quant(kn, k_scale), quant(vn, v_scale));
                for (b, &c) in cache_seqlens.iter().enumerate() {
                    for i in 0..s_new {
                        let t = c.max(0) as usize + i;
                        let page = block_table[(b, t / ps)] as usize;
                        k_pages.slice_mut(s![page, t % ps, .., ..]).assign(&kq.slice(s![b, i, .., ..]));
                        v_pages.slice_mut(s![page, t % ps, .., ..]).assign(&vq.slice(s![b, i, .., ..]));
                    }
                }
            }
            let (mut kf, mut vf) = (deq(k_pages, k_scale), deq(v_pages, v_scale));
            let pages = PagedKvMut { k_pages: kf.view_mut(), v_pages: vf.view_mut(), block_table: block_table.view() };
            reference::paged_kvcache_attention::<f32>(qf.view(), pages, &lens, None, None, params, alibi)?
        }
    };
    Ok((out.o.mapv(T::from_f32), out.lse))
}
