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
//!   `num_splits`: forced by the caller, else a heuristic: for the
//!   flash-decoding kernels the busiest SM's key blocks
//!   ([`decode_splits_heuristic`]), for the `fa2d` tile FlashAttention-2's
//!   wave efficiency ([`num_splits_heuristic`]). Scratch: allocated per call on the stream,
//!   or a caller's [`SplitScratch`] (fixed size: CUDA-graph capture).
//! * **Head packing**: one query token and `g = nheads / nheads_k > 1` query
//!   heads per KV head, without window or ALiBi: the `g` heads become the
//!   rows of one tile (a re-striding of q and o, no copy), so each KV head is
//!   read once per step instead of `g` times.

use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream, DevicePtr, DevicePtrMut, LaunchConfig, PushKernelArg};
use flash_attn_common::{AttnParams, DecodeParams, INTERLEAVE_PAGED, MAX_TICKET_BLOCKS};
use flash_attn_common::tc::timeline::WORDS as TIMELINE_WORDS;
/// The flash-decoding kernels' per-block timeline layout ([`DecodeOptions::timeline`]).
pub use flash_attn_common::tc::timeline;

use crate::api::{AttnElem, Extras, ForwardOutput, RowStats, Tensor, TensorLayout, TensorMut};
use crate::decode_kernels::DecKernel;
use crate::device::FlashAttention;
use crate::dispatch::{DispatchKey, Launch, Plan};
use crate::types::{DType, Dims, Features};
use crate::error::{FlashAttnError, Result};
use crate::params::{ForwardParams, LoopOrder};
use crate::varlen::{check_alibi, check_gqa};
use crate::varlen_api::{Varlen, VarlenOutput, check_varlen_lens};

/// The kernels of this module (loaded with the others).
pub const DECODE_KERNELS: &[&str] = &["combine_splits_f16", "combine_splits_bf16", "kv_append_u16", "kv_append_u16_c"];
/// The quantizing appends into an FP8 cache (the sm_90 builds).
pub const DECODE_FP8_KERNELS: &[&str] = &["kv_append_e4m3_f16", "kv_append_e4m3_bf16"];

#[path = "decode_fp8.rs"]
mod fp8;
pub use fp8::KvCacheFp8;
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
///
/// `counters` (optional): u32 tile counters for the fused combine of the
/// flash-decoding kernels (the last split of each tile merges the partials:
/// no combine launch), at least `batch · nheads · ⌈seqlen_q / 16⌉` of them
/// (one per tile of 16 query rows of a (sequence, head); varlen: the
/// longest sequence's `seqlen_q`), **zeroed once** by the caller before the first call and
/// put back to 0 by every launch (keep them to one stream at a time).
/// Without them the combine runs as a second launch. Calls without a
/// caller scratch use the library's own per-stream counters.
pub struct SplitScratch<'a> {
    pub o_accum: &'a mut dyn DevicePtrMut<f32>,
    pub lse_accum: &'a mut dyn DevicePtrMut<f32>,
    pub max_splits: usize,
    pub counters: Option<&'a mut dyn DevicePtrMut<u32>>,
}

/// A caller's output buffers of [`FlashAttention::forward_kvcache_into`].
struct CallerOut<'a, T> {
    o: &'a mut dyn DevicePtrMut<T>,
    o_layout: TensorLayout,
    lse: &'a mut dyn DevicePtrMut<f32>,
}

impl<'a, T> CallerOut<'a, T> {
    fn new<O: DevicePtrMut<T>>(o: TensorMut<'a, O>, lse: &'a mut dyn DevicePtrMut<f32>) -> Self {
        Self { o: o.data, o_layout: o.layout, lse }
    }

    /// What the plan checks of these buffers.
    fn spec(&self) -> OutSpec {
        OutSpec { o_layout: self.o_layout, o_len: self.o.len(), lse_len: self.lse.len() }
    }
}

/// O and the LSE allocated by the library for a call.
type OwnOut<T> = (CudaSlice<T>, CudaSlice<f32>);

/// The library's O and LSE of a call that was given no buffers
/// ([`FlashAttention::attend_launch`] allocates them exactly then).
fn allocated<T>(own: Option<OwnOut<T>>) -> OwnOut<T> {
    own.expect("the library's buffers when the caller gives none")
}

/// What [`FlashAttention::plan_attend`] checks of a caller's outputs:
/// O's layout and buffer length, the LSE buffer's length.
#[derive(Clone, Copy)]
struct OutSpec {
    o_layout: TensorLayout,
    o_len: usize,
    lse_len: usize,
}

