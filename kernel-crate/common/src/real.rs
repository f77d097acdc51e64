//! The float operations the online softmax needs, as one trait.
//!
//! Everything is in base 2 (`exp2`, `log2`): the kernels fold `log2(e)` into
//! the softmax scale (FA3, seed 003) so that the hot loop issues a single
//! `ex2.approx` per score, and the host reference uses the very same code.

use core::ops::{Add, Div, Mul, Neg, Sub};

/// A real number type the online softmax is generic over.
pub trait Real:
    Copy
    + PartialOrd
    + Add<Output = Self>
    + Sub<Output = Self>
    + Mul<Output = Self>
    + Div<Output = Self>
    + Neg<Output = Self>
{
    const ZERO: Self;
    const ONE: Self;
    const NEG_INFINITY: Self;
    const LOG2_E: Self;
    const LN_2: Self;
    fn from_f32(x: f32) -> Self;
    /// `x` rounded to the nearest `Self` (exact for f64).
    fn from_f64(x: f64) -> Self;
    fn to_f64(self) -> f64;
    /// 2^x (with 2^-inf = 0).
    fn exp2(self) -> Self;
    /// log2(x) (with log2(0) = -inf).
    fn log2(self) -> Self;
    /// e^x (with e^-inf = 0). On the GPU: `exp2(x * LOG2_E)`.
    fn exp(self) -> Self;
    /// ln(x) (with ln(0) = -inf). On the GPU: `log2(x) * LN_2`.
    fn ln(self) -> Self;
    /// Square root, correctly rounded (IEEE 754; PTX `sqrt.rn`).
    fn sqrt(self) -> Self;
    fn is_nan(self) -> bool;
    /// Hyperbolic tangent (softcap). The default, used on the GPU, is
    /// [`tanh_exp2`] (accurate to a few f32 ulps *relative* over the whole
    /// line, where PTX `tanh.approx` has a 2^-11 relative error). The host
    /// uses `std`'s; the tests run [`tanh_exp2`] on the host against it.
    #[inline(always)]
    fn tanh(self) -> Self {
        tanh_exp2(self)
    }
    /// The larger of the two; NaN propagates from either side.
    #[inline(always)]
    fn max_nan(self, other: Self) -> Self {
        if self.is_nan() || other.is_nan() {
            self + other
        } else if other > self {
            other
        } else {
            self
        }
    }
}

/// Below this `|x|`, [`tanh_exp2`] uses its odd polynomial.
pub const TANH_POLY_MAX: f64 = 0.5;

/// Taylor coefficients of `tanh x = x + x·Σ_n c_n x^(2n)`, `n = 1..=7`
/// (`−1/3, 2/15, −17/315, 62/2835, −1382/155925, 21844/6081075,
/// −929569/638512875`). On `|x| < 0.5` the first omitted term,
/// `6404582/10854718875 · x^17`, is below `9e-9 · |x|`: under an f32 ulp.
const TANH_TAYLOR: [f64; 7] = [
    -1.0 / 3.0,
    2.0 / 15.0,
    -17.0 / 315.0,
    62.0 / 2835.0,
    -1382.0 / 155925.0,
    21844.0 / 6081075.0,
    -929569.0 / 638512875.0,
];

/// `tanh(x)` from `+ − × ÷` and [`Real::exp2`] only, so that the GPU
/// (`ex2.approx`) and the host (any [`Real`]) run the same formula:
///
/// * `|x| < 0.5` ([`TANH_POLY_MAX`]): the odd Taylor polynomial
///   `x + x·z·P(z)`, `z = x²`, degree 15 (`TANH_TAYLOR`), Horner in `z`.
///   Relative error ≈ 1 ulp, down to the tiniest `x` (`tanh x → x`): the
///   exp form below would return `1 − (1 − 2x + …)`, whose cancellation
///   loses all relative precision as `x → 0` (f32 softcap measured 3–11×
///   plain f32's error with it alone, issue 30 item 8).
/// * `|x| ≥ 0.5`: `sign(x)·(1 − 2/(2^(2·log2 e·|x|) + 1))`; there
///   `tanh |x| ≥ 0.46` and `2/(e^{2|x|}+1) ≤ 0.54`: no cancellation beyond
///   a factor 1.2. `2^(huge) = inf` gives exactly ±1.
///
/// Odd (`tanh(−x) = −tanh(x)` bit for bit), NaN propagates, `tanh(±0) = ±0`.
#[inline(always)]
pub fn tanh_exp2<F: Real>(x: F) -> F {
    let a = if x < F::ZERO { -x } else { x };
    if a < F::from_f64(TANH_POLY_MAX) {
        let z = x * x;
        let c = |i: usize| F::from_f64(TANH_TAYLOR[i]);
        let p = c(6);
        let p = p * z + c(5);
        let p = p * z + c(4);
        let p = p * z + c(3);
        let p = p * z + c(2);
        let p = p * z + c(1);
        let p = p * z + c(0);
        // `x + x·(z·p)` is +0 at x = −0 (−0·−0); tanh(−0) = −0.
        if a == F::ZERO { x } else { x + x * (z * p) }
    } else {
        let two = F::ONE + F::ONE;
        let t = F::ONE - two / ((two * F::LOG2_E * a).exp2() + F::ONE);
        // NaN: `a < 0.5` is false and `t` is NaN; `x < 0` is false too.
        if x < F::ZERO { -t } else { t }
    }
}

