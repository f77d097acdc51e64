//! The front end of the decode calls on [`FlashAttention`]: decode against
//! a KV cache that the call appends to ([`FlashAttention::forward_kvcache`])
//! or only reads ([`FlashAttention::forward_kvcache_ref`]), varlen prefill
//! over a paged cache ([`FlashAttention::forward_varlen_paged`]) and the
//! append alone ([`FlashAttention::append_kv`]): each validates, plans,
//! then launches.

use std::sync::Arc;

use cudarc::driver::{CudaStream, DevicePtr, DevicePtrMut};

use super::args::{BlockTable, CallerOut, DecodeOptions, KvCache, KvCacheRef, NewRows, OwnOut, PagedCache, allocated};
use super::validate::{check_cache, check_new, check_new_pair, check_q_o_alignment, invalid};
use crate::device::FlashAttention;
use crate::error::{FlashAttnError, Result};
use crate::params::ForwardParams;
use crate::tensor::{AttnElem, AttnOutput, Extras, Tensor, TensorLayout, TensorMut, Varlen};
use crate::types::DType;
use crate::validate::varlen::check_varlen_lens;

impl FlashAttention {
    /// Attention of `q` against a KV cache, appending `k_new`/`v_new` first
    /// (see the module docs). Returns O `(batch, seqlen_q, nheads, d)`
    /// contiguous and the logsumexp `(batch, nheads, seqlen_q)`; causal and
    /// window align bottom-right with each sequence's `cache_seqlens[b] +
    /// s_new` keys. Everything is validated before anything is enqueued (an
    /// error leaves the cache untouched). Only enqueues work on `stream`.
    pub fn forward_kvcache<T, Q>(
        &self,
        stream: &Arc<CudaStream>,
        q: Tensor<'_, Q>,
        cache: KvCache<'_, T>,
        params: &ForwardParams,
        ext: &Extras<'_>,
        opts: DecodeOptions<'_>,
    ) -> Result<AttnOutput<T>>
    where
        T: AttnElem,
        Q: DevicePtr<T> + ?Sized,
    {
        let (own, o_layout) = self.kvcache_call(stream, q, cache, None, params, ext, opts)?;
        let (o, lse) = allocated(own);
        Ok(AttnOutput { o, o_layout, lse })
    }

    /// [`FlashAttention::forward_kvcache`] into caller-owned buffers: O `o`
    /// (q's shape `(batch, seqlen_q, nheads, d)`, any non-overlapping
    /// strides; 16-byte aligned, strides of axes longer than 1 multiples of
    /// 8 elements) and the logsumexp `lse` (`(batch, nheads, seqlen_q)` f32,
    /// contiguous). Validated before anything is enqueued, as the
    /// allocating call.
    ///
    /// **CUDA graphs.** Without a split (`num_splits: Some(1)`), or with a
    /// caller's [`SplitScratch`](super::SplitScratch) sized for the call's split count, this call
    /// allocates nothing, copies nothing between host and device and never
    /// synchronizes: it only enqueues kernels on `stream`, so it can be
    /// captured (`CudaStream::begin_capture` … `end_capture`) and the graph
    /// replayed step after step. Each replay reads `cache_seqlens`, q,
    /// `k_new`/`v_new`, the block table and the cache from their buffers
    /// (their addresses are fixed at capture; their contents may change
    /// between replays); the launch shape and split count are fixed at
    /// capture (they depend on shapes only, never on device values). Give
    /// the scratch `counters` for the fused combine (else the combine is a
    /// second captured launch). Buffers a captured call uses should be
    /// created with cudarc's event tracking off
    /// (`CudaContext::disable_event_tracking`), as a graph cannot wait on
    /// events recorded outside it (`gpu_decode_cuda_graph` does this).
    #[allow(clippy::too_many_arguments)]
    pub fn forward_kvcache_into<T, Q, O>(
        &self,
        stream: &Arc<CudaStream>,
        q: Tensor<'_, Q>,
        cache: KvCache<'_, T>,
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
        self.kvcache_call(stream, q, cache, Some(CallerOut::new(o, lse)), params, ext, opts)?;
        Ok(())
    }

