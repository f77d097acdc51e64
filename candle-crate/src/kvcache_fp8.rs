//! Decode against an FP8 (e4m3) KV cache on candle tensors: `k_cache` and
//! `v_cache` of dtype [`DType::F8E4M3`] with f32 scales (vLLM's
//! `k_scale`/`v_scale`: `k = k_scale · e4m3(k_cache)`, one scale for the
//! tensor or one per KV head), q, `k_new`, `v_new` and O in bf16 or f16.
//! New keys and values are quantized into the caches in place first,
//! `e4m3(x / scale)` rounded to nearest even and saturated to ±448, then
//! q attends over the dequantized cache.
//!
//! The call is [`FlashAttnKvCache::forward`]'s (same options, same in-place
//! machinery: one core call holding both caches for writing, everything
//! checked before the first write):
//!
//! * CUDA (feature `cuda`): the core's `forward_kvcache_fp8` on candle's
//!   stream and buffers (sm_90 and newer; elsewhere the core's `DeviceLacks`
//!   error). The scale values are read on the device, unchecked.
//! * CPU: the new rows quantized with `reference::fp8::e4m3_from_f32`, the
//!   caches dequantized to f32, the reference's `kvcache_attention` /
//!   `paged_kvcache_attention` over them; the appended codes written back
//!   into candle's buffers. Scales must be finite and positive.

use candle_core::backend::BackendStorage;
use candle_core::{CpuStorage, DType, Layout, Result, Tensor};
use flash_attn::reference::fp8::{e4m3_from_f32, e4m3_to_f32};
use flash_attn::reference::{self, PagedKvMut};
use flash_attn::TensorLayout;
use half::{bf16, f16};
use ndarray::{Array4, ArrayView2, s};

use crate::check::{self, core_err, err};
use crate::cpu;
use crate::kvcache::{FlashAttnKvCache, KvCacheArgs, KvChecked};
use crate::storage::Held;

/// The scales of an FP8 cache: f32, `()`/`(1)` (one for the tensor) or
/// `(nheads_k)` (one per KV head), both of one shape.
#[derive(Clone, Copy, Debug)]
pub(crate) struct KvScales<'a> {
    pub k_scale: &'a Tensor,
    pub v_scale: &'a Tensor,
}

/// q (and new rows) bf16 or f16, the caches F8E4M3.
pub(crate) fn check_dtypes(q: DType, k_cache: DType, v_cache: DType) -> Result<()> {
    for (argument, dt) in [("k_cache", k_cache), ("v_cache", v_cache)] {
        if dt != DType::F8E4M3 {
            return Err(err(format_args!("dtype mismatch: `{argument}` is {dt:?}, expected F8E4M3 (an FP8 KV cache)")));
        }
    }
    if !crate::fp8::OUT_DTYPES.contains(&q) {
        return Err(err(format_args!("`q`: dtype {q:?} is not supported with an FP8 KV cache (supported: {:?})", crate::fp8::OUT_DTYPES)));
    }
    Ok(())
}

/// `k_scale`, `v_scale`: F32, contiguous, `()`/`(1)` or `(nheads_k)`, one shape.
pub(crate) fn check_scales(s: &KvScales<'_>, nheads_k: usize) -> Result<()> {
    let mut lens = [0usize; 2];
    for (i, (argument, t)) in [("k_scale", s.k_scale), ("v_scale", s.v_scale)].into_iter().enumerate() {
        if t.dtype() != DType::F32 {
            return Err(err(format_args!("dtype mismatch: `{argument}` is {:?}, expected F32", t.dtype())));
        }
        lens[i] = match t.dims() {
            [] | [1] => 1,
            &[h] if h == nheads_k => h,
            dims => {
                return Err(err(format_args!(
                    "shape mismatch: `{argument}` is {dims:?}, expected () or (1) (one scale) or ({nheads_k}) (one per KV head)"
                )));
            }
        };
        if !t.is_contiguous() {
            return Err(err(format_args!("`{argument}` must be contiguous, got strides {:?}", t.stride())));
        }
    }
    if lens[0] != lens[1] {
        return Err(err(format_args!("shape mismatch: `v_scale` holds {} values but `k_scale` {}: they must have the same shape", lens[1], lens[0])));
    }
    Ok(())
}