/// Options of a decode call.
#[derive(Default)]
pub struct DecodeOptions<'a> {
    /// `None`: the heuristic; `Some(1)`: no split; at most [`MAX_SPLITS`]
    /// (and the scratch's `max_splits`).
    pub num_splits: Option<usize>,
    pub scratch: Option<SplitScratch<'a>>,
    /// Forces a kernel by name (benchmarks, tests): a flash-decoding kernel
    /// ([`crate::decode_kernels::DEC_KERNELS`]: its `name` runs the entry
    /// taking the full `AttnParams`, its `compact` name the entry taking the
    /// 184-byte `DecodeParams`, an error for a call that block cannot carry)
    /// or the call's `fa2d` tile kernel. `None`: the flash-decoding kernel
    /// for calls with at most 16 rows per (sequence, head) — through its
    /// compact entry when the call fits one — else the `fa2d` kernel.
    pub kernel: Option<&'static str>,
    /// A per-block timeline of the flash-decoding kernel (profiling:
    /// `decode-tune --timeline`): [`timeline::WORDS`] u64 per thread block,
    /// written by thread 0 of each (SM, split, both clocks at each point
    /// of [`timeline::POINTS`]). Calls that run another
    /// kernel return [`FlashAttnError::Unsupported`].
    pub timeline: Option<&'a mut CudaSlice<u64>>,
    /// Split-KV in the flash-decoding kernels: `true` gives each split a
    /// fixed share of a tile's key blocks (split `s` of `ns`: blocks `s, s +
    /// ns, …` over a contiguous cache, and over pages of at least a key
    /// block on devices that gain from it ([`INTERLEAVE_PAGED`]); else a
    /// contiguous run), so the same inputs give the same bits on every run
    /// on one device. `false` (default), with the fused
    /// combine: a tile's key blocks go to its splits one at a time (a ticket
    /// count per tile, [`AttnParams::split_tickets`]), so splits on SMs that
    /// stream faster take more blocks and the call waits less for its
    /// slowest SM; the partial sums then run in a different order on each
    /// run (the result agrees to rounding, not bitwise). Paged caches,
    /// calls with fewer than [`MIN_TICKET_BLOCKS_PER_SPLIT`] key blocks per
    /// split, kernels built without the schedule ([`DecKernel::tickets`]),
    /// and devices with more than [`MAX_TICKET_BANDWIDTH_PER_SM`] of DRAM
    /// bandwidth per SM (the H200) keep the fixed shares.
    pub deterministic: bool,
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

/// The flash-decoding kernels' split count. Their blocks are bound by HBM
/// bandwidth, so a call lasts as long as its busiest SM streams keys: with
/// `work` tiles cut in `s` splits on `sms` SMs, that SM holds
/// ⌈work·s / sms⌉ blocks of ⌈n_blocks / s⌉ key blocks each. Among the
/// split counts that keep every block resident at once
/// (`work·s ≤ sms·blocks_per_sm`: a second wave would pay each block's ramp
/// and partial again) and leave no split without keys, the one with the
/// least such load; among equals, more
/// resident blocks (more loads in flight), then fewer splits (fewer partials
/// to merge). No split when there are at most 4 key blocks, or when the work
/// alone fills the share `no_split_fill` of the resident slots
/// ([`decode_no_split_fill`]).
///
/// FlashAttention-2's wave efficiency ([`num_splits_heuristic`]) accepts
/// 85% of the best: for GQA 32/8 at batch 1 it gives 14 splits, 112 blocks
/// for 132 SMs, and 20 SMs stay idle (docs/perf-notes.md, decode step 9).
pub fn decode_splits_heuristic(
    work: usize,
    sms: usize,
    blocks_per_sm: usize,
    n_blocks: usize,
    max_splits: usize,
    no_split_fill: f64,
) -> usize {
    let (sms, slots) = (sms.max(1), sms.max(1) * blocks_per_sm.max(1));
    if work == 0 || work as f64 >= no_split_fill * slots as f64 || n_blocks <= 4 {
        return 1;
    }
    let rank = |s: usize| {
        let blocks = work * s;
        (blocks.div_ceil(sms) * n_blocks.div_ceil(s), std::cmp::Reverse(blocks), s)
    };
    (1..=max_splits.min(n_blocks).max(1))
        // One wave, and no split left without keys (⌈n_blocks / s⌉ key
        // blocks per split must need all s splits).
        .filter(|&s| s == 1 || (work * s <= slots && n_blocks.div_ceil(n_blocks.div_ceil(s)) == s))
        .min_by_key(|&s| rank(s))
        .unwrap_or(1)
}

/// The share of the resident block slots from which
/// [`decode_splits_heuristic`] leaves the work unsplit (it was 0.8 for
/// every call). Since the K/V stages are swizzled (decode step 29) one block
/// streams fast enough alone that 64 of the H100's 132 SMs nearly saturate
/// its DRAM, and a split only adds its epilogue (~3.5 µs) or, static, its
/// imbalance (decode step 30, batch 8 GQA 32/8, 64 tiles): at 4k keys 51.0
/// µs unsplit against 54.1 with 2 splits (page 256: 51.4 against 54.5); over
/// 256-token pages at 32k 351.4 against 360.1, at 131k 1380.2 against
/// 1397.4. Two kinds of call keep splitting up to 80%: long contiguous
/// caches whose splits take tickets (`balanced`), which balance them (131k:
/// 1370.8 split against 1394.0 unsplit; 32k level, 347.5 against 350.6),
/// and caches of pages smaller than a key block, where a block looks each
/// row's page up and streams slower alone (4k: 56.3 split against 71.5).
pub const NO_SPLIT_FILL: f64 = 0.45;

/// Key blocks per tile up to which even a `balanced` call takes
/// [`NO_SPLIT_FILL`] (8k keys at Bc = 128; measured at 32 and 256).
pub const SHORT_KEY_BLOCKS: usize = 64;

