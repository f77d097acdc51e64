//! Helpers shared by the CPU property tests (`cpu_*.rs`): a tiny seeded
//! generator (proptest draws the seed and the shape; the bulk data comes from
//! the seed, which keeps shrinking meaningful and generation cheap) and the
//! error measures of `../shared/GPU-NOTES.md` ("Method").
#![allow(dead_code)]

use ndarray::{Array4, ArrayView, Dimension};

/// SplitMix64: fast, seedable, good enough for test data.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Self(seed ^ 0x9E37_79B9_7F4A_7C15)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }
    /// Uniform in [-a, a).
    pub fn sym(&mut self, a: f64) -> f64 {
        (2.0 * self.unit() - 1.0) * a
    }
    /// A `(b, n, h, d)` tensor uniform in [-a, a), never all zeros.
    pub fn tensor(&mut self, shape: (usize, usize, usize, usize), a: f64) -> Array4<f64> {
        Array4::from_shape_simple_fn(shape, || self.sym(a))
    }
}

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
