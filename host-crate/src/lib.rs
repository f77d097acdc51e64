//! # flash-attn
//!
//! FlashAttention written in Rust: the forward and backward passes of
//! FlashAttention (FA1's and FA2's loop orders) and flash-decoding, as GPU
//! kernels compiled from Rust by rustc's `nvptx64-nvidia-cuda` target, with
//! a host API over [cudarc] device buffers and one over [`ndarray`] arrays
//! that runs on the CPU reference when there is no GPU.
//!
//! ## Front doors
//!
//! * **ndarray** (any machine; the GPU when there is one):
//!   [`flash_attn_func`], [`flash_attn_varlen_func`],
//!   [`flash_attn_with_kvcache`], [`flash_attn_varlen_paged_func`],
//!   [`flash_attn_backward`], [`flash_attn_varlen_backward`] — the names and
//!   argument order of FlashAttention-2's Python API; [`Backend`] says where
//!   a call runs.
//! * **device** ([`FlashAttention`]): attention over cudarc buffers on the
//!   caller's stream, with no host synchronization: [`FlashAttention::forward`]
//!   and its `_into`/`_ext` forms, [`FlashAttention::forward_varlen`],
//!   [`FlashAttention::forward_kvcache`] (decode against a contiguous or
//!   paged [`KvCache`]), [`FlashAttention::backward`]. Tensors are
//!   [`Tensor`]s: a buffer and a [`TensorLayout`] `(batch, seqlen, nheads,
//!   headdim)` with strides. The calls return [`AttnOutput`] `{ o, o_layout,
//!   lse }`; the dense forward, whose loop order decides its statistics,
//!   [`ForwardOutput`] `{ o, o_layout, stats }` ([`ForwardOutput::lse`]).
//!   The caches ([`KvCache::new`] and its `with_` methods) take any cudarc
//!   buffer.
//! * [`order_block_table`]: a paged KV cache's block table sorted by page
//!   address where the key order is free ([`KvCacheCall`]).
//! * [`reference`](mod@reference): the CPU reference of every feature,
//!   generic over f32 and f64 — the specification the kernels are tested
//!   against.
//! * [`context_parallel`]: one sequence over several GPUs (ring, zigzag,
//!   Ulysses), with its CPU simulation.
//! * [`plan`]: the FA1 tiling plan and the HBM-traffic model.
//!
//! Options are [`ForwardParams`] (causal, `softmax_scale`, sliding window,
//! softcap, loop order); every error is a [`FlashAttnError`] naming the
//! argument and the value. [`advanced`] holds the kernel tables and
//! dispatch for tuning and benchmarks, with no stability promise.
//!
//! ```
//! use flash_attn::{ForwardParams, flash_attn_func};
//! use ndarray::Array4;
//!
//! // (batch, seqlen, nheads, headdim); runs on the GPU if there is one.
//! let q = Array4::<f32>::from_shape_fn((1, 128, 4, 64), |(_, i, h, d)| ((i + h + d) as f32 * 0.01).sin());
//! let (k, v) = (q.clone(), q.clone());
//! let params = ForwardParams { causal: true, ..Default::default() };
//! let (out, lse) = flash_attn_func(q.view(), k.view(), v.view(), &params)?;
//! assert_eq!(out.shape(), &[1, 128, 4, 64]);
//! assert_eq!(lse.shape(), &[1, 4, 128]); // (batch, nheads, seqlen_q)
//! # Ok::<(), flash_attn::FlashAttnError>(())
//! ```
//!
//! Decode against a KV cache, the new token's key and value appended in
//! place (FlashAttention-2's `flash_attn_with_kvcache`):
//!
//! ```
//! use flash_attn::{ForwardParams, HostKvCache, flash_attn_with_kvcache};
//! use ndarray::{Array4, s};
//!
//! let (batch, nheads, nheads_k, d) = (2, 4, 2, 32);
//! let fill = |shape: (usize, usize, usize, usize), seed: f32| {
//!     Array4::from_shape_fn(shape, |(b, i, h, c)| ((b + 3 * i + 5 * h + 7 * c) as f32 * seed).sin())
//! };
//! // (batch_c, seqlen_cache, nheads_k, d): room for 64 keys per sequence.
//! let mut k_cache = fill((batch, 64, nheads_k, d), 0.01);
//! let mut v_cache = fill((batch, 64, nheads_k, d), 0.02);
//! let cache_seqlens = [10, 20]; // keys already cached per sequence
//! let q = fill((batch, 1, nheads, d), 0.03); // one new token per sequence
//! let (k_new, v_new) = (fill((batch, 1, nheads_k, d), 0.04), fill((batch, 1, nheads_k, d), 0.05));
//! let cache = HostKvCache::Contiguous { k_cache: &mut k_cache, v_cache: &mut v_cache, cache_batch_idx: None };
//! let params = ForwardParams { causal: true, ..Default::default() };
//! let (out, lse) =
//!     flash_attn_with_kvcache(q.view(), cache, &cache_seqlens, Some(k_new.view()), Some(v_new.view()), &params, None, None)?;
//! assert_eq!((out.dim(), lse.dim()), ((batch, 1, nheads, d), (batch, nheads, 1)));
//! // The new keys now sit at rows cache_seqlens[b] of the cache.
//! assert_eq!(k_cache.slice(s![1, 20, .., ..]), k_new.slice(s![1, 0, .., ..]));
//! # Ok::<(), flash_attn::FlashAttnError>(())
//! ```
//!
//! ## Modules and layers
//!
//! Data flows one way: the front ends (`api`, `varlen_api`, `decode`,
//! `backward`, the `ndarray_*` modules) validate (`validate`, `varlen`)
//! into a checked problem, plan it (`dispatch`, `hopper`'s plan, the kernel
//! tables) and launch it (the only `unsafe`); all of them speak `types`
//! (a problem's element type, sizes and kernel-variant features), the
//! bottom layer. The CPU reference sits beside them and imports none of
//! them; `tests/layers.rs` checks that the modules import each other
//! without a cycle.
//!
//! [cudarc]: https://docs.rs/cudarc
#![warn(missing_docs)]