/// The share of the resident block slots from which
/// [`decode_splits_heuristic`] leaves the work unsplit: [`NO_SPLIT_FILL`],
/// or 0.8 (the rule before decode step 30) for caches of pages smaller than
/// a key block (`small_pages`), for `balanced` calls (their splits would
/// take tickets) past [`SHORT_KEY_BLOCKS`] key blocks per tile, and on
/// devices where half the SMs do not saturate the DRAM (`few_sms_saturate`
/// false: peak bandwidth per SM over [`MAX_TICKET_BANDWIDTH_PER_SM`] — on an
/// H200, 36 GB/s per SM, batch 8 GQA 32/8 at 32k keys ran unsplit 276.8 µs
/// on 64 SMs, 0.89× PyTorch flash: session 11, call 8).
pub fn decode_no_split_fill(small_pages: bool, balanced: bool, n_blocks: usize, few_sms_saturate: bool) -> f64 {
    if !few_sms_saturate || small_pages || (balanced && n_blocks > SHORT_KEY_BLOCKS) { 0.8 } else { NO_SPLIT_FILL }
}

/// Key blocks per split from which the ticket schedule pays (H100,
/// decode step 18: 16 per split — GQA 32/8 at 32k keys — streamed 1–2%
/// slower with tickets, 64 per split 2–3% faster; 32 is between the two,
/// not measured).
pub const MIN_TICKET_BLOCKS_PER_SPLIT: usize = 32;

/// Peak DRAM bandwidth per SM (bytes/s) up to which the ticket schedule
/// pays (decode step 26): on an H100 SXM (3.35 TB/s, 132 SMs: 25 GB/s per
/// SM) tickets took 3–4% off long contiguous caches (MHA 32k 193.6 →
/// 185.5 µs, MHA 131k 735 → 712, GQA 131k 189 → 182.5); on an H200
/// (4.8 TB/s, 132 SMs: 36 GB/s per SM) they made the same cells 12–15%
/// slower (MHA 32k 139 → 158 µs, MHA 131k 531 → 610, GQA 131k 138 → 156).
/// 30 GB/s lies between the two; devices whose bandwidth the driver does
/// not report keep the H100's rule.
pub const MAX_TICKET_BANDWIDTH_PER_SM: f64 = 30e9;

/// Whether the ticket schedule pays on a device with `num_sms` SMs and
/// peak DRAM bandwidth `bandwidth` ([`MAX_TICKET_BANDWIDTH_PER_SM`]).
fn tickets_pay_on(bandwidth: Option<f64>, num_sms: usize) -> bool {
    bandwidth.is_none_or(|b| b / num_sms.max(1) as f64 <= MAX_TICKET_BANDWIDTH_PER_SM)
}

/// Whether a flash-decoding call with `ns` splits of `n_blocks` key blocks
/// takes the ticket schedule ([`DecodeOptions::deterministic`],
/// [`AttnParams::split_tickets`]): split, not deterministic, a kernel built
/// with it, a device where it pays ([`tickets_pay_on`]), a contiguous cache
/// (over pages, every ticket's block starts with a dependent block-table
/// load: with 256-token pages the 8-warp kernel ran 8–11% slower with
/// tickets, decode step 18), at least [`MIN_TICKET_BLOCKS_PER_SPLIT`] key
/// blocks per split, and tickets that fit their 16 bits. (The fused
/// combine's counters, which hold the tickets, are checked at launch.)
fn split_tickets(ns: usize, kernel_has_tickets: bool, device_pays: bool, paged: bool, n_blocks: usize, deterministic: bool) -> bool {
    ns > 1 && !deterministic && kernel_has_tickets && device_pays && !paged && n_blocks >= MIN_TICKET_BLOCKS_PER_SPLIT * ns && n_blocks + 2 * ns <= MAX_TICKET_BLOCKS as usize
}

/// Whether the flash-decoding kernels interleave their fixed split shares
/// over a paged cache ([`INTERLEAVE_PAGED`]; contiguous caches always do):
/// over pages of at least a key block, on devices where the ticket rule
/// holds (≤ 30 GB/s of DRAM bandwidth per SM). Decode step 38: H100 GQA
/// 131k over 256-token pages 183.3 → 181.2 µs interleaved; H200 129.0 →
/// 135.6–136.7 (each block then waits for its own page lookup, and its
/// blocks stream faster); over 16-token pages 0.5–2% slower on the H100.
fn interleave_paged(paged: bool, small_pages: bool, device_pays: bool) -> bool {
    paged && !small_pages && device_pays
}

/// New keys or values `(batch, s_new, nheads_k, d)` to append ([`KvCache::k_new`]).
type NewRows<'a, T> = Tensor<'a, dyn DevicePtr<T> + 'a>;

fn invalid(argument: &'static str, value: String, reason: &'static str) -> FlashAttnError {
    FlashAttnError::InvalidArgument {
        argument,
        value,
        reason,
    }
}

/// A KV cache read in place, nothing appended by the call: the attention
/// half of [`FlashAttention::forward_kvcache`], for callers that append
/// with [`FlashAttention::append_kv`] themselves (one cache tensor at a
/// time, e.g. frameworks whose tensors mutate one at a time). Layout and
/// meaning as [`KvCache`].
pub struct KvCacheRef<'a, T> {
    pub k_cache: &'a dyn DevicePtr<T>,
    pub v_cache: &'a dyn DevicePtr<T>,
    pub layout: TensorLayout,
    pub cache_seqlens: &'a dyn DevicePtr<i32>,
    pub cache_batch_idx: Option<&'a dyn DevicePtr<i32>>,
    pub block_table: Option<BlockTable<'a>>,
    /// Keys already appended after `cache_seqlens[b]` that this call
    /// attends to: sequence `b` sees `cache_seqlens[b] + seqlen_new` keys.
    pub seqlen_new: usize,
}

