//! Tuning, benchmarking and kernel-selection internals; **no stability
//! promise**: these items follow the kernels and change with them.
//!
//! The front doors ([`FlashAttention`](crate::FlashAttention),
//! [`flash_attn_func`](crate::flash_attn_func), …) choose kernels by
//! themselves. What is here is for the repository's own tests, benchmarks
//! and tuning tools, and for users who pick a kernel by hand: the kernel
//! tables, the dispatch rule, the Hopper tensor-map launch, the split-KV
//! heuristics of decode, the embedded PTX builds and the pure validation
//! functions.

/// The dispatch rule: problem → kernel family, tiles and grid.
pub mod dispatch {
    pub use crate::dispatch::{DeviceLimits, DispatchKey, F32_KERNELS, Launch, Plan, plan, tc_head_dim, tc_supports};
    pub use crate::types::{Dims, Features};
}

/// The tensor-core (`mma.sync`, f16/bf16) kernel table and a direct launcher.
pub mod tc {
    pub use crate::tc::{KernelArg, TC_HEAD_DIMS, TC_KERNELS, TcKernel, TcLoop, TcModule};
}

/// The Hopper-native (sm_90a) kernels: table, head-dim mapping, tensor maps
/// and launches.
pub mod hopper {
    pub use crate::hopper::{
        HOPPER_FP8_KERNELS, HOPPER_KERNELS, HopperFp8Kernel, HopperKernel, PROBE_KERNELS, PROBE_SMEM_BYTES, TensorMap, hopper_head_dim, launch_params,
        launch_with_maps, tensor_maps, tensor_maps_in_global_memory,
    };
}

/// Flash-decoding: its kernel tables (16-bit and FP8 caches), the split-KV heuristics and the
/// per-block timeline of `DecodeOptions::timeline`.
pub mod decode {
    pub use crate::decode::{
        DEC_F8_KERNELS, DEC_KERNELS, DecKernel, MAX_SPLITS, MAX_TICKET_BANDWIDTH_PER_SM, MIN_TICKET_BLOCKS_PER_SPLIT,
        NO_SPLIT_FILL, SHORT_KEY_BLOCKS, decode_no_split_fill, decode_splits_heuristic, num_splits_heuristic, timeline,
    };
}

/// The embedded PTX builds (one per target family).
pub mod ptx {
    pub use crate::ptx::{PtxBuild, SplitPtx, for_compute_capability, portable_for_compute_capability};
}

/// The pure validation of the device API (no GPU needed): what a call's
/// layouts, buffer lengths and options become before any launch.
pub mod validate {
    pub use crate::validate::{MAX_DIM, MAX_HEADDIM, Problem, validate, validate_varlen};
    pub use crate::varlen::{SeqSpan, check_alibi, check_gqa, check_varlen};
}
