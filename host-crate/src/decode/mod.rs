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
//!
//! Layers, each a module: the front end `api` (with `fp8`, the front end of
//! FP8 caches) validates (`validate`: cache geometry, new rows, alignment,
//! streams), plans (`plan`: kernel, head packing, splits, grid and kernel
//! parameters, from the kernel table `kernels` and the split rules `split`)
//! and launches (`launch`: append, attention, combine; the only `unsafe`);
//! `args` holds the types of a call. Each imports only the layers below it
//! (`launch` → `plan` → `validate` → `args`); none imports `api`.

mod api;
mod args;
mod fp8;
mod kernels;
mod launch;
mod plan;
mod split;
mod validate;

pub use args::{BlockTable, DecodeCache, DecodeOptions, KvCache, KvCacheRef, PagedCache, SplitScratch};
pub use fp8::KvCacheFp8;
pub use kernels::{DEC_F8_KERNELS, DEC_KERNELS, DecKernel};
pub(crate) use launch::{DECODE_FP8_KERNELS, DECODE_KERNELS};
pub use split::{
    MAX_SPLITS, MAX_TICKET_BANDWIDTH_PER_SM, MIN_TICKET_BLOCKS_PER_SPLIT, NO_SPLIT_FILL, SHORT_KEY_BLOCKS,
    decode_no_split_fill, decode_splits_heuristic, num_splits_heuristic,
};
/// The flash-decoding kernels' per-block timeline layout ([`DecodeOptions::timeline`]).
pub use flash_attn_common::tc::timeline;
