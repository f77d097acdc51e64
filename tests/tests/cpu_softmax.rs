//! Online softmax = safe softmax = standard softmax (seed 004), as properties
//! over random vectors: lengths 1..4096, magnitudes up to 1e4, some `-inf`
//! entries, some rows entirely `-inf`, random block sizes for the online pass.
//!
//! Tolerances (relative, per element, `ε` the type's epsilon, `X = max |x|`
//! over the finite entries, `n` the length):
//!
//! * f64, online vs safe: `ε·(16·(1 + X) + 4n)`. The online path works in base
//!   2 (`x·log2 e`), whose rounding moves each exponent by up to `ε·|x·log2 e|`,
//!   i.e. a relative error of about `ε·X` on the output; the sums add `n·ε`.
//! * f64, standard vs safe: the same bound, but only where standard softmax is
//!   defined (`X ≤ 300`: `exp` neither overflows nor underflows to an all-zero
//!   sum); beyond that it overflows (NaN), which is the reason safe softmax exists.
//! * f32 online vs the f64 safe softmax of the same (f32) inputs: the same
//!   formula with `ε = f32::EPSILON`, plus `1e-37` absolute for results in the
//!   subnormal range.

mod cpu_support;

use cpu_support::Rng;
use flash_attn::reference::{softmax_online, softmax_safe, softmax_standard};
use proptest::prelude::*;

#[derive(Clone, Debug)]
struct Vector {
    len: usize,
    /// log10 of the magnitude: entries are uniform in `[-10^mag, 10^mag]`.
    mag: f64,
    /// Fraction of entries replaced by `-inf`.
    neg_inf: f64,
    all_neg_inf: bool,
    block: usize,
    seed: u64,
}

impl Vector {
    fn values(&self) -> Vec<f64> {
        let mut rng = Rng::new(self.seed);
        let a = 10f64.powf(self.mag);
        (0..self.len)
            .map(|_| {
                let x = rng.sym(a);
                if self.all_neg_inf || rng.unit() < self.neg_inf { f64::NEG_INFINITY } else { x }
            })
            .collect()
    }
}

fn vector() -> impl Strategy<Value = Vector> {
    (
        prop_oneof![1usize..=16, 1usize..=4096],
        -2.0f64..=4.0,
        prop_oneof![Just(0.0), 0.0f64..0.5, 0.9f64..1.0],
        prop::bool::weighted(0.06),
        1usize..=256,
        any::<u64>(),
    )
        .prop_map(|(len, mag, neg_inf, all_neg_inf, block, seed)| {
            // Block sizes from 1 to beyond the length.
            let block = 1 + block % (len + 8);
            Vector { len, mag, neg_inf, all_neg_inf, block, seed }
        })
}

fn max_finite_abs(x: &[f64]) -> f64 {
    x.iter().filter(|v| v.is_finite()).fold(0.0f64, |a, v| a.max(v.abs()))
}

/// Checks `got` against `want` elementwise with relative tolerance `rel` and
/// absolute slack `abs`; NaN never passes.
fn check_close(got: &[f64], want: &[f64], rel: f64, abs: f64, what: &str) -> Result<(), TestCaseError> {
    prop_assert_eq!(got.len(), want.len());
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        prop_assert!(!g.is_nan() && !w.is_nan(), "{what}: NaN at {i}: got {g}, want {w}");
        prop_assert!(
            (g - w).abs() <= rel * w.abs() + abs,
            "{what}: element {i}: got {g:e}, want {w:e} (rel tol {rel:e})"
        );
    }
    Ok(())
}

