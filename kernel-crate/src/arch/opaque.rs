//! Values LLVM cannot see through: a `mov` in inline asm hides what the
//! optimizer knows about a value (its range), so it cannot narrow
//! arithmetic on it.

/// `x`, unknown to the optimizer. Used where a known range makes LLVM
/// narrow a 32-bit division to 16 bits, which ptxas lowers to a call into
/// a subroutine placed at the far end of the kernel's code (a cold
/// instruction fetch at kernel start: decode step 23).
#[inline(always)]
pub fn u32(x: u32) -> u32 {
    let y: u32;
    // SAFETY: a register move.
    unsafe { core::arch::asm!("mov.b32 {y}, {x};", y = out(reg32) y, x = in(reg32) x, options(pure, nomem, nostack)) };
    y
}

/// `x`, recomputed where it is used: a `mov` LLVM treats as having side
/// effects, so it neither hoists it out of a loop nor merges two of them.
/// A shared-memory tile base passed through it inside a loop keeps the
/// fragment addresses derived from it (`base + constant`) inside the loop,
/// where ptxas folds the constants into the `ldmatrix` address operand,
/// instead of one hoisted register per address (the backward kernel's
/// spills, `tc::bwd`).
#[inline(always)]
pub fn u32_fresh(x: u32) -> u32 {
    let y: u32;
    // SAFETY: a register move.
    unsafe { core::arch::asm!("mov.b32 {y}, {x};", y = out(reg32) y, x = in(reg32) x, options(nomem, nostack)) };
    y
}

/// [`u32_fresh`] for 64-bit values (global addresses advanced row by row:
/// each step's sum stays in the loop instead of a hoisted multiple of the
/// stride per row).
#[inline(always)]
pub fn u64_fresh(x: u64) -> u64 {
    let y: u64;
    // SAFETY: a register move.
    unsafe { core::arch::asm!("mov.b64 {y}, {x};", y = out(reg64) y, x = in(reg64) x, options(nomem, nostack)) };
    y
}
