//! The tensor-core kernels (f16/bf16, `kernel-crate/src/tc/`): the table of
//! compiled configurations, the default choice per head dim with the
//! measurement that chose it, and their launch.
//!
//! Kernel names are `flash_fwd_tc_{fa1,fa2}_{f16,bf16}_d{D}_w{warps}_m{MT}_bc{Bc}`;
//! `Br = 16 · MT · warps` (each warp owns `MT` m-tiles of 16 query rows).
//!
//! * `table`: the configurations ([`TC_KERNELS`], [`TcKernel`]) and the
//!   default per head dim and device ([`TcKernel::preferred`]); no GPU,
//!   below `dispatch`;
//! * `launch`: [`KernelArg`] and [`TcModule`], above the device.

mod launch;
mod table;

pub use launch::{KernelArg, TcModule};
pub use table::{TC_HEAD_DIMS, TC_KERNELS, TcKernel, TcLoop};
