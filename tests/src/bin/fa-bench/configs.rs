//! What is measured: the implementations (key, label, plot colour), one
//! configuration (dtype, d, causal, N) with its shape and FLOPs on the
//! papers' setup (batch × N = `--tokens`, nheads = ⌊hidden / d⌋), and the
//! random inputs.

use flash_attn_tests::Rng;
use flash_attn_tests::bench::Dtype;

use crate::opts::Opts;

/// An implementation measured: key (JSON, `--impls`), label, plot colour.
pub struct Impl {
    pub key: &'static str,
    pub label: &'static str,
    pub color: &'static str,
}

#[rustfmt::skip]
pub const IMPLS: &[Impl] = &[
    Impl { key: "fa2", label: "FA2 (ours)", color: "#d62728" },
    Impl { key: "hopper", label: "Hopper (ours)", color: "#e377c2" },
    Impl { key: "fa1", label: "FA1 (ours)", color: "#ff7f0e" },
    Impl { key: "standard", label: "Standard (ours)", color: "#8c564b" },
    Impl { key: "torch-flash", label: "PyTorch flash", color: "#1f77b4" },
    Impl { key: "torch-cudnn", label: "cuDNN", color: "#2ca02c" },
    Impl { key: "torch-efficient", label: "PyTorch efficient", color: "#9467bd" },
    Impl { key: "torch-math", label: "PyTorch math", color: "#7f7f7f" },
];

/// Our implementations (the rest are PyTorch's, `torch-*`).
pub const OURS: &[&str] = &["fa2", "hopper", "fa1", "standard"];

pub fn impl_of(key: &str) -> &'static Impl {
    IMPLS.iter().find(|i| i.key == key).expect("known impl key")
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Cfg {
    pub dtype: Dtype,
    pub d: usize,
    pub causal: bool,
    pub n: usize,
}

impl Cfg {
    pub fn batch(&self, o: &Opts) -> usize {
        o.tokens / self.n
    }
    /// `hidden / d`, rounded down where `d` does not divide it (d = 96:
    /// 21 heads, 2016 wide).
    pub fn heads(&self, o: &Opts) -> usize {
        o.hidden / self.d
    }
    /// Elements of q, k, v and o: `batch · N · nheads · d`.
    pub fn elems(&self, o: &Opts) -> usize {
        o.tokens * self.heads(o) * self.d
    }
    pub fn flops(&self, o: &Opts) -> f64 {
        let f =
            4.0 * (self.batch(o) * self.heads(o)) as f64 * (self.n as f64).powi(2) * self.d as f64;
        if self.causal { f / 2.0 } else { f }
    }
    pub fn label(&self) -> String {
        format!(
            "{:4} d={:<3} {} N={:<5}",
            self.dtype.name(),
            self.d,
            if self.causal { "causal" } else { "full  " },
            self.n
        )
    }
    /// The plot this configuration belongs to.
    pub fn plot(&self) -> (Dtype, usize, bool) {
        (self.dtype, self.d, self.causal)
    }
    /// Bytes of an f32 (batch, nheads, N, N) score matrix.
    pub fn s_bytes(&self, o: &Opts) -> f64 {
        4.0 * (self.batch(o) * self.heads(o)) as f64 * (self.n as f64).powi(2)
    }
}

pub fn configs(o: &Opts) -> Vec<Cfg> {
    let mut v = Vec::new();
    for &dtype in &o.dtypes {
        for &d in &o.dims {
            for causal in o.causal.values() {
                for &n in &o.seqlens {
                    v.push(Cfg {
                        dtype,
                        d,
                        causal,
                        n,
                    });
                }
            }
        }
    }
    v
}

/// Fills `out` with standard-normal values rounded to `dt` (Box–Muller),
/// in parallel; deterministic in `seed` whatever the thread count.
pub fn fill_normal(dt: Dtype, seed: u64, out: &mut [u16]) {
    const CHUNK: usize = 1 << 16;
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(64);
    let per = out.len().div_ceil(threads).div_ceil(CHUNK) * CHUNK;
    std::thread::scope(|s| {
        for (t, part) in out.chunks_mut(per.max(CHUNK)).enumerate() {
            s.spawn(move || {
                for (c, chunk) in part.chunks_mut(CHUNK).enumerate() {
                    let global = (t * per / CHUNK + c) as u64;
                    let mut rng = Rng::with_seed(seed ^ global.wrapping_mul(0xD1B5_4A32_D192_ED03));
                    for pair in chunk.chunks_mut(2) {
                        // u1 in (0, 1]: ln(u1) stays finite.
                        let u1 = ((rng.next_u64() >> 11) + 1) as f64 * (1.0 / (1u64 << 53) as f64);
                        let u2 = rng.unit();
                        let r = (-2.0 * u1.ln()).sqrt();
                        let (sn, cs) = (std::f64::consts::TAU * u2).sin_cos();
                        pair[0] = dt.bits((r * cs) as f32);
                        if pair.len() > 1 {
                            pair[1] = dt.bits((r * sn) as f32);
                        }
                    }
                }
            });
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normal_inputs_have_unit_variance() {
        let mut v = vec![0u16; 1 << 20];
        fill_normal(Dtype::F16, 7, &mut v);
        let xs: Vec<f64> = v.iter().map(|&b| Dtype::F16.value(b) as f64).collect();
        let mean = xs.iter().sum::<f64>() / xs.len() as f64;
        let var = xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / xs.len() as f64;
        assert!(
            mean.abs() < 0.01 && (var - 1.0).abs() < 0.01,
            "mean {mean} var {var}"
        );
    }
}