/// The output of a row that is not all `-inf` sums to 1; an all-`-inf` row is all 0.
fn check_mass(y: &[f64], x: &[f64], tol: f64, what: &str) -> Result<(), TestCaseError> {
    let sum: f64 = y.iter().sum();
    if x.iter().all(|&v| v == f64::NEG_INFINITY) {
        prop_assert!(y.iter().all(|&v| v == 0.0), "{what}: all -inf row must give zeros");
    } else {
        prop_assert!((sum - 1.0).abs() <= tol, "{what}: sums to {sum}");
    }
    for (&yi, &xi) in y.iter().zip(x) {
        if xi == f64::NEG_INFINITY {
            prop_assert_eq!(yi, 0.0, "{}: a -inf entry must give exactly 0", what);
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn online_equals_safe_f64(v in vector()) {
        let x = v.values();
        let n = x.len() as f64;
        let big = max_finite_abs(&x);
        let rel = f64::EPSILON * (16.0 * (1.0 + big) + 4.0 * n);
        let safe = softmax_safe(&x);
        let online = softmax_online(&x, v.block);
        check_close(&online, &safe, rel, 1e-300, "online vs safe")?;
        check_mass(&safe, &x, 4.0 * n * f64::EPSILON, "safe")?;
        check_mass(&online, &x, 4.0 * n * f64::EPSILON + rel, "online")?;
        // Element-by-element online softmax (block = 1) is the same function.
        check_close(&softmax_online(&x, 1), &safe, rel, 1e-300, "online(block=1) vs safe")?;
    }

    #[test]
    fn standard_equals_safe_where_defined_f64(v in vector()) {
        let x = v.values();
        let n = x.len() as f64;
        let big = max_finite_abs(&x);
        let standard = softmax_standard(&x);
        let safe = softmax_safe(&x);
        if big <= 300.0 {
            let rel = f64::EPSILON * (16.0 * (1.0 + big) + 4.0 * n);
            check_close(&standard, &safe, rel, 1e-300, "standard vs safe")?;
            check_mass(&standard, &x, 4.0 * n * f64::EPSILON + rel, "standard")?;
        } else if x.iter().any(|&v| v > 710.0) {
            // exp overflows: standard softmax is not safe (seed 004).
            prop_assert!(standard.iter().any(|v| v.is_nan()), "expected overflow to NaN");
        }
    }

    #[test]
    fn online_f32_against_f64(v in vector()) {
        let x32: Vec<f32> = v.values().iter().map(|&x| x as f32).collect();
        // Reference from the same (rounded) inputs, so only arithmetic differs.
        let x64: Vec<f64> = x32.iter().map(|&x| x as f64).collect();
        let n = x64.len() as f64;
        let big = max_finite_abs(&x64);
        let rel = f32::EPSILON as f64 * (16.0 * (1.0 + big) + 4.0 * n);
        let want = softmax_safe(&x64);
        let online: Vec<f64> = softmax_online(&x32, v.block).iter().map(|&y| y as f64).collect();
        check_close(&online, &want, rel, 1e-37, "f32 online vs f64 safe")?;
        let safe: Vec<f64> = softmax_safe(&x32).iter().map(|&y| y as f64).collect();
        check_close(&safe, &want, rel, 1e-37, "f32 safe vs f64 safe")?;
    }
}

#[test]
fn standard_softmax_overflows_where_safe_does_not() {
    let x = [1000.0f64, 1000.0];
    assert!(softmax_standard(&x).iter().all(|v| v.is_nan()), "exp(1000) = inf, inf/inf = NaN");
    assert_eq!(softmax_safe(&x), vec![0.5, 0.5]);
    assert_eq!(softmax_online(&x, 1), vec![0.5, 0.5]);
    let x = [100.0f32, 0.0];
    assert!(softmax_standard(&x)[0].is_nan(), "f32 exp overflows past 88.7");
    assert!((softmax_online(&x, 1)[0] - 1.0).abs() < 1e-6);
}

#[test]
fn all_neg_inf_rows_are_zero_never_nan() {
    let x = [f64::NEG_INFINITY; 5];
    for y in [softmax_standard(&x), softmax_safe(&x), softmax_online(&x, 2), softmax_online(&x, 1)] {
        assert_eq!(y, vec![0.0; 5]);
    }
}

#[test]
#[should_panic(expected = "block size must be positive")]
fn online_block_zero_panics() {
    softmax_online(&[1.0f64], 0);
}
