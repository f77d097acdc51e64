//! Conversions (PTX ISA §9.7.9.21 `cvt`).

/// `cvt.rn.f16x2.f32 d, hi, lo`: packs two f32 as f16 (round to nearest
/// even), `lo` in the low 16 bits.
#[inline(always)]
pub fn pack_f16x2(lo: f32, hi: f32) -> u32 {
    let d: u32;
    // SAFETY: register-only instruction.
    unsafe { core::arch::asm!("cvt.rn.f16x2.f32 {d}, {h}, {l};", d = out(reg32) d, h = in(reg32) hi, l = in(reg32) lo, options(pure, nomem, nostack)) };
    d
}

/// `cvt.rn.bf16x2.f32 d, hi, lo` (sm_80+): packs two f32 as bf16.
#[inline(always)]
pub fn pack_bf16x2(lo: f32, hi: f32) -> u32 {
    let d: u32;
    // SAFETY: register-only instruction.
    unsafe { core::arch::asm!("cvt.rn.bf16x2.f32 {d}, {h}, {l};", d = out(reg32) d, h = in(reg32) hi, l = in(reg32) lo, options(pure, nomem, nostack)) };
    d
}

/// f16 bits → f32 (`cvt.f32.f16`).
#[inline(always)]
pub fn f16_to_f32(x: u16) -> f32 {
    let d: f32;
    // SAFETY: register-only instruction.
    unsafe { core::arch::asm!("cvt.f32.f16 {d}, {x};", d = out(reg32) d, x = in(reg16) x, options(pure, nomem, nostack)) };
    d
}

/// bf16 bits → f32 (exact: the bf16 bits are the high half of the f32).
#[inline(always)]
pub fn bf16_to_f32(x: u16) -> f32 {
    f32::from_bits((x as u32) << 16)
}

/// f32 → f16 bits (`cvt.rn.f16.f32`).
#[inline(always)]
pub fn f32_to_f16(x: f32) -> u16 {
    pack_f16x2(x, 0.0) as u16
}

/// f32 → bf16 bits (`cvt.rn.bf16.f32` through the packed form, sm_80+).
#[inline(always)]
pub fn f32_to_bf16(x: f32) -> u16 {
    pack_bf16x2(x, 0.0) as u16
}
