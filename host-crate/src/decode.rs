//! Decode: attention of a few query tokens against a KV cache (contiguous
//! or paged), with new keys/values appended in place first, split-KV
//! (flash-decoding) with the LSE combine, and GQA head packing
//! (`../shared/INFERENCE.md`). f16/bf16 on the tensor cores (`fa2d` kernels).
//!
//! ```text
//! k_cache, v_cache   (batch_c, seqlen_cache, nheads_k, d)         contiguous
//!                    (num_pages, page_size, nheads_k, d)          paged (block_table)
//! cache_seqlens      i32 (batch): keys already cached per sequence
//! k_new, v_new       (batch, s_new, nheads_k, d), written at rows cache_seqlens[b]..
//! q                  (batch, seqlen_q, nheads, d); attends to cache_seqlens[b] + s_new keys
//! ```
//!
//! Device-side values the host cannot see (`cache_seqlens`,
//! `cache_batch_idx`, `block_table` entries) are clamped in the kernels to
//! the capacity, the cache batch and the page count: never an access out of
//! bounds (`gpu_decode` runs them under compute-sanitizer memcheck).
//!
//! * **Split-KV**: each (query block, head) cuts its keys into `num_splits`
//!   parts run by separate thread blocks, each writing a normalized partial
//!   O and its LSE in f32; `combine_splits_*` merges them and rounds once.
//!   `num_splits`: forced by the caller or FlashAttention-2's heuristic
//!   ([`num_splits_heuristic`]). Scratch: allocated per call on the stream,
//!   or a caller's [`SplitScratch`] (fixed size: CUDA-graph capture).
//! * **Head packing**: one query token and `g = nheads / nheads_k > 1` query
//!   heads per KV head, without window or ALiBi: the `g` heads become the
//!   rows of one tile (a re-striding of q and o, no copy), so each KV head is
//!   read once per step instead of `g` times.

use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream, DevicePtr, DevicePtrMut, LaunchConfig, PushKernelArg};
use flash_attn_common::AttnParams;

use crate::api::{AttnElem, Extras, ForwardOutput, RowStats, Tensor, TensorLayout};
use crate::device::FlashAttention;
use crate::dispatch::{DType, Dims, DispatchKey, Features, Launch, Plan};
use crate::error::{FlashAttnError, Result};
use crate::params::{ForwardParams, LoopOrder};
use crate::varlen::{check_alibi, check_gqa};

/// The kernels of this module (loaded with the others).
pub const DECODE_KERNELS: &[&str] = &["combine_splits_f16", "combine_splits_bf16", "kv_append_u16"];
/// Largest `num_splits` (FlashAttention-2's bound).
pub const MAX_SPLITS: usize = 128;
/// Warps per block of the combine kernel (`kernel-crate/src/decode.rs`).
const COMBINE_WARPS: u32 = 4;

/// A paged cache's block table: i32 `(batch, max_blocks_per_seq)`; key `t`
/// of sequence `b` is row `t % page_size` of page `block_table[b][t / page_size]`.
#[derive(Clone, Copy)]
pub struct BlockTable<'a> {
    pub table: &'a dyn DevicePtr<i32>,
    pub max_blocks_per_seq: usize,
}

/// The KV cache of a decode call. `layout` describes k_cache and v_cache
/// alike: `(batch_c, seqlen_cache, nheads_k, d)` or, with a block table,
/// `(num_pages, page_size, nheads_k, d)`.
pub struct KvCache<'a, T> {
    pub k_cache: &'a mut dyn DevicePtrMut<T>,
    pub v_cache: &'a mut dyn DevicePtrMut<T>,
    pub layout: TensorLayout,
    pub cache_seqlens: &'a dyn DevicePtr<i32>,
    pub cache_batch_idx: Option<&'a dyn DevicePtr<i32>>,
    pub block_table: Option<BlockTable<'a>>,
    /// New keys and values `(batch, s_new, nheads_k, d)` to append first.
    pub k_new: Option<Tensor<'a, dyn DevicePtr<T> + 'a>>,
    pub v_new: Option<Tensor<'a, dyn DevicePtr<T> + 'a>>,
}

/// Caller-owned split-KV scratch (fixed size: usable under CUDA-graph
/// capture): `o_accum` ≥ `max_splits · batch · nheads · seqlen_q · d` f32,
/// `lse_accum` ≥ `max_splits · batch · nheads · seqlen_q` f32.
pub struct SplitScratch<'a> {
    pub o_accum: &'a mut dyn DevicePtrMut<f32>,
    pub lse_accum: &'a mut dyn DevicePtrMut<f32>,
    pub max_splits: usize,
}