// Used by the impls below: host f32/f64 (`std`) and device f32.
#[cfg(any(feature = "std", target_arch = "nvptx64"))]
macro_rules! real_consts {
    ($t:ty) => {
        const ZERO: Self = 0.0;
        const ONE: Self = 1.0;
        const NEG_INFINITY: Self = <$t>::NEG_INFINITY;
        const LOG2_E: Self = core::f64::consts::LOG2_E as $t;
        const LN_2: Self = core::f64::consts::LN_2 as $t;
        #[inline(always)]
        fn from_f32(x: f32) -> Self {
            x as $t
        }
        #[inline(always)]
        fn from_f64(x: f64) -> Self {
            x as $t
        }
        #[inline(always)]
        fn to_f64(self) -> f64 {
            self as f64
        }
        #[inline(always)]
        fn is_nan(self) -> bool {
            self != self
        }
    };
}

#[cfg(feature = "std")]
impl Real for f64 {
    real_consts!(f64);
    #[inline(always)]
    fn tanh(self) -> Self {
        f64::tanh(self)
    }
    #[inline(always)]
    fn exp2(self) -> Self {
        f64::exp2(self)
    }
    #[inline(always)]
    fn log2(self) -> Self {
        f64::log2(self)
    }
    #[inline(always)]
    fn exp(self) -> Self {
        f64::exp(self)
    }
    #[inline(always)]
    fn ln(self) -> Self {
        f64::ln(self)
    }
    #[inline(always)]
    fn sqrt(self) -> Self {
        f64::sqrt(self)
    }
}

#[cfg(feature = "std")]
impl Real for f32 {
    real_consts!(f32);
    #[inline(always)]
    fn tanh(self) -> Self {
        f32::tanh(self)
    }
    #[inline(always)]
    fn exp2(self) -> Self {
        f32::exp2(self)
    }
    #[inline(always)]
    fn log2(self) -> Self {
        f32::log2(self)
    }
    #[inline(always)]
    fn exp(self) -> Self {
        f32::exp(self)
    }
    #[inline(always)]
    fn ln(self) -> Self {
        f32::ln(self)
    }
    #[inline(always)]
    fn sqrt(self) -> Self {
        f32::sqrt(self)
    }
}

#[cfg(all(not(feature = "std"), target_arch = "nvptx64"))]
impl Real for f32 {
    real_consts!(f32);
    /// PTX `ex2.approx.ftz.f32` (max rel. error 2^-22; ex2(-inf) = +0).
    #[inline(always)]
    fn exp2(self) -> Self {
        let y: f32;
        // SAFETY: pure register-to-register arithmetic instruction.
        unsafe { core::arch::asm!("ex2.approx.ftz.f32 {y}, {x};", y = out(reg32) y, x = in(reg32) self, options(pure, nomem, nostack)) };
        y
    }
    /// PTX `lg2.approx.ftz.f32` (lg2(+0) = -inf).
    #[inline(always)]
    fn log2(self) -> Self {
        let y: f32;
        // SAFETY: pure register-to-register arithmetic instruction.
        unsafe { core::arch::asm!("lg2.approx.ftz.f32 {y}, {x};", y = out(reg32) y, x = in(reg32) self, options(pure, nomem, nostack)) };
        y
    }
    /// `ex2.approx(x * LOG2_E)`: there is no `ex` instruction; this is what
    /// CUDA's `__expf` does too.
    #[inline(always)]
    fn exp(self) -> Self {
        (self * Self::LOG2_E).exp2()
    }
    /// `lg2.approx(x) * LN_2` (CUDA's `__logf`).
    #[inline(always)]
    fn ln(self) -> Self {
        self.log2() * Self::LN_2
    }
    /// PTX `sqrt.rn.f32` (IEEE round-to-nearest; no `.ftz`, so subnormals are kept).
    #[inline(always)]
    fn sqrt(self) -> Self {
        let y: f32;
        // SAFETY: pure register-to-register arithmetic instruction.
        unsafe { core::arch::asm!("sqrt.rn.f32 {y}, {x};", y = out(reg32) y, x = in(reg32) self, options(pure, nomem, nostack)) };
        y
    }
}
