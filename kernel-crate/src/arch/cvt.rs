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

/// `cvt.rn.f16x2.e4m3x2 d, a` (sm_89+, PTX ISA 7.8): two FP8 e4m3 codes
/// (byte 0 → the low half) as f16 — exact (every e4m3 value, subnormals
/// included, is a normal f16 or zero).
#[cfg(fa_ptx74)]
#[inline(always)]
pub fn e4m3x2_to_f16x2(x: u16) -> u32 {
    let d: u32;
    // SAFETY: register-only instruction.
    unsafe { core::arch::asm!("cvt.rn.f16x2.e4m3x2 {d}, {x};", d = out(reg32) d, x = in(reg16) x, options(pure, nomem, nostack)) };
    d
}

/// Two f16 that came from e4m3 codes (normal or zero, at most 3 mantissa
/// bits) as bf16, exactly: the f16 bits moved to bf16's field positions
/// read as the value times 2⁻¹¹² (the 5-bit exponent lands in the low bits
/// of bf16's 8-bit one), and `mul.rn.bf16x2` by 2¹¹² (sm_90) puts the scale
/// back without rounding. Zero stays zero.
#[cfg(fa_ptx74)]
#[inline(always)]
pub fn f16x2_from_e4m3_to_bf16x2(x: u32) -> u32 {
    let moved = ((x >> 3) & 0x0fff_0fff) | (x & 0x8000_8000);
    let d: u32;
    // SAFETY: register-only instruction. 0x7780 is 2¹¹² in bf16.
    unsafe { core::arch::asm!("mul.rn.bf16x2 {d}, {a}, {s};", d = out(reg32) d, a = in(reg32) moved, s = in(reg32) 0x7780_7780u32, options(pure, nomem, nostack)) };
    d
}

/// Four e4m3 codes (byte `i` = code `i`) as two f16 pairs **times 2⁻⁸**,
/// by moving bits (no conversion instruction): `[(c0, c2), (c1, c3)]`
/// (low half first). An e4m3 code `s eeee mmm` read as the f16 `s 0eeee
/// mmm0000000` is its value times 2⁻⁸ — subnormal codes too, as f16
/// subnormals — so the caller multiplies 2⁸ back in wherever it is exact
/// (a scale). NaN codes (`0x7f`, `0xff`) become finite; callers hold
/// saturated codes only.
#[inline(always)]
pub fn e4m3x4_to_f16x2_scaled(x: u32) -> [u32; 2] {
    const SIGN: u32 = 0x8000_8000;
    const EM: u32 = 0x3f80_3f80; // bits 7..13 of each half
    [((x << 8) & SIGN) | ((x << 7) & EM), (x & SIGN) | ((x >> 1) & EM)]
}

/// Four e4m3 codes as two bf16 pairs, exactly: `[(c0, c2), (c1, c3)]`. The
/// code `s eeee mmm` read as the bf16 `s 0000eeee mmm0000` is its value
/// times 2⁻¹²⁰ (subnormal codes land on bf16 subnormals), and
/// `mul.rn.bf16x2` by 2¹²⁰ (sm_90) restores it without rounding. NaN codes
/// become finite (callers hold saturated codes only).
#[cfg(fa_ptx74)]
#[inline(always)]
pub fn e4m3x4_to_bf16x2(x: u32) -> [u32; 2] {
    const SIGN: u32 = 0x8000_8000;
    const EM: u32 = 0x07f0_07f0; // bits 4..10 of each half
    let moved = [((x << 8) & SIGN) | ((x << 4) & EM), (x & SIGN) | ((x >> 4) & EM)];
    moved.map(|m| {
        let d: u32;
        // SAFETY: register-only instruction. 0x7b80 is 2¹²⁰ in bf16.
        unsafe { core::arch::asm!("mul.rn.bf16x2 {d}, {a}, {s};", d = out(reg32) d, a = in(reg32) m, s = in(reg32) 0x7b80_7b80u32, options(pure, nomem, nostack)) };
        d
    })
}

/// `cvt.rn.satfinite.e4m3x2.f32 d, hi, lo` (sm_89+): two f32 as FP8 e4m3
/// codes, round to nearest even, saturating to ±448 (NaN stays NaN); `lo`
/// in the low byte.
#[cfg(fa_ptx74)]
#[inline(always)]
pub fn pack_e4m3x2(lo: f32, hi: f32) -> u16 {
    let d: u16;
    // SAFETY: register-only instruction.
    unsafe { core::arch::asm!("cvt.rn.satfinite.e4m3x2.f32 {d}, {h}, {l};", d = out(reg16) d, h = in(reg32) hi, l = in(reg32) lo, options(pure, nomem, nostack)) };
    d
}

/// `prmt.b32 d, a, b, sel`: byte `i` of `d` is byte `sel` nibble `i` of the
/// eight bytes `b:a` (`a` bytes 0–3, `b` bytes 4–7).
#[inline(always)]
pub fn prmt(a: u32, b: u32, sel: u32) -> u32 {
    let d: u32;
    // SAFETY: register-only instruction.
    unsafe { core::arch::asm!("prmt.b32 {d}, {a}, {b}, {s};", d = out(reg32) d, a = in(reg32) a, b = in(reg32) b, s = in(reg32) sel, options(pure, nomem, nostack)) };
    d
}