/// Options of a decode call.
#[derive(Default)]
pub struct DecodeOptions<'a> {
    /// `None`: the heuristic; `Some(1)`: no split; at most [`MAX_SPLITS`]
    /// (and the scratch's `max_splits`).
    pub num_splits: Option<usize>,
    pub scratch: Option<SplitScratch<'a>>,
}

/// FlashAttention-2's split heuristic: with `work` thread blocks for
/// `slots` resident slots (2 per SM) and `n_blocks` key blocks, the smallest
/// split count whose wave efficiency is within 85% of the best (no split
/// when the work already fills 80% of the slots; FA3: none for ≤ 4 key
/// blocks).
pub fn num_splits_heuristic(
    work: usize,
    slots: usize,
    n_blocks: usize,
    max_splits: usize,
) -> usize {
    if work as f64 >= 0.8 * slots as f64 || n_blocks <= 4 {
        return 1;
    }
    let max_splits = max_splits.min(slots).min(n_blocks).max(1);
    let eff = |s: usize| {
        let w = (work * s) as f64 / slots as f64;
        w / w.ceil()
    };
    let eligible = |s: usize| s == 1 || n_blocks.div_ceil(s) != n_blocks.div_ceil(s - 1);
    let best = (1..=max_splits)
        .filter(|&s| eligible(s))
        .map(eff)
        .fold(0.0, f64::max);
    (1..=max_splits)
        .find(|&s| eligible(s) && eff(s) >= 0.85 * best)
        .unwrap_or(1)
}

fn invalid(argument: &'static str, value: String, reason: &'static str) -> FlashAttnError {
    FlashAttnError::InvalidArgument {
        argument,
        value,
        reason,
    }
}

