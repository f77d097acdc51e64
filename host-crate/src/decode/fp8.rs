//! FP8 (e4m3) KV caches: decode against a cache of one-byte e4m3 codes
//! with f32 dequantization scales — vLLM's `k_scale`/`v_scale`, one per
//! tensor or one per KV head: `k = k_scale · e4m3(k_cache)`. Half the bytes
//! of a 16-bit cache stream per decode step, and twice the tokens fit.
//!
//! The flash-decoding kernels' `F8` builds (`DEC_F8_KERNELS`) copy the codes
//! into shared memory, convert them there exactly to the call's f16/bf16
//! (`cvt.rn.f16x2.e4m3x2`, sm_89+), and fold `k_scale` into the softmax
//! scale (and softcap) and `v_scale` into O. New keys and values (f16/bf16)
//! are quantized into the cache first by `kv_append_e4m3_*`: `e4m3(x /
//! scale)`, round to nearest even, saturating to ±448 — the rounding of
//! [`crate::reference::fp8::e4m3_from_f32`].
//!
//! The kernels are in the sm_90 PTX builds (Hopper and newer); other devices
//! get [`FlashAttnError::DeviceLacks`]. Same layouts, page sizes, GQA packing,
//! split-KV, masks and modifiers as [`FlashAttention::forward_kvcache`], for
//! calls with at most 16 query rows per (sequence, head) as launched (one
//! token, the packed query heads of a GQA group, or a few speculative
//! tokens); head dims that are multiples of 16, and cache strides (and
//! buffers) multiples of 16 bytes.

use std::sync::Arc;

use cudarc::driver::{CudaStream, DevicePtr, DevicePtrMut};
use flash_attn_common::AttnParams;

use super::args::{BlockTable, CallerOut, DecodeCache, DecodeOptions, NewRows, OwnOut, allocated, cache_builders, sealed};
use super::launch::Quant;
use super::validate::{check_cache, check_new, check_new_pair, check_q_o_alignment, invalid};
use crate::device::FlashAttention;
use crate::error::{FlashAttnError, Result};
use crate::params::ForwardParams;
use crate::tensor::{AttnElem, AttnOutput, Extras, Tensor, TensorLayout, TensorMut};
use crate::types::DType;

/// An FP8 (e4m3) KV cache of a decode call: as [`super::KvCache`], with the
/// cache tensors holding one-byte e4m3 codes (`u8`: the bit patterns of
/// `float8_e4m3fn`, as vLLM and PyTorch store them) and their f32 scales.
/// `layout` counts elements (= bytes): `(batch_c, seqlen_cache, nheads_k, d)`
/// or, with a block table, `(num_pages, page_size, nheads_k, d)`.
pub struct KvCacheFp8<'a, T> {
    pub k_cache: &'a mut dyn DevicePtrMut<u8>,
    pub v_cache: &'a mut dyn DevicePtrMut<u8>,
    pub layout: TensorLayout,
    /// f32 on the device: one scale for the whole tensor, or one per KV head
    /// (`nheads_k`); `k_scale` and `v_scale` of the same length.
    pub k_scale: &'a dyn DevicePtr<f32>,
    pub v_scale: &'a dyn DevicePtr<f32>,
    pub cache_seqlens: &'a dyn DevicePtr<i32>,
    pub cache_batch_idx: Option<&'a dyn DevicePtr<i32>>,
    pub block_table: Option<BlockTable<'a>>,
    /// New keys and values `(batch, s_new, nheads_k, d)` in the call's
    /// 16-bit type, quantized into the cache first.
    pub k_new: Option<Tensor<'a, dyn DevicePtr<T> + 'a>>,
    pub v_new: Option<Tensor<'a, dyn DevicePtr<T> + 'a>>,
}

