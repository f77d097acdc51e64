//! The softcap `tanh` of the kernels (`flash_attn::common::real::tanh_exp2`,
//! the default `Real::tanh` that the GPU runs, issue 30 item 8) on the host,
//! as f32 with the host's `exp2`, against f64 `tanh` of the same f32 input:
//! relative error over a dense sweep of `[-20, 20]`, tiny and subnormal
//! inputs, every f32 near the polynomial/exp switch; odd symmetry bit for
//! bit; NaN, ±0, ±inf. The device's `ex2.approx` (2^-22 relative) adds at
//! most ~2.4e-7 relative on the exp branch (`|x| ≥ 0.5`), inside the bound.

use flash_attn::common::real::{TANH_POLY_MAX, tanh_exp2};

/// Relative error of `tanh_exp2::<f32>(x)` against f64 tanh of `x`.
fn rel_err(x: f32) -> f64 {
    let want = (x as f64).tanh();
    let got = tanh_exp2(x) as f64;
    if want == 0.0 { got.abs() } else { ((got - want) / want).abs() }
}

/// Every test input: a dense grid of [-20, 20] (step 2^-14), powers of two
/// and their neighbours from the smallest subnormal up, and the 4096 f32s on
/// each side of ±TANH_POLY_MAX.
fn inputs() -> Vec<f32> {
    let mut xs = vec![];
    let n = 20 << 14;
    for i in -n..=n {
        xs.push(i as f32 / (1 << 14) as f32);
    }
    let mut p = f32::from_bits(1); // smallest subnormal
    while p < 20.0 {
        for x in [p, f32::from_bits(p.to_bits() + 1), p * 1.37, p * 1.9] {
            xs.extend([x, -x]);
        }
        p *= 2.0;
    }
    let c = (TANH_POLY_MAX as f32).to_bits();
    for b in c - 4096..c + 4096 {
        let x = f32::from_bits(b);
        xs.extend([x, -x]);
    }
    xs
}

#[test]
fn relative_error_is_a_few_ulps() {
    let (mut worst, mut at) = (0.0f64, 0.0f32);
    for x in inputs() {
        let e = rel_err(x);
        assert!(!e.is_nan(), "NaN at {x:e}");
        if e > worst {
            (worst, at) = (e, x);
        }
    }
    println!("max relative error {worst:e} at x = {at:e} ({:.2} f32 ulps of 2^-24)", worst / 2f64.powi(-24));
    // f32 rounds to 2^-24 relative (half an ulp at the top of a binade):
    // 3e-7 is ~5 half-ulps.
    assert!(worst <= 3e-7, "max relative error {worst:e} at x = {at:e}");
}

#[test]
fn the_old_exp_form_was_not_accurate_near_zero() {
    // What this replaces, kept here to show the sweep above can fail:
    // 1 − 2/(e^{2|x|}+1) loses relative precision as x → 0.
    let old = |x: f32| {
        let a = x.abs();
        let t = 1.0 - 2.0 / ((2.0 * std::f32::consts::LOG2_E * a).exp2() + 1.0);
        if x < 0.0 { -t } else { t }
    };
    let x = 1e-3f32;
    let e = ((old(x) as f64 - (x as f64).tanh()) / (x as f64).tanh()).abs();
    assert!(e > 1e-5, "old form at 1e-3: {e:e}");
    assert!(rel_err(x) < 1e-7);
}

#[test]
fn odd_and_special_values() {
    for x in inputs() {
        assert_eq!(tanh_exp2(-x).to_bits(), (-tanh_exp2(x)).to_bits(), "odd symmetry at {x:e}");
        let t = tanh_exp2(x);
        assert!(t.abs() <= 1.0, "|tanh({x:e})| = {t} > 1");
    }
    assert!(tanh_exp2(f32::NAN).is_nan());
    assert_eq!(tanh_exp2(0.0f32).to_bits(), 0.0f32.to_bits());
    assert_eq!(tanh_exp2(-0.0f32).to_bits(), (-0.0f32).to_bits());
    assert_eq!(tanh_exp2(f32::INFINITY), 1.0);
    assert_eq!(tanh_exp2(f32::NEG_INFINITY), -1.0);
    assert_eq!(tanh_exp2(1e4f32), 1.0);
    // The same code in f64: the Taylor truncation (< 9e-9 relative) bounds it.
    for i in -2000..=2000 {
        let x = i as f64 / 100.0;
        let (got, want) = (tanh_exp2(x), x.tanh());
        let e = if want == 0.0 { got.abs() } else { ((got - want) / want).abs() };
        assert!(e < 1e-8, "f64 at {x}: {e:e}");
    }
}