    /// The KV-cache call of [`FlashAttention::forward_kvcache`] (`out`
    /// `None`: O and the LSE allocated and returned, with O's layout) and
    /// [`FlashAttention::forward_kvcache_into`].
    #[allow(clippy::too_many_arguments)]
    fn kvcache_call<T, Q>(
        &self,
        stream: &Arc<CudaStream>,
        q: Tensor<'_, Q>,
        cache: KvCache<'_, T>,
        mut out: Option<CallerOut<'_, T>>,
        params: &ForwardParams,
        ext: &Extras<'_>,
        opts: DecodeOptions<'_>,
    ) -> Result<(Option<OwnOut<T>>, TensorLayout)>
    where
        T: AttnElem,
        Q: DevicePtr<T> + ?Sized,
    {
        let KvCache { k_cache, v_cache, layout, cache_seqlens, cache_batch_idx, block_table, k_new, v_new } = cache;
        let [batch, _, _, d] = q.layout.shape;
        let geom = check_cache(
            ("k_cache", "v_cache"),
            &layout,
            (k_cache.len(), v_cache.len()),
            d,
            batch,
            cache_batch_idx.map(|c| c.len()),
            block_table.as_ref(),
        )?;
        let new = check_new_pair(k_new, v_new, batch, &geom, d)?;
        let s_new = new.as_ref().map_or(0, |(kn, _)| kn.layout.shape[1]);
        let plan = self.plan_attend::<T>(&q.layout, q.data.len(), None, &geom, &layout, s_new, cache_seqlens.len(), params, ext, &opts, out.as_ref().map(CallerOut::spec), false)?;
        self.check_streams(stream, &[("q", q.data.stream()), ("k_cache", k_cache.stream()), ("v_cache", v_cache.stream())], out.as_ref())?;
        // A flash-decoding kernel built for it appends the new rows itself as
        // it reads them (decode step 21); the others run after an append
        // launch (K and V in one: decode step 20).
        let fused = new.as_ref().filter(|_| plan.dec.is_some_and(|k| k.append)).map(|(kn, vn)| (kn, vn));
        if let Some((kn, vn)) = &new
            && fused.is_none()
        {
            // q and o move in 16-byte chunks: checked before the append
            // touches the cache (attend_launch checks every pointer after
            // it; the library's own O is aligned).
            check_q_o_alignment(stream, q.data, out.as_mut(), &plan.params)?;
            self.append_launch::<T, T>(stream, (&mut *k_cache, kn), Some((&mut *v_cache, vn)), &layout, cache_seqlens, cache_batch_idx, block_table.as_ref(), &geom, None)?;
        }
        let (kp, _gk) = k_cache.device_ptr_mut(stream);
        let (vp, _gv) = v_cache.device_ptr_mut(stream);
        let own = self.attend_launch::<T>(stream, &plan, q.data, (kp, vp), cache_seqlens, cache_batch_idx, block_table.as_ref(), None, fused, ext, opts, out)?;
        Ok((own, plan.o_layout))
    }

    /// [`FlashAttention::forward_kvcache`] over a cache that the call only
    /// reads (new keys, if any, appended before by [`FlashAttention::append_kv`]
    /// and counted in `cache.seqlen_new`).
    pub fn forward_kvcache_ref<T, Q>(
        &self,
        stream: &Arc<CudaStream>,
        q: Tensor<'_, Q>,
        cache: KvCacheRef<'_, T>,
        params: &ForwardParams,
        ext: &Extras<'_>,
        opts: DecodeOptions<'_>,
    ) -> Result<AttnOutput<T>>
    where
        T: AttnElem,
        Q: DevicePtr<T> + ?Sized,
    {
        let (own, o_layout) = self.kvcache_ref_call(stream, q, cache, None, params, ext, opts)?;
        let (o, lse) = allocated(own);
        Ok(AttnOutput { o, o_layout, lse })
    }

