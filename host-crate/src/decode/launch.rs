//! The launches of the decode calls (the only `unsafe` of decode): the
//! append of new rows into a cache (`kv_append_*`), the attention of a
//! planned call and, split without the fused combine, `combine_splits_*`.

use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream, DevicePtr, DevicePtrMut, LaunchConfig, PushKernelArg};
use flash_attn_common::tc::timeline::WORDS as TIMELINE_WORDS;
use flash_attn_common::{AttnParams, DecodeParams};

use super::args::{BlockTable, CallerOut, DecodeOptions, NewRows, OwnOut};
use super::kernels::DecKernel;
use super::plan::AttendPlan;
use super::validate::{CacheGeom, invalid};
use crate::device::FlashAttention;
use crate::dispatch::Launch;
use crate::error::{FlashAttnError, Result};
use crate::tc::KernelArg;
use crate::tensor::{AttnElem, Extras, TensorLayout, Varlen};
use crate::types::DType;
use crate::validate::check_tc_alignment;

/// The kernels of this module (loaded with the others).
pub(crate) const DECODE_KERNELS: &[&str] = &["combine_splits_f16", "combine_splits_bf16", "kv_append_u16", "kv_append_u16_c"];
/// The quantizing appends into an FP8 cache (the sm_90 builds).
pub(crate) const DECODE_FP8_KERNELS: &[&str] = &["kv_append_e4m3_f16", "kv_append_e4m3_bf16"];
/// Warps per block of the combine kernel (`kernel-crate/src/decode.rs`).
const COMBINE_WARPS: u32 = 4;

/// The scale arrays of an FP8 call, as the kernels take them
/// (`AttnParams::k_descale_ptr`, …).
#[derive(Clone, Copy)]
pub(super) struct Quant {
    pub(super) k: u64,
    pub(super) v: u64,
    pub(super) head_stride: u32,
}

impl Quant {
    /// Default parameters with these scales.
    pub(super) fn params(self) -> AttnParams {
        AttnParams { k_descale_ptr: self.k, v_descale_ptr: self.v, descale_head_stride: self.head_stride, ..AttnParams::default() }
    }
}