/// A paged cache read by a varlen prefill ([`FlashAttention::forward_varlen_paged`]):
/// `k_pages`/`v_pages` `(num_pages, page_size, nheads_k, d)` (`layout`),
/// key `t` of sequence `b` at row `t % page_size` of page
/// `block_table[b][t / page_size]`.
pub struct PagedCache<'a, T> {
    pub k_pages: &'a dyn DevicePtr<T>,
    pub v_pages: &'a dyn DevicePtr<T>,
    pub layout: TensorLayout,
    pub block_table: BlockTable<'a>,
}

impl<T> Clone for PagedCache<'_, T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for PagedCache<'_, T> {}

/// What the host knows of a cache.
#[derive(Clone, Copy)]
struct CacheGeom {
    /// `batch_c` (contiguous) or `num_pages` (paged).
    n_rows: usize,
    /// `seqlen_cache` or `page_size`.
    rows_per: usize,
    nheads_k: usize,
    /// Keys one sequence can hold.
    capacity: usize,
    paged: bool,
}

/// Validates a cache's layout against its buffers and the call (`batch`
/// sequences of head dim `d`).
fn check_cache(
    names: (&'static str, &'static str),
    layout: &TensorLayout,
    lens: (usize, usize),
    d: usize,
    batch: usize,
    cache_batch_idx: Option<usize>,
    block_table: Option<&BlockTable<'_>>,
) -> Result<CacheGeom> {
    let [n_rows, rows_per, nheads_k, dk] = layout.shape;
    crate::api::check_layout(names.0, layout, lens.0)?;
    crate::api::check_layout(names.1, layout, lens.1)?;
    if dk != d {
        return Err(FlashAttnError::ShapeMismatch { argument: names.0, axis: "headdim", actual: dk, expected: d, rule: "same as q" });
    }
    if let Some(n) = cache_batch_idx {
        if block_table.is_some() {
            return Err(invalid("cache_batch_idx", "given".into(), "applies to contiguous caches; a paged cache has a block table"));
        }
        if n != batch {
            return Err(invalid("cache_batch_idx", format!("length {n}"), "must hold one i32 per sequence (q's batch)"));
        }
    } else if block_table.is_none() && n_rows < batch {
        return Err(invalid(names.0, format!("batch_c = {n_rows} < batch = {batch}"), "needs a cache row per sequence (or cache_batch_idx)"));
    }
    let capacity = match block_table {
        Some(bt) => {
            if bt.max_blocks_per_seq == 0 {
                return Err(invalid("block_table", "0 blocks per sequence".into(), "max_blocks_per_seq must be positive"));
            }
            if bt.table.len() < batch * bt.max_blocks_per_seq {
                return Err(invalid("block_table", format!("length {}", bt.table.len()), "must hold batch · max_blocks_per_seq i32"));
            }
            bt.max_blocks_per_seq.checked_mul(rows_per).filter(|&c| c <= crate::api::MAX_DIM).ok_or_else(|| {
                invalid("block_table", format!("{} blocks of {rows_per}", bt.max_blocks_per_seq), "capacity exceeds 2³¹ − 1 keys")
            })?
        }
        None => rows_per,
    };
    Ok(CacheGeom { n_rows, rows_per, nheads_k, capacity, paged: block_table.is_some() })
}

/// Validates new keys (or values) `(batch, s_new, nheads_k, d)` to append;
/// returns `s_new`.
fn check_new<T>(name: &'static str, new: &Tensor<'_, dyn DevicePtr<T> + '_>, batch: usize, geom: &CacheGeom, d: usize) -> Result<usize> {
    crate::api::check_layout(name, &new.layout, new.data.len())?;
    let [b2, s_new, h2, d2] = new.layout.shape;
    if (b2, h2, d2) != (batch, geom.nheads_k, d) {
        return Err(invalid(name, format!("shape {:?}", new.layout.shape), "must be (batch, s_new, nheads_k, headdim)"));
    }
    if s_new > geom.capacity {
        return Err(invalid(name, format!("{s_new} new keys"), "more new keys than the cache holds (capacity)"));
    }
    Ok(s_new)
}

/// Validates the new keys and values of a call, which come together;
/// returns them (or `None`).
fn check_new_pair<'a, T>(k_new: Option<NewRows<'a, T>>, v_new: Option<NewRows<'a, T>>, batch: usize, geom: &CacheGeom, d: usize) -> Result<Option<(NewRows<'a, T>, NewRows<'a, T>)>> {
    match (k_new, v_new) {
        (None, None) => Ok(None),
        (Some(kn), Some(vn)) => {
            if kn.layout.shape != vn.layout.shape {
                return Err(invalid("v_new", format!("shape {:?}", vn.layout.shape), "must have k_new's shape"));
            }
            check_new("k_new", &kn, batch, geom, d)?;
            check_new("v_new", &vn, batch, geom, d)?;
            Ok(Some((kn, vn)))
        }
        _ => Err(invalid("v_new", "missing or extra".into(), "k_new and v_new come together")),
    }
}

/// q's and a caller's O's 16-byte alignment, checked before an append
/// touches the cache (the attention launch checks every pointer after it).
fn check_q_o_alignment<T, Q: DevicePtr<T> + ?Sized>(stream: &Arc<CudaStream>, q: &Q, out: Option<&mut CallerOut<'_, T>>, params: &AttnParams) -> Result<()> {
    let (q_ptr, _gq) = q.device_ptr(stream);
    let o_ptr = match out {
        Some(c) => c.o.device_ptr_mut(stream).0,
        None => 0,
    };
    crate::api::check_tc_alignment(&AttnParams { q_ptr, o_ptr, ..*params })
}

