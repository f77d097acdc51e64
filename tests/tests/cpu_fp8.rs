//! The CPU reference's e4m3 (OCP E4M3FN): decoding of all 256 codes from the
//! format's definition, rounding to nearest even at every midpoint between
//! neighbouring values, saturation, NaN, and the per-head scale layout.

use flash_attn::reference::RefError;
use flash_attn::reference::fp8::{
    E4M3_MAX, E4M3_NAN, dequantize, dequantize_per_head, e4m3_from_f32, e4m3_to_f32, quantize, quantize_per_head,
    scale_for_amax,
};
use ndarray::{Array4, IxDyn};

/// Every finite non-negative value, ascending, with its code.
fn positive_values() -> Vec<(f32, u8)> {
    let mut v: Vec<(f32, u8)> = (0u8..0x7F).map(|c| (e4m3_to_f32(c), c)).collect();
    v.sort_by(|a, b| a.0.partial_cmp(&b.0).unwrap());
    v
}

#[test]
fn decodes_every_code_as_the_format_defines() {
    // Written differently from the library: exponent field e, mantissa m.
    for c in 0u16..256 {
        let c = c as u8;
        let (s, e, m) = (c >> 7, (c >> 3) & 15, c & 7);
        let got = e4m3_to_f32(c);
        if e == 15 && m == 7 {
            assert!(got.is_nan(), "code {c:#04x}");
            continue;
        }
        let mag = if e == 0 { m as f64 / 512.0 } else { (8 + m) as f64 / 8.0 * 2f64.powi(e as i32 - 7) };
        let want = if s == 1 { -mag } else { mag };
        assert_eq!(got as f64, want, "code {c:#04x}");
    }
    assert_eq!(e4m3_to_f32(0x7E), 448.0);
    assert_eq!(e4m3_to_f32(0x01), 2f32.powi(-9));
    assert_eq!(e4m3_to_f32(0x08), 2f32.powi(-6));
    assert!(e4m3_to_f32(0xFF).is_nan());
}

#[test]
fn every_value_round_trips() {
    for c in 0u16..256 {
        let c = c as u8;
        let x = e4m3_to_f32(c);
        if x.is_nan() {
            assert_eq!(e4m3_from_f32(x), E4M3_NAN);
        } else {
            assert_eq!(e4m3_from_f32(x), c, "{x}");
        }
    }
}

#[test]
fn rounds_to_nearest_with_ties_to_even() {
    let vals = positive_values();
    for w in vals.windows(2) {
        let ((lo, clo), (hi, chi)) = (w[0], w[1]);
        let mid = ((lo as f64 + hi as f64) / 2.0) as f32;
        assert_eq!(mid as f64, (lo as f64 + hi as f64) / 2.0, "midpoints are exact in f32");
        // The tie goes to the even code (mantissa's last bit 0).
        let even = if clo & 1 == 0 { clo } else { chi };
        assert_eq!(e4m3_from_f32(mid), even, "tie between {lo} and {hi}");
        assert_eq!(e4m3_from_f32(-mid), 0x80 | even, "tie between -{lo} and -{hi}");
        // Just off the midpoint: the nearer neighbour.
        let below = f32::from_bits(mid.to_bits() - 1);
        let above = f32::from_bits(mid.to_bits() + 1);
        assert_eq!(e4m3_from_f32(below), clo, "just below the midpoint of {lo} and {hi}");
        assert_eq!(e4m3_from_f32(above), chi, "just above the midpoint of {lo} and {hi}");
    }
}

#[test]
fn saturates_and_keeps_nan() {
    for x in [448.0f32, 449.0, 463.9, 464.0, 480.0, 1e6, f32::MAX, f32::INFINITY] {
        assert_eq!(e4m3_from_f32(x), 0x7E, "{x}");
        assert_eq!(e4m3_from_f32(-x), 0xFE, "-{x}");
    }
    assert_eq!(e4m3_from_f32(f32::NAN), E4M3_NAN);
    // Below half the smallest subnormal: zero, with its sign.
    assert_eq!(e4m3_from_f32(2f32.powi(-11)), 0x00);
    assert_eq!(e4m3_from_f32(-2f32.powi(-11)), 0x80);
    assert_eq!(e4m3_from_f32(-0.0), 0x80);
    assert_eq!(e4m3_from_f32(f32::MIN_POSITIVE), 0x00);
    // Exactly half the smallest subnormal ties to even: zero.
    assert_eq!(e4m3_from_f32(2f32.powi(-10)), 0x00);
}

#[test]
fn quantization_error_is_within_half_a_step() {
    // Relative error of a normal value ≤ 2^-4 (3 mantissa bits, round to nearest).
    let mut x = 2f32.powi(-6);
    while x < E4M3_MAX {
        let q = e4m3_to_f32(e4m3_from_f32(x));
        assert!(((q - x) / x).abs() <= 1.0 / 16.0 + 1e-7, "{x} -> {q}");
        x *= 1.0137;
    }
}

#[test]
fn scales_map_amax_to_448_and_back() {
    let amax = 3.7f32;
    let s = scale_for_amax(amax);
    assert_eq!(e4m3_to_f32(e4m3_from_f32(amax / s)), 448.0);
    assert_eq!(scale_for_amax(0.0), 1.0);
    let x = ndarray::ArrayD::from_shape_fn(IxDyn(&[3, 5]), |i| (i[0] as f32 - 1.0) * 0.61 + i[1] as f32 * 0.17);
    let q = quantize(x.view(), s);
    let d = dequantize(q.view(), s);
    for (a, b) in x.iter().zip(d.iter()) {
        assert!((*a as f64 - b).abs() <= (*a as f64).abs() / 16.0 + 2f64.powi(-10) * s as f64, "{a} vs {b}");
    }
}

#[test]
fn per_head_scales() {
    let (b, n, h, d) = (2, 3, 2, 4);
    let x = Array4::from_shape_fn((b, n, h, d), |(bi, i, hi, c)| (1 + bi + 3 * hi) as f32 * (0.1 * (i * d + c) as f32 - 0.5));
    let scales: Vec<f32> = (0..b * h).map(|i| 0.01 * (i + 1) as f32).collect();
    let q = quantize_per_head(x.view(), &scales).unwrap();
    let back = dequantize_per_head(q.view(), &scales).unwrap();
    for ((bi, i, hi, c), v) in back.indexed_iter() {
        let s = scales[bi * h + hi];
        assert_eq!(q[(bi, i, hi, c)], e4m3_from_f32(x[(bi, i, hi, c)] / s));
        assert_eq!(*v, e4m3_to_f32(q[(bi, i, hi, c)]) as f64 * s as f64);
    }
    // One scale for the whole tensor.
    let one = quantize_per_head(x.view(), &[0.05]).unwrap();
    assert_eq!(one[(1, 2, 1, 3)], e4m3_from_f32(x[(1, 2, 1, 3)] / 0.05));
    // Wrong count, zero, NaN: typed errors.
    for bad in [vec![1.0f32; 3], vec![0.0], vec![f32::NAN], vec![1.0, -1.0, 1.0, 1.0]] {
        assert!(matches!(quantize_per_head(x.view(), &bad), Err(RefError::BadFp8Scales { .. })), "{bad:?}");
        assert!(matches!(dequantize_per_head(q.view(), &bad), Err(RefError::BadFp8Scales { .. })), "{bad:?}");
    }
}
