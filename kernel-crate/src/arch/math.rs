//! Scalar arithmetic whose instruction the kernels choose themselves.

/// `a·b + c` rounded once (PTX `fma.rn.f32`): LLVM fuses a multiply and an
/// add only where it is allowed to, and the kernels that want the fused
/// form (one instruction, one rounding) say so.
#[inline(always)]
pub fn fma_f32(a: f32, b: f32, c: f32) -> f32 {
    let d: f32;
    // SAFETY: pure register-to-register arithmetic instruction.
    unsafe { core::arch::asm!("fma.rn.f32 {d}, {a}, {b}, {c};", d = out(reg32) d, a = in(reg32) a, b = in(reg32) b, c = in(reg32) c, options(pure, nomem, nostack)) };
    d
}