impl FlashAttnKvCache {
    /// [`Self::forward`] over an FP8 cache (see the module docs): `k_cache`,
    /// `v_cache` F8E4M3 (head dims multiples of 16; on the GPU strides in
    /// multiples of 16 bytes), `k_scale`, `v_scale` f32 `()`/`(1)` or
    /// `(nheads_k)`; q and `a.k_new`/`a.v_new` bf16 or f16. Appends the new
    /// rows quantized, then attends. Returns O (q's dtype) and the
    /// logsumexp, f32 `(batch, num_heads_q, seq_len_q)`. Errors name the
    /// argument and leave the caches untouched.
    pub fn forward_fp8(&self, q: &Tensor, k_cache: &Tensor, v_cache: &Tensor, k_scale: &Tensor, v_scale: &Tensor, a: KvCacheArgs<'_>) -> Result<(Tensor, Tensor)> {
        self.run(q, k_cache, v_cache, a, Some(KvScales { k_scale, v_scale }))
    }
}

/// [`crate::flash_attn_with_kvcache`] over an FP8 (e4m3) cache: `k_new`/
/// `v_new` `(batch, seqlen_new, num_heads_kv, head_size)` (q's dtype) are
/// quantized (`e4m3(x / scale)`, round to nearest even, saturating to
/// ±448) into `k_cache`, `v_cache` in place at rows `cache_seqlens[b]..`,
/// then `q` `(batch, seq_len_q, num_heads_q, head_size)` attends to
/// `cache_seqlens[b] + seqlen_new` keys of the dequantized cache
/// (`k = k_scale · e4m3(code)`).
///
/// * `q`, `k_new`, `v_new`: bf16 or f16; O comes back in q's dtype.
/// * `k_cache`, `v_cache`: `DType::F8E4M3`, `(batch_c, seqlen_cache,
///   num_heads_kv, head_size)`, or pages `(num_blocks, page_block_size,
///   num_heads_kv, head_size)` with a `block_table`; head dims multiples of 16.
/// * `k_scale`, `v_scale`: f32 `()`/`(1)` or `(num_heads_kv)`, same shape.
/// * `cache_seqlens`, `block_table`, `causal`: as [`crate::flash_attn_with_kvcache`]
///   (`cache_seqlens` `None`: every sequence fills the whole cache, and
///   nothing may be appended).
///
/// More options (window, softcap, ALiBi, `cache_batch_idx`, split count)
/// and the logsumexp: [`FlashAttnKvCache::forward_fp8`].
///
/// ```
/// # fn main() -> candle_core::Result<()> {
/// use candle_core::{DType, Device, Tensor};
/// let dev = Device::Cpu;
/// let (k_cache, v_cache) = (Tensor::zeros((1, 256, 2, 64), DType::F8E4M3, &dev)?, Tensor::zeros((1, 256, 2, 64), DType::F8E4M3, &dev)?);
/// let scale = Tensor::new(&[0.01f32], &dev)?;
/// let q = Tensor::randn(0f32, 1., (1, 1, 8, 64), &dev)?.to_dtype(DType::BF16)?;
/// let k_new = Tensor::randn(0f32, 1., (1, 1, 2, 64), &dev)?.to_dtype(DType::BF16)?;
/// let lens = Tensor::new(&[17u32], &dev)?; // 17 tokens cached; the new one goes to row 17
/// let o = flash_attn_candle::flash_attn_with_kvcache_fp8(
///     &q, &k_cache, &v_cache, &scale, &scale, Some(&k_new), Some(&k_new), Some(&lens), None, 0.125, true)?;
/// assert_eq!(o.dims4()?, (1, 1, 8, 64));
/// # Ok(()) }
/// ```
#[allow(clippy::too_many_arguments)]
pub fn flash_attn_with_kvcache_fp8(
    q: &Tensor,
    k_cache: &Tensor,
    v_cache: &Tensor,
    k_scale: &Tensor,
    v_scale: &Tensor,
    k_new: Option<&Tensor>,
    v_new: Option<&Tensor>,
    cache_seqlens: Option<&Tensor>,
    block_table: Option<&Tensor>,
    softmax_scale: f32,
    causal: bool,
) -> Result<Tensor> {
    let (window_size_left, window_size_right) = crate::causal_window(causal);
    let op = FlashAttnKvCache { softmax_scale, alibi_slopes: None, window_size_left, window_size_right, softcap: None, num_splits: None };
    let full;
    let cache_seqlens = match cache_seqlens {
        Some(l) => l,
        None if k_new.is_some() || v_new.is_some() => {
            return Err(err("`cache_seqlens` is None but `k_new`/`v_new` are given: appending needs each sequence's cached length"));
        }
        None => {
            // Every sequence fills the whole cache (or its table's capacity).
            let (rows, batch) = match block_table {
                Some(bt) => {
                    let &[batch, max_blocks] = check::index_tensor("block_table", bt, "(batch, max_blocks_per_seq)", 2)? else {
                        return Err(err("`block_table` must have rank 2"));
                    };
                    (max_blocks * k_cache.dims().get(1).copied().unwrap_or(0), batch)
                }
                None => (k_cache.dims().get(1).copied().unwrap_or(0), q.dims().first().copied().unwrap_or(0)),
            };
            let rows = u32::try_from(rows).map_err(|_| err("`k_cache`: capacity exceeds u32"))?;
            full = Tensor::full(rows, batch, q.device())?;
            &full
        }
    };
    let args = KvCacheArgs { k_new, v_new, cache_seqlens, cache_batch_idx: None, block_table };
    Ok(op.forward_fp8(q, k_cache, v_cache, k_scale, v_scale, args)?.0)
}

