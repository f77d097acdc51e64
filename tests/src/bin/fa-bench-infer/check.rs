//! Correctness of every row we time: outputs poisoned with NaN, one call on
//! input set 0, every O element must be finite (written), and sampled rows
//! are compared with an f64 CPU attention on the same (rounded) inputs and
//! with a naive attention in the input dtype. Pass: relative error ≤ 2× the
//! naive one, LSE within 1e-3, no non-finite output (the rule of
//! `shared/GPU-NOTES.md`, "Method").

use flash_attn_tests::Rng;

use crate::Opts;
use flash_attn_tests::bench::reference_row;

use crate::configs::{Case, Dtype, Shape};
use crate::measure::{Gpu, Inputs, Res};

#[derive(Clone, Debug)]
pub struct Check {
    pub rows: usize,
    pub rel_err: f64,
    pub naive_rel_err: f64,
    pub max_abs_err: f64,
    pub lse_abs_err: f64,
    pub nonfinite: usize,
    pub ok: bool,
}

/// One checked output row: where its q (= o) row starts, its keys (`nkeys`
/// rows of k/v from `kbase`, `kstride` apart) and its LSE element.
struct Sample {
    qbase: usize,
    kbase: usize,
    kstride: usize,
    nkeys: usize,
    lse_ix: usize,
}

/// Rows of a sequence of length `l` worth checking: the first two, the
/// last, one in the second half, two at random.
fn rows(r: &mut Rng, l: usize) -> Vec<usize> {
    let mut v = vec![0, 1.min(l - 1), l / 2 + r.below(l.div_ceil(2)), l - 1, r.below(l), r.below(l)];
    v.sort();
    v.dedup();
    v
}

fn samples(o: &Opts, c: &Case) -> Vec<Sample> {
    let mut r = Rng::with_seed(o.seed ^ c.flops.to_bits());
    let mut out = Vec::new();
    match &c.shape {
        Shape::Dense(s) => {
            let group = s.h / s.hk;
            let pairs = [(0, 0), (s.b - 1, s.h - 1), (r.below(s.b), r.below(s.h))];
            for (b, hh) in pairs {
                let kh = hh / group;
                for i in rows(&mut r, s.n) {
                    out.push(Sample {
                        qbase: ((b * s.n + i) * s.h + hh) * s.d,
                        kbase: (b * s.n * s.hk + kh) * s.d,
                        kstride: s.hk * s.d,
                        nkeys: if c.causal { i + 1 } else { s.n },
                        lse_ix: (b * s.h + hh) * s.n + i,
                    });
                }
            }
        }
        Shape::Varlen(p) => {
            let (cu, total, last) = (p.cu(), p.total(), p.lens.len() - 1);
            let longest = (0..p.lens.len()).max_by_key(|&b| p.lens[b]).unwrap();
            let pairs = [(0, 0), (last, p.h - 1), (longest, r.below(p.h)), (r.below(last + 1), r.below(p.h))];
            for (b, hh) in pairs {
                let (start, l) = (cu[b] as usize, p.lens[b]);
                for i in rows(&mut r, l) {
                    out.push(Sample {
                        qbase: ((start + i) * p.h + hh) * p.d,
                        kbase: (start * p.h + hh) * p.d,
                        kstride: p.h * p.d,
                        nkeys: if c.causal { i + 1 } else { l },
                        lse_ix: hh * total + start + i,
                    });
                }
            }
        }
    }
    out
}

/// f64 output row and LSE, and the naive same-dtype row (the shared
/// `flash_attn_tests::bench::reference_row`).
fn reference(dt: Dtype, host: &[Vec<u16>; 3], s: &Sample, d: usize) -> (Vec<f64>, f64, Vec<f32>) {
    let r = reference_row(dt, host, s.qbase, s.kbase, s.kstride, s.nkeys, d);
    (r.o, r.lse, r.naive)
}

pub fn check(gpu: &Gpu, o: &Opts, c: &Case, inp: &mut Inputs) -> Res<Check> {
    gpu.poison(inp)?;
    gpu.call(c, inp, 0)?;
    gpu.stream.synchronize()?;
    let out = gpu.stream.clone_dtoh(&inp.o)?;
    let lse = gpu.stream.clone_dtoh(&inp.lse)?;
    let dt = c.dtype;
    let nonfinite = out.iter().filter(|&&b| !dt.value(b).is_finite()).count();
    let d = match &c.shape {
        Shape::Dense(s) => s.d,
        Shape::Varlen(p) => p.d,
    };
    let smp = samples(o, c);
    let host = &inp.host0;
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let refs: Vec<_> = std::thread::scope(|sc| {
        let hs: Vec<_> = smp
            .chunks(smp.len().div_ceil(threads).max(1))
            .map(|ch| sc.spawn(move || ch.iter().map(|s| reference(dt, host, s, d)).collect::<Vec<_>>()))
            .collect();
        hs.into_iter().flat_map(|h| h.join().unwrap()).collect()
    });
    let (mut num, mut den, mut nnum, mut max_abs, mut lse_err) = (0f64, 0f64, 0f64, 0f64, 0f64);
    for (s, (r, rl, naive)) in smp.iter().zip(&refs) {
        for e in 0..d {
            let got = dt.value(out[s.qbase + e]) as f64;
            let diff = if got.is_finite() { (got - r[e]).abs() } else { f64::INFINITY };
            max_abs = max_abs.max(diff);
            num += diff * diff;
            den += r[e] * r[e];
            nnum += (naive[e] as f64 - r[e]).powi(2);
        }
        let g = lse[s.lse_ix] as f64;
        lse_err = lse_err.max(if g.is_finite() { (g - rl).abs() } else { f64::INFINITY });
    }
    let (rel_err, naive_rel_err) = ((num / den).sqrt(), (nnum / den).sqrt());
    let ok = nonfinite == 0 && rel_err.is_finite() && rel_err <= 2.0 * naive_rel_err && lse_err <= 1e-3;
    Ok(Check { rows: smp.len(), rel_err, naive_rel_err, max_abs_err: max_abs, lse_abs_err: lse_err, nonfinite, ok })
}
