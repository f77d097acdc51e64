//! Math written once, compiled both into the `#![no_std]` kernel crate (for
//! `nvptx64-nvidia-cuda`) and into the host library, where the property tests
//! exercise exactly the code that runs on the GPU.
//!
//! * [`real`]: the small float trait the math is generic over (f32/f64 on the
//!   host through `std`, f32 on the GPU through PTX `ex2.approx`/`lg2.approx`).
//! * [`softmax`]: the online-softmax row state (`m_i`, `l_i`), its rescale and
//!   its finalization with the `-inf` guards of seed 003.
//! * [`params`]: the `#[repr(C)]` parameter block every attention kernel takes.
//! * [`bwd_params`]: the backward kernels' block (the forward's plus gradients and scratch).
//! * [`plan`]: the FA1 tiling plan (`Bc = ceil(M/4d)`, `Br = min(ceil(M/4d), d)`)
//!   and the HBM-traffic model of standard attention, FA1 and FA2.
//! * [`smem_layout`]: thread shape and shared-memory layout of the f32 kernels.
//! * [`tc`]: shared-memory footprint of the tensor-core kernels.
//! * [`tc_bwd`]: the tensor-core backward's configurations and block ranges.
//! * [`page_order`]: which block-table slots may be read in address order.
//! * [`ring`]: the exact merge of partial (O, LSE) of context-parallel attention.
#![cfg_attr(not(feature = "std"), no_std)]
#![cfg_attr(target_arch = "nvptx64", feature(asm_experimental_arch))]

pub mod bwd_params;
pub mod decode_params;
pub mod hopper;
pub mod hopper_bwd;
pub mod hopper_fp8;
pub mod mask;
pub mod page_order;
pub mod params;
pub mod plan;
pub mod real;
pub mod ring;
pub mod smem_layout;
pub mod softmax;
pub mod tc;
pub mod tc_bwd;

pub use bwd_params::BwdParams;
pub use decode_params::DecodeParams;
pub use mask::{KeyWindow, ScoreMod, UNBOUNDED};
pub use params::{AttnParams, INTERLEAVE_PAGED, MAX_TICKET_BLOCKS, SeqInfo};
pub use plan::{HbmTraffic, PlanError, TilingPlan};
pub use real::Real;
pub use softmax::{LN_2, LOG2_E, RowState};
