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
    /// `sign(x)·(1 − 2/(e^{2|x|} + 1))` on `exp2`: its absolute error is a few
    /// f32 ulps of 1 (so `cap·tanh(s/cap)` errs by ~`cap·1e-7`, far below a
    /// 16-bit score's rounding), where PTX `tanh.approx` has a 2^-11
    /// relative error. The host uses `std`'s.
    #[inline(always)]
    fn tanh(self) -> Self {
        let two = Self::ONE + Self::ONE;
        let a = if self < Self::ZERO { -self } else { self };
        let t = Self::ONE - two / ((two * Self::LOG2_E * a).exp2() + Self::ONE);
        if self < Self::ZERO { -t } else if self.is_nan() { self } else { t }
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