impl FlashAttention {
    /// Attention of `q` against a KV cache, appending `k_new`/`v_new` first
    /// (see the module docs). Returns O `(batch, seqlen_q, nheads, d)`
    /// contiguous and the logsumexp `(batch, nheads, seqlen_q)`; causal and
    /// window align bottom-right with each sequence's `cache_seqlens[b] +
    /// s_new` keys. Only enqueues work on `stream`.
    pub fn forward_kvcache<T, Q>(
        &self,
        stream: &Arc<CudaStream>,
        q: Tensor<'_, Q>,
        cache: KvCache<'_, T>,
        params: &ForwardParams,
        ext: &Extras<'_>,
        opts: DecodeOptions<'_>,
    ) -> Result<ForwardOutput<T>>
    where
        T: AttnElem,
        Q: DevicePtr<T> + ?Sized,
    {
        let dtype = T::DTYPE;
        if dtype == DType::F32 {
            return Err(FlashAttnError::Unsupported {
                argument: "q",
                dtype: "f32",
                what: "the KV-cache call (f16/bf16 tensor-core kernels; the CPU reference has f32/f64)",
            });
        }
        if params.loop_order != LoopOrder::Fa2 {
            return Err(FlashAttnError::Unsupported {
                argument: "params.loop_order",
                dtype: dtype.name(),
                what: "the KV-cache call with FA1 or Standard (it runs the FA2 loop order)",
            });
        }
        let [batch, sq, nheads, d] = q.layout.shape;
        crate::api::check_layout("q", &q.layout, q.data.len())?;
        let cl = cache.layout;
        let [n_rows, rows_per, nheads_k, dk] = cl.shape;
        crate::api::check_layout("k_cache", &cl, cache.k_cache.len())?;
        crate::api::check_layout("v_cache", &cl, cache.v_cache.len())?;
        if dk != d {
            return Err(FlashAttnError::ShapeMismatch {
                argument: "k_cache",
                axis: "headdim",
                actual: dk,
                expected: d,
                rule: "same as q",
            });
        }
        check_gqa(nheads, nheads_k)?;
        if cache.cache_seqlens.len() != batch {
            return Err(invalid(
                "cache_seqlens",
                format!("length {}", cache.cache_seqlens.len()),
                "must hold one i32 per sequence (q's batch)",
            ));
        }
        if let Some(idx) = cache.cache_batch_idx {
            if cache.block_table.is_some() {
                return Err(invalid(
                    "cache_batch_idx",
                    "given".into(),
                    "applies to contiguous caches; a paged cache has a block table",
                ));
            }
            if idx.len() != batch {
                return Err(invalid(
                    "cache_batch_idx",
                    format!("length {}", idx.len()),
                    "must hold one i32 per sequence (q's batch)",
                ));
            }
        } else if cache.block_table.is_none() && n_rows < batch {
            return Err(invalid(
                "k_cache",
                format!("batch_c = {n_rows} < batch = {batch}"),
                "needs a cache row per sequence (or cache_batch_idx)",
            ));
        }
        // Capacity: keys one sequence can hold.
        let capacity = match &cache.block_table {
            Some(bt) => {
                if rows_per == 0 || bt.max_blocks_per_seq == 0 {
                    return Err(invalid(
                        "block_table",
                        format!(
                            "page_size {rows_per}, {} blocks per sequence",
                            bt.max_blocks_per_seq
                        ),
                        "must be positive",
                    ));
                }
                if bt.table.len() < batch * bt.max_blocks_per_seq {
                    return Err(invalid(
                        "block_table",
                        format!("length {}", bt.table.len()),
                        "must hold batch · max_blocks_per_seq i32",
                    ));
                }
                bt.max_blocks_per_seq
                    .checked_mul(rows_per)
                    .filter(|&c| c <= crate::api::MAX_DIM)
                    .ok_or_else(|| {
                        invalid(
                            "block_table",
                            format!("{} blocks of {rows_per}", bt.max_blocks_per_seq),
                            "capacity exceeds 2³¹ − 1 keys",
                        )
                    })?
            }
            None => rows_per,
        };
        let s_new = match (&cache.k_new, &cache.v_new) {
            (None, None) => 0,
            (Some(kn), Some(vn)) => {
                if kn.layout.shape != vn.layout.shape {
                    return Err(invalid(
                        "v_new",
                        format!("shape {:?}", vn.layout.shape),
                        "must have k_new's shape",
                    ));
                }
                crate::api::check_layout("k_new", &kn.layout, kn.data.len())?;
                crate::api::check_layout("v_new", &vn.layout, vn.data.len())?;
                let [b2, s_new, h2, d2] = kn.layout.shape;
                if (b2, h2, d2) != (batch, nheads_k, d) {
                    return Err(invalid(
                        "k_new",
                        format!("shape {:?}", kn.layout.shape),
                        "must be (batch, s_new, nheads_k, headdim)",
                    ));
                }
                if s_new > capacity {
                    return Err(invalid(
                        "k_new",
                        format!("{s_new} new keys"),
                        "more new keys than the cache holds (capacity)",
                    ));
                }
                s_new
            }
            _ => {
                return Err(invalid(
                    "v_new",
                    "missing or extra".into(),
                    "k_new and v_new come together",
                ));
            }
        };
        let opts_r = params.resolve(d, capacity)?;
        if let Some(a) = &ext.alibi_slopes {
            check_alibi(a.shape, a.slopes.len(), batch, nheads)?;
        }
        let max_splits = opts
            .scratch
            .as_ref()
            .map_or(MAX_SPLITS, |s| s.max_splits.min(MAX_SPLITS));
        if let Some(n) = opts.num_splits
            && (n == 0 || n > max_splits)
        {
            return Err(invalid(
                "num_splits",
                n.to_string(),
                "must be in 1..=128 and at most the scratch's max_splits",
            ));
        }
        for (name, s) in [
            ("q", q.data.stream()),
            ("k_cache", cache.k_cache.stream()),
            ("v_cache", cache.v_cache.stream()),
        ] {
            self.check_stream(name, s)?;
        }
        self.check_stream("stream", stream)?;

        // ---- head packing (one token, GQA, no window/ALiBi) ---------------
        let group = nheads / nheads_k;
        let pack = sq == 1
            && group > 1
            && opts_r.window_left < 0
            && opts_r.window_right < 0
            && ext.alibi_slopes.is_none();
        let o_layout = TensorLayout::contiguous([batch, sq, nheads, d]);
        let (rq, rh) = if pack {
            (group, nheads_k)
        } else {
            (sq, nheads)
        };
        let pack_strides = |s: [usize; 3]| if pack { [s[0], s[2], s[2] * group] } else { s };

        // ---- plan ----------------------------------------------------------
        let features = Features {
            varlen: false,
            mods: true,
            decode: true,
        };
        let key = DispatchKey {
            dtype,
            headdim: d,
            causal: params.causal && !pack,
            loop_order: LoopOrder::Fa2,
            arch: self.compute_capability(),
            features,
        };
        let dims = Dims {
            batch,
            nheads: rh,
            nheads_k,
            seqlen_q: rq,
            seqlen_k: capacity,
            headdim: d,
        };
        let Plan::TcFa2 { kernel, main } =
            crate::dispatch::plan(&key, &dims, None, &self.limits())?
        else {
            unreachable!("decode dispatch gives the tensor-core FA2 plan")
        };
        let num_m = rq.div_ceil(kernel.br());
        let work = batch * rh * num_m;
        let n_blocks = capacity.div_ceil(kernel.bc);
        let ns = opts.num_splits.unwrap_or_else(|| {
            num_splits_heuristic(work, 2 * self.num_sms(), n_blocks, max_splits)
        });
        let lse_len = batch * nheads * sq;
        let grid = (main.grid as u64)
            .checked_mul(ns as u64)
            .filter(|&g| g <= i32::MAX as u64)
            .ok_or_else(|| FlashAttnError::DimTooLarge {
                argument: "num_splits",
                axis: "grid blocks",
                value: ns,
                max: i32::MAX as usize,
            })? as u32;

        // ---- buffers -------------------------------------------------------
        let mut o = stream.alloc_zeros::<T>(o_layout.required_len().unwrap_or(0))?;
        let mut lse = stream.alloc_zeros::<f32>(lse_len)?;
        let mut own: Option<(CudaSlice<f32>, CudaSlice<f32>)> = None;
        let mut opts = opts;
        if ns > 1 && opts.scratch.is_none() {
            // SAFETY: f32 scratch, every element read by the combine is first
            // written by a split (each split writes all its rows).
            own = Some(unsafe {
                (
                    stream.alloc::<f32>(ns * lse_len * d)?,
                    stream.alloc::<f32>(ns * lse_len)?,
                )
            });
        }
        if let Some(sc) = &opts.scratch
            && ns > 1
            && (sc.o_accum.len() < ns * lse_len * d || sc.lse_accum.len() < ns * lse_len)
        {
            return Err(invalid(
                "scratch",
                format!("{} / {} f32", sc.o_accum.len(), sc.lse_accum.len()),
                "too small for num_splits · batch · nheads · seqlen_q (· d)",
            ));
        }

        // The stream guards below drop at the end of this block, after the launches.
        {
            let (q_ptr, _gq) = q.data.device_ptr(stream);
            let (k_ptr, _gk) = cache.k_cache.device_ptr_mut(stream);
            let (v_ptr, _gv) = cache.v_cache.device_ptr_mut(stream);
            let (cs_ptr, _gcs) = cache.cache_seqlens.device_ptr(stream);
            let cbi = cache.cache_batch_idx.map(|c| c.device_ptr(stream));
            let bt = cache
                .block_table
                .map(|b| (b.table.device_ptr(stream), b.max_blocks_per_seq));
            let alibi = ext
                .alibi_slopes
                .map(|a| (a.slopes.device_ptr(stream), a.shape.batch_stride(nheads)));
            let (o_ptr, _go) = o.device_ptr_mut(stream);
            let (lse_ptr, _gl) = lse.device_ptr_mut(stream);
            let u = |x: usize| x as u64;
            let mut p = AttnParams {
                q_ptr,
                k_ptr,
                v_ptr,
                o_ptr,
                lse_ptr,
                q_stride: pack_strides(q.layout.strides).map(u),
                k_stride: cl.strides.map(u),
                v_stride: cl.strides.map(u),
                o_stride: pack_strides(o_layout.strides).map(u),
                batch: batch as u32,
                nheads: rh as u32,
                nheads_k: nheads_k as u32,
                seqlen_q: rq as u32,
                seqlen_k: capacity as u32,
                headdim: d as u32,
                causal: key.causal as u32,
                alibi_ptr: alibi.as_ref().map_or(0, |((ptr, _), _)| *ptr),
                alibi_batch_stride: alibi.as_ref().map_or(0, |(_, s)| *s as u32),
                cache_seqlens_ptr: cs_ptr,
                cache_batch_idx_ptr: cbi.as_ref().map_or(0, |(ptr, _)| *ptr),
                cache_batch: n_rows as u32,
                seqlen_new: s_new as u32,
                block_table_ptr: bt.as_ref().map_or(0, |((ptr, _), _)| *ptr),
                block_table_stride: bt.as_ref().map_or(0, |(_, m)| *m as u32),
                page_size: if bt.is_some() { rows_per as u32 } else { 0 },
                num_pages: if bt.is_some() { n_rows as u32 } else { 0 },
                num_splits: ns as u32,
                br: kernel.br() as u32,
                bc: kernel.bc as u32,
                ..opts_r.kernel_params()
            };
            crate::api::check_tc_alignment(&p)?;

            // ---- 1. append k_new, v_new ----------------------------------------
            if let (Some(kn), Some(vn)) = (&cache.k_new, &cache.v_new) {
                let (f, _) = self.prepare(&Launch {
                    kernel: "kv_append_u16",
                    grid: 1,
                    threads: 256,
                    smem_bytes: 0,
                })?;
                let chunks = (batch * s_new * nheads_k * d / 8) as u64;
                let cfg = LaunchConfig {
                    grid_dim: (chunks.div_ceil(256).clamp(1, 1 << 16) as u32, 1, 1),
                    block_dim: (256, 1, 1),
                    shared_mem_bytes: 0,
                };
                for (src, dst, dst_stride) in [(kn, k_ptr, cl.strides), (vn, v_ptr, cl.strides)] {
                    let (src_ptr, _gs) = src.data.device_ptr(stream);
                    let ap = AttnParams {
                        q_ptr: src_ptr,
                        q_stride: src.layout.strides.map(u),
                        o_ptr: dst,
                        o_stride: dst_stride.map(u),
                        batch: batch as u32,
                        seqlen_q: s_new as u32,
                        nheads: nheads_k as u32,
                        headdim: d as u32,
                        seqlen_k: capacity as u32,
                        ..p
                    };
                    crate::api::check_tc_alignment(&AttnParams {
                        k_ptr: src_ptr,
                        k_stride: src.layout.strides.map(u),
                        ..p
                    })?;
                    let arg = crate::tc::KernelArg(ap);
                    // SAFETY: `kv_append_u16(p: AttnParams)`: source (batch, s_new,
                    // nheads_k, d) validated and 16-byte aligned; destination the
                    // validated cache (rows past the capacity skipped, device
                    // values clamped); cache_seqlens holds batch i32.
                    unsafe { stream.launch_builder(f).arg(&arg).launch(cfg) }?;
                }
            }

            // ---- 2. attention (partials when split) ----------------------------
            let scratch_ptrs = if ns > 1 {
                Some(match (&mut own, &mut opts.scratch) {
                    (Some((oa, la)), _) => (oa.device_ptr_mut(stream), la.device_ptr_mut(stream)),
                    (None, Some(sc)) => (
                        sc.o_accum.device_ptr_mut(stream),
                        sc.lse_accum.device_ptr_mut(stream),
                    ),
                    (None, None) => unreachable!("scratch allocated above"),
                })
            } else {
                None
            };
            if let Some(((oa, _), (la, _))) = &scratch_ptrs {
                p.o_accum_ptr = *oa;
                p.lse_accum_ptr = *la;
            }
            let (f, mut cfg) = self.prepare(&main)?;
            cfg.grid_dim.0 = grid;
            let arg = crate::tc::KernelArg(p);
            // SAFETY: `flash_fwd_tc_fa2d_*(p: AttnParams)`: q, o validated (head
            // packing re-strides within the same elements), the cache validated
            // against its layout with device-side lengths, indices and pages
            // clamped in the kernel; partials (when split) ≥ ns·lse_len(·d) f32;
            // the kernel's threads and shared memory, num_m·ns·batch·heads blocks.
            unsafe { stream.launch_builder(f).arg(&arg).launch(cfg) }?;

            // ---- 3. combine ------------------------------------------------------
            if ns > 1 {
                let name = if dtype == DType::BF16 {
                    "combine_splits_bf16"
                } else {
                    "combine_splits_f16"
                };
                let (f, _) = self.prepare(&Launch {
                    kernel: name,
                    grid: 1,
                    threads: 32 * COMBINE_WARPS,
                    smem_bytes: 0,
                })?;
                let cfg = LaunchConfig {
                    grid_dim: (
                        (lse_len as u64)
                            .div_ceil(COMBINE_WARPS as u64)
                            .clamp(1, 1 << 20) as u32,
                        1,
                        1,
                    ),
                    block_dim: (32 * COMBINE_WARPS, 1, 1),
                    shared_mem_bytes: 0,
                };
                // The combine walks the unpacked (batch, nheads, seqlen_q) rows.
                let cp = AttnParams {
                    nheads: nheads as u32,
                    seqlen_q: sq as u32,
                    o_stride: o_layout.strides.map(u),
                    ..p
                };
                let arg = crate::tc::KernelArg(cp);
                // SAFETY: `combine_splits_*(p: AttnParams)`: partials written by the
                // launch above (same stream), lse_len rows; o and lse as allocated.
                unsafe { stream.launch_builder(f).arg(&arg).launch(cfg) }?;
            }
            drop(scratch_ptrs);
        }
        Ok(ForwardOutput {
            o,
            o_layout,
            stats: RowStats::LogSumExp(lse),
        })
    }
}