    /// [`FlashAttention::forward_kvcache_ref`] into caller-owned buffers, as
    /// [`FlashAttention::forward_kvcache_into`] (and as it, capturable in a
    /// CUDA graph with a caller's [`SplitScratch`](super::SplitScratch); with
    /// [`FlashAttention::append_kv`] before it, the two-step decode step of
    /// engines that write their cache in an operation of its own).
    #[allow(clippy::too_many_arguments)]
    pub fn forward_kvcache_ref_into<T, Q, O>(
        &self,
        stream: &Arc<CudaStream>,
        q: Tensor<'_, Q>,
        cache: KvCacheRef<'_, T>,
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
        self.kvcache_ref_call(stream, q, cache, Some(CallerOut::new(o, lse)), params, ext, opts)?;
        Ok(())
    }

    /// The read-only KV-cache call of [`FlashAttention::forward_kvcache_ref`]
    /// and [`FlashAttention::forward_kvcache_ref_into`] (`out` as in
    /// [`FlashAttention::kvcache_call`]).
    #[allow(clippy::too_many_arguments)]
    fn kvcache_ref_call<T, Q>(
        &self,
        stream: &Arc<CudaStream>,
        q: Tensor<'_, Q>,
        cache: KvCacheRef<'_, T>,
        out: Option<CallerOut<'_, T>>,
        params: &ForwardParams,
        ext: &Extras<'_>,
        opts: DecodeOptions<'_>,
    ) -> Result<(Option<OwnOut<T>>, TensorLayout)>
    where
        T: AttnElem,
        Q: DevicePtr<T> + ?Sized,
    {
        let [batch, _, _, d] = q.layout.shape;
        let geom = check_cache(
            ("k_cache", "v_cache"),
            &cache.layout,
            (cache.k_cache.len(), cache.v_cache.len()),
            d,
            batch,
            cache.cache_batch_idx.map(|c| c.len()),
            cache.block_table.as_ref(),
        )?;
        if cache.seqlen_new > geom.capacity {
            return Err(invalid("seqlen_new", cache.seqlen_new.to_string(), "more appended keys than the cache holds (capacity)"));
        }
        let plan = self.plan_attend::<T>(&q.layout, q.data.len(), None, &geom, &cache.layout, cache.seqlen_new, cache.cache_seqlens.len(), params, ext, &opts, out.as_ref().map(CallerOut::spec), false)?;
        self.check_streams(stream, &[("q", q.data.stream()), ("k_cache", cache.k_cache.stream()), ("v_cache", cache.v_cache.stream())], out.as_ref())?;
        let (kp, _gk) = cache.k_cache.device_ptr(stream);
        let (vp, _gv) = cache.v_cache.device_ptr(stream);
        let own = self.attend_launch::<T>(
            stream,
            &plan,
            q.data,
            (kp, vp),
            cache.cache_seqlens,
            cache.cache_batch_idx,
            cache.block_table.as_ref(),
            None,
            None,
            ext,
            opts,
            out,
        )?;
        Ok((own, plan.o_layout))
    }

