//! Named barriers (PTX ISA §9.7.13.1 `bar.sync` / `bar.arrive` with an id):
//! 16 per block, id 0 is `__syncthreads`. The Hopper kernels use ids 1 and
//! 2 to order the two consumer warpgroups' GEMM issues (pingpong).

/// `bar.sync id, count;` — waits until `count` threads (a multiple of 32,
/// these included) arrived on barrier `id`.
///
/// # Safety
/// Whole warps call it; the threads that sync and arrive on `id` add up to
/// `count` per phase (a mismatch is a hang, not memory unsafety, but the
/// kernels keep it exact).
#[inline(always)]
pub unsafe fn named_bar_sync(id: u32, count: u32) {
    // SAFETY: forwarded to the caller.
    unsafe { core::arch::asm!("bar.sync {i}, {c};", i = in(reg32) id, c = in(reg32) count, options(nostack)) }
}

/// `bar.arrive id, count;` — arrives on barrier `id` without waiting.
///
/// # Safety
/// As [`named_bar_sync`].
#[inline(always)]
pub unsafe fn named_bar_arrive(id: u32, count: u32) {
    // SAFETY: forwarded to the caller.
    unsafe { core::arch::asm!("bar.arrive {i}, {c};", i = in(reg32) id, c = in(reg32) count, options(nostack)) }
}
