//! Helpers shared by the CPU property tests (`cpu_*.rs`): a tiny seeded
//! generator (proptest draws the seed and the shape; the bulk data comes from
//! the seed, which keeps shrinking meaningful and generation cheap) and the
//! error measures of `../shared/GPU-NOTES.md` ("Method").
#![allow(dead_code)]

use ndarray::{ArrayView, Dimension};

/// The tests crate's SplitMix64 generator; `Rng::new(seed)` seeds it.
pub use flash_attn_tests::Rng;

/// `‖x − y‖ / ‖y‖` (Frobenius), NaN-propagating; `‖x‖` when `y` is all zeros.
pub fn rel_err<D: Dimension>(x: ArrayView<f64, D>, y: ArrayView<f64, D>) -> f64 {
    let mut num = 0.0;
    let mut den = 0.0;
    for (&a, &b) in x.iter().zip(y.iter()) {
        num += (a - b) * (a - b);
        den += b * b;
    }
    if den == 0.0 { num.sqrt() } else { (num / den).sqrt() }
}

/// Largest `|x − y|`, treating equal infinities as 0 apart and any NaN as
/// infinitely far.
pub fn max_abs_diff<D: Dimension>(x: ArrayView<f64, D>, y: ArrayView<f64, D>) -> f64 {
    x.iter().zip(y.iter()).fold(0.0f64, |acc, (&a, &b)| {
        let d = if a == b {
            0.0
        } else if a.is_nan() || b.is_nan() {
            f64::INFINITY
        } else {
            (a - b).abs()
        };
        acc.max(d)
    })
}

pub fn any_nan<D: Dimension>(x: ArrayView<f64, D>) -> bool {
    x.iter().any(|v| v.is_nan())
}
