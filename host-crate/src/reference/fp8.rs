//! FP8 e4m3 (OCP `E4M3FN`, the H100's `e4m3`) on the CPU: the exact
//! rounding the GPU's `cvt.rn.satfinite.e4m3x2.f32` performs, the decoding
//! of `cvt.rn.f16x2.e4m3x2`, and the scale conventions of FlashAttention-3's
//! FP8 path, so that FP8 results are checked against f64 attention over the
//! very values the kernels see (the *dequantized* inputs).
//!
//! The format: 1 sign bit, 4 exponent bits (bias 7), 3 mantissa bits; no
//! infinities; `S.1111.111` is NaN; the largest finite value is 448
//! (`S.1111.110`); normals down to 2⁻⁶, subnormals `m · 2⁻⁹`, `m` in 1..=7.
//!
//! Scales: a tensor `x` is stored as `e4m3(x / scale)` and read back as
//! `e4m3_to_f32(b) · scale` — FA3's `descale` is that `scale` (one per tensor,
//! or one per (batch, KV head)). [`scale_for_amax`] maps a tensor's largest
//! magnitude onto 448.

use ndarray::{Array4, ArrayD, ArrayView4, ArrayViewD};

use super::RefError;

/// The largest finite e4m3 value.
pub const E4M3_MAX: f32 = 448.0;

/// The canonical NaN code (`0x7F`; `0xFF` is NaN too).
pub const E4M3_NAN: u8 = 0x7F;

/// `x` rounded to e4m3, to nearest with ties to even, magnitudes beyond
/// [`E4M3_MAX`] (infinities included) saturated to ±448, NaN to
/// [`E4M3_NAN`] — `cvt.rn.satfinite.e4m3x2.f32`, one lane.
pub fn e4m3_from_f32(x: f32) -> u8 {
    if x.is_nan() {
        return E4M3_NAN;
    }
    let sign = if x.is_sign_negative() { 0x80u8 } else { 0 };
    // f64 holds every f32 and every step below exactly.
    let a = (x as f64).abs();
    if a >= E4M3_MAX as f64 {
        return sign | 0x7E;
    }
    const MIN_NORMAL: f64 = 1.0 / 64.0; // 2^-6
    let code = if a < MIN_NORMAL {
        // Subnormals (and zero): multiples of 2^-9; 8 · 2^-9 is the
        // smallest normal, whose code is 8 as well.
        (a * 512.0).round_ties_even() as u8
    } else {
        // a = 2^e · (1 + f), 1 + f in [1, 2): the exponent from the bits.
        let e = ((a.to_bits() >> 52) & 0x7FF) as i32 - 1023;
        let q = (a / f64::powi(2.0, e) - 1.0) * 8.0;
        let q = q.round_ties_even() as i32; // 0..=8; 8 carries into e + 1
        let (e, q) = if q == 8 { (e + 1, 0) } else { (e, q) };
        (((e + 7) as u8) << 3) | q as u8
    };
    // Rounding up to 2^9 · 0.9375 = 480 cannot happen: a < 448 rounds to
    // at most 448 (the midpoint 464 lies above).
    sign | code
}

/// The value of an e4m3 code (exact in f32): `cvt.rn.f16x2.e4m3x2`, one lane.
pub fn e4m3_to_f32(b: u8) -> f32 {
    let sign = if b & 0x80 != 0 { -1.0f32 } else { 1.0 };
    let e = (b >> 3) & 0x0F;
    let m = (b & 0x07) as f32;
    match e {
        0x0F if b & 0x07 == 0x07 => f32::NAN,
        0 => sign * m * f32::powi(2.0, -9),
        _ => sign * (1.0 + m / 8.0) * f32::powi(2.0, e as i32 - 7),
    }
}

/// The scale that maps a largest magnitude `amax` onto [`E4M3_MAX`] (1 for an
/// all-zero tensor, so that dequantizing stays finite).
pub fn scale_for_amax(amax: f32) -> f32 {
    if amax > 0.0 && amax.is_finite() { amax / E4M3_MAX } else { 1.0 }
}

/// `e4m3(x / scale)` element by element (one scale for the whole tensor).
pub fn quantize(x: ArrayViewD<'_, f32>, scale: f32) -> ArrayD<u8> {
    x.mapv(|v| e4m3_from_f32(v / scale))
}

