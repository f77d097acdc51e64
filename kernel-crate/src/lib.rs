//! FlashAttention device code. Built only for `nvptx64-nvidia-cuda` (by
//! `host-crate/build.rs`), never for the host.
//!
//! * `arch/`: one file per hardware primitive; all inline PTX lives there.
//! * `softmax_rows`: row-wise online softmax (one pass for max and sum).
//! * `tile/`, `fa1`, `fa2`, `standard`: the f32 kernels (the readable
//!   reference GPU path): shared-memory tiles, Algorithm 1, FA2, Algorithm 0.
//! * `tc/`: tensor-core FA2 and FA1 kernels for f16/bf16.
//! * `page_order`: block tables sorted by address on the device.
//! * `ring`: the merge of context-parallel partials (`ring_merge_*`).
//!
//! Every exported entry point is `extern "ptx-kernel"` and takes one
//! `#[repr(C)]` parameter block from `flash_attn_common` (`params`,
//! `decode_params`, `page_order`, `ring`).
#![no_std]
#![feature(abi_ptx, stdarch_nvptx, asm_experimental_arch, core_intrinsics, gpu_intrinsics, gpu_launch_sized_workgroup_mem)]
#![allow(internal_features)]

pub mod arch;
pub mod bwd;
pub mod decode;
pub mod fa1;
pub mod fa2;
#[cfg(fa_sm90a)]
pub mod hopper;
pub mod page_order;
pub mod ring;
pub mod score;
pub mod softmax_rows;
pub mod standard;
pub mod tc;
pub mod tile;

#[cfg(target_arch = "nvptx64")]
#[panic_handler]
fn panic(_: &core::panic::PanicInfo) -> ! {
    // SAFETY: `trap` aborts the kernel; nothing after it runs.
    unsafe { core::arch::nvptx::trap() }
}
