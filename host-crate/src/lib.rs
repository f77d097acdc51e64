//! # flash-attn
//!
//! FlashAttention forward passes written as pure-Rust GPU kernels (compiled
//! by rustc's `nvptx64-nvidia-cuda` target; see `kernel-crate/`), with
//! a host API over cudarc device buffers and over `ndarray` arrays.
//!
//! * [`reference`](mod@reference): the CPU reference (standard attention, safe and online
//!   softmax, the FA1 and FA2 loop orders), generic over f32 and f64.
//! * [`plan`]: the FA1 tiling plan and the HBM-traffic model.
//! * [`FlashAttention`] ([`device`], [`api`]): the device-level API over
//!   cudarc buffers on the caller's stream; [`dispatch`]: the one table that
//!   picks kernels and launch configurations; [`error`]: the error type.
//! * [`ndarray_api`]: `flash_attn_func` over `ndarray` arrays, with a CPU
//!   fallback when no GPU is present.
//! * [`ptx`]: the embedded PTX, one build per target family.
//! * [`page_order`]: block tables sorted by address where key order is free
//!   (a paged cache streamed as its pages lie in memory).
//! * [`tc`]: the tensor-core (f16/bf16) kernel table and launch.
//! * [`context_parallel`]: one sequence over several GPUs (ring, zigzag,
//!   Ulysses), with its CPU simulation.
pub mod api;
pub mod backward;
pub mod context_parallel;
pub mod decode;
pub mod decode_kernels;
pub mod device;
pub mod dispatch;
pub mod error;
pub mod hopper;
pub mod ndarray_api;
pub mod ndarray_backward;
pub mod ndarray_kvcache;
pub mod ndarray_kvcache_fp8;
pub mod page_order;
pub mod params;
pub mod ptx;
pub mod reference;
pub mod varlen;
pub mod tc;
pub mod varlen_api;

pub use params::{AlibiShape, ForwardParams, LoopOrder, Resolved};
pub use varlen_api::{Varlen, VarlenOutput};
pub use api::{
    AlibiSlopes, AttnElem, Extras, ForwardOutput, RowStats, StatsMut, Tensor, TensorLayout, TensorMut,
    default_softmax_scale,
};
pub use backward::{BackwardParams, BackwardScratch, Gradients, ScratchSizes};
pub use decode::{BlockTable, DecodeOptions, KvCache, KvCacheFp8, KvCacheRef, PagedCache, SplitScratch};
pub use device::FlashAttention;
pub use dispatch::DType;
pub use error::{FlashAttnError, Result};
pub use hopper::KernelFamily;
pub use ndarray_backward::{
    HostVarlen, flash_attn_backward, flash_attn_backward_cpu_ext, flash_attn_backward_ext, flash_attn_backward_on_ext,
    flash_attn_varlen_backward,
};
pub use ndarray_kvcache::{HostKvCache, flash_attn_varlen_paged_func, flash_attn_with_kvcache};
pub use ndarray_kvcache_fp8::flash_attn_with_kvcache_fp8;
pub use page_order::{KvCacheCall, order_block_table};
pub use ndarray_api::{
    Backend, default_backend, flash_attn_func, flash_attn_func_ext, flash_attn_func_on, flash_attn_func_on_ext,
    flash_attn_varlen_func,
};
pub use flash_attn_common as common;
pub use flash_attn_common::plan;
pub use flash_attn_common::{AttnParams, RowState};
