//! What the benchmark binaries (`fa-bench`, `fa-bench-infer`,
//! `fa-bench-decode`) share: the 16-bit [`Dtype`]s, one [`Meas`]urement, the
//! CUDA-event timing loop of the method ([`time_events`]), the PyTorch peer
//! subprocess ([`torch_peer`]) and line plots as SVG ([`plot`]).
//!
//! Method (`shared/GPU-NOTES.md`, "Method"): CUDA events around the work
//! only, warm-up runs first, the median of the timed runs; inputs rotated or
//! the L2 flushed by the caller, outside the events.

pub mod decode;
pub mod flush;
pub mod plot;
pub mod timeline;
pub mod torch_peer;

use std::sync::Arc;

use cudarc::driver::sys::CUevent_flags;
use cudarc::driver::{CudaContext, CudaEvent, CudaStream};

pub type Res<T> = Result<T, Box<dyn std::error::Error>>;

/// Fewest timed runs when the time budget cuts a measurement short.
pub const MIN_REPS: usize = 5;

/// The 16-bit input types, stored as `u16` words on both sides.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Dtype {
    F16,
    Bf16,
}

impl Dtype {
    pub fn name(self) -> &'static str {
        match self {
            Dtype::F16 => "f16",
            Dtype::Bf16 => "bf16",
        }
    }
    /// `f16` (also `fp16`, `half`) or `bf16`.
    pub fn parse(s: &str) -> Option<Self> {
        match s.trim() {
            "f16" | "fp16" | "half" => Some(Dtype::F16),
            "bf16" => Some(Dtype::Bf16),
            _ => None,
        }
    }
    pub fn bits(self, x: f32) -> u16 {
        match self {
            Dtype::F16 => half::f16::from_f32(x).to_bits(),
            Dtype::Bf16 => half::bf16::from_f32(x).to_bits(),
        }
    }
    pub fn value(self, b: u16) -> f32 {
        match self {
            Dtype::F16 => half::f16::from_bits(b).to_f32(),
            Dtype::Bf16 => half::bf16::from_bits(b).to_f32(),
        }
    }
    pub fn round(self, x: f32) -> f32 {
        self.value(self.bits(x))
    }
}

/// One measurement: the median and spread of the timed runs (ms), or why
/// there is none (`ms` = `None`, the reason in `note`).
#[derive(Clone, Debug, Default)]
pub struct Meas {
    pub ms: Option<f64>,
    pub min_ms: f64,
    pub max_ms: f64,
    pub reps: usize,
    pub note: String,
    /// Our kernel that ran, where the caller knows it (its name carries its configuration).
    pub kernel: Option<&'static str>,
}

impl Meas {
    pub fn na(note: impl Into<String>) -> Self {
        Meas {
            note: note.into(),
            ..Default::default()
        }
    }

    pub fn tflops(&self, flops: f64) -> Option<f64> {
        self.ms.map(|ms| flops / ms / 1e9)
    }

    /// The median (the mean of the middle two for an even count), min and
    /// max of `ts`; `requested` runs were asked for (fewer: a budget note).
    pub fn from_times(mut ts: Vec<f64>, requested: usize) -> Self {
        assert!(!ts.is_empty(), "no timed runs");
        ts.sort_by(f64::total_cmp);
        let n = ts.len();
        let med = if n % 2 == 1 {
            ts[n / 2]
        } else {
            0.5 * (ts[n / 2 - 1] + ts[n / 2])
        };
        let note = if n < requested {
            format!("{n} runs (time budget)")
        } else {
            String::new()
        };
        Meas {
            ms: Some(med),
            min_ms: ts[0],
            max_ms: ts[n - 1],
            reps: n,
            note,
            kernel: None,
        }
    }

    /// A record of the PyTorch peer (`torch_common.timed` plus `note`).
    pub fn from_peer(r: &serde_json::Value) -> Self {
        Meas {
            ms: r["ms"].as_f64(),
            min_ms: r["min_ms"].as_f64().unwrap_or(0.0),
            max_ms: r["max_ms"].as_f64().unwrap_or(0.0),
            reps: r["reps"].as_u64().unwrap_or(0) as usize,
            note: r["note"].as_str().unwrap_or("").to_string(),
            kernel: None,
        }
    }
}

/// How many runs a measurement makes.
#[derive(Clone, Copy, Debug)]
pub struct Timing {
    /// Warm-up runs, each timed: the fastest sizes the repetition count.
    pub warmup: usize,
    /// Timed runs asked for.
    pub reps: usize,
    /// Fewer runs (at least [`MIN_REPS`]) where `reps` would take longer.
    pub budget_s: f64,
}

/// One step of a measurement, handed to the caller's closure.
#[derive(Clone, Copy, Debug)]
pub enum Step {
    /// Work before run `i`, outside the events (FA1's initialization, an L2 flush).
    Setup(usize),
    /// Run `i` itself, between the two events (input set `i % sets`).
    Timed(usize),
}

/// Times `run` with CUDA events on `stream`: `t.warmup` warm-up runs (each
/// timed; the fastest sizes the repetition count within `t.budget_s`),
/// then the timed runs, all enqueued before one synchronization; the median.
pub fn time_events(
    ctx: &Arc<CudaContext>,
    stream: &Arc<CudaStream>,
    t: Timing,
    run: impl FnMut(Step) -> Res<()>,
) -> Res<Meas> {
    Ok(Meas::from_times(time_events_runs(ctx, stream, t, run)?, t.reps))
}