impl<'a, T> KvCacheFp8<'a, T> {
    /// A contiguous FP8 cache with its scales, as [`super::KvCache::new`]:
    /// no batch index, no block table, nothing appended; the `with_`
    /// methods add them.
    pub fn new<K, V, KS, VS, S>(k_cache: &'a mut K, v_cache: &'a mut V, layout: TensorLayout, k_scale: &'a KS, v_scale: &'a VS, cache_seqlens: &'a S) -> Self
    where
        K: DevicePtrMut<u8>,
        V: DevicePtrMut<u8>,
        KS: DevicePtr<f32>,
        VS: DevicePtr<f32>,
        S: DevicePtr<i32>,
    {
        Self { k_cache, v_cache, layout, k_scale, v_scale, cache_seqlens, cache_batch_idx: None, block_table: None, k_new: None, v_new: None }
    }
}

// The new rows (f16/bf16) are quantized into the cache.
cache_builders!(KvCacheFp8, appends);

/// FP8 caches move in 16-byte chunks of 16 codes: head dims and strides in
/// multiples of 16 bytes.
fn check_layout_fp8(name: &'static str, layout: &TensorLayout) -> Result<()> {
    let d = layout.headdim();
    if !d.is_multiple_of(16) {
        return Err(invalid(name, format!("headdim {d}"), "an FP8 cache needs a head dim that is a multiple of 16 (16-byte chunks of codes)"));
    }
    if let Some(s) = layout.strides.iter().find(|s| !s.is_multiple_of(16)) {
        return Err(invalid(name, format!("stride {s} in strides {:?}", layout.strides), "an FP8 cache needs strides that are multiples of 16 bytes"));
    }
    Ok(())
}

fn check_ptr_fp8(name: &'static str, ptr: u64) -> Result<()> {
    if !ptr.is_multiple_of(16) {
        return Err(FlashAttnError::Misaligned { argument: name, requirement: "a 16-byte aligned device address", value: ptr });
    }
    Ok(())
}

/// The scales' head stride: 0 for one scale per tensor, 1 for one per KV head.
fn scale_head_stride(k_len: usize, v_len: usize, nheads_k: usize) -> Result<u32> {
    if k_len != v_len {
        return Err(invalid("v_scale", format!("length {v_len}"), "must have k_scale's length"));
    }
    match k_len {
        1 => Ok(0),
        n if n == nheads_k => Ok(1),
        n => Err(invalid("k_scale", format!("length {n}"), "must hold one f32 (per tensor) or nheads_k (per KV head)")),
    }
}

impl FlashAttention {
    /// Refuses FP8 caches on builds without their kernels, naming the device.
    fn check_fp8_device(&self) -> Result<()> {
        if self.has_fp8_kv_cache() {
            return Ok(());
        }
        let (major, minor) = self.compute_capability();
        Err(FlashAttnError::DeviceLacks {
            name: self.device_name().to_string(),
            major,
            minor,
            what: "FP8 (e4m3) KV caches, which need sm_90 (Hopper) or newer",
        })
    }

    /// [`FlashAttention::forward_kvcache`] over an FP8 (e4m3) cache (see
    /// the module docs): appends `k_new`/`v_new` (quantized) first, then
    /// attends. Returns O `(batch, seqlen_q, nheads, d)` in `T` and the
    /// logsumexp `(batch, nheads, seqlen_q)`, those of attention over the
    /// dequantized cache. Everything is validated before anything is
    /// enqueued.
    pub fn forward_kvcache_fp8<T, Q>(
        &self,
        stream: &Arc<CudaStream>,
        q: Tensor<'_, Q>,
        cache: KvCacheFp8<'_, T>,
        params: &ForwardParams,
        ext: &Extras<'_>,
        opts: DecodeOptions<'_>,
    ) -> Result<AttnOutput<T>>
    where
        T: AttnElem,
        Q: DevicePtr<T> + ?Sized,
    {
        let (own, o_layout) = self.kvcache_fp8_call(stream, q, cache, None, params, ext, opts)?;
        let (o, lse) = allocated(own);
        Ok(AttnOutput { o, o_layout, lse })
    }

