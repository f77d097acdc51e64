//! The `ndarray` API of the KV-cache calls: [`flash_attn_with_kvcache`]
//! (decode against a contiguous or paged cache, new keys appended in place)
//! and [`flash_attn_varlen_paged_func`] (varlen prefill over a paged cache).
//!
//! Host arrays in, host arrays out; the cache arrays are updated in place
//! as FlashAttention-2's `flash_attn_with_kvcache` does. Every host-side
//! check of the CPU reference runs first on both paths (the same typed
//! errors; a failing call leaves the cache untouched). On a GPU (f16/bf16):
//! the tensor-core decode kernels (split-KV by the heuristic, or
//! `num_splits`); without one, or for f32 (the device KV-cache calls are
//! 16-bit), the CPU reference in f32
//! ([`reference::kvcache_attention`], [`reference::paged_kvcache_attention`],
//! [`reference::attention_varlen_paged`]).

use ndarray::{Array2, Array3, Array4, ArrayView2, ArrayView3, ArrayView4};

use crate::tensor::{AttnElem, Tensor, TensorLayout};
use crate::decode::{BlockTable, DecodeOptions, KvCache, MAX_SPLITS, PagedCache};
use crate::types::DType;
use crate::error::{FlashAttnError, Result};
use crate::ndarray_api::{Backend, DeviceSlopes, DeviceVarlen, default_backend, host_vec};
use crate::params::ForwardParams;
use crate::reference::decode::{CacheShape, check_kvcache_call, check_varlen_paged_call};
use crate::reference::{self, HostAlibi, PagedKv, PagedKvMut};

