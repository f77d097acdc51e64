//! `--check`: sampled output rows of each of our kernels against an f64 CPU
//! attention on the same inputs, and against a naive attention computed in
//! the input dtype. Pass: every output written (poisoned with NaN first),
//! finite, error at most twice the naive one, |lse − ref| ≤ 1e-3.

use flash_attn_tests::Rng;
use flash_attn_tests::bench::{self, Dtype, Res};

use crate::configs::Cfg;
use crate::measure::{Gpu, Which};
use crate::opts::Opts;

#[derive(Clone, Debug)]
pub struct Check {
    pub imp: &'static str,
    pub rel_err: f64,
    pub naive_rel_err: f64,
    pub lse_abs_err: Option<f64>,
    pub nonfinite: usize,
    pub ok: bool,
}

impl Check {
    /// The progress line's account.
    pub fn line(&self, dt: Dtype) -> String {
        format!(
            "rel err {:.2e} (naive {} {:.2e}){}{} {}",
            self.rel_err,
            dt.name(),
            self.naive_rel_err,
            self.lse_abs_err
                .map_or(String::new(), |e| format!(", lse err {e:.1e}")),
            if self.nonfinite > 0 {
                format!(", {} non-finite outputs", self.nonfinite)
            } else {
                String::new()
            },
            if self.ok { "ok" } else { "FAIL" }
        )
    }
}

/// A sampled row (batch, head, query) and its reference.
pub struct RefRow {
    b: usize,
    h: usize,
    i: usize,
    r: bench::RefRow,
}

fn sample_rows(o: &Opts, c: &Cfg) -> Vec<(usize, usize, usize)> {
    let (bn, hn, n) = (c.batch(o), c.heads(o), c.n);
    let mut r = Rng::with_seed(o.seed ^ (c.n as u64 * 31 + c.d as u64 * 7 + c.causal as u64));
    let mut rnd = |m: usize| r.below(m);
    let mut pairs = vec![(0, 0), (bn - 1, hn - 1), (rnd(bn), rnd(hn))];
    pairs.dedup();
    let mut out = Vec::new();
    for (b, h) in pairs {
        let mut rows = vec![0, 1.min(n - 1), n / 2 + rnd(n / 2), n - 1, rnd(n), rnd(n)];
        rows.sort();
        rows.dedup();
        out.extend(rows.into_iter().map(|i| (b, h, i)));
    }
    out
}

pub fn reference(o: &Opts, c: &Cfg, host: &[Vec<u16>; 3]) -> Vec<RefRow> {
    let samples = sample_rows(o, c);
    let (h, n, d, dt) = (c.heads(o), c.n, c.d, c.dtype);
    let one = |&(b, hh, i): &(usize, usize, usize)| -> RefRow {
        let nkeys = if c.causal { i + 1 } else { n };
        let r = bench::reference_row(
            dt,
            host,
            ((b * n + i) * h + hh) * d,
            (b * n * h + hh) * d,
            h * d,
            nkeys,
            d,
        );
        RefRow { b, h: hh, i, r }
    };
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let per = samples.len().div_ceil(threads).max(1);
    std::thread::scope(|s| {
        let hs: Vec<_> = samples
            .chunks(per)
            .map(|ch| s.spawn(move || ch.iter().map(one).collect::<Vec<_>>()))
            .collect();
        hs.into_iter().flat_map(|h| h.join().unwrap()).collect()
    })
}

