//! Shared helpers of the integration tests.
//!
//! * [`gpu`]: the one way a GPU test gets its device. It returns the GPU, or
//!   `None` after printing why the test is skipped; with `FA_REQUIRE_GPU=1`
//!   a missing GPU is a failure instead, so a GPU run can never pass by
//!   skipping.
//! * [`Rng`]: fresh random inputs for every run (seeded from the clock unless
//!   `FA_SEED` is set; the seed is printed so a failure can be replayed), or
//!   seeded ones for the CPU property tests and the binaries.
//! * [`rel_err`] and friends: the error measures of the project's method
//!   (`‖out − ref‖ / ‖ref‖`, NaN never passes).
//! * [`case`]: one attention problem of the GPU sweeps (`gpu_attention.rs`,
//!   `gpu_half.rs`): its random inputs and its run through `forward_into`.
//! * [`bench`]: what the benchmark binaries share (timing loop, PyTorch
//!   peer subprocess, SVG line charts, the check's reference rows).
//! * [`naive`]: naive attention computed in f16/bf16 on the CPU, the
//!   yardstick of the 16-bit accuracy rule.
//! * [`traffic`]: the HBM-traffic model of forward + backward (FA1's
//!   Algorithm 4, the rows of seed 002's GPT-2 table) that `fa-run` prints.

pub mod bench;
pub mod case;
pub mod features;
pub mod naive;
pub mod traffic;

use std::sync::{Arc, OnceLock};

use cudarc::driver::{CudaContext, CudaStream};
use flash_attn::FlashAttention;
use ndarray::Array4;

/// A GPU with the flash-attn kernels loaded, and a stream to work on.
pub struct Gpu {
    pub ctx: Arc<CudaContext>,
    pub stream: Arc<CudaStream>,
    pub fa: FlashAttention,
}

/// Whether `FA_REQUIRE_GPU=1` (or any value but `0`/empty) is set.
pub fn gpu_required() -> bool {
    std::env::var("FA_REQUIRE_GPU").map(|v| !v.is_empty() && v != "0").unwrap_or(false)
}

fn probe() -> Result<Gpu, String> {
    let ctx = flash_attn::try_default_context().map_err(|e| e.to_string())?;
    let fa = FlashAttention::new(&ctx).map_err(|e| format!("FlashAttention::new: {e}"))?;
    let stream = ctx.new_stream().map_err(|e| format!("new_stream: {e}"))?;
    Ok(Gpu { ctx, stream, fa })
}

/// The GPU for test `test`, or `None` (test skipped, reason printed).
///
/// # Panics
/// When no GPU can be used and `FA_REQUIRE_GPU=1`.
pub fn gpu(test: &str) -> Option<&'static Gpu> {
    static GPU: OnceLock<Result<Gpu, String>> = OnceLock::new();
    match GPU.get_or_init(probe) {
        Ok(g) => Some(g),
        Err(reason) => {
            if gpu_required() {
                panic!("{test}: FA_REQUIRE_GPU=1 but no GPU can be used: {reason}");
            }
            println!("SKIPPED {test}: no GPU ({reason}); set FA_REQUIRE_GPU=1 to make this a failure");
            None
        }
    }
}

/// SplitMix64: small, fast, good enough for test inputs.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    /// Seeded from `FA_SEED` if set, else from the clock; prints the seed.
    pub fn fresh(test: &str) -> Self {
        let seed = std::env::var("FA_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| {
            let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(1);
            (t as u64) ^ ((t >> 64) as u64) ^ (test.len() as u64).rotate_left(32)
        });
        println!("{test}: FA_SEED={seed}");
        Self(seed)
    }

    /// Starts the generator's state at `seed`.
    pub fn with_seed(seed: u64) -> Self {
        Self(seed)
    }

    /// Starts the state at `seed` mixed with the SplitMix64 increment (the
    /// seeding of the CPU property tests, whose seeds proptest draws).
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

    /// Uniform in `[0, 1)`.
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Uniform in `[-a, a)`.
    pub fn sym(&mut self, a: f64) -> f64 {
        (2.0 * self.unit() - 1.0) * a
    }

    /// Uniform in `[-a, a]`, never exactly 0.
    pub fn nonzero(&mut self, a: f32) -> f32 {
        loop {
            let x = self.sym(a as f64) as f32;
            if x != 0.0 {
                return x;
            }
        }
    }

    /// `n` values uniform in `[-a, a]`, none 0.
    pub fn vec(&mut self, n: usize, a: f32) -> Vec<f32> {
        (0..n).map(|_| self.nonzero(a)).collect()
    }

    /// Uniform in `0..n`.
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }

    /// A `(b, n, h, d)` tensor uniform in `[-a, a)`.
    pub fn tensor(&mut self, shape: (usize, usize, usize, usize), a: f64) -> Array4<f64> {
        Array4::from_shape_simple_fn(shape, || self.sym(a))
    }
}

/// `‖out − ref‖₂ / ‖ref‖₂` over the pairs where `ref` is finite (NaN in
/// `out` there makes it NaN, so it never passes a `<` check); 0 when `ref`
/// is all zero and `out` matches.
pub fn rel_err(out: impl IntoIterator<Item = f64>, reference: impl IntoIterator<Item = f64>) -> f64 {
    let (mut num, mut den) = (0.0f64, 0.0f64);
    for (o, r) in out.into_iter().zip(reference) {
        if r.is_finite() {
            num += (o - r) * (o - r);
            den += r * r;
        }
    }
    if den == 0.0 { num.sqrt() } else { (num / den).sqrt() }
}

/// Indices where `out` and `reference` disagree on being NaN, or on being
/// ±inf (a non-finite reference value must be matched exactly).
pub fn nonfinite_mismatches(out: &[f64], reference: &[f64]) -> Vec<usize> {
    out.iter()
        .zip(reference)
        .enumerate()
        .filter(|(_, (o, r))| {
            if r.is_nan() {
                !o.is_nan()
            } else if r.is_infinite() {
                **o != **r
            } else {
                !o.is_finite()
            }
        })
        .map(|(i, _)| i)
        .collect()
}
