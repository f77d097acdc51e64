//! FlashAttention device code, compiled for `nvptx64-nvidia-cuda` by
//! `host-crate/build.rs` (`host-crate/build/kernels.rs`). On any other target
//! the crate is empty: flash-attn depends on it only for its sources (this
//! package's folder reaches flash-attn's build script through `links`
//! metadata, see `build.rs`).
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
#![cfg_attr(target_arch = "nvptx64", no_std)]
#![cfg_attr(
    target_arch = "nvptx64",
    feature(abi_ptx, stdarch_nvptx, asm_experimental_arch, core_intrinsics, gpu_intrinsics, gpu_launch_sized_workgroup_mem)
)]
#![cfg_attr(target_arch = "nvptx64", allow(internal_features))]

#[cfg(target_arch = "nvptx64")]
pub mod arch;
#[cfg(target_arch = "nvptx64")]
pub mod bwd;
#[cfg(target_arch = "nvptx64")]
pub mod decode;
#[cfg(target_arch = "nvptx64")]
pub mod fa1;
#[cfg(target_arch = "nvptx64")]
pub mod fa2;
#[cfg(all(target_arch = "nvptx64", fa_sm90a))]
pub mod hopper;
#[cfg(target_arch = "nvptx64")]
pub mod page_order;
#[cfg(target_arch = "nvptx64")]
pub mod ring;
#[cfg(target_arch = "nvptx64")]
pub mod score;
#[cfg(target_arch = "nvptx64")]
pub mod softmax_rows;
#[cfg(target_arch = "nvptx64")]
pub mod standard;
#[cfg(target_arch = "nvptx64")]
pub mod tc;
#[cfg(target_arch = "nvptx64")]
pub mod tile;

#[cfg(target_arch = "nvptx64")]
#[panic_handler]
fn panic(_: &core::panic::PanicInfo) -> ! {
    // SAFETY: `trap` aborts the kernel; nothing after it runs.
    unsafe { core::arch::nvptx::trap() }
}
