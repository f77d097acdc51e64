//! Special registers: thread, block and grid indices (PTX ISA §10
//! "Special Registers": `%tid`, `%ctaid`, `%ntid`, `%nctaid`).
use core::arch::nvptx;

/// `%tid.x`
#[inline(always)]
pub fn thread_idx_x() -> u32 {
    // SAFETY: reading a special register has no side effects.
    unsafe { nvptx::_thread_idx_x() as u32 }
}
/// `%ntid.x`
#[inline(always)]
pub fn block_dim_x() -> u32 {
    // SAFETY: reading a special register has no side effects.
    unsafe { nvptx::_block_dim_x() as u32 }
}
/// `%ctaid.x`
#[inline(always)]
pub fn block_idx_x() -> u32 {
    // SAFETY: reading a special register has no side effects.
    unsafe { nvptx::_block_idx_x() as u32 }
}
/// `%ctaid.y`
#[inline(always)]
pub fn block_idx_y() -> u32 {
    // SAFETY: reading a special register has no side effects.
    unsafe { nvptx::_block_idx_y() as u32 }
}
/// `%ctaid.z`
#[inline(always)]
pub fn block_idx_z() -> u32 {
    // SAFETY: reading a special register has no side effects.
    unsafe { nvptx::_block_idx_z() as u32 }
}
/// `%nctaid.x`
#[inline(always)]
pub fn grid_dim_x() -> u32 {
    // SAFETY: reading a special register has no side effects.
    unsafe { nvptx::_grid_dim_x() as u32 }
}
/// `%nctaid.y`
#[inline(always)]
pub fn grid_dim_y() -> u32 {
    // SAFETY: reading a special register has no side effects.
    unsafe { nvptx::_grid_dim_y() as u32 }
}
/// Lane index within the warp (`%tid.x % 32` for 1-D blocks).
#[inline(always)]
pub fn lane_id() -> u32 {
    thread_idx_x() & 31
}
/// Warp index within the block (`%tid.x / 32` for 1-D blocks).
#[inline(always)]
pub fn warp_id() -> u32 {
    thread_idx_x() >> 5
}

/// `%ctaid.x` and `%tid.x` read again: an opaque read (not merged with
/// earlier reads by LLVM), so indices derived from them can be recomputed
/// after a long loop instead of being kept live across it.
#[inline(always)]
pub fn block_and_thread_idx_fresh() -> (u32, u32) {
    let (b, t): (u32, u32);
    // SAFETY: reading special registers has no side effects.
    unsafe { core::arch::asm!("mov.u32 {b}, %ctaid.x;\n\tmov.u32 {t}, %tid.x;", b = out(reg32) b, t = out(reg32) t, options(nomem, nostack)) };
    (b, t)
}

/// `%globaltimer`: nanoseconds, the same clock on every SM (the decode
/// kernels' optional timeline).
#[inline(always)]
pub fn globaltimer() -> u64 {
    let t: u64;
    // SAFETY: reading a special register; volatile (not merged or hoisted).
    unsafe { core::arch::asm!("mov.u64 {t}, %globaltimer;", t = out(reg64) t, options(nostack)) };
    t
}

/// `%clock64`: this SM's cycle counter.
#[inline(always)]
pub fn clock64() -> u64 {
    let t: u64;
    // SAFETY: as above.
    unsafe { core::arch::asm!("mov.u64 {t}, %clock64;", t = out(reg64) t, options(nostack)) };
    t
}

/// `%smid`: the SM this block runs on.
#[inline(always)]
pub fn smid() -> u32 {
    let t: u32;
    // SAFETY: as above.
    unsafe { core::arch::asm!("mov.u32 {t}, %smid;", t = out(reg32) t, options(nostack)) };
    t
}