/// The validated attention launch of a KV-cache call (nothing enqueued yet).
struct AttendPlan {
    main: Launch,
    ns: usize,
    grid: u32,
    /// Query heads and rows as the caller sees them (the launch may pack
    /// the `g` query heads of a KV head as rows of one tile).
    nheads: usize,
    sq: usize,
    o_layout: TensorLayout,
    lse_len: usize,
    /// Varlen q: `total_q`.
    varlen: Option<usize>,
    /// The flash-decoding kernel that runs, if one does (split-KV: its fused
    /// combine can replace the combine launch; built with [`DecKernel::append`]:
    /// it appends new k/v itself).
    dec: Option<&'static DecKernel>,
    /// The flash-decoding kernel whose compact entry may run, and whether
    /// the caller forced that entry (then a call it cannot carry is an error).
    compact: Option<(&'static DecKernel, bool)>,
    params: AttnParams,
}

impl FlashAttention {
    /// Whether this device takes the ticket schedule where a call allows it
    /// ([`DecodeOptions::deterministic`], [`MAX_TICKET_BANDWIDTH_PER_SM`]):
    /// an H100 yes, an H200 no.
    pub fn split_tickets_pay(&self) -> bool {
        tickets_pay_on(self.peak_mem_bandwidth(), self.num_sms())
    }

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
    ) -> Result<ForwardOutput<T>>
    where
        T: AttnElem,
        Q: DevicePtr<T> + ?Sized,
    {
        let (own, o_layout) = self.kvcache_call(stream, q, cache, None, params, ext, opts)?;
        let (o, lse) = allocated(own);
        Ok(ForwardOutput { o, o_layout, stats: RowStats::LogSumExp(lse) })
    }