/// `e4m3_to_f32(b) · scale` element by element, in f64: the inputs the
/// f64 reference attends over.
pub fn dequantize(b: ArrayViewD<'_, u8>, scale: f32) -> ArrayD<f64> {
    b.mapv(|c| e4m3_to_f32(c) as f64 * scale as f64)
}

/// [`quantize`] with one scale per head: `x` is `(batch, seqlen, nheads,
/// headdim)` (a K or V tensor, or a KV cache), `scales` is `(batch, nheads)`
/// row-major (FA3's per-(batch, KV head) descale) or a single value (one
/// scale for the tensor).
pub fn quantize_per_head(x: ArrayView4<'_, f32>, scales: &[f32]) -> Result<Array4<u8>, RefError> {
    let (b, _, h, _) = x.dim();
    check_scales(scales, b, h)?;
    Ok(Array4::from_shape_fn(x.dim(), |(bi, s, hi, c)| {
        e4m3_from_f32(x[(bi, s, hi, c)] / head_scale(scales, h, bi, hi))
    }))
}

/// [`dequantize`] with one scale per head (the layout of [`quantize_per_head`]).
pub fn dequantize_per_head(x: ArrayView4<'_, u8>, scales: &[f32]) -> Result<Array4<f64>, RefError> {
    let (b, _, h, _) = x.dim();
    check_scales(scales, b, h)?;
    Ok(Array4::from_shape_fn(x.dim(), |(bi, s, hi, c)| {
        e4m3_to_f32(x[(bi, s, hi, c)]) as f64 * head_scale(scales, h, bi, hi) as f64
    }))
}

fn head_scale(scales: &[f32], nheads: usize, b: usize, h: usize) -> f32 {
    if scales.len() == 1 { scales[0] } else { scales[b * nheads + h] }
}

fn check_scales(scales: &[f32], batch: usize, nheads: usize) -> Result<(), RefError> {
    if scales.len() != 1 && scales.len() != batch * nheads {
        return Err(RefError::BadFp8Scales {
            reason: format!("{} values; expected 1 (per tensor) or batch · nheads = {} (per head)", scales.len(), batch * nheads),
        });
    }
    if let Some(s) = scales.iter().find(|s| !(s.is_finite() && **s > 0.0)) {
        return Err(RefError::BadFp8Scales { reason: format!("{s} is not a finite positive number") });
    }
    Ok(())
}

/// FP8 attention as FlashAttention-3 defines it, in f64 over the
/// **dequantized** inputs: q `(batch, seqlen_q, nheads, d)`, k and v
/// `(batch, seqlen_k, nheads_k, d)` as e4m3 codes, each descale one f32 or
/// `(batch, nheads_k)` (a query head reads its KV head's; `None` is 1).
/// Options as [`super::features::attention`] (causal, window; no softcap in
/// FP8 calls). What `FlashAttention::forward_fp8` is checked against (up to
/// its e4m3 rounding of the probabilities).
pub fn attention_fp8(
    q: ArrayView4<'_, u8>,
    k: ArrayView4<'_, u8>,
    v: ArrayView4<'_, u8>,
    descales: [Option<&[f32]>; 3],
    params: &crate::params::ForwardParams,
) -> crate::error::Result<super::AttnOutput<f64>> {
    let (b, _, h, _) = q.dim();
    let hk = k.dim().2;
    if hk == 0 || h % hk != 0 {
        return Err(crate::error::FlashAttnError::InvalidArgument { argument: "k", value: format!("nheads_k {hk}"), reason: "must divide q's nheads" });
    }
    let [qs, ks, vs] = descales.map(|s| s.unwrap_or(&[1.0]));
    for s in [qs, ks, vs] {
        check_scales(s, b, hk)?;
    }
    let group = h / hk;
    let qd = Array4::from_shape_fn(q.dim(), |(bi, s, hi, c)| e4m3_to_f32(q[(bi, s, hi, c)]) as f64 * head_scale(qs, hk, bi, hi / group) as f64);
    let kd = dequantize_per_head(k, ks)?;
    let vd = dequantize_per_head(v, vs)?;
    super::features::attention::<f64>(qd.view(), kd.view(), vd.view(), params, None)
}
