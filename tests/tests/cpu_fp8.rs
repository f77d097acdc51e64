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

/// FP8 attention over dequantized inputs (`reference::fp8::attention_fp8`,
/// the CPU side of `flash_attn_fp8_func`) against a direct loop: GQA with
/// per-(sequence, KV head) scales, causal, seqlen_q ≠ seqlen_k.
#[test]
fn fp8_attention_is_attention_of_the_dequantized_inputs() {
    use flash_attn::reference::fp8::attention_fp8;
    use flash_attn::{ForwardParams, flash_attn_fp8_func};
    let (b, sq, sk, h, hk, d) = (2, 5, 9, 4, 2, 16);
    let code = |i: usize| flash_attn::reference::fp8::e4m3_from_f32(((i * 37 % 23) as f32 - 11.0) * 0.37);
    let q = ndarray::Array4::from_shape_fn((b, sq, h, d), |(x, i, hh, c)| code(x * 1000 + i * 100 + hh * 20 + c));
    let k = ndarray::Array4::from_shape_fn((b, sk, hk, d), |(x, j, hh, c)| code(x * 777 + j * 51 + hh * 13 + c + 5));
    let v = ndarray::Array4::from_shape_fn((b, sk, hk, d), |(x, j, hh, c)| code(x * 313 + j * 29 + hh * 7 + c + 9));
    let qs = [0.5f32, 0.25, 0.125, 1.0];
    let ks = [0.3f32, 0.7, 1.1, 0.2];
    let vs = [2.0f32];
    let params = ForwardParams { causal: true, ..Default::default() };
    let r = attention_fp8(q.view(), k.view(), v.view(), [Some(&qs[..]), Some(&ks[..]), Some(&vs[..])], &params).unwrap();
    let deq = |c: u8| flash_attn::reference::fp8::e4m3_to_f32(c) as f64;
    let scale = 1.0 / (d as f64).sqrt();
    for x in 0..b {
        for hh in 0..h {
            let kh = hh / (h / hk);
            for i in 0..sq {
                let keys: Vec<usize> = (0..sk).filter(|&j| j <= i + sk - sq).collect();
                let s: Vec<f64> = keys.iter().map(|&j| scale * (0..d).map(|c| deq(q[(x, i, hh, c)]) * qs[x * hk + kh] as f64 * deq(k[(x, j, kh, c)]) * ks[x * hk + kh] as f64).sum::<f64>()).collect();
                let m = s.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let l: f64 = s.iter().map(|t| (t - m).exp()).sum();
                assert!((r.lse[(x, hh, i)] - (m + l.ln())).abs() < 1e-12);
                for c in 0..d {
                    let o: f64 = keys.iter().zip(&s).map(|(&j, t)| (t - m).exp() / l * deq(v[(x, j, kh, c)]) * vs[0] as f64).sum();
                    assert!((r.o[(x, i, hh, c)] - o).abs() < 1e-12, "({x},{i},{hh},{c})");
                }
            }
        }
    }
    // Scales of the wrong length, or not positive, are errors.
    assert!(attention_fp8(q.view(), k.view(), v.view(), [Some(&qs[..3]), None, None], &params).is_err());
    assert!(attention_fp8(q.view(), k.view(), v.view(), [None, Some(&[0.0][..]), None], &params).is_err());
    // The ndarray front door: on the GPU the FP8 kernel, else this reference rounded to T.
    let (o, lse) = flash_attn_fp8_func::<half::bf16>(q.view(), k.view(), v.view(), [Some(&qs[..]), Some(&ks[..]), Some(&vs[..])], &params).unwrap();
    assert_eq!((o.dim(), lse.dim()), ((b, sq, h, d), (b, h, sq)));
    let err = o.iter().zip(r.o.iter()).map(|(a, b)| (a.to_f32() as f64 - b).abs()).fold(0.0, f64::max);
    let amax = r.o.iter().fold(0.0f64, |a, x| a.max(x.abs()));
    // bf16 rounding on the CPU; FP8 probabilities (≤ 2⁻⁴ relative each) on a GPU.
    assert!(err <= 0.07 * amax.max(1e-3), "{err} (max |O| {amax})");
}