impl FlashAttention {
    /// Enqueues `kv_append_u16` (arguments validated) for one cache tensor
    /// and its new rows, or two (K and V: same shapes, caches of the same
    /// `layout`) in the same launch.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn append_launch<T: AttnElem, C>(
        &self,
        stream: &Arc<CudaStream>,
        (cache, new): (&mut dyn DevicePtrMut<C>, &NewRows<'_, T>),
        second: Option<(&mut dyn DevicePtrMut<C>, &NewRows<'_, T>)>,
        layout: &TensorLayout,
        cache_seqlens: &dyn DevicePtr<i32>,
        cache_batch_idx: Option<&dyn DevicePtr<i32>>,
        block_table: Option<&BlockTable<'_>>,
        geom: &CacheGeom,
        quant: Option<Quant>,
    ) -> Result<()> {
        let [batch, s_new, nheads_k, d] = new.layout.shape;
        let u = |x: usize| x as u64;
        let (src, _gs) = new.data.device_ptr(stream);
        let (dst, _gd) = cache.device_ptr_mut(stream);
        let (src2, _gs2) = second.as_ref().map_or((0, None), |(_, n)| { let (ptr, g) = n.data.device_ptr(stream); (ptr, Some(g)) });
        let src2_strides = second.as_ref().map_or([0; 3], |(_, n)| n.layout.strides.map(|x| x as u64));
        let (dst2, _gd2) = match second {
            Some((c, _)) => { let (ptr, g) = c.device_ptr_mut(stream); (ptr, Some(g)) }
            None => (0, None),
        };
        let (cs, _gc) = cache_seqlens.device_ptr(stream);
        let cbi = cache_batch_idx.map(|c| c.device_ptr(stream));
        let bt = block_table.map(|b| (b.table.device_ptr(stream), b.max_blocks_per_seq));
        let p = AttnParams {
            q_ptr: src,
            q_stride: new.layout.strides.map(u),
            o_ptr: dst,
            o_stride: layout.strides.map(u),
            k_ptr: src2,
            k_stride: src2_strides,
            v_ptr: dst2,
            batch: batch as u32,
            seqlen_q: s_new as u32,
            nheads: nheads_k as u32,
            headdim: d as u32,
            seqlen_k: geom.capacity as u32,
            cache_seqlens_ptr: cs,
            cache_batch_idx_ptr: cbi.as_ref().map_or(0, |(ptr, _)| *ptr),
            cache_batch: geom.n_rows as u32,
            block_table_ptr: bt.as_ref().map_or(0, |((ptr, _), _)| *ptr),
            block_table_stride: bt.as_ref().map_or(0, |(_, m)| *m as u32),
            page_size: if geom.paged { geom.rows_per as u32 } else { 0 },
            num_pages: if geom.paged { geom.n_rows as u32 } else { 0 },
            ..quant.map_or_else(AttnParams::default, |q| q.params())
        };
        // Every tensor moves in 16-byte chunks: the tensor-core alignment rule.
        check_tc_alignment(&AttnParams { k_ptr: dst, k_stride: p.o_stride, v_ptr: dst, v_stride: p.o_stride, ..p })?;
        if dst2 != 0 {
            check_tc_alignment(&AttnParams { q_ptr: src2, q_stride: src2_strides, k_ptr: dst2, k_stride: p.o_stride, v_ptr: dst2, v_stride: p.o_stride, ..p })?;
        }
        let chunks = (batch * s_new * nheads_k * d / 8) as u64 * if dst2 != 0 { 2 } else { 1 };
        let cfg = LaunchConfig { grid_dim: (chunks.div_ceil(256).clamp(1, 1 << 16) as u32, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
        // The compact 184-byte block when it carries the call (no
        // cache_batch_idx, strides under 2³²): decode step 17.
        // (An FP8 cache's quantizing append takes the full block.)
        let compact = DecodeParams::from_attn(&p, 0, 0).filter(|_| quant.is_none()).map(KernelArg);
        let kernel = match quant {
            Some(_) if T::DTYPE == DType::BF16 => "kv_append_e4m3_bf16",
            Some(_) => "kv_append_e4m3_f16",
            None if compact.is_some() => "kv_append_u16_c",
            None => "kv_append_u16",
        };
        let (f, _) = self.prepare(&Launch { kernel, grid: 1, threads: 256, smem_bytes: 0 })?;
        let full = KernelArg(p);
        let mut launch = stream.launch_builder(f);
        match &compact {
            Some(c) => launch.arg(c),
            None => launch.arg(&full),
        };
        // SAFETY: `kv_append_u16(p: AttnParams)`: source (batch, s_new,
        // nheads_k, d) validated and 16-byte aligned; destination the
        // validated cache (rows past the capacity skipped, device values
        // clamped), and with v_ptr set a second source and cache of the same
        // shape and layout (validated by the caller, aligned above);
        // cache_seqlens holds batch i32. `kv_append_u16_c(c:
        // DecodeParams)` runs the same append on `c.to_attn(0, 0)` == `p`
        // (from_attn refuses what the block cannot carry).
        // `kv_append_e4m3_*(p: AttnParams)`: the same with one-byte cache
        // elements (strides and pointers 16-byte multiples: fp8::check_cache)
        // and the validated scale arrays of `quant`.
        unsafe { launch.launch(cfg) }?;
        Ok(())
    }
    /// Enqueues the attention (and, split, the combine) of a planned
    /// KV-cache call. `seqlens`: `cache_seqlens` (decode) or `cu_seqlens_k`
    /// (varlen, then `varlen` is `Some`).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn attend_launch<T: AttnElem>(
        &self,
        stream: &Arc<CudaStream>,
        plan: &AttendPlan,
        q: &(impl DevicePtr<T> + ?Sized),
        kv: (u64, u64),
        seqlens: &dyn DevicePtr<i32>,
        cache_batch_idx: Option<&dyn DevicePtr<i32>>,
        block_table: Option<&BlockTable<'_>>,
        varlen: Option<&Varlen<'_>>,
        new_kv: Option<(&NewRows<'_, T>, &NewRows<'_, T>)>,
        ext: &Extras<'_>,
        opts: DecodeOptions<'_>,
        caller: Option<CallerOut<'_, T>>,
    ) -> Result<Option<OwnOut<T>>> {
        let (ns, lse_len, d) = (plan.ns, plan.lse_len, plan.params.headdim as usize);
        let o_len = plan.o_layout.required_len().unwrap_or(0);
        // The caller's O and LSE (checked in the plan; dense q only), or the
        // library's.
        let mut own_out: Option<OwnOut<T>> = None;
        let (o, lse): (&mut dyn DevicePtrMut<T>, &mut dyn DevicePtrMut<f32>) = match caller {
            Some(c) => (c.o, c.lse),
            None => {
                let (o, l) = own_out.insert(if plan.varlen.is_some() {
                    // Packed q rows outside every sequence are written by no block: zeros.
                    (stream.alloc_zeros::<T>(o_len)?, stream.alloc_zeros::<f32>(lse_len)?)
                } else {
                    // SAFETY: dense q: every (sequence, row < seqlen_q, head) has a
                    // block (or a combine row) that writes its d columns of O and
                    // its LSE (an empty key range writes O = 0, LSE = −inf), so no
                    // element is read before it is written; two memsets less on the
                    // stream of every decode step.
                    unsafe { (stream.alloc::<T>(o_len)?, stream.alloc::<f32>(lse_len)?) }
                });
                (o, l)
            }
        };
        let mut own: Option<(CudaSlice<f32>, CudaSlice<f32>)> = None;
        let mut opts = opts;
        if ns > 1 && opts.scratch.is_none() {
            // SAFETY: f32 scratch; every element the combine reads is first
            // written by a split (dense), or zeroed below (varlen).
            own = Some(unsafe { (stream.alloc::<f32>(ns * lse_len * d)?, stream.alloc::<f32>(ns * lse_len)?) });
        }
        // The stream guards drop at the end of this block, after the launches.
        {
            let (qp, _gq) = q.device_ptr(stream);
            let (kp, vp) = kv;
            let (sp, _gs) = seqlens.device_ptr(stream);
            let cbi = cache_batch_idx.map(|c| c.device_ptr(stream));
            let bt = block_table.map(|b| (b.table.device_ptr(stream), b.max_blocks_per_seq));
            let alibi = ext.alibi_slopes.map(|a| (a.slopes.device_ptr(stream), a.shape.batch_stride(plan.nheads)));
            let cu_q = varlen.map(|v| v.cu_seqlens_q.device_ptr(stream));
            let used = varlen.and_then(|v| v.seqused_k).map(|s| s.device_ptr(stream));
            let (o_ptr, _go) = o.device_ptr_mut(stream);
            let (lse_ptr, _gl) = lse.device_ptr_mut(stream);
            let mut p = AttnParams {
                q_ptr: qp,
                k_ptr: kp,
                v_ptr: vp,
                o_ptr,
                lse_ptr,
                alibi_ptr: alibi.as_ref().map_or(0, |((ptr, _), _)| *ptr),
                alibi_batch_stride: alibi.as_ref().map_or(0, |(_, s)| *s as u32),
                cache_batch_idx_ptr: cbi.as_ref().map_or(0, |(ptr, _)| *ptr),
                block_table_ptr: bt.as_ref().map_or(0, |((ptr, _), _)| *ptr),
                block_table_stride: bt.as_ref().map_or(0, |(_, m)| *m as u32),
                ..plan.params
            };
            match &cu_q {
                Some((cq, _)) => {
                    p.cu_seqlens_q_ptr = *cq;
                    p.cu_seqlens_k_ptr = sp;
                    p.seqused_k_ptr = used.as_ref().map_or(0, |(ptr, _)| *ptr);
                }
                None => p.cache_seqlens_ptr = sp,
            }
            check_tc_alignment(&p)?;
            // The append fused into the flash-decoding kernel (DecKernel::append):
            // the new rows' buffers, 16-byte chunks as the cache's.
            let kn = new_kv.map(|(kn, _)| (kn.data.device_ptr(stream), kn.layout.strides.map(|x| x as u64)));
            let vn = new_kv.map(|(_, vn)| (vn.data.device_ptr(stream), vn.layout.strides.map(|x| x as u64)));
            if let (Some(((kptr, _), ks)), Some(((vptr, _), vs))) = (&kn, &vn) {
                (p.knew_ptr, p.knew_stride, p.vnew_ptr, p.vnew_stride) = (*kptr, *ks, *vptr, *vs);
                check_tc_alignment(&AttnParams { q_ptr: *kptr, q_stride: *ks, k_ptr: *vptr, k_stride: *vs, ..p })?;
            }
            let caller_scratch = opts.scratch.is_some();
            let (scratch_ptrs, caller_counters) = match (ns > 1, &mut own, &mut opts.scratch) {
                (false, _, _) => (None, None),
                (true, Some((oa, la)), _) => (Some((oa.device_ptr_mut(stream), la.device_ptr_mut(stream))), None),
                (true, None, Some(sc)) => (Some((sc.o_accum.device_ptr_mut(stream), sc.lse_accum.device_ptr_mut(stream))), sc.counters.as_mut().map(|c| c.device_ptr_mut(stream))),
                (true, None, None) => unreachable!("scratch allocated above"),
            };
            // Fused combine (flash-decoding kernels, split): the caller's
            // counters, or the library's for this stream when the scratch
            // is the library's; a caller scratch without counters keeps the
            // combine launch.
            let counters = match (ns > 1 && plan.dec.is_some(), &caller_counters, caller_scratch) {
                (false, _, _) => None,
                (true, Some((c, _)), _) => Some(*c),
                (true, None, false) => Some(self.split_counters(stream, plan.main.grid as usize)?),
                (true, None, true) => None,
            };
            match counters {
                Some(ptr) => p.split_counter_ptr = ptr,
                // The tickets live in the fused combine's counters.
                None => p.split_tickets = 0,
            }
            let timeline = match opts.timeline.as_mut() {
                None => None,
                Some(_) if plan.dec.is_none() => return Err(FlashAttnError::Unsupported { argument: "timeline", dtype: T::DTYPE.name(), what: "a timeline of a call that does not run a flash-decoding kernel" }),
                Some(t) if t.len() < plan.grid as usize * TIMELINE_WORDS => {
                    return Err(invalid("timeline", format!("{} u64", t.len()), "needs timeline::WORDS u64 per thread block of the launch"));
                }
                Some(t) => Some(t.device_ptr_mut(stream)),
            };
            if let Some((ptr, _)) = &timeline {
                p.scratch_ptr = *ptr;
            }
            if let Some(((oa, _), (la, _))) = &scratch_ptrs {
                p.o_accum_ptr = *oa;
                p.lse_accum_ptr = *la;
                if plan.varlen.is_some() {
                    // Varlen: q rows outside every sequence are written by no
                    // split; zeros combine to O = 0 there.
                    for (ptr, n) in [(*oa, ns * lse_len * d), (*la, ns * lse_len)] {
                        // SAFETY: the scratch holds ≥ n f32 (allocated above or checked in the plan).
                        unsafe { cudarc::driver::result::memset_d8_async(ptr, 0, 4 * n, stream.cu_stream()) }?;
                    }
                }
            }
            // The compact entry when the call fits its 184-byte block (the
            // same kernel body on the same values: docs/perf-notes.md decode
            // step 17); a timeline needs the full block.
            let compact = match plan.compact {
                Some((k, forced)) => match DecodeParams::from_attn(&p, DecKernel::BR as u32, k.bc as u32).filter(|_| timeline.is_none()) {
                    Some(c) => k.compact.map(|name| (name, KernelArg(c))),
                    None if forced => {
                        return Err(FlashAttnError::Unsupported {
                            argument: "opts.kernel",
                            dtype: T::DTYPE.name(),
                            what: "a compact flash-decoding entry for a call with ALiBi, softcap, varlen, seqused_k, cache_batch_idx, a timeline, new k/v to append, or strides over 32 bits",
                        });
                    }
                    None => None,
                },
                None => None,
            };
            let main = Launch { kernel: compact.as_ref().map_or(plan.main.kernel, |(name, _)| name), ..plan.main };
            let (f, mut cfg) = self.prepare(&main)?;
            cfg.grid_dim.0 = plan.grid;
            let full = KernelArg(p);
            let mut launch = stream.launch_builder(f);
            match &compact {
                Some((_, c)) => launch.arg(c),
                None => launch.arg(&full),
            };
            // SAFETY: `flash_fwd_tc_fa2d_*(p: AttnParams)` / `flash_fwd_tc_dec_*(p:
            // AttnParams)`: q, o validated (head packing re-strides within the same
            // elements), the cache validated against its layout with device-side
            // lengths, indices and pages clamped in the kernel; partials (when
            // split) ≥ ns·lse_len(·d) f32; the kernel's threads and shared memory,
            // num_m·ns·batch·heads blocks. `flash_fwd_tc_dec_*_c(c: DecodeParams)`
            // runs the same kernel on `c.to_attn(16, bc)` == `p` (from_attn refuses
            // what the block cannot carry, and br, bc other than this kernel's).
            unsafe { launch.launch(cfg) }?;

            if ns > 1 && counters.is_none() {
                let name = if T::DTYPE == DType::BF16 { "combine_splits_bf16" } else { "combine_splits_f16" };
                let (f, _) = self.prepare(&Launch { kernel: name, grid: 1, threads: 32 * COMBINE_WARPS, smem_bytes: 0 })?;
                let cfg = LaunchConfig {
                    grid_dim: ((lse_len as u64).div_ceil(COMBINE_WARPS as u64).clamp(1, 1 << 20) as u32, 1, 1),
                    block_dim: (32 * COMBINE_WARPS, 1, 1),
                    shared_mem_bytes: 0,
                };
                // The combine walks the unpacked rows: (batch, nheads, seqlen_q)
                // or, varlen, (nheads, total_q).
                let mut o_stride = plan.o_layout.strides.map(|x| x as u64);
                if plan.varlen.is_some() {
                    o_stride[0] = 0;
                }
                let cp = AttnParams { nheads: plan.nheads as u32, seqlen_q: plan.sq as u32, o_stride, ..p };
                let arg = KernelArg(cp);
                // SAFETY: `combine_splits_*(p: AttnParams)`: partials written by the
                // launch above (same stream), lse_len rows; o and lse allocated
                // above or the caller's (checked in the plan: O's layout in
                // its buffer, lse_len f32).
                unsafe { stream.launch_builder(f).arg(&arg).launch(cfg) }?;
            }
            drop(scratch_ptrs);
            drop(caller_counters);
            drop(timeline);
            drop((kn, vn));
        }
        Ok(own_out)
    }
}
