//! Barriers (PTX ISA §9.7.13.1 `bar.sync` / `barrier.sync`).

/// `bar.sync 0`: block-wide barrier; orders shared-memory accesses of all
/// threads of the block.
///
/// Every thread of the block must reach it (no divergent calls).
#[inline(always)]
pub fn sync_threads() {
    // SAFETY: a barrier has no memory-safety preconditions; callers keep it
    // non-divergent (a divergent barrier is a hang, not UB in Rust's sense).
    unsafe { core::arch::nvptx::_syncthreads() }
}

/// `bar.warp.sync 0xffffffff`: re-converges the warp.
#[inline(always)]
pub fn sync_warp() {
    // SAFETY: warp barrier with the full mask; all lanes execute it.
    unsafe { core::arch::asm!("bar.warp.sync 0xffffffff;", options(nostack)) }
}
