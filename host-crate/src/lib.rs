//! # flash-attn
//!
//! FlashAttention forward passes written as pure-Rust GPU kernels (compiled
//! by rustc's `nvptx64-nvidia-cuda` target; see `kernel-crate/`), with
//! a host API over cudarc device buffers and over `ndarray` arrays.
//!
//! * [`reference`]: the CPU reference (standard attention, safe and online
//!   softmax, the FA1 and FA2 loop orders), generic over f32 and f64.
//! * [`plan`]: the FA1 tiling plan and the HBM-traffic model.
//! * [`ptx`]: the embedded PTX, one build per target family.
pub mod ptx;

pub use flash_attn_common as common;
pub use flash_attn_common::{AttnParams, RowState};