// The four modules marked `allow(missing_docs)` (decode with its kernel
// table, dispatch, the tensor-core table, ndarray_kvcache) still lack field
// and variant docs on some public items; every other module is held to
// `missing_docs`.
pub mod advanced;
mod api;
mod backward;
pub mod context_parallel;
#[allow(missing_docs)] // see above
mod decode;
mod device;
#[allow(missing_docs)] // see above
mod dispatch;
mod error;
mod hopper;
mod launch;
mod ndarray_api;
mod ndarray_backward;
mod ndarray_fp8;
#[allow(missing_docs)] // see above
mod ndarray_kvcache;
mod ndarray_kvcache_fp8;
mod open;
mod page_order;
mod params;
mod prefill_fp8;
mod ptx;
pub mod reference;
#[allow(missing_docs)] // see above
mod tc;
mod tensor;
mod types;
mod validate;
mod varlen;
mod varlen_api;

pub use backward::{BackwardParams, BackwardScratch, Gradients, ScratchSizes};
pub use decode::{BlockTable, DecodeCache, DecodeOptions, KvCache, KvCacheFp8, KvCacheRef, PagedCache, SplitScratch};
pub use device::{FlashAttention, KernelFamily, try_default_context};
pub use error::{FlashAttnError, RefError, Result};
pub use ndarray_api::{
    Backend, default_backend, flash_attn_func, flash_attn_func_cpu, flash_attn_func_cpu_ext, flash_attn_func_ext,
    flash_attn_func_on, flash_attn_func_on_ext, flash_attn_varlen_func,
};
pub use ndarray_backward::{
    HostVarlen, flash_attn_backward, flash_attn_backward_cpu_ext, flash_attn_backward_ext, flash_attn_backward_on_ext,
    flash_attn_varlen_backward,
};
pub use ndarray_kvcache::{HostKvCache, flash_attn_varlen_paged_func, flash_attn_with_kvcache};
pub use ndarray_fp8::flash_attn_fp8_func;
pub use ndarray_kvcache_fp8::flash_attn_with_kvcache_fp8;
pub use open::default_flash_attention;
pub use page_order::{KvCacheCall, MAX_DEVICE_ORDER_BLOCKS, order_block_table};
pub use prefill_fp8::Fp8Descales;
pub use params::{AlibiShape, ForwardParams, LoopOrder, Resolved, default_softmax_scale};
pub use tensor::{
    AlibiSlopes, AttnElem, AttnOutput, Extras, ForwardOutput, RowStats, StatsMut, StatsRef, Tensor, TensorLayout,
    TensorMut, Varlen,
};
pub use types::DType;

/// The math shared by the kernels and the host (`flash-attn-common`):
/// the online-softmax row state, masks, the kernel parameter blocks.
pub use flash_attn_common as common;
/// The FA1 tiling plan and the HBM-traffic model (`flash_attn_common::plan`).
pub use flash_attn_common::plan;
pub use flash_attn_common::{AttnParams, RowState};