/// The cache of [`flash_attn_with_kvcache`], updated in place.
#[derive(Debug)]
pub enum HostKvCache<'a, T> {
    /// `(batch_c, seqlen_cache, nheads_k, d)`; sequence `b` in cache row
    /// `cache_batch_idx[b]` (default `b`).
    Contiguous { k_cache: &'a mut Array4<T>, v_cache: &'a mut Array4<T>, cache_batch_idx: Option<&'a [i32]> },
    /// `(num_blocks, page_size, nheads_k, d)` pages and the i32 block table
    /// `(batch, max_blocks_per_seq)`.
    Paged { k_pages: &'a mut Array4<T>, v_pages: &'a mut Array4<T>, block_table: ArrayView2<'a, i32> },
}

pub(crate) fn dims<T>(a: &ArrayView4<'_, T>) -> [usize; 4] {
    let (b, s, h, d) = a.dim();
    [b, s, h, d]
}

pub(crate) fn check_splits(num_splits: Option<usize>) -> Result<()> {
    match num_splits {
        Some(n) if n == 0 || n > MAX_SPLITS => Err(FlashAttnError::InvalidArgument {
            argument: "num_splits",
            value: n.to_string(),
            reason: "must be in 1..=128",
        }),
        _ => Ok(()),
    }
}

fn to_f32<T: AttnElem, D: ndarray::Dimension>(a: ndarray::ArrayView<'_, T, D>) -> ndarray::Array<f32, D> {
    a.mapv(|x| x.to_f32())
}

/// Attention of `q` `(batch, seqlen_q, nheads, d)` against a KV cache,
/// appending `k_new`/`v_new` `(batch, s_new, nheads_k, d)` at rows
/// `cache_seqlens[b]..` first (FlashAttention-2's `flash_attn_with_kvcache`;
/// causal/window bottom-right over the `cache_seqlens[b] + s_new` keys).
/// Returns O `(batch, seqlen_q, nheads, d)` and the logsumexp `(batch,
/// nheads, seqlen_q)`; the cache arrays hold the appended rows afterwards.
/// `num_splits`: split-KV on the GPU (`None`: the heuristic; 1 = off); the
/// CPU path computes one pass.
#[allow(clippy::too_many_arguments)]
pub fn flash_attn_with_kvcache<T: AttnElem>(
    q: ArrayView4<'_, T>,
    cache: HostKvCache<'_, T>,
    cache_seqlens: &[i32],
    k_new: Option<ArrayView4<'_, T>>,
    v_new: Option<ArrayView4<'_, T>>,
    params: &ForwardParams,
    alibi: Option<HostAlibi<'_>>,
    num_splits: Option<usize>,
) -> Result<(Array4<T>, Array3<f32>)> {
    check_splits(num_splits)?;
    let shape = match &cache {
        HostKvCache::Contiguous { k_cache, v_cache, cache_batch_idx } => {
            CacheShape::Contiguous { k: dims(&k_cache.view()), v: dims(&v_cache.view()), cache_batch_idx: *cache_batch_idx }
        }
        HostKvCache::Paged { k_pages, v_pages, block_table } => {
            CacheShape::Paged { k: dims(&k_pages.view()), v: dims(&v_pages.view()), block_table: *block_table }
        }
    };
    let new = (k_new.as_ref().map(dims), v_new.as_ref().map(dims));
    check_kvcache_call(dims(&q), shape, cache_seqlens, new, params, alibi.as_ref())?;
    let fa = match default_backend() {
        Backend::Gpu(fa) if T::DTYPE != DType::F32 => fa,
        _ => return kvcache_cpu(q, cache, cache_seqlens, (k_new, v_new), params, alibi),
    };
    let stream = fa.context().default_stream();
    let (batch, sq, nheads, d) = q.dim();
    let qd = stream.clone_htod(&host_vec(&q))?;
    let kn = k_new.as_ref().map(|a| stream.clone_htod(&host_vec(a))).transpose()?;
    let vn = v_new.as_ref().map(|a| stream.clone_htod(&host_vec(a))).transpose()?;
    let new_layout = k_new.as_ref().map(|a| TensorLayout::contiguous(dims(a)));
    let seqlens = stream.clone_htod(cache_seqlens)?;
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
    let out = fa.forward_kvcache::<T, _>(
        &stream,
        Tensor::new(&qd, TensorLayout::contiguous([batch, sq, nheads, d])),
        KvCache {
            k_cache: &mut kc,
            v_cache: &mut vc,
            layout,
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

/// The CPU path of [`flash_attn_with_kvcache`]: the reference in f32, the
/// cache converted there and back (appended rows included).
fn kvcache_cpu<T: AttnElem>(
    q: ArrayView4<'_, T>,
    cache: HostKvCache<'_, T>,
    cache_seqlens: &[i32],
    (k_new, v_new): (Option<ArrayView4<'_, T>>, Option<ArrayView4<'_, T>>),
    params: &ForwardParams,
    alibi: Option<HostAlibi<'_>>,
) -> Result<(Array4<T>, Array3<f32>)> {
    let qf = to_f32(q);
    let (knf, vnf) = (k_new.map(to_f32), v_new.map(to_f32));
    let (k_host, v_host, out) = match cache {
        HostKvCache::Contiguous { k_cache, v_cache, cache_batch_idx } => {
            let (mut kf, mut vf) = (to_f32(k_cache.view()), to_f32(v_cache.view()));
            let out = reference::kvcache_attention::<f32>(qf.view(), &mut kf, &mut vf, cache_seqlens, knf.as_ref().map(|a| a.view()), vnf.as_ref().map(|a| a.view()), cache_batch_idx, params, alibi)?;
            (k_cache, v_cache, (out, kf, vf))
        }
        HostKvCache::Paged { k_pages, v_pages, block_table } => {
            let (mut kf, mut vf) = (to_f32(k_pages.view()), to_f32(v_pages.view()));
            let pages = PagedKvMut { k_pages: kf.view_mut(), v_pages: vf.view_mut(), block_table: block_table.view() };
            let out = reference::paged_kvcache_attention::<f32>(qf.view(), pages, cache_seqlens, knf.as_ref().map(|a| a.view()), vnf.as_ref().map(|a| a.view()), params, alibi)?;
            (k_pages, v_pages, (out, kf, vf))
        }
    };
    let (out, kf, vf) = out;
    *k_host = kf.mapv(T::from_f32);
    *v_host = vf.mapv(T::from_f32);
    Ok((out.o.mapv(T::from_f32), out.lse))
}

/// Varlen prefill over a paged cache (prefix caching;
/// `flash_attn_varlen_func` with a block table): q `(total_q, nheads, d)`,
/// pages `(num_blocks, page_size, nheads_k, d)`, block table `(batch,
/// max_blocks_per_seq)`; sequence `b` attends to the first
/// `cu_seqlens_k[b+1] − cu_seqlens_k[b]` (or `seqused_k[b]`) keys of its
/// pages. Returns O `(total_q, nheads, d)` and the logsumexp `(nheads,
/// total_q)`. GPU (f16/bf16): the decode kernels; otherwise
/// [`reference::attention_varlen_paged`] in f32.
#[allow(clippy::too_many_arguments)]
pub fn flash_attn_varlen_paged_func<T: AttnElem>(
    q: ArrayView3<'_, T>,
    k_pages: ArrayView4<'_, T>,
    v_pages: ArrayView4<'_, T>,
    block_table: ArrayView2<'_, i32>,
    cu_seqlens_q: &[i32],
    cu_seqlens_k: &[i32],
    seqused_k: Option<&[i32]>,
    max_seqlen: (usize, usize),
    params: &ForwardParams,
    alibi: Option<HostAlibi<'_>>,
) -> Result<(Array3<T>, Array2<f32>)> {
    let (tq, nheads, d) = q.dim();
    check_varlen_paged_call(
        [tq, nheads, d],
        (dims(&k_pages), dims(&v_pages), block_table),
        (cu_seqlens_q, cu_seqlens_k, seqused_k),
        max_seqlen,
        params,
        alibi.as_ref(),
    )?;
    let fa = match default_backend() {
        Backend::Gpu(fa) if T::DTYPE != DType::F32 => fa,
        _ => {
            let (kf, vf) = (to_f32(k_pages), to_f32(v_pages));
            let pages = PagedKv { k_pages: kf.view(), v_pages: vf.view(), block_table: block_table.view() };
            let out = reference::attention_varlen_paged::<f32>(to_f32(q).view(), &pages, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen.0, max_seqlen.1, params, alibi)?;
            return Ok((out.o.mapv(T::from_f32), out.lse));
        }
    };
    let stream = fa.context().default_stream();
    let qd = stream.clone_htod(&host_vec(&q))?;
    let (kd, vd) = (stream.clone_htod(&host_vec(&k_pages))?, stream.clone_htod(&host_vec(&v_pages))?);
    let table = stream.clone_htod(&host_vec(&block_table))?;
    let dv = DeviceVarlen::upload(&stream, cu_seqlens_q, cu_seqlens_k, seqused_k)?;
    let slopes = DeviceSlopes::upload(&stream, alibi.as_ref())?;
    let (ext, varlen) = (slopes.extras(), dv.varlen(max_seqlen));
    let cache = PagedCache {
        k_pages: &kd,
        v_pages: &vd,
        layout: TensorLayout::contiguous(dims(&k_pages)),
        block_table: BlockTable { table: &table, max_blocks_per_seq: block_table.dim().1 },
    };
    let out = fa.forward_varlen_paged::<T, _>(&stream, Tensor::new(&qd, TensorLayout::varlen(tq, nheads, d)), cache, &varlen, params, &ext, DecodeOptions::default())?;
    let o = Array3::from_shape_vec((tq, nheads, d), stream.clone_dtoh(&out.o)?)?;
    let lse = Array2::from_shape_vec((nheads, tq), stream.clone_dtoh(&out.lse)?)?;
    Ok((o, lse))
}