impl Gpu {
    /// Poisons the outputs, runs `w` on set 0, and compares sampled rows
    /// with the reference.
    pub fn check(&mut self, o: &Opts, c: &Cfg, w: Which, refs: &[RefRow]) -> Res<Check> {
        // The whole O buffer is poisoned; this configuration writes `elems`.
        let (all, elems) = (o.tokens * o.hidden, c.elems(o));
        let rows = c.batch(o) * c.heads(o) * c.n;
        // 0xFFFF is NaN in f16 and bf16; 0xFFFFFFFF is NaN in f32.
        self.memset32(&self.o, u32::MAX, all / 2)?;
        self.memset32(&self.lse, u32::MAX, rows)?;
        self.pre(o, c, w)?;
        self.go(o, c, w, 0)?;
        self.stream.synchronize()?;
        let out = self.stream.clone_dtoh(&self.o)?;
        let lse = self.stream.clone_dtoh(&self.lse)?;
        let dt = c.dtype;
        let nonfinite = out[..elems]
            .iter()
            .filter(|&&b| !dt.value(b).is_finite())
            .count();
        let (h, n, d) = (c.heads(o), c.n, c.d);
        let (mut num, mut den, mut nnum) = (0f64, 0f64, 0f64);
        let mut lse_err = 0f64;
        for r in refs {
            let base = ((r.b * n + r.i) * h + r.h) * d;
            let (want, naive) = (&r.r.o, &r.r.naive);
            for e in 0..d {
                let got = dt.value(out[base + e]) as f64;
                num += (got - want[e]).powi(2);
                den += want[e].powi(2);
                nnum += (naive[e] as f64 - want[e]).powi(2);
            }
            let got = lse[(r.b * h + r.h) * n + r.i] as f64;
            lse_err = lse_err.max(if got.is_finite() {
                (got - r.r.lse).abs()
            } else {
                f64::INFINITY
            });
        }
        let rel_err = (num / den).sqrt();
        let naive_rel_err = (nnum / den).sqrt();
        // FA1 leaves l (not the logsumexp) in lse_ptr.
        let lse_abs_err = if w.key() == "fa1" {
            None
        } else {
            Some(lse_err)
        };
        let ok = nonfinite == 0
            && rel_err.is_finite()
            && rel_err <= 2.0 * naive_rel_err
            && lse_abs_err.is_none_or(|e| e <= 1e-3);
        Ok(Check {
            imp: w.key(),
            rel_err,
            naive_rel_err,
            lse_abs_err,
            nonfinite,
            ok,
        })
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;
    use crate::configs::fill_normal;

    #[test]
    fn naive_attention_is_close_to_the_f64_reference() {
        let o = Opts::parse_from([
            "fa-bench",
            "--dtypes",
            "bf16",
            "--tokens",
            "512",
            "--hidden",
            "128",
            "--seqlens",
            "256",
            "--seed",
            "3",
        ]);
        for (causal, d) in [(false, 64), (true, 64), (false, 96), (true, 32)] {
            let c = Cfg {
                dtype: Dtype::Bf16,
                d,
                causal,
                n: 256,
            };
            // d = 96 does not divide hidden = 128: one 96-wide head.
            assert!(c.elems(&o) <= o.tokens * o.hidden && c.heads(&o) == 128 / d);
            let elems = o.tokens * o.hidden;
            let host: [Vec<u16>; 3] = std::array::from_fn(|j| {
                let mut v = vec![0u16; elems];
                fill_normal(c.dtype, 11 + j as u64, &mut v);
                v
            });
            let refs = reference(&o, &c, &host);
            assert!(refs.len() >= 6);
            let (mut num, mut den) = (0.0, 0.0);
            for r in &refs {
                assert!(r.r.lse.is_finite());
                for e in 0..c.d {
                    num += (r.r.naive[e] as f64 - r.r.o[e]).powi(2);
                    den += r.r.o[e].powi(2);
                }
            }
            let err = (num / den).sqrt();
            assert!(err > 1e-4 && err < 2e-2, "naive bf16 rel err {err}");
            // Row 0 of a causal head sees only key 0: its output is V[0].
            if causal {
                let r = refs.iter().find(|r| r.i == 0).unwrap();
                let v0 = Dtype::Bf16.value(host[2][(r.b * c.n * c.heads(&o) + r.h) * c.d]) as f64;
                assert!((r.r.o[0] - v0).abs() < 1e-12);
            }
        }
    }
}