    /// [`FlashAttention::forward_kvcache`] into caller-owned buffers: O `o`
    /// (q's shape `(batch, seqlen_q, nheads, d)`, any non-overlapping
    /// strides; 16-byte aligned, strides of axes longer than 1 multiples of
    /// 8 elements) and the logsumexp `lse` (`(batch, nheads, seqlen_q)` f32,
    /// contiguous). Validated before anything is enqueued, as the
    /// allocating call.
    ///
    /// **CUDA graphs.** Without a split (`num_splits: Some(1)`), or with a
    /// caller's [`SplitScratch`] sized for the call's split count, this call
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
    ) -> Result<ForwardOutput<T>>
    where
        T: AttnElem,
        Q: DevicePtr<T> + ?Sized,
    {
        let (own, o_layout) = self.kvcache_ref_call(stream, q, cache, None, params, ext, opts)?;
        let (o, lse) = allocated(own);
        Ok(ForwardOutput { o, o_layout, stats: RowStats::LogSumExp(lse) })
    }

    /// [`FlashAttention::forward_kvcache_ref`] into caller-owned buffers, as
    /// [`FlashAttention::forward_kvcache_into`] (and as it, capturable in a
    /// CUDA graph with a caller's [`SplitScratch`]; with
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
    ) -> Result<VarlenOutput<T>>
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
        Ok(VarlenOutput { o, o_layout: plan.o_layout, lse })
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
        new: Tensor<'_, dyn DevicePtr<T> + '_>,
        cache_seqlens: &dyn DevicePtr<i32>,
        cache_batch_idx: Option<&dyn DevicePtr<i32>>,
        block_table: Option<BlockTable<'_>>,
    ) -> Result<()> {
        if T::DTYPE == DType::F32 {
            return Err(FlashAttnError::Unsupported { argument: "cache", dtype: "f32", what: "the KV-cache calls (f16/bf16)" });
        }
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

    /// Enqueues `kv_append_u16` (arguments validated) for one cache tensor
    /// and its new rows, or two (K and V: same shapes, caches of the same
    /// `layout`) in the same launch.
    #[allow(clippy::too_many_arguments)]
    fn append_launch<T: AttnElem, C>(
        &self,
        stream: &Arc<CudaStream>,
        (cache, new): (&mut dyn DevicePtrMut<C>, &NewRows<'_, T>),
        second: Option<(&mut dyn DevicePtrMut<C>, &NewRows<'_, T>)>,
        layout: &TensorLayout,
        cache_seqlens: &dyn DevicePtr<i32>,
        cache_batch_idx: Option<&dyn DevicePtr<i32>>,
        block_table: Option<&BlockTable<'_>>,
        geom: &CacheGeom,
        quant: Option<fp8::Quant>,
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
        crate::api::check_tc_alignment(&AttnParams { k_ptr: dst, k_stride: p.o_stride, v_ptr: dst, v_stride: p.o_stride, ..p })?;
        if dst2 != 0 {
            crate::api::check_tc_alignment(&AttnParams { q_ptr: src2, q_stride: src2_strides, k_ptr: dst2, k_stride: p.o_stride, v_ptr: dst2, v_stride: p.o_stride, ..p })?;
        }
        let chunks = (batch * s_new * nheads_k * d / 8) as u64 * if dst2 != 0 { 2 } else { 1 };
        let cfg = LaunchConfig { grid_dim: (chunks.div_ceil(256).clamp(1, 1 << 16) as u32, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
        // The compact 184-byte block when it carries the call (no
        // cache_batch_idx, strides under 2³²): decode step 17.
        // (An FP8 cache's quantizing append takes the full block.)
        let compact = DecodeParams::from_attn(&p, 0, 0).filter(|_| quant.is_none()).map(crate::tc::KernelArg);
        let kernel = match quant {
            Some(_) if T::DTYPE == DType::BF16 => "kv_append_e4m3_bf16",
            Some(_) => "kv_append_e4m3_f16",
            None if compact.is_some() => "kv_append_u16_c",
            None => "kv_append_u16",
        };
        let (f, _) = self.prepare(&Launch { kernel, grid: 1, threads: 256, smem_bytes: 0 })?;
        let full = crate::tc::KernelArg(p);
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

    /// The streams of a KV-cache call: `stream` and the `inputs`' (named)
    /// on this context, and the caller's O and LSE when given.
    fn check_streams<T>(&self, stream: &CudaStream, inputs: &[(&'static str, &CudaStream)], out: Option<&CallerOut<'_, T>>) -> Result<()> {
        for &(name, s) in inputs.iter().chain([("stream", stream)].iter()) {
            self.check_stream(name, s)?;
        }
        match out {
            Some(c) => {
                self.check_stream("o", c.o.stream())?;
                self.check_stream("lse", c.lse.stream())
            }
            None => Ok(()),
        }
    }

    /// Validation and plan of the attention launch of a KV-cache call:
    /// q dense `(batch, sq, nheads, d)`, or packed with `varlen`.
    #[allow(clippy::too_many_arguments)]
    fn plan_attend<T: AttnElem>(
        &self,
        q_layout: &TensorLayout,
        q_len: usize,
        varlen: Option<&Varlen<'_>>,
        geom: &CacheGeom,
        cache_layout: &TensorLayout,
        s_new: usize,
        seqlens_len: usize,
        params: &ForwardParams,
        ext: &Extras<'_>,
        opts: &DecodeOptions<'_>,
        out: Option<OutSpec>,
        fp8: bool,
    ) -> Result<AttendPlan> {
        let dtype = T::DTYPE;
        if dtype == DType::F32 {
            return Err(FlashAttnError::Unsupported {
                argument: "q",
                dtype: "f32",
                what: "the KV-cache calls (f16/bf16 tensor-core kernels; the CPU reference has f32/f64)",
            });
        }
        if params.loop_order != LoopOrder::Fa2 {
            return Err(FlashAttnError::Unsupported {
                argument: "params.loop_order",
                dtype: dtype.name(),
                what: "the KV-cache calls with FA1 or Standard (they run the FA2 loop order)",
            });
        }
        crate::api::check_layout("q", q_layout, q_len)?;
        let [qb, q_rows, nheads, d] = q_layout.shape;
        let (batch, sq) = match varlen {
            Some(v) => {
                if qb != 1 {
                    return Err(invalid("q", format!("shape {:?}", q_layout.shape), "varlen q is packed (total_q, nheads, headdim): TensorLayout::varlen"));
                }
                (v.batch(), v.max_seqlen_q)
            }
            None => (qb, q_rows),
        };
        let nheads_k = geom.nheads_k;
        check_gqa(nheads, nheads_k)?;
        if seqlens_len != batch {
            let argument = if varlen.is_some() { "cu_seqlens_k" } else { "cache_seqlens" };
            return Err(invalid(argument, format!("length {seqlens_len}"), "must hold one i32 per sequence (q's batch)"));
        }
        // Keys per sequence: at most the capacity (and, varlen, max_seqlen_k).
        let seqlen_k = match varlen {
            Some(v) => v.max_seqlen_k.min(geom.capacity),
            None => geom.capacity,
        };
        let window_seqlen_k = varlen.map_or(geom.capacity, |v| v.max_seqlen_k);
        let opts_r = params.resolve(d, window_seqlen_k.max(1))?;
        if let Some(a) = &ext.alibi_slopes {
            check_alibi(a.shape, a.slopes.len(), batch, nheads)?;
        }
        let max_splits = opts.scratch.as_ref().map_or(MAX_SPLITS, |s| s.max_splits.min(MAX_SPLITS));
        if let Some(n) = opts.num_splits
            && (n == 0 || n > max_splits)
        {
            return Err(invalid("num_splits", n.to_string(), "must be in 1..=128 and at most the scratch's max_splits"));
        }

        // One query row per sequence (dense): a right window (or causal,
        // bottom-right) hides no key from the last row, so it is dropped —
        // and no longer stands in the way of head packing.
        let single_row = varlen.is_none() && sq == 1;
        let opts_r = if single_row { crate::params::Resolved { window_right: -1, ..opts_r } } else { opts_r };
        let causal = params.causal && !single_row;

        // ---- head packing (one token, GQA, no window/ALiBi) ---------------
        let group = nheads / nheads_k;
        let pack = varlen.is_none()
            && sq == 1
            && group > 1
            && opts_r.window_left < 0
            && opts_r.window_right < 0
            && ext.alibi_slopes.is_none();
        let o_layout = match (varlen, out) {
            (Some(_), _) => TensorLayout::varlen(q_rows, nheads, d),
            (None, None) => TensorLayout::contiguous([batch, sq, nheads, d]),
            (None, Some(c)) => {
                crate::api::check_output(&c.o_layout, c.o_len, [batch, sq, nheads, d])?;
                c.o_layout
            }
        };
        let (rq, rh) = if pack { (group, nheads_k) } else { (sq, nheads) };
        let pack_strides = |s: [usize; 3]| if pack { [s[0], s[2], s[2] * group] } else { s };

        // ---- plan ----------------------------------------------------------
        let key = DispatchKey {
            dtype,
            headdim: d,
            causal: causal && !pack,
            loop_order: LoopOrder::Fa2,
            arch: self.compute_capability(),
            features: Features { varlen: false, mods: true, decode: true },
        };
        let dims = Dims { batch, nheads: rh, nheads_k, seqlen_q: rq, seqlen_k: seqlen_k.max(1), headdim: d };
        let Plan::TcFa2 { kernel, main } = crate::dispatch::plan(&key, &dims, None, &self.limits())? else {
            unreachable!("decode dispatch gives the tensor-core FA2 plan")
        };
        // At most 16 rows per (sequence, head) as launched: the
        // flash-decoding kernel (warps split the keys), else the fa2d tile.
        let page = geom.paged.then_some(geom.rows_per);
        let dec = if rq <= DecKernel::BR { DecKernel::default_fitting(dtype == DType::BF16, kernel.d, page, self.limits().max_smem_per_block) } else { None };
        let (dec, compact) = match opts.kernel {
            // An FP8 cache: its own kernel, no compact entry.
            _ if fp8 => (Some(fp8::kernel_for(dtype, kernel.d, rq, opts.kernel, self.limits().max_smem_per_block)?), None),
            // The compact entry where it pays (`DecKernel::compact_by_default`).
            // A call with new keys and values runs the default's build with
            // the append fused in where there is one (`_pga` over small
            // pages, decode step 24).
            None => {
                let dec = if s_new > 0 { dec.map(DecKernel::with_append) } else { dec };
                (dec, dec.filter(|k| k.compact_by_default(page)).map(|k| (k, false)))
            }
            Some(name) if name == kernel.name => (None, None),
            Some(name) => match DecKernel::by_name(name).map(|k| (k, None)).or_else(|| DecKernel::by_compact_name(name).map(|k| (k, Some((k, true))))) {
                Some((k, c)) if k.d == kernel.d && k.bf16 == (dtype == DType::BF16) && rq <= DecKernel::BR => (Some(k), c),
                _ => {
                    return Err(invalid(
                        "opts.kernel",
                        name.to_string(),
                        "must name a flash-decoding kernel of the call's dtype and head dim (at most 16 rows per sequence and head) or the call's fa2d kernel",
                    ));
                }
            },
        };
        let (main, br, bc) = match dec {
            Some(k) => {
                let grid = rq.div_ceil(k.br()) * batch * rh;
                let launch = Launch { kernel: k.name, grid: grid as u32, threads: k.threads(), smem_bytes: k.smem_bytes() as u32 };
                (launch, k.br(), k.bc)
            }
            None => (main, kernel.br(), kernel.bc),
        };
        let work = batch * rh * rq.div_ceil(br);
        let n_blocks = seqlen_k.div_ceil(bc);
        let per_sm = self.blocks_per_sm(&main).unwrap_or(2);
        let slots = self.num_sms() * per_sm;
        // Tickets pay, and half the SMs saturate the DRAM, on the same
        // devices (≤ 30 GB/s of peak bandwidth per SM).
        let device_pays = self.split_tickets_pay();
        // Pages smaller than the flash-decoding kernel's key block.
        let small_pages = dec.is_some_and(|k| page.is_some_and(|rows| !rows.is_multiple_of(k.bc)));
        let ns = opts.num_splits.unwrap_or_else(|| match dec {
            Some(k) => {
                let balanced = k.tickets && device_pays && !geom.paged && !opts.deterministic;
                let fill = decode_no_split_fill(small_pages, balanced, n_blocks, device_pays);
                decode_splits_heuristic(work, self.num_sms(), per_sm, n_blocks, max_splits, fill)
            }
            None => num_splits_heuristic(work, slots, n_blocks, max_splits),
        });
        // The ticket schedule (decode step 18), unless the caller asks for
        // reproducible bits.
        let split_tickets = dec.is_some_and(|k| split_tickets(ns, k.tickets, device_pays, geom.paged, n_blocks, opts.deterministic));
        // Fixed shares interleaved over whole-block pages where it pays
        // (decode step 38).
        let interleave_paged = dec.is_some() && interleave_paged(geom.paged, small_pages, device_pays);
        // A default call that draws no ticket and appends nothing runs the
        // build without the ticket loop (`DecKernel::without_tickets`, decode
        // step 29): same configuration, launch shape and split count.
        let (dec, compact, main) = match dec.map(|k| (k, k.without_tickets())) {
            Some((k, w)) if opts.kernel.is_none() && !split_tickets && s_new == 0 && w != k => (Some(w), w.compact_by_default(page).then_some((w, false)), Launch { kernel: w.name, ..main }),
            _ => (dec, compact, main),
        };
        let lse_len = nheads * if varlen.is_some() { q_rows } else { batch * sq };
        if let Some(c) = out {
            crate::api::check_stats("lse", c.lse_len, lse_len)?;
        }
        let grid = (main.grid as u64)
            .checked_mul(ns as u64)
            .filter(|&g| g <= i32::MAX as u64)
            .ok_or(FlashAttnError::DimTooLarge { argument: "num_splits", axis: "grid blocks", value: ns, max: i32::MAX as usize })?
            as u32;
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
        if let Some(SplitScratch { counters: Some(c), .. }) = &opts.scratch
            && dec.is_some()
            && ns > 1
            && c.len() < main.grid as usize
        {
            return Err(invalid("scratch.counters", format!("{} u32", c.len()), "too small: one u32 per tile, batch · nheads · ⌈seqlen_q / 16⌉"));
        }
        let u = |x: usize| x as u64;
        let mut q_stride = pack_strides(q_layout.strides).map(u);
        let mut o_stride = pack_strides(o_layout.strides).map(u);
        if varlen.is_some() {
            // Packed rows: the sequence's row offset comes from cu_seqlens_q.
            q_stride[0] = 0;
            o_stride[0] = 0;
        }
        let params = AttnParams {
            q_stride,
            k_stride: cache_layout.strides.map(u),
            v_stride: cache_layout.strides.map(u),
            o_stride,
            batch: batch as u32,
            nheads: rh as u32,
            nheads_k: nheads_k as u32,
            seqlen_q: rq as u32,
            seqlen_k: seqlen_k as u32,
            headdim: d as u32,
            causal: key.causal as u32,
            cache_batch: geom.n_rows as u32,
            seqlen_new: s_new as u32,
            page_size: if geom.paged { geom.rows_per as u32 } else { 0 },
            num_pages: if geom.paged { geom.n_rows as u32 } else { 0 },
            num_splits: ns as u32,
            total_q: if varlen.is_some() { q_rows as u32 } else { 0 },
            // Prefix sums of key lengths index pages, not rows: any value
            // is clamped to seqlen_k per sequence.
            total_k: if varlen.is_some() { i32::MAX as u32 } else { 0 },
            br: br as u32,
            bc: bc as u32,
            split_tickets: split_tickets as u32 | if interleave_paged { INTERLEAVE_PAGED } else { 0 },
            ..opts_r.kernel_params()
        };
        Ok(AttendPlan {
            main,
            ns,
            grid,
            nheads,
            sq,
            o_layout,
            lse_len,
            varlen: varlen.map(|_| q_rows),
            dec,
            compact,
            params,
        })
    }

    /// Enqueues the attention (and, split, the combine) of a planned
    /// KV-cache call. `seqlens`: `cache_seqlens` (decode) or `cu_seqlens_k`
    /// (varlen, then `varlen` is `Some`).
    #[allow(clippy::too_many_arguments)]
    fn attend_launch<T: AttnElem>(
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
            crate::api::check_tc_alignment(&p)?;
            // The append fused into the flash-decoding kernel (DecKernel::append):
            // the new rows' buffers, 16-byte chunks as the cache's.
            let kn = new_kv.map(|(kn, _)| (kn.data.device_ptr(stream), kn.layout.strides.map(|x| x as u64)));
            let vn = new_kv.map(|(_, vn)| (vn.data.device_ptr(stream), vn.layout.strides.map(|x| x as u64)));
            if let (Some(((kptr, _), ks)), Some(((vptr, _), vs))) = (&kn, &vn) {
                (p.knew_ptr, p.knew_stride, p.vnew_ptr, p.vnew_stride) = (*kptr, *ks, *vptr, *vs);
                crate::api::check_tc_alignment(&AttnParams { q_ptr: *kptr, q_stride: *ks, k_ptr: *vptr, k_stride: *vs, ..p })?;
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
                    Some(c) => k.compact.map(|name| (name, crate::tc::KernelArg(c))),
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
            let full = crate::tc::KernelArg(p);
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
                let arg = crate::tc::KernelArg(cp);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticket_schedule_eligibility() {
        // MHA 32k at batch 1 (4 splits of 256 key blocks), GQA 131k (16 of 1024): tickets.
        assert!(split_tickets(4, true, true, false, 256, false));
        assert!(split_tickets(16, true, true, false, 1024, false));
        // GQA 32k (16 splits of 256 blocks: 16 each): not.
        assert!(!split_tickets(16, true, true, false, 256, false));
        assert!(split_tickets(16, true, true, false, 16 * MIN_TICKET_BLOCKS_PER_SPLIT, false));
        assert!(!split_tickets(16, true, true, false, 16 * MIN_TICKET_BLOCKS_PER_SPLIT - 1, false));
        // Paged caches, kernels built without tickets: not.
        assert!(!split_tickets(4, true, true, true, 256, false));
        assert!(!split_tickets(4, false, true, false, 256, false));
        // No split, or the caller asks for reproducible bits: not.
        assert!(!split_tickets(1, true, true, false, 256, false));
        assert!(!split_tickets(4, true, true, false, 256, true));
        // Interleaved fixed shares over pages: whole-block pages on a device
        // where few SMs saturate the DRAM (the H100), not small pages, not
        // the H200; contiguous caches interleave in the kernel regardless.
        assert!(interleave_paged(true, false, true));
        assert!(!interleave_paged(true, true, true));
        assert!(!interleave_paged(true, false, false));
        assert!(!interleave_paged(false, false, true));
        // The tickets' 16 bits: blocks + two draws past the end per split.
        let max = MAX_TICKET_BLOCKS as usize;
        assert!(split_tickets(16, true, true, false, max - 32, false));
        assert!(!split_tickets(16, true, true, false, max - 31, false));
        // A device where tickets do not pay (decode step 26): not.
        assert!(!split_tickets(4, true, false, false, 256, false));
    }

    #[test]
    fn tickets_pay_by_bandwidth_per_sm() {
        // H100 SXM (3.35 TB/s, 132 SMs): yes; H200 (4.8 TB/s, 132 SMs): no.
        assert!(tickets_pay_on(Some(2.0 * 2_619_000e3 * 5120.0 / 8.0), 132));
        assert!(!tickets_pay_on(Some(4.8e12), 132));
        // Bandwidth not reported: the H100's rule.
        assert!(tickets_pay_on(None, 132));
    }
}