    /// Varlen prefill over a paged cache (prefix caching; FlashAttention-2's
    /// `flash_attn_varlen_func` with a `block_table`): q packed `(total_q,
    /// nheads, d)` ([`TensorLayout::varlen`]) with `varlen.cu_seqlens_q`;
    /// sequence `b` attends to the first `cu_seqlens_k[b+1] − cu_seqlens_k[b]`
    /// (or `seqused_k[b]`) keys of its pages — `cu_seqlens_k` gives lengths
    /// only. Causal/window bottom-right per sequence, window normalized with
    /// `max_seqlen_k`. Split-KV as for the decode call (`opts`). Returns O
    /// packed like q and the LSE `(nheads, total_q)`. A sequence longer than
    /// `min(max_seqlen_k, max_blocks_per_seq · page_size)` is cut to it in
    /// the kernel (device prefix sums are clamped, never out of bounds);
    /// q rows outside every sequence are left 0.
    #[allow(clippy::too_many_arguments)]
    pub fn forward_varlen_paged<T, Q>(
        &self,
        stream: &Arc<CudaStream>,
        q: Tensor<'_, Q>,
        cache: PagedCache<'_, T>,
        varlen: &Varlen<'_>,
        params: &ForwardParams,
        ext: &Extras<'_>,
        opts: DecodeOptions<'_>,
    ) -> Result<AttnOutput<T>>
    where
        T: AttnElem,
        Q: DevicePtr<T> + ?Sized,
    {
        let batch = check_varlen_lens(varlen)?;
        let d = q.layout.headdim();
        let geom = check_cache(
            ("k_pages", "v_pages"),
            &cache.layout,
            (cache.k_pages.len(), cache.v_pages.len()),
            d,
            batch,
            None,
            Some(&cache.block_table),
        )?;
        let plan = self.plan_attend::<T>(&q.layout, q.data.len(), Some(varlen), &geom, &cache.layout, 0, batch, params, ext, &opts, None, false)?;
        for (name, s) in [
            ("q", q.data.stream()),
            ("k_pages", cache.k_pages.stream()),
            ("v_pages", cache.v_pages.stream()),
            ("cu_seqlens_q", varlen.cu_seqlens_q.stream()),
            ("cu_seqlens_k", varlen.cu_seqlens_k.stream()),
            ("stream", stream),
        ] {
            self.check_stream(name, s)?;
        }
        if let Some(s) = varlen.seqused_k {
            self.check_stream("seqused_k", s.stream())?;
        }
        // The kernels take per-sequence key counts from cu_seqlens_k (and
        // seqused_k) when no cache_seqlens is given.
        let (kp, _gk) = cache.k_pages.device_ptr(stream);
        let (vp, _gv) = cache.v_pages.device_ptr(stream);
        let (o, lse) = allocated(self.attend_launch::<T>(stream, &plan, q.data, (kp, vp), varlen.cu_seqlens_k, None, Some(&cache.block_table), Some(varlen), None, ext, opts, None)?);
        Ok(AttnOutput { o, o_layout: plan.o_layout, lse })
    }

    /// Appends `new` `(batch, s_new, nheads_k, d)` to one cache tensor
    /// (k or v; `layout` as in [`KvCache`]) at rows `cache_seqlens[b]..` of
    /// cache row `cache_batch_idx[b]` (or of the pages of `block_table[b]`),
    /// as [`FlashAttention::forward_kvcache`] does before attending. Rows
    /// past a sequence's capacity are not written (device `cache_seqlens`
    /// are clamped, never out of bounds). Only enqueues work on `stream`.
    #[allow(clippy::too_many_arguments)]
    pub fn append_kv<T: AttnElem>(
        &self,
        stream: &Arc<CudaStream>,
        cache: &mut dyn DevicePtrMut<T>,
        layout: TensorLayout,
        new: Tensor<'_, impl DevicePtr<T>>,
        cache_seqlens: &dyn DevicePtr<i32>,
        cache_batch_idx: Option<&dyn DevicePtr<i32>>,
        block_table: Option<BlockTable<'_>>,
    ) -> Result<()> {
        if T::DTYPE == DType::F32 {
            return Err(FlashAttnError::Unsupported { argument: "cache", dtype: "f32", what: "the KV-cache calls (f16/bf16)" });
        }
        let new: NewRows<'_, T> = new.into();
        let [batch, _, _, d] = new.layout.shape;
        let len = cache.len();
        let geom = check_cache(("cache", "cache"), &layout, (len, len), d, batch, cache_batch_idx.map(|c| c.len()), block_table.as_ref())?;
        check_new("new", &new, batch, &geom, d)?;
        if cache_seqlens.len() != batch {
            return Err(invalid("cache_seqlens", format!("length {}", cache_seqlens.len()), "must hold one i32 per sequence (new's batch)"));
        }
        for (name, s) in [("cache", cache.stream()), ("new", new.data.stream()), ("stream", stream)] {
            self.check_stream(name, s)?;
        }
        self.append_launch::<T, T>(stream, (cache, &new), None, &layout, cache_seqlens, cache_batch_idx, block_table.as_ref(), &geom, None)
    }
}