/// [`time_events`]' timed runs themselves (ms, in run order), for callers
/// that pool several measurements (e.g. two configurations timed in
/// alternating halves).
pub fn time_events_runs(
    ctx: &Arc<CudaContext>,
    stream: &Arc<CudaStream>,
    t: Timing,
    mut run: impl FnMut(Step) -> Res<()>,
) -> Res<Vec<f64>> {
    let ev = || -> Res<CudaEvent> { Ok(ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?) };
    let mut t0 = f64::INFINITY;
    for i in 0..t.warmup {
        let (a, z) = (ev()?, ev()?);
        run(Step::Setup(i))?;
        a.record(stream)?;
        run(Step::Timed(i))?;
        z.record(stream)?;
        t0 = t0.min(a.elapsed_ms(&z)? as f64);
    }
    let reps = ((t.budget_s * 1e3 / t0.max(1e-3)) as usize).clamp(MIN_REPS.min(t.reps), t.reps);
    let evs: Vec<(CudaEvent, CudaEvent)> =
        (0..reps).map(|_| Ok((ev()?, ev()?))).collect::<Res<_>>()?;
    for (i, (a, z)) in evs.iter().enumerate() {
        run(Step::Setup(i))?;
        a.record(stream)?;
        run(Step::Timed(i))?;
        z.record(stream)?;
    }
    stream.synchronize()?;
    Ok(evs
        .iter()
        .map(|(a, z)| a.elapsed_ms(z).map(f64::from))
        .collect::<Result<Vec<_>, _>>()?)
}

/// One query row of the check's reference: the f64 output row, its
/// natural-log LSE, and the naive row in the input dtype (S rounded to the
/// dtype, softmax in f32, P rounded, P·V accumulated in f32 and rounded:
/// the yardstick of the 16-bit accuracy rule).
#[derive(Clone, Debug)]
pub struct RefRow {
    pub o: Vec<f64>,
    pub lse: f64,
    pub naive: Vec<f32>,
}

/// [`RefRow`] of the query row at `qbase` in `host[0]` against `nkeys`
/// keys and values starting at `kbase` in `host[1]`/`host[2]`, `kstride`
/// elements apart; head dim `d`, scale `1/√d`.
pub fn reference_row(
    dt: Dtype,
    host: &[Vec<u16>; 3],
    qbase: usize,
    kbase: usize,
    kstride: usize,
    nkeys: usize,
    d: usize,
) -> RefRow {
    let scale = 1.0 / (d as f64).sqrt();
    let q: Vec<f32> = (0..d).map(|e| dt.value(host[0][qbase + e])).collect();
    let (mut s64, mut s32) = (vec![0f64; nkeys], vec![0f32; nkeys]);
    for j in 0..nkeys {
        let kb = kbase + j * kstride;
        let (mut a64, mut a32) = (0f64, 0f32);
        for e in 0..d {
            let kv = dt.value(host[1][kb + e]);
            a64 += q[e] as f64 * kv as f64;
            a32 += q[e] * kv;
        }
        s64[j] = a64 * scale;
        s32[j] = dt.round(a32) * scale as f32;
    }
    let m64 = s64.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let m32 = s32.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let p64: Vec<f64> = s64.iter().map(|x| (x - m64).exp()).collect();
    let e32: Vec<f32> = s32.iter().map(|x| (x - m32).exp()).collect();
    let (l64, l32): (f64, f32) = (p64.iter().sum(), e32.iter().sum());
    let (mut o64, mut o32) = (vec![0f64; d], vec![0f32; d]);
    for j in 0..nkeys {
        let vb = kbase + j * kstride;
        let pn = dt.round(e32[j] / l32);
        for e in 0..d {
            let vv = dt.value(host[2][vb + e]);
            o64[e] += p64[j] * vv as f64;
            o32[e] += pn * vv;
        }
    }
    RefRow {
        o: o64.iter().map(|x| x / l64).collect(),
        lse: m64 + l64.ln(),
        naive: o32.iter().map(|&x| dt.round(x)).collect(),
    }
}

/// `geo-mean 1.23× (0.90–1.50, 12 <what>)` of the ratios `v`; `None` for none.
pub fn geomean_range(v: &[f64], what: &str) -> Option<String> {
    if v.is_empty() {
        return None;
    }
    let g = (v.iter().map(|x| x.ln()).sum::<f64>() / v.len() as f64).exp();
    let (lo, hi) = v
        .iter()
        .fold((f64::MAX, 0f64), |(a, b), &x| (a.min(x), b.max(x)));
    Some(format!(
        "geo-mean {g:.2}× ({lo:.2}–{hi:.2}, {} {what})",
        v.len()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_of_even_and_odd_counts() {
        let m = Meas::from_times(vec![3.0, 1.0, 2.0], 3);
        assert_eq!(
            (m.ms, m.min_ms, m.max_ms, m.reps, m.note.as_str()),
            (Some(2.0), 1.0, 3.0, 3, "")
        );
        let m = Meas::from_times(vec![4.0, 1.0, 2.0, 3.0], 10);
        assert_eq!((m.ms, m.note.as_str()), (Some(2.5), "4 runs (time budget)"));
        assert_eq!(m.tflops(5e9), Some(2.0));
    }

    #[test]
    fn dtype_round_trip() {
        for dt in [Dtype::F16, Dtype::Bf16] {
            assert_eq!(Dtype::parse(dt.name()), Some(dt));
            assert_eq!(dt.round(1.5), 1.5);
        }
        assert_eq!(Dtype::parse("half"), Some(Dtype::F16));
        assert!(Dtype::parse("f32").is_none());
        assert_eq!(
            geomean_range(&[1.0, 4.0], "cells").unwrap(),
            "geo-mean 2.00× (1.00–4.00, 2 cells)"
        );
        assert!(geomean_range(&[], "cells").is_none());
    }
}