    /// [`FlashAttention::forward_kvcache_fp8`] into caller-owned buffers, as
    /// [`FlashAttention::forward_kvcache_into`] (and as it, capturable in a
    /// CUDA graph with a caller's `SplitScratch`).
    #[allow(clippy::too_many_arguments)]
    pub fn forward_kvcache_fp8_into<T, Q, O>(
        &self,
        stream: &Arc<CudaStream>,
        q: Tensor<'_, Q>,
        cache: KvCacheFp8<'_, T>,
        o: TensorMut<'_, O>,
        lse: &mut dyn DevicePtrMut<f32>,
        params: &ForwardParams,
        ext: &Extras<'_>,
        opts: DecodeOptions<'_>,
    ) -> Result<()>
    where
        T: AttnElem,
        Q: DevicePtr<T> + ?Sized,
        O: DevicePtrMut<T>,
    {
        self.kvcache_fp8_call(stream, q, cache, Some(CallerOut::new(o, lse)), params, ext, opts)?;
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    fn kvcache_fp8_call<T, Q>(
        &self,
        stream: &Arc<CudaStream>,
        q: Tensor<'_, Q>,
        cache: KvCacheFp8<'_, T>,
        mut out: Option<CallerOut<'_, T>>,
        params: &ForwardParams,
        ext: &Extras<'_>,
        opts: DecodeOptions<'_>,
    ) -> Result<(Option<OwnOut<T>>, TensorLayout)>
    where
        T: AttnElem,
        Q: DevicePtr<T> + ?Sized,
    {
        let KvCacheFp8 { k_cache, v_cache, layout, k_scale, v_scale, cache_seqlens, cache_batch_idx, block_table, k_new, v_new } = cache;
        self.check_fp8_device()?;
        let [batch, _, _, d] = q.layout.shape;
        let geom = check_cache(("k_cache", "v_cache"), &layout, (k_cache.len(), v_cache.len()), d, batch, cache_batch_idx.map(|c| c.len()), block_table.as_ref())?;
        check_layout_fp8("k_cache", &layout)?;
        let head_stride = scale_head_stride(k_scale.len(), v_scale.len(), geom.nheads_k)?;
        let new = check_new_pair(k_new, v_new, batch, &geom, d)?;
        let s_new = new.as_ref().map_or(0, |(kn, _)| kn.layout.shape[1]);
        let mut plan = self.plan_attend::<T>(&q.layout, q.data.len(), None, &geom, &layout, s_new, cache_seqlens.len(), params, ext, &opts, out.as_ref().map(CallerOut::spec), true)?;
        self.check_streams(
            stream,
            &[("q", q.data.stream()), ("k_cache", k_cache.stream()), ("v_cache", v_cache.stream()), ("k_scale", k_scale.stream()), ("v_scale", v_scale.stream())],
            out.as_ref(),
        )?;
        for (name, c) in [("k_cache", &mut *k_cache), ("v_cache", &mut *v_cache)] {
            let (ptr, _g) = c.device_ptr_mut(stream);
            check_ptr_fp8(name, ptr)?;
        }
        let (ks, _gks) = k_scale.device_ptr(stream);
        let (vs, _gvs) = v_scale.device_ptr(stream);
        let quant = Quant { k: ks, v: vs, head_stride };
        plan.params = AttnParams { k_descale_ptr: ks, v_descale_ptr: vs, descale_head_stride: head_stride, ..plan.params };
        if let Some((kn, vn)) = &new {
            // q and o are checked before the append touches the cache.
            check_q_o_alignment(stream, q.data, out.as_mut(), &plan.params)?;
            self.append_launch::<T, u8>(stream, (&mut *k_cache, kn), Some((&mut *v_cache, vn)), &layout, cache_seqlens, cache_batch_idx, block_table.as_ref(), &geom, Some(quant))?;
        }
        let (kp, _gk) = k_cache.device_ptr_mut(stream);
        let (vp, _gv) = v_cache.device_ptr_mut(stream);
        let own = self.attend_launch::<T>(stream, &plan, q.data, (kp, vp), cache_seqlens, cache_batch_idx, block_table.as_ref(), None, None, ext, opts, out)?;
        Ok((own, plan.o_layout))
    }

    /// Quantizes `new` `(batch, s_new, nheads_k, d)` (f16/bf16) into one FP8
    /// cache tensor (k or v; `layout` as in [`KvCacheFp8`]) at rows
    /// `cache_seqlens[b]..`: the code of `x` is `e4m3(x / scale)` (round to
    /// nearest even, saturating to ±448), `scale` one f32 or one per KV head.
    /// As [`FlashAttention::append_kv`] otherwise. Only enqueues work on
    /// `stream`.
    #[allow(clippy::too_many_arguments)]
    pub fn append_kv_fp8<T: AttnElem>(
        &self,
        stream: &Arc<CudaStream>,
        cache: &mut dyn DevicePtrMut<u8>,
        layout: TensorLayout,
        scale: &dyn DevicePtr<f32>,
        new: Tensor<'_, impl DevicePtr<T>>,
        cache_seqlens: &dyn DevicePtr<i32>,
        cache_batch_idx: Option<&dyn DevicePtr<i32>>,
        block_table: Option<BlockTable<'_>>,
    ) -> Result<()> {
        if T::DTYPE == DType::F32 {
            return Err(FlashAttnError::Unsupported { argument: "new", dtype: "f32", what: "the KV-cache calls (f16/bf16)" });
        }
        self.check_fp8_device()?;
        let new: NewRows<'_, T> = new.into();
        let [batch, _, _, d] = new.layout.shape;
        let len = cache.len();
        let geom = check_cache(("cache", "cache"), &layout, (len, len), d, batch, cache_batch_idx.map(|c| c.len()), block_table.as_ref())?;
        check_layout_fp8("cache", &layout)?;
        let head_stride = scale_head_stride(scale.len(), scale.len(), geom.nheads_k)?;
        check_new("new", &new, batch, &geom, d)?;
        if cache_seqlens.len() != batch {
            return Err(invalid("cache_seqlens", format!("length {}", cache_seqlens.len()), "must hold one i32 per sequence (new's batch)"));
        }
        for (name, s) in [("cache", cache.stream()), ("new", new.data.stream()), ("scale", scale.stream()), ("stream", stream)] {
            self.check_stream(name, s)?;
        }
        {
            let (ptr, _g) = cache.device_ptr_mut(stream);
            check_ptr_fp8("cache", ptr)?;
        }
        let (sp, _gs) = scale.device_ptr(stream);
        let quant = Quant { k: sp, v: 0, head_stride };
        self.append_launch::<T, u8>(stream, (cache, &new), None, &layout, cache_seqlens, cache_batch_idx, block_table.as_ref(), &geom, Some(quant))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scales_per_tensor_or_per_kv_head() {
        assert_eq!(scale_head_stride(1, 1, 8).unwrap(), 0);
        assert_eq!(scale_head_stride(8, 8, 8).unwrap(), 1);
        assert!(scale_head_stride(8, 1, 8).is_err());
        assert!(scale_head_stride(4, 4, 8).is_err());
        // One KV head: a single scale is both readings, stride 0.
        assert_eq!(scale_head_stride(1, 1, 1).unwrap(), 0);
    }

    #[test]
    fn fp8_layouts_move_in_16_byte_chunks() {
        assert!(check_layout_fp8("k_cache", &TensorLayout::contiguous([2, 64, 8, 128])).is_ok());
        assert!(check_layout_fp8("k_cache", &TensorLayout::contiguous([2, 64, 8, 40])).is_err());
        let padded = TensorLayout { shape: [2, 64, 8, 128], strides: [64 * 8 * 144, 8 * 144, 144] };
        assert!(check_layout_fp8("k_cache", &padded).is_ok());
        let bad = TensorLayout { shape: [2, 64, 8, 128], strides: [64 * 8 * 136, 8 * 136, 136] };
        assert!(check_layout_fp8("k_cache", &bad).is_err());
    }
}
