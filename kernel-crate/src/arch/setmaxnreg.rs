//! Warpgroup register reallocation (PTX ISA §9.7.17.1 `setmaxnreg`, sm_90a).
//! Takes effect only when the kernel has a register cap at entry
//! (`.maxntid` and `.minnctapersm 1`, which `host-crate/build.rs` adds to the
//! Hopper entries); otherwise ptxas ignores it with warning C7508.

/// `setmaxnreg.inc.sync.aligned.u32 N;` — raises this warpgroup's
/// per-thread register limit to `N` (a multiple of 8 in 24..=256), waiting
/// until another warpgroup released enough.
#[inline(always)]
pub fn setmaxnreg_inc<const N: u32>() {
    // SAFETY: all threads of the warpgroup execute it (the kernels call it
    // at the top of a warpgroup-uniform branch).
    unsafe { core::arch::asm!("setmaxnreg.inc.sync.aligned.u32 {n};", n = const N, options(nostack)) }
}

/// `setmaxnreg.dec.sync.aligned.u32 N;` — lowers it to `N`, releasing the
/// rest to the block's pool.
#[inline(always)]
pub fn setmaxnreg_dec<const N: u32>() {
    // SAFETY: as `setmaxnreg_inc`.
    unsafe { core::arch::asm!("setmaxnreg.dec.sync.aligned.u32 {n};", n = const N, options(nostack)) }
}