/// A scale tensor on the CPU: host copy, every value finite and positive.
fn host_scale(argument: &str, t: &Tensor) -> Result<Vec<f32>> {
    let v = crate::fp8::host_f32(argument, t)?;
    if let Some(x) = v.iter().find(|x| !(x.is_finite() && **x > 0.0)) {
        return Err(err(format_args!("`{argument}`: {x} is not a finite positive scale")));
    }
    Ok(v)
}

/// Scale of KV head `h` (one per tensor or one per head).
fn head_scale(scales: &[f32], h: usize) -> f32 {
    if scales.len() == 1 { scales[0] } else { scales[h] }
}

/// A bf16/f16 tensor of the call as f32 (q, k_new, v_new).
fn widen(argument: &str, s: &CpuStorage, l: &Layout, tl: &TensorLayout) -> Result<Array4<f32>> {
    match s.dtype() {
        DType::BF16 => cpu::widen::<bf16>(s, l, tl),
        DType::F16 => cpu::widen::<f16>(s, l, tl),
        dt => Err(err(format_args!("`{argument}`: dtype {dt:?} is not supported with an FP8 KV cache"))),
    }
}

/// The CPU path (module docs). Returns O `(batch, seqlen_q, nheads, d)` in
/// q's dtype and the LSE `(batch, nheads, seqlen_q)`.
pub(crate) fn cpu(
    c: &KvChecked,
    a: &KvCacheArgs<'_>,
    scales: &KvScales<'_>,
    alibi: Option<&Tensor>,
    q: &Tensor,
    (k_st, k_l): (&mut CpuStorage, &Layout),
    (v_st, v_l): (&mut CpuStorage, &Layout),
) -> Result<(CpuStorage, CpuStorage)> {
    let lens = cpu::host_i32("cache_seqlens", a.cache_seqlens)?;
    let batch_idx = a.cache_batch_idx.map(|t| cpu::host_i32("cache_batch_idx", t)).transpose()?;
    let table = a.block_table.map(|t| cpu::host_i32("block_table", t)).transpose()?;
    let (ks, vs) = (host_scale("k_scale", scales.k_scale)?, host_scale("v_scale", scales.v_scale)?);
    let alibi = cpu::host_alibi(alibi, c.batch, c.q.nheads())?;
    let q_held = Held::new("q", q);
    let (qs, ql) = q_held.cpu()?;
    let out_dtype = qs.dtype();
    let qf = widen("q", qs, ql, &c.q)?;
    let deq = |codes: &Array4<u8>, sc: &[f32]| Array4::from_shape_fn(codes.dim(), |(r, t, h, e)| e4m3_to_f32(codes[(r, t, h, e)]) * head_scale(sc, h));
    let mut kc = deq(&crate::fp8::codes("k_cache", k_st, k_l, &c.k_cache)?, &ks);
    let mut vc = deq(&crate::fp8::codes("v_cache", v_st, v_l, &c.v_cache)?, &vs);
    // The new rows' codes, and their values as the cache will hold them.
    let new = match (a.held_new(), &c.new) {
        (Some([kn, vn]), Some((lk, lv))) => {
            let ((kn, kn_l), (vn, vn_l)) = (kn.cpu()?, vn.cpu()?);
            let quant = |x: Array4<f32>, sc: &[f32]| Array4::from_shape_fn(x.dim(), |(b, i, h, e)| e4m3_from_f32(x[(b, i, h, e)] / head_scale(sc, h)));
            let (kq, vq) = (quant(widen("k_new", kn, kn_l, lk)?, &ks), quant(widen("v_new", vn, vn_l, lv)?, &vs));
            let (kd, vd) = (deq(&kq, &ks), deq(&vq, &vs));
            Some((kq, vq, kd, vd))
        }
        _ => None,
    };
    let (kn, vn) = (new.as_ref().map(|n| n.2.view()), new.as_ref().map(|n| n.3.view()));
    let alibi = alibi.as_ref().map(cpu::Slopes::host);
    let out = match (&table, c.max_blocks) {
        (Some(table), Some(max_blocks)) => {
            let block_table = ArrayView2::from_shape((c.batch, max_blocks), table)
                .map_err(|_| err(format_args!("`block_table`: {} entries, expected ({}, {max_blocks})", table.len(), c.batch)))?;
            let pages = PagedKvMut { k_pages: kc.view_mut(), v_pages: vc.view_mut(), block_table };
            reference::paged_kvcache_attention::<f32>(qf.view(), pages, &lens, kn, vn, &c.params, alibi)
        }
        _ => reference::kvcache_attention::<f32>(qf.view(), &mut kc, &mut vc, &lens, kn, vn, batch_idx.as_deref(), &c.params, alibi),
    }
    .map_err(core_err)?;
    if let Some((kq, vq, _, _)) = &new {
        // The reference checked every slot: write the appended codes in place.
        let s_new = kq.dim().1;
        let page = c.k_cache.shape[1];
        for (b, &len) in lens.iter().enumerate() {
            for i in 0..s_new {
                let t = len as usize + i;
                let (outer, row) = match (&table, c.max_blocks) {
                    (Some(table), Some(max_blocks)) => (table[b * max_blocks + t / page] as usize, t % page),
                    _ => (batch_idx.as_ref().map_or(b, |x| x[b] as usize), t),
                };
                store_codes("k_cache", k_st, k_l, &c.k_cache, kq, (b, i), (outer, row))?;
                store_codes("v_cache", v_st, v_l, &c.v_cache, vq, (b, i), (outer, row))?;
            }
        }
    }
    let o = match out_dtype {
        DType::BF16 => CpuStorage::BF16(out.o.iter().map(|&x| bf16::from_f32(x)).collect()),
        _ => CpuStorage::F16(out.o.iter().map(|&x| f16::from_f32(x)).collect()),
    };
    Ok((o, CpuStorage::F32(out.lse.iter().copied().collect())))
}

/// Writes the codes of new row `(b, i)` (all heads) into candle's F8E4M3
/// buffer at cache row `(outer, row)`.
fn store_codes(argument: &str, dst: &mut CpuStorage, l: &Layout, tl: &TensorLayout, codes: &Array4<u8>, (b, i): (usize, usize), (outer, row): (usize, usize)) -> Result<()> {
    let CpuStorage::F8E4M3(data) = dst else {
        return Err(err(format_args!("dtype mismatch: `{argument}` is {:?}, expected F8E4M3", dst.dtype())));
    };
    let [sb, ss, sh] = tl.strides;
    let base = l.start_offset() + outer * sb + row * ss;
    for ((h, e), &x) in codes.slice(s![b, i, .., ..]).indexed_iter() {
        *data.get_mut(base + h * sh + e).ok_or_else(|| err(format_args!("`{argument}`: strides address past the buffer")))? = float8::F8E4M3::from_bits(x);
    }
    Ok(())
}
