//! `fa-bench`: our tensor-core FA2 and FA1 (and standard attention, once the
//! public API offers it for 16-bit inputs) side by side with PyTorch SDPA's
//! flash, cuDNN, efficient and math backends, in one run, on the shapes of
//! the FlashAttention papers.
//!
//! Shapes: batch × seqlen = `--tokens` (16384), hidden = `--hidden` (2048),
//! nheads = ⌊hidden / d⌋ (d = 96: 21); layout (batch, seqlen, nheads, headdim). FLOPs =
//! 4·B·H·N²·d, halved when causal.
//!
//! Method (`shared/GPU-NOTES.md`, "Method"): CUDA events around the kernel
//! only (FA1's O/l/m initialization is outside them); warm-up; median of
//! `--reps` runs; inputs random normal, rotated among `--sets` input sets
//! (3 × 3 × 64 MB by default, far over the 50 MB L2). The PyTorch side
//! (`bench_torch.py`, embedded) uses the same method with `torch.cuda.Event`.
//!
//! `--check` first compares, for every configuration, a sample of output rows
//! of each of our kernels with an f64 CPU attention on the same inputs, and
//! with a naive attention computed in the input dtype: the error must be
//! finite and at most twice the naive one; every output element must be
//! written (outputs are poisoned with NaN first). A failure makes the exit
//! code non-zero.
//!
//! Outputs (in `--out`, default `bench-out/`): `bench.md` (the table),
//! `bench.json`, and one `tflops_<dtype>_d<d>_<causal|full>.svg` per
//! configuration. Progress lines go to stderr; the table and a one-line
//! summary to stdout.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Instant;

use cudarc::driver::sys::{self, CUevent_flags};
use cudarc::driver::{CudaContext, CudaEvent, CudaSlice, CudaStream, DevicePtr};
use flash_attn::tc::{TC_HEAD_DIMS, TcKernel, TcLoop, TcModule};
use flash_attn::{
    AttnElem, AttnParams, FlashAttention, FlashAttnError, ForwardParams, LoopOrder, StatsMut,
    Tensor, TensorLayout, TensorMut,
};
use flash_attn_tests::Rng;
use serde_json::{Value, json};

const TORCH_SCRIPT: &str = include_str!("bench_torch.py");
const LOG2_E: f32 = std::f32::consts::LOG2_E;
/// H100 L2 size: the rotated input sets must exceed it.
const L2_BYTES: usize = 50 << 20;
/// Fewest timed runs when the time budget cuts a measurement short.
const MIN_REPS: usize = 5;

type Res<T> = Result<T, Box<dyn std::error::Error>>;

// ---------------------------------------------------------------------------
// Options
// ---------------------------------------------------------------------------

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
enum Dtype {
    F16,
    Bf16,
}

impl Dtype {
    fn name(self) -> &'static str {
        match self {
            Dtype::F16 => "f16",
            Dtype::Bf16 => "bf16",
        }
    }
    fn bits(self, x: f32) -> u16 {
        match self {
            Dtype::F16 => half::f16::from_f32(x).to_bits(),
            Dtype::Bf16 => half::bf16::from_f32(x).to_bits(),
        }
    }
    fn value(self, b: u16) -> f32 {
        match self {
            Dtype::F16 => half::f16::from_bits(b).to_f32(),
            Dtype::Bf16 => half::bf16::from_bits(b).to_f32(),
        }
    }
    fn round(self, x: f32) -> f32 {
        self.value(self.bits(x))
    }
}

/// An implementation measured: key (JSON, `--impls`), label, plot colour.
struct Impl {
    key: &'static str,
    label: &'static str,
    color: &'static str,
}

const IMPLS: &[Impl] = &[
    Impl {
        key: "fa2",
        label: "FA2 (ours)",
        color: "#d62728",
    },
    Impl {
        key: "fa1",
        label: "FA1 (ours)",
        color: "#ff7f0e",
    },
    Impl {
        key: "standard",
        label: "Standard (ours)",
        color: "#8c564b",
    },
    Impl {
        key: "torch-flash",
        label: "PyTorch flash",
        color: "#1f77b4",
    },
    Impl {
        key: "torch-cudnn",
        label: "cuDNN",
        color: "#2ca02c",
    },
    Impl {
        key: "torch-efficient",
        label: "PyTorch efficient",
        color: "#9467bd",
    },
    Impl {
        key: "torch-math",
        label: "PyTorch math",
        color: "#7f7f7f",
    },
];

fn impl_of(key: &str) -> &'static Impl {
    IMPLS.iter().find(|i| i.key == key).expect("known impl key")
}

#[derive(Clone, Debug)]
struct Opts {
    dtypes: Vec<Dtype>,
    dims: Vec<usize>,
    seqlens: Vec<usize>,
    causal: Vec<bool>,
    impls: Vec<&'static str>,
    tokens: usize,
    hidden: usize,
    warmup: usize,
    reps: usize,
    sets: usize,
    budget_s: f64,
    fa1_max_seqlen: usize,
    mem_cap_gb: f64,
    check: bool,
    check_only: bool,
    torch: bool,
    python: String,
    out: PathBuf,
    seed: u64,
}

const USAGE: &str = "\
fa-bench: our FA2/FA1/standard attention vs PyTorch SDPA (flash, cuDNN, efficient, math)

USAGE: fa-bench [FLAGS]
  --dtypes LIST        f16,bf16                         [f16,bf16]
  --dims LIST          head dims, of 32,64,96,128,256   [64,128]
  --all-dims           every tensor-core head dim (32,64,96,128,256)
  --seqlens LIST       512,1024,2048,4096,8192,16384    [all six]
  --causal WHICH       both | yes | no                  [both]
  --impls LIST         fa2,fa1,standard,torch-flash,torch-cudnn,torch-efficient,torch-math [all]
  --no-torch           skip the PyTorch backends
  --python PATH        python with torch                [python3]
  --tokens N           batch x seqlen                   [16384]
  --hidden N           nheads x d                       [2048]
  --warmup N           warm-up runs per measurement     [3]
  --reps N             timed runs (median)              [30]
  --sets N             rotated input sets (>= 3)        [3]
  --budget-s S         time budget per measurement: fewer runs (>= 5) past it [5]
  --fa1-max-seqlen N   skip FA1 above this seqlen       [8192]
  --mem-cap-gb G       skip implementations that materialize S (N x N) above this [40]
  --check              correctness pass (sampled rows vs f64 CPU) before timing
  --check-only         only the correctness pass
  --out DIR            output folder                    [bench-out]
  --seed N             input seed                       [1]
";

fn parse_list<T: std::str::FromStr>(flag: &str, s: &str) -> Result<Vec<T>, String> {
    s.split(',')
        .filter(|x| !x.is_empty())
        .map(|x| {
            x.trim()
                .parse()
                .map_err(|_| format!("{flag}: bad value `{x}`"))
        })
        .collect()
}

fn parse_args() -> Result<Opts, String> {
    let mut o = Opts {
        dtypes: vec![Dtype::F16, Dtype::Bf16],
        dims: vec![64, 128],
        seqlens: vec![512, 1024, 2048, 4096, 8192, 16384],
        causal: vec![false, true],
        impls: IMPLS.iter().map(|i| i.key).collect(),
        tokens: 16384,
        hidden: 2048,
        warmup: 3,
        reps: 30,
        sets: 3,
        budget_s: 5.0,
        fa1_max_seqlen: 8192,
        mem_cap_gb: 40.0,
        check: false,
        check_only: false,
        torch: true,
        python: "python3".into(),
        out: PathBuf::from("bench-out"),
        seed: 1,
    };
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let (flag, inline) = match a.split_once('=') {
            Some((f, v)) if f.starts_with("--") => (f.to_string(), Some(v.to_string())),
            _ => (a.clone(), None),
        };
        let mut val = || -> Result<String, String> {
            inline
                .clone()
                .or_else(|| it.next().cloned())
                .ok_or_else(|| format!("{flag} needs a value"))
        };
        let num = |s: String| -> Result<usize, String> {
            s.parse().map_err(|_| format!("{flag}: bad number `{s}`"))
        };
        match flag.as_str() {
            "-h" | "--help" => {
                print!("{USAGE}");
                std::process::exit(0);
            }
            "--dtypes" => {
                o.dtypes = val()?
                    .split(',')
                    .map(|x| match x.trim() {
                        "f16" | "fp16" | "half" => Ok(Dtype::F16),
                        "bf16" => Ok(Dtype::Bf16),
                        other => Err(format!("--dtypes: unknown dtype `{other}` (f16, bf16)")),
                    })
                    .collect::<Result<_, _>>()?
            }
            "--dims" => o.dims = parse_list("--dims", &val()?)?,
            "--all-dims" => o.dims = TC_HEAD_DIMS.to_vec(),
            "--seqlens" => o.seqlens = parse_list("--seqlens", &val()?)?,
            "--causal" => {
                o.causal = match val()?.as_str() {
                    "both" => vec![false, true],
                    "yes" | "true" | "1" => vec![true],
                    "no" | "false" | "0" => vec![false],
                    other => return Err(format!("--causal: `{other}` (both, yes, no)")),
                }
            }
            "--impls" => {
                o.impls = val()?
                    .split(',')
                    .map(|x| {
                        IMPLS
                            .iter()
                            .find(|i| i.key == x.trim())
                            .map(|i| i.key)
                            .ok_or_else(|| format!("--impls: unknown `{x}`"))
                    })
                    .collect::<Result<_, _>>()?
            }
            "--no-torch" => o.torch = false,
            "--python" => o.python = val()?,
            "--tokens" => o.tokens = num(val()?)?,
            "--hidden" => o.hidden = num(val()?)?,
            "--warmup" => o.warmup = num(val()?)?,
            "--reps" => o.reps = num(val()?)?,
            "--sets" => o.sets = num(val()?)?,
            "--budget-s" => {
                o.budget_s = val()?
                    .parse()
                    .map_err(|_| "--budget-s: bad number".to_string())?
            }
            "--fa1-max-seqlen" => o.fa1_max_seqlen = num(val()?)?,
            "--mem-cap-gb" => {
                o.mem_cap_gb = val()?
                    .parse()
                    .map_err(|_| "--mem-cap-gb: bad number".to_string())?
            }
            "--check" => o.check = true,
            "--check-only" => {
                o.check = true;
                o.check_only = true
            }
            "--out" => o.out = PathBuf::from(val()?),
            "--seed" => o.seed = num(val()?)? as u64,
            other => return Err(format!("unknown argument `{other}` (see --help)")),
        }
    }
    o.impls
        .sort_by_key(|k| IMPLS.iter().position(|i| i.key == *k));
    o.impls.dedup();
    o.dims.sort();
    o.dims.dedup();
    o.seqlens.sort();
    o.seqlens.dedup();
    o.dtypes.sort();
    o.dtypes.dedup();
    for &d in &o.dims {
        if !TC_HEAD_DIMS.contains(&d) {
            return Err(format!(
                "--dims: {d} is not a tensor-core head dim ({TC_HEAD_DIMS:?})"
            ));
        }
        if d > o.hidden {
            return Err(format!("--dims: {d} is larger than --hidden {}", o.hidden));
        }
    }
    for &n in &o.seqlens {
        if n == 0 || !o.tokens.is_multiple_of(n) {
            return Err(format!(
                "--seqlens: {n} does not divide --tokens {}",
                o.tokens
            ));
        }
    }
    if o.reps == 0 || o.warmup == 0 || o.sets == 0 {
        return Err("--reps, --warmup and --sets must be >= 1".into());
    }
    if o.dtypes.is_empty() || o.dims.is_empty() || o.seqlens.is_empty() || o.impls.is_empty() {
        return Err("empty --dtypes, --dims, --seqlens or --impls".into());
    }
    Ok(o)
}

// ---------------------------------------------------------------------------
// Configurations and results
// ---------------------------------------------------------------------------

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
struct Cfg {
    dtype: Dtype,
    d: usize,
    causal: bool,
    n: usize,
}

impl Cfg {
    fn batch(&self, o: &Opts) -> usize {
        o.tokens / self.n
    }
    /// `hidden / d`, rounded down where `d` does not divide it (d = 96:
    /// 21 heads, 2016 wide).
    fn heads(&self, o: &Opts) -> usize {
        o.hidden / self.d
    }
    /// Elements of q, k, v and o: `batch · N · nheads · d`.
    fn elems(&self, o: &Opts) -> usize {
        o.tokens * self.heads(o) * self.d
    }
    fn flops(&self, o: &Opts) -> f64 {
        let f =
            4.0 * (self.batch(o) * self.heads(o)) as f64 * (self.n as f64).powi(2) * self.d as f64;
        if self.causal { f / 2.0 } else { f }
    }
    fn label(&self) -> String {
        format!(
            "{:4} d={:<3} {} N={:<5}",
            self.dtype.name(),
            self.d,
            if self.causal { "causal" } else { "full  " },
            self.n
        )
    }
    /// The plot this configuration belongs to.
    fn plot(&self) -> (Dtype, usize, bool) {
        (self.dtype, self.d, self.causal)
    }
    /// Bytes of an f32 (batch, nheads, N, N) score matrix.
    fn s_bytes(&self, o: &Opts) -> f64 {
        4.0 * (self.batch(o) * self.heads(o)) as f64 * (self.n as f64).powi(2)
    }
}

#[derive(Clone, Debug, Default)]
struct Meas {
    ms: Option<f64>,
    min_ms: f64,
    max_ms: f64,
    reps: usize,
    note: String,
    /// Our tensor-core kernel that ran (its name carries its configuration).
    kernel: Option<&'static str>,
}

impl Meas {
    fn na(note: impl Into<String>) -> Self {
        Meas {
            note: note.into(),
            ..Default::default()
        }
    }
    fn tflops(&self, flops: f64) -> Option<f64> {
        self.ms.map(|ms| flops / ms / 1e9)
    }
}

#[derive(Clone, Debug)]
struct Check {
    imp: &'static str,
    rel_err: f64,
    naive_rel_err: f64,
    lse_abs_err: Option<f64>,
    nonfinite: usize,
    ok: bool,
}

type Results = BTreeMap<Cfg, BTreeMap<&'static str, Meas>>;

fn configs(o: &Opts) -> Vec<Cfg> {
    let mut v = Vec::new();
    for &dtype in &o.dtypes {
        for &d in &o.dims {
            for &causal in &o.causal {
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

fn progress(
    i: usize,
    total: usize,
    c: &Cfg,
    imp: &str,
    m: &Meas,
    flops: f64,
    requested_reps: usize,
) {
    let what = match m.ms {
        Some(ms) => format!(
            "{ms:9.3} ms {:7.1} TFLOP/s ({} runs{})",
            flops / ms / 1e9,
            m.reps,
            if m.reps < requested_reps {
                ", time budget"
            } else {
                ""
            }
        ),
        None => format!("n/a ({})", m.note),
    };
    let k = m.kernel.map_or(String::new(), |k| format!(" {k}"));
    eprintln!("[ours  {i:3}/{total}] {} {imp:15} {what}{k}", c.label());
}

// ---------------------------------------------------------------------------
// Inputs
// ---------------------------------------------------------------------------

/// Fills `out` with standard-normal values rounded to `dt` (Box–Muller),
/// in parallel; deterministic in `seed` whatever the thread count.
fn fill_normal(dt: Dtype, seed: u64, out: &mut [u16]) {
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

// ---------------------------------------------------------------------------
// Our kernels on the GPU
// ---------------------------------------------------------------------------

struct Gpu {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    /// The public API (standard attention) and its loaded module.
    fa: FlashAttention,
    tc: TcModule,
    /// `sets` × (q, k, v), each `tokens × hidden` 16-bit elements.
    sets: Vec<[CudaSlice<u16>; 3]>,
    o: CudaSlice<u16>,
    o_accum: CudaSlice<f32>,
    lse: CudaSlice<f32>,
    m: CudaSlice<f32>,
    /// Set 0 on the host, for the check.
    host0: [Vec<u16>; 3],
    loaded: Option<Dtype>,
}

fn dptr<T>(s: &CudaSlice<T>, stream: &CudaStream) -> u64 {
    // Event tracking is off (single stream): the guard records nothing.
    let (p, _guard) = s.device_ptr(stream);
    p
}

impl Gpu {
    fn new(o: &Opts, ctx: Arc<CudaContext>) -> Res<Self> {
        // One stream only: no cross-stream tracking needed, and none of its
        // event records inside the timed region.
        // SAFETY: every buffer below is used on `stream` alone.
        unsafe { ctx.disable_event_tracking() };
        let stream = ctx.new_stream()?;
        let t = Instant::now();
        let fa = FlashAttention::new(&ctx)?;
        let tc = TcModule::from_module(fa.module())?;
        eprintln!(
            "fa-bench: loaded the {} PTX ({} tensor-core kernels) in {:.1} s",
            fa.ptx_build().arch,
            flash_attn::tc::TC_KERNELS.len(),
            t.elapsed().as_secs_f64()
        );
        let elems = o.tokens * o.hidden;
        let min_d = *o.dims.iter().min().unwrap();
        let rows = o.tokens * (o.hidden / min_d);
        let need = o.sets * 3 * elems * 2 + elems * 2 + elems * 4 + 2 * rows * 4;
        let (free, total) = ctx.mem_get_info()?;
        eprintln!(
            "fa-bench: GPU memory {:.1} GB free of {:.1} GB; ours needs {:.2} GB ({} input sets of {:.0} MB)",
            free as f64 / 1e9,
            total as f64 / 1e9,
            need as f64 / 1e9,
            o.sets,
            (3 * elems * 2) as f64 / 1e6
        );
        if need > free {
            return Err(format!("not enough GPU memory: need {need} bytes, {free} free").into());
        }
        // SAFETY (alloc): every buffer is written before it is read (inputs
        // uploaded in `load`, outputs written by the kernels or memsets).
        let mut sets = Vec::new();
        for _ in 0..o.sets {
            sets.push(unsafe {
                [
                    stream.alloc::<u16>(elems)?,
                    stream.alloc::<u16>(elems)?,
                    stream.alloc::<u16>(elems)?,
                ]
            });
        }
        let (o_buf, o_accum, lse, m) = unsafe {
            (
                stream.alloc::<u16>(elems)?,
                stream.alloc::<f32>(elems)?,
                stream.alloc::<f32>(rows)?,
                stream.alloc::<f32>(rows)?,
            )
        };
        Ok(Gpu {
            ctx,
            stream,
            fa,
            tc,
            sets,
            o: o_buf,
            o_accum,
            lse,
            m,
            host0: [vec![], vec![], vec![]],
            loaded: None,
        })
    }

    /// Uploads fresh random inputs in `dt` to every set.
    fn load(&mut self, o: &Opts, dt: Dtype) -> Res<()> {
        if self.loaded == Some(dt) {
            return Ok(());
        }
        let t = Instant::now();
        let elems = o.tokens * o.hidden;
        let mut host = vec![0u16; elems];
        for s in 0..o.sets {
            for j in 0..3 {
                let seed = o.seed.wrapping_mul(1_000_003)
                    ^ ((dt as u64) << 40)
                    ^ ((s as u64) << 20)
                    ^ j as u64;
                fill_normal(dt, seed, &mut host);
                self.stream.memcpy_htod(&host, &mut self.sets[s][j])?;
                if s == 0 && o.check {
                    self.host0[j] = host.clone();
                }
            }
        }
        self.stream.synchronize()?;
        self.loaded = Some(dt);
        eprintln!(
            "fa-bench: {} inputs: {} sets uploaded in {:.1} s",
            dt.name(),
            o.sets,
            t.elapsed().as_secs_f64()
        );
        Ok(())
    }

    fn params(&self, o: &Opts, c: &Cfg, k: &TcKernel, set: usize) -> AttnParams {
        let (b, h, n, d) = (c.batch(o), c.heads(o), c.n, c.d);
        let st = [(n * h * d) as u64, (h * d) as u64, d as u64];
        let scale = 1.0 / (d as f32).sqrt();
        let fa1 = k.loop_order == TcLoop::Fa1;
        let s = &self.sets[set % self.sets.len()];
        AttnParams {
            q_ptr: dptr(&s[0], &self.stream),
            k_ptr: dptr(&s[1], &self.stream),
            v_ptr: dptr(&s[2], &self.stream),
            o_ptr: dptr(&self.o, &self.stream),
            lse_ptr: dptr(&self.lse, &self.stream),
            m_ptr: if fa1 { dptr(&self.m, &self.stream) } else { 0 },
            o_accum_ptr: if fa1 {
                dptr(&self.o_accum, &self.stream)
            } else {
                0
            },
            q_stride: st,
            k_stride: st,
            v_stride: st,
            o_stride: st,
            batch: b as u32,
            nheads: h as u32,
            seqlen_q: n as u32,
            seqlen_k: n as u32,
            headdim: d as u32,
            causal: c.causal as u32,
            softmax_scale: scale,
            softmax_scale_log2: scale * LOG2_E,
            br: k.br() as u32,
            bc: k.bc as u32,
            ..Default::default()
        }
    }

    fn memset32(&self, p: u64, value: u32, count: usize) -> Res<()> {
        // SAFETY: `p` is the start of a live allocation of at least `count` 4-byte words.
        unsafe { sys::cuMemsetD32Async(p, value, count, self.stream.cu_stream()).result()? };
        Ok(())
    }

    /// FA1's contract: O accumulator = 0, l = 0, m = −inf before every launch.
    fn fa1_init(&self, o: &Opts, c: &Cfg) -> Res<()> {
        let rows = c.batch(o) * c.heads(o) * c.n;
        self.memset32(dptr(&self.o_accum, &self.stream), 0, c.elems(o))?;
        self.memset32(dptr(&self.lse, &self.stream), 0, rows)?;
        self.memset32(
            dptr(&self.m, &self.stream),
            f32::NEG_INFINITY.to_bits(),
            rows,
        )
    }

    fn launch(&self, o: &Opts, c: &Cfg, k: &TcKernel, set: usize) -> Res<()> {
        let p = self.params(o, c, k, set);
        // SAFETY: q/k/v/o are `tokens × hidden` = batch·seqlen·nheads·d
        // elements with the contiguous strides of `params` (multiples of 8
        // elements, d >= 32), 256-byte aligned by cuMemAlloc; lse and m hold
        // batch·nheads·seqlen f32 (sized for the smallest d); o_accum is
        // contiguous f32 of O's shape; br/bc/headdim come from `k`; FA1's
        // buffers are initialized by `fa1_init` before every launch.
        unsafe { self.tc.launch(&self.stream, k, &p)? };
        Ok(())
    }

    /// Standard attention through the public API (`LoopOrder::Standard`:
    /// three kernels over an f32 S/P scratch matrix it allocates on the
    /// stream), reading our 16-bit buffers as `T`.
    fn standard<T: AttnElem>(
        &mut self,
        o: &Opts,
        c: &Cfg,
        set: usize,
    ) -> Result<(), FlashAttnError> {
        let elems = c.elems(o);
        let layout = TensorLayout::contiguous([c.batch(o), c.n, c.heads(o), c.d]);
        let params = ForwardParams {
            causal: c.causal,
            softmax_scale: Some(1.0 / (c.d as f32).sqrt()),
            loop_order: LoopOrder::Standard,
            block: None,
            ..Default::default()
        };
        let s = &self.sets[set % self.sets.len()];
        // SAFETY: u16 and T (f16 or bf16) have the same size and alignment,
        // and every bit pattern is a valid T; `elems` is each buffer's length.
        let (q, k, v, mut out) = unsafe {
            (
                s[0].transmute::<T>(elems).expect("q length"),
                s[1].transmute::<T>(elems).expect("k length"),
                s[2].transmute::<T>(elems).expect("v length"),
                self.o.transmute_mut::<T>(elems).expect("o length"),
            )
        };
        let lse = self.lse.as_view_mut();
        self.fa.forward_into(
            &self.stream,
            Tensor::new(&q, layout),
            Tensor::new(&k, layout),
            Tensor::new(&v, layout),
            TensorMut::new(&mut out, layout),
            StatsMut::LogSumExp(lse),
            &params,
        )
    }

    /// Work before a timed run, outside the events (FA1's initialization).
    fn pre(&self, o: &Opts, c: &Cfg, w: Which) -> Res<()> {
        match w {
            Which::Tc(k) if k.loop_order == TcLoop::Fa1 => self.fa1_init(o, c),
            _ => Ok(()),
        }
    }

    /// One run of `w` on input set `set`.
    fn go(&mut self, o: &Opts, c: &Cfg, w: Which, set: usize) -> Res<()> {
        match w {
            Which::Tc(k) => self.launch(o, c, k, set),
            Which::Standard => match c.dtype {
                Dtype::F16 => Ok(self.standard::<half::f16>(o, c, set)?),
                Dtype::Bf16 => Ok(self.standard::<half::bf16>(o, c, set)?),
            },
        }
    }

    /// Times `w`: warm-up, then `reps` runs on rotating input sets, each
    /// between two CUDA events; the median.
    fn time(&mut self, o: &Opts, c: &Cfg, w: Which) -> Res<Meas> {
        let ctx = self.ctx.clone();
        let ev = || ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT));
        // Warm-up runs, each timed: the fastest sizes the repetition count
        // (the first run of a shape can include one-time setup).
        let mut t0 = f64::INFINITY;
        for i in 0..o.warmup {
            let (a, z) = (ev()?, ev()?);
            self.pre(o, c, w)?;
            a.record(&self.stream)?;
            self.go(o, c, w, i)?;
            z.record(&self.stream)?;
            t0 = t0.min(a.elapsed_ms(&z)? as f64);
        }
        let reps = ((o.budget_s * 1e3 / t0.max(1e-3)) as usize).clamp(MIN_REPS.min(o.reps), o.reps);
        let evs: Vec<(CudaEvent, CudaEvent)> =
            (0..reps).map(|_| Ok((ev()?, ev()?))).collect::<Res<_>>()?;
        for (i, (a, z)) in evs.iter().enumerate() {
            self.pre(o, c, w)?;
            a.record(&self.stream)?;
            self.go(o, c, w, i)?;
            z.record(&self.stream)?;
        }
        self.stream.synchronize()?;
        let mut ts = evs
            .iter()
            .map(|(a, z)| a.elapsed_ms(z).map(f64::from))
            .collect::<Result<Vec<_>, _>>()?;
        ts.sort_by(|x, y| x.total_cmp(y));
        let med = if reps % 2 == 1 {
            ts[reps / 2]
        } else {
            0.5 * (ts[reps / 2 - 1] + ts[reps / 2])
        };
        let note = if reps < o.reps {
            format!("{reps} runs (time budget)")
        } else {
            String::new()
        };
        Ok(Meas {
            ms: Some(med),
            min_ms: ts[0],
            max_ms: ts[reps - 1],
            reps,
            note,
            kernel: None,
        })
    }

    /// Poisons the outputs, runs `w` on set 0, and compares sampled rows
    /// with the reference.
    fn check(&mut self, o: &Opts, c: &Cfg, w: Which, refs: &[RefRow]) -> Res<Check> {
        // The whole O buffer is poisoned; this configuration writes `elems`.
        let (all, elems) = (o.tokens * o.hidden, c.elems(o));
        let rows = c.batch(o) * c.heads(o) * c.n;
        // 0xFFFF is NaN in f16 and bf16; 0xFFFFFFFF is NaN in f32.
        self.memset32(dptr(&self.o, &self.stream), u32::MAX, all / 2)?;
        self.memset32(dptr(&self.lse, &self.stream), u32::MAX, rows)?;
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
            for e in 0..d {
                let got = dt.value(out[base + e]) as f64;
                num += (got - r.o[e]).powi(2);
                den += r.o[e].powi(2);
                nnum += (r.naive[e] as f64 - r.o[e]).powi(2);
            }
            let got = lse[(r.b * h + r.h) * n + r.i] as f64;
            lse_err = lse_err.max(if got.is_finite() {
                (got - r.lse).abs()
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

/// What runs: a tensor-core kernel, or standard attention through the API.
#[derive(Clone, Copy, Debug)]
enum Which {
    Tc(&'static TcKernel),
    Standard,
}

impl Which {
    fn key(self) -> &'static str {
        match self {
            Which::Tc(k) if k.loop_order == TcLoop::Fa1 => "fa1",
            Which::Tc(_) => "fa2",
            Which::Standard => "standard",
        }
    }
}

// ---------------------------------------------------------------------------
// CPU reference on sampled rows
// ---------------------------------------------------------------------------

struct RefRow {
    b: usize,
    h: usize,
    i: usize,
    /// f64 attention output row.
    o: Vec<f64>,
    /// Natural-log logsumexp of the scaled scores.
    lse: f64,
    /// Naive attention in the input dtype: S rounded to dtype, softmax in
    /// f32, P rounded to dtype, P·V accumulated in f32 and rounded.
    naive: Vec<f32>,
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

fn reference(o: &Opts, c: &Cfg, host: &[Vec<u16>; 3]) -> Vec<RefRow> {
    let samples = sample_rows(o, c);
    let (h, n, d, dt) = (c.heads(o), c.n, c.d, c.dtype);
    let scale = 1.0 / (d as f64).sqrt();
    let at = |t: &Vec<u16>, b: usize, s: usize, hh: usize, e: usize| {
        dt.value(t[((b * n + s) * h + hh) * d + e])
    };
    let one = |&(b, hh, i): &(usize, usize, usize)| -> RefRow {
        let lim = if c.causal { i + 1 } else { n };
        let q: Vec<f32> = (0..d).map(|e| at(&host[0], b, i, hh, e)).collect();
        let mut s64 = vec![0f64; lim];
        let mut s32 = vec![0f32; lim];
        for j in 0..lim {
            let base = ((b * n + j) * h + hh) * d;
            let (mut a64, mut a32) = (0f64, 0f32);
            for e in 0..d {
                let kv = dt.value(host[1][base + e]);
                a64 += q[e] as f64 * kv as f64;
                a32 += q[e] * kv;
            }
            s64[j] = a64 * scale;
            s32[j] = dt.round(a32) * scale as f32;
        }
        let m64 = s64.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let m32 = s32.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
        let p64: Vec<f64> = s64.iter().map(|s| (s - m64).exp()).collect();
        let e32: Vec<f32> = s32.iter().map(|s| (s - m32).exp()).collect();
        let l64: f64 = p64.iter().sum();
        let l32: f32 = e32.iter().sum();
        let mut o64 = vec![0f64; d];
        let mut o32 = vec![0f32; d];
        for j in 0..lim {
            let base = ((b * n + j) * h + hh) * d;
            let pn = dt.round(e32[j] / l32);
            for e in 0..d {
                let vv = dt.value(host[2][base + e]);
                o64[e] += p64[j] * vv as f64;
                o32[e] += pn * vv;
            }
        }
        RefRow {
            b,
            h: hh,
            i,
            o: o64.iter().map(|x| x / l64).collect(),
            lse: m64 + l64.ln(),
            naive: o32.iter().map(|&x| dt.round(x)).collect(),
        }
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

// ---------------------------------------------------------------------------
// Runs
// ---------------------------------------------------------------------------

struct DeviceInfo {
    name: String,
    cc: (i32, i32),
    arch: String,
}

fn run_ours(
    o: &Opts,
    cfgs: &[Cfg],
    results: &mut Results,
    checks: &mut BTreeMap<Cfg, Vec<Check>>,
    info: &mut Option<DeviceInfo>,
) -> Res<()> {
    let ours: Vec<&'static str> = o
        .impls
        .iter()
        .copied()
        .filter(|k| ["fa2", "fa1", "standard"].contains(k))
        .collect();
    if ours.is_empty() && !o.check {
        return Ok(());
    }
    // SAFETY: only tries to dlopen the driver library (cudarc panics instead
    // of returning an error when it is missing).
    if !unsafe { sys::is_culib_present() } {
        return Err("no CUDA driver library (libcuda.so) on this machine".into());
    }
    let ctx = CudaContext::new(0)?;
    let cc = ctx.compute_capability()?;
    let build = flash_attn::ptx::for_compute_capability(cc.0, cc.1).ok_or_else(|| {
        format!(
            "compute capability {}.{} is below sm_80: no tensor-core PTX",
            cc.0, cc.1
        )
    })?;
    *info = Some(DeviceInfo {
        name: ctx.name()?,
        cc,
        arch: build.arch.to_string(),
    });
    eprintln!(
        "fa-bench: {} (sm_{}{}), {} configurations",
        ctx.name()?,
        cc.0,
        cc.1,
        cfgs.len()
    );
    let mut gpu = Gpu::new(o, ctx)?;
    let smem_limit = gpu.fa.limits().max_smem_per_block;
    let total = cfgs.len();
    for (ci, c) in cfgs.iter().enumerate() {
        gpu.load(o, c.dtype)?;
        let flops = c.flops(o);
        // What the library picks on this device (the tuned default, or a
        // smaller tile where shared memory is short).
        let kernel = |lo| TcKernel::default_fitting(lo, c.dtype == Dtype::Bf16, c.d, Default::default(), smem_limit);
        let fa1_skip = c.n > o.fa1_max_seqlen;
        let std_skip = c.s_bytes(o) > o.mem_cap_gb * 1e9;
        // What runs for each of our implementations, or why not.
        let plan = |key: &str| -> Result<Which, String> {
            match key {
                "fa2" => kernel(TcLoop::Fa2)
                    .map(Which::Tc)
                    .ok_or_else(|| "no FA2 tensor-core kernel for this dtype/d".into()),
                "fa1" if fa1_skip => Err(format!(
                    "skipped: N > --fa1-max-seqlen {} (FA1's grid is batch·heads = {} blocks)",
                    o.fa1_max_seqlen,
                    c.batch(o) * c.heads(o)
                )),
                "fa1" => kernel(TcLoop::Fa1)
                    .map(Which::Tc)
                    .ok_or_else(|| "no FA1 tensor-core kernel for this dtype/d".into()),
                _ if std_skip => Err(format!(
                    "skipped: the f32 S matrix would need {:.0} GB > --mem-cap-gb {}",
                    c.s_bytes(o) / 1e9,
                    o.mem_cap_gb
                )),
                _ => Ok(Which::Standard),
            }
        };
        // Standard goes through the public API: probe it once (it refuses
        // what it does not support before launching anything).
        let mut std_err: Option<String> = None;
        if ours.contains(&"standard")
            && !std_skip
            && !o.check_only
            && let Err(e) = gpu
                .go(o, c, Which::Standard, 0)
                .and_then(|_| Ok(gpu.stream.synchronize()?))
        {
            std_err = Some(format!("public API: {e}"));
        }
        if o.check {
            let refs = reference(o, c, &gpu.host0);
            let mut v = Vec::new();
            for &key in &ours {
                let Ok(w) = plan(key) else { continue };
                if key == "standard" && std_err.is_some() {
                    continue;
                }
                let ch = match gpu.check(o, c, w, &refs) {
                    Err(e) if key == "standard" => {
                        std_err = Some(format!("public API: {e}"));
                        continue;
                    }
                    r => r?,
                };
                eprintln!(
                    "[check {:3}/{total}] {} {:15} rel err {:.2e} (naive {} {:.2e}){}{} {}",
                    ci + 1,
                    c.label(),
                    key,
                    ch.rel_err,
                    c.dtype.name(),
                    ch.naive_rel_err,
                    ch.lse_abs_err
                        .map_or(String::new(), |e| format!(", lse err {e:.1e}")),
                    if ch.nonfinite > 0 {
                        format!(", {} non-finite outputs", ch.nonfinite)
                    } else {
                        String::new()
                    },
                    if ch.ok { "ok" } else { "FAIL" }
                );
                v.push(ch);
            }
            checks.insert(*c, v);
        }
        if o.check_only {
            continue;
        }
        let row = results.entry(*c).or_default();
        for &key in &ours {
            let m = match (plan(key), &std_err) {
                (Err(why), _) => Meas::na(why),
                (Ok(Which::Standard), Some(e)) => Meas::na(e.clone()),
                (Ok(w), _) => Meas {
                    kernel: match w {
                        Which::Tc(k) => Some(k.name),
                        Which::Standard => None,
                    },
                    ..gpu.time(o, c, w)?
                },
            };
            progress(ci + 1, total, c, key, &m, flops, o.reps);
            row.insert(key, m);
        }
    }
    Ok(())
}

struct TorchInfo {
    available: bool,
    version: Option<String>,
    reason: String,
}

fn run_torch(o: &Opts, cfgs: &[Cfg], results: &mut Results) -> TorchInfo {
    let torch_impls: Vec<&str> = o
        .impls
        .iter()
        .copied()
        .filter(|k| k.starts_with("torch-"))
        .collect();
    let mut info = TorchInfo {
        available: false,
        version: None,
        reason: String::new(),
    };
    if torch_impls.is_empty() {
        info.reason = "no torch backend selected".into();
        return info;
    }
    if !o.torch {
        info.reason = "--no-torch".into();
        return info;
    }
    let dir = std::env::temp_dir().join(format!("fa-bench-{}", std::process::id()));
    let run = || -> Res<Value> {
        std::fs::create_dir_all(&dir)?;
        let script = dir.join("bench_torch.py");
        let cfg_path = dir.join("config.json");
        let res_path = dir.join("result.json");
        std::fs::write(&script, TORCH_SCRIPT)?;
        let cfg = json!({
            "tokens": o.tokens, "hidden": o.hidden, "sets": o.sets, "warmup": o.warmup, "reps": o.reps,
            "budget_s": o.budget_s, "mem_cap_bytes": o.mem_cap_gb * 1e9, "seed": o.seed, "impls": torch_impls,
            "configs": cfgs.iter().map(|c| json!({"dtype": c.dtype.name(), "d": c.d, "causal": c.causal, "seqlen": c.n})).collect::<Vec<_>>(),
        });
        std::fs::write(&cfg_path, serde_json::to_vec(&cfg)?)?;
        eprintln!(
            "fa-bench: running PyTorch SDPA ({}) with {}",
            torch_impls.join(", "),
            o.python
        );
        let status = Command::new(&o.python)
            .arg(&script)
            .arg(&cfg_path)
            .arg(&res_path)
            .env("PYTHONUNBUFFERED", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::from(std::io::stderr()))
            .status()
            .map_err(|e| format!("cannot run `{}`: {e}", o.python))?;
        let text = std::fs::read_to_string(&res_path).map_err(|e| {
            format!(
                "`{}` exited with {status} and wrote no result ({e})",
                o.python
            )
        })?;
        let mut v: Value = serde_json::from_str(&text)?;
        if !status.success() {
            v["reason"] = json!(format!(
                "python exited with {status} (partial results kept)"
            ));
        }
        Ok(v)
    };
    let v = match run() {
        Ok(v) => v,
        Err(e) => {
            info.reason = e.to_string();
            let _ = std::fs::remove_dir_all(&dir);
            return info;
        }
    };
    let _ = std::fs::remove_dir_all(&dir);
    info.available = v["available"].as_bool().unwrap_or(false);
    info.version = v["torch"].as_str().map(|s| s.to_string());
    info.reason = v["reason"].as_str().unwrap_or("").to_string();
    for r in v["results"].as_array().into_iter().flatten() {
        let dtype = if r["dtype"] == "bf16" {
            Dtype::Bf16
        } else {
            Dtype::F16
        };
        let c = Cfg {
            dtype,
            d: r["d"].as_u64().unwrap_or(0) as usize,
            causal: r["causal"].as_bool().unwrap_or(false),
            n: r["seqlen"].as_u64().unwrap_or(0) as usize,
        };
        let Some(imp) = IMPLS.iter().find(|i| Some(i.key) == r["impl"].as_str()) else {
            continue;
        };
        let m = Meas {
            ms: r["ms"].as_f64(),
            min_ms: r["min_ms"].as_f64().unwrap_or(0.0),
            max_ms: r["max_ms"].as_f64().unwrap_or(0.0),
            reps: r["reps"].as_u64().unwrap_or(0) as usize,
            note: r["note"].as_str().unwrap_or("").to_string(),
            kernel: None,
        };
        results.entry(c).or_default().insert(imp.key, m);
    }
    info
}

// ---------------------------------------------------------------------------
// Reports
// ---------------------------------------------------------------------------

fn ratio(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    match (a, b) {
        (Some(a), Some(b)) if b > 0.0 => Some(a / b),
        _ => None,
    }
}

const RATIOS: &[(&str, &str)] = &[
    ("torch-flash", "FA2/flash"),
    ("torch-cudnn", "FA2/cuDNN"),
    ("fa1", "FA2/FA1"),
    ("standard", "FA2/std"),
];

fn markdown(
    o: &Opts,
    cfgs: &[Cfg],
    results: &Results,
    checks: &BTreeMap<Cfg, Vec<Check>>,
    header: &str,
) -> String {
    let mut s = String::new();
    let mut notes: Vec<String> = Vec::new();
    let mut note_ix = |n: &str| -> usize {
        match notes.iter().position(|x| x == n) {
            Some(i) => i + 1,
            None => {
                notes.push(n.to_string());
                notes.len()
            }
        }
    };
    writeln!(s, "{header}\n").unwrap();
    if !o.check_only {
        writeln!(
            s,
            "TFLOP/s (median ms). Ratios are TFLOP/s of our FA2 over the other implementation.\n"
        )
        .unwrap();
        let mut head = "| dtype | d | causal | N | B×H |".to_string();
        let mut sep = "| --- | --- | --- | --- | --- |".to_string();
        for k in &o.impls {
            head += &format!(" {} |", impl_of(k).label);
            sep += " --- |";
        }
        for (k, name) in RATIOS {
            if o.impls.contains(&"fa2") && o.impls.contains(k) {
                head += &format!(" {name} |");
                sep += " --- |";
            }
        }
        writeln!(s, "{head}\n{sep}").unwrap();
        for c in cfgs {
            let Some(row) = results.get(c) else { continue };
            let flops = c.flops(o);
            let mut line = format!(
                "| {} | {} | {} | {} | {}×{} |",
                c.dtype.name(),
                c.d,
                if c.causal { "yes" } else { "no" },
                c.n,
                c.batch(o),
                c.heads(o)
            );
            for k in &o.impls {
                match row.get(k) {
                    Some(m) if m.ms.is_some() => {
                        let mark = if m.note.is_empty() {
                            String::new()
                        } else {
                            format!(" [{}]", note_ix(&m.note))
                        };
                        line += &format!(
                            " {:.1} ({:.3} ms){mark} |",
                            m.tflops(flops).unwrap(),
                            m.ms.unwrap()
                        );
                    }
                    Some(m) => line += &format!(" n/a [{}] |", note_ix(&m.note)),
                    None => line += " – |",
                }
            }
            let fa2 = row.get("fa2").and_then(|m| m.tflops(flops));
            for (k, _) in RATIOS {
                if o.impls.contains(&"fa2") && o.impls.contains(k) {
                    match ratio(fa2, row.get(k).and_then(|m| m.tflops(flops))) {
                        Some(r) => line += &format!(" {r:.2}× |"),
                        None => line += " – |",
                    }
                }
            }
            writeln!(s, "{line}").unwrap();
        }
        if !notes.is_empty() {
            writeln!(s).unwrap();
            for (i, n) in notes.iter().enumerate() {
                writeln!(s, "[{}] {n}  ", i + 1).unwrap();
            }
        }
        let mut kernels: Vec<&str> = results
            .values()
            .flat_map(|r| r.values().filter_map(|m| m.kernel))
            .collect();
        kernels.sort();
        kernels.dedup();
        if !kernels.is_empty() {
            writeln!(
                s,
                "\nOur kernels: {}",
                kernels
                    .iter()
                    .map(|k| format!("`{k}`"))
                    .collect::<Vec<_>>()
                    .join(", ")
            )
            .unwrap();
        }
    }
    if !checks.is_empty() {
        writeln!(s, "\nCorrectness (sampled rows vs f64 CPU attention; pass: finite, every output written, ‖out−ref‖/‖ref‖ ≤ 2 × naive attention in the same dtype, |lse − ref| ≤ 1e-3):\n").unwrap();
        writeln!(s, "| dtype | d | causal | N | impl | rel err | naive rel err | lse abs err | result |\n| --- | --- | --- | --- | --- | --- | --- | --- | --- |").unwrap();
        for (c, v) in checks {
            for ch in v {
                writeln!(
                    s,
                    "| {} | {} | {} | {} | {} | {:.2e} | {:.2e} | {} | {} |",
                    c.dtype.name(),
                    c.d,
                    if c.causal { "yes" } else { "no" },
                    c.n,
                    impl_of(ch.imp).label,
                    ch.rel_err,
                    ch.naive_rel_err,
                    ch.lse_abs_err
                        .map_or("–".to_string(), |e| format!("{e:.1e}")),
                    if ch.ok {
                        "ok".to_string()
                    } else {
                        format!("**FAIL** ({} non-finite)", ch.nonfinite)
                    }
                )
                .unwrap();
            }
        }
    }
    s
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// A "nice" axis maximum and tick step for values up to `max`.
fn nice_axis(max: f64) -> (f64, f64) {
    let max = if max > 0.0 { max * 1.08 } else { 1.0 };
    let raw = max / 6.0;
    let mag = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 2.5, 5.0, 10.0]
        .iter()
        .map(|m| m * mag)
        .find(|s| *s >= raw)
        .unwrap_or(10.0 * mag);
    ((max / step).ceil() * step, step)
}

/// TFLOP/s vs seqlen, one line per implementation, hand-written SVG.
fn svg_plot(
    title: &str,
    subtitle: &str,
    seqlens: &[usize],
    series: &[(&Impl, Vec<Option<f64>>)],
) -> String {
    let (w, h) = (760.0, 450.0);
    let (x0, x1, y0, y1) = (70.0, 560.0, 60.0, 390.0); // plot area: left, right, top, bottom
    let ymax_data = series
        .iter()
        .flat_map(|(_, v)| v.iter().flatten())
        .cloned()
        .fold(0.0, f64::max);
    let (ymax, step) = nice_axis(ymax_data);
    let nx = seqlens.len();
    let xp = |i: usize| {
        if nx == 1 {
            (x0 + x1) / 2.0
        } else {
            x0 + (x1 - x0) * i as f64 / (nx - 1) as f64
        }
    };
    let yp = |v: f64| y1 - (y1 - y0) * v / ymax;
    let mut s = String::new();
    writeln!(s, r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" font-family="sans-serif" font-size="12">"#).unwrap();
    writeln!(s, r#"<rect width="{w}" height="{h}" fill="white"/>"#).unwrap();
    writeln!(
        s,
        r#"<text x="{}" y="28" text-anchor="middle" font-size="15" font-weight="bold">{}</text>"#,
        w / 2.0, // centred on the image: the subtitle is wider than the plot area
        esc(title)
    )
    .unwrap();
    writeln!(
        s,
        r##"<text x="{}" y="46" text-anchor="middle" fill="#555">{}</text>"##,
        w / 2.0,
        esc(subtitle)
    )
    .unwrap();
    // y grid and ticks
    let mut v = 0.0;
    while v <= ymax + 1e-9 {
        let y = yp(v);
        writeln!(
            s,
            r##"<line x1="{x0}" y1="{y:.1}" x2="{x1}" y2="{y:.1}" stroke="#ddd"/>"##
        )
        .unwrap();
        writeln!(
            s,
            r#"<text x="{}" y="{:.1}" text-anchor="end">{}</text>"#,
            x0 - 6.0,
            y + 4.0,
            v
        )
        .unwrap();
        v += step;
    }
    // x ticks
    for (i, n) in seqlens.iter().enumerate() {
        let x = xp(i);
        writeln!(
            s,
            r##"<line x1="{x:.1}" y1="{y1}" x2="{x:.1}" y2="{}" stroke="#333"/>"##,
            y1 + 5.0
        )
        .unwrap();
        let lbl = if n % 1024 == 0 {
            format!("{}k", n / 1024)
        } else {
            n.to_string()
        };
        writeln!(
            s,
            r#"<text x="{x:.1}" y="{}" text-anchor="middle">{lbl}</text>"#,
            y1 + 20.0
        )
        .unwrap();
    }
    // axes
    writeln!(s, r##"<line x1="{x0}" y1="{y0}" x2="{x0}" y2="{y1}" stroke="#333"/><line x1="{x0}" y1="{y1}" x2="{x1}" y2="{y1}" stroke="#333"/>"##).unwrap();
    writeln!(
        s,
        r#"<text x="{}" y="{}" text-anchor="middle">sequence length N (batch × N = const)</text>"#,
        (x0 + x1) / 2.0,
        y1 + 45.0
    )
    .unwrap();
    writeln!(
        s,
        r#"<text transform="translate(20 {}) rotate(-90)" text-anchor="middle">TFLOP/s</text>"#,
        (y0 + y1) / 2.0
    )
    .unwrap();
    // series
    let mut ly = y0 + 10.0;
    for (imp, vals) in series {
        if vals.iter().all(|v| v.is_none()) {
            continue;
        }
        let mut seg: Vec<String> = Vec::new();
        let flush = |seg: &mut Vec<String>, s: &mut String| {
            if seg.len() > 1 {
                writeln!(
                    s,
                    r#"<polyline fill="none" stroke="{}" stroke-width="2" points="{}"/>"#,
                    imp.color,
                    seg.join(" ")
                )
                .unwrap();
            }
            seg.clear();
        };
        for (i, v) in vals.iter().enumerate() {
            match v {
                Some(v) => {
                    seg.push(format!("{:.1},{:.1}", xp(i), yp(*v)));
                    writeln!(s, r#"<circle cx="{:.1}" cy="{:.1}" r="3.5" fill="{}"><title>{} N={}: {:.1} TFLOP/s</title></circle>"#, xp(i), yp(*v), imp.color, esc(imp.label), seqlens[i], v).unwrap();
                }
                None => flush(&mut seg, &mut s),
            }
        }
        flush(&mut seg, &mut s);
        writeln!(s, r#"<line x1="{}" y1="{ly}" x2="{}" y2="{ly}" stroke="{}" stroke-width="2"/><circle cx="{}" cy="{ly}" r="3.5" fill="{}"/>"#, x1 + 20.0, x1 + 48.0, imp.color, x1 + 34.0, imp.color).unwrap();
        writeln!(
            s,
            r#"<text x="{}" y="{}">{}</text>"#,
            x1 + 56.0,
            ly + 4.0,
            esc(imp.label)
        )
        .unwrap();
        ly += 22.0;
    }
    writeln!(s, "</svg>").unwrap();
    s
}

fn json_report(
    o: &Opts,
    cfgs: &[Cfg],
    results: &Results,
    checks: &BTreeMap<Cfg, Vec<Check>>,
    dev: &Option<DeviceInfo>,
    torch: &TorchInfo,
) -> Value {
    let rows: Vec<Value> = cfgs
        .iter()
        .map(|c| {
            let flops = c.flops(o);
            let mut impls = serde_json::Map::new();
            if let Some(row) = results.get(c) {
                for (k, m) in row {
                    impls.insert(
                        k.to_string(),
                        json!({"ms": m.ms, "min_ms": m.ms.map(|_| m.min_ms), "max_ms": m.ms.map(|_| m.max_ms),
                               "reps": m.reps, "tflops": m.tflops(flops), "note": m.note, "kernel": m.kernel}),
                    );
                }
            }
            let ch: Vec<Value> = checks
                .get(c)
                .into_iter()
                .flatten()
                .map(|ch| json!({"impl": ch.imp, "rel_err": ch.rel_err, "naive_rel_err": ch.naive_rel_err,
                                 "lse_abs_err": ch.lse_abs_err, "nonfinite": ch.nonfinite, "ok": ch.ok}))
                .collect();
            json!({"dtype": c.dtype.name(), "d": c.d, "causal": c.causal, "seqlen": c.n, "batch": c.batch(o),
                   "nheads": c.heads(o), "flops": flops, "impls": impls, "check": ch})
        })
        .collect();
    json!({
        "tool": "fa-bench",
        "device": dev.as_ref().map(|d| d.name.clone()),
        "compute_capability": dev.as_ref().map(|d| [d.cc.0, d.cc.1]),
        "ptx_arch": dev.as_ref().map(|d| d.arch.clone()),
        "params": {"tokens": o.tokens, "hidden": o.hidden, "warmup": o.warmup, "reps": o.reps, "sets": o.sets,
                   "input_bytes_total": o.sets * 3 * o.tokens * o.hidden * 2, "budget_s": o.budget_s,
                   "fa1_max_seqlen": o.fa1_max_seqlen, "mem_cap_gb": o.mem_cap_gb, "seed": o.seed,
                   "timing": "CUDA events around each kernel, median"},
        "torch": {"available": torch.available, "version": torch.version, "reason": torch.reason},
        "results": rows,
    })
}

fn geomean(v: &[f64]) -> Option<f64> {
    if v.is_empty() {
        None
    } else {
        Some((v.iter().map(|x| x.ln()).sum::<f64>() / v.len() as f64).exp())
    }
}

fn write_outputs(
    o: &Opts,
    cfgs: &[Cfg],
    results: &Results,
    md: &str,
    json: &Value,
    subtitle: &str,
) -> Res<Vec<PathBuf>> {
    std::fs::create_dir_all(&o.out)?;
    let mut files = vec![o.out.join("bench.md"), o.out.join("bench.json")];
    std::fs::write(&files[0], md)?;
    std::fs::write(&files[1], serde_json::to_string_pretty(json)?)?;
    if o.check_only {
        return Ok(files);
    }
    let mut plots: Vec<(Dtype, usize, bool)> = cfgs.iter().map(Cfg::plot).collect();
    plots.dedup();
    for (dtype, d, causal) in plots {
        let series: Vec<(&Impl, Vec<Option<f64>>)> = o
            .impls
            .iter()
            .map(|k| {
                let vals = o
                    .seqlens
                    .iter()
                    .map(|&n| {
                        let c = Cfg {
                            dtype,
                            d,
                            causal,
                            n,
                        };
                        results
                            .get(&c)
                            .and_then(|r| r.get(k))
                            .and_then(|m| m.tflops(c.flops(o)))
                    })
                    .collect();
                (impl_of(k), vals)
            })
            .collect();
        let title = format!(
            "{} d={} {} — forward TFLOP/s, {} tokens, hidden {}",
            dtype.name(),
            d,
            if causal { "causal" } else { "non-causal" },
            o.tokens,
            o.hidden
        );
        let path = o.out.join(format!(
            "tflops_{}_d{}_{}.svg",
            dtype.name(),
            d,
            if causal { "causal" } else { "full" }
        ));
        std::fs::write(&path, svg_plot(&title, subtitle, &o.seqlens, &series))?;
        files.push(path);
    }
    Ok(files)
}

fn main() {
    let o = match parse_args() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("fa-bench: {e}\n\n{USAGE}");
            std::process::exit(2);
        }
    };
    let t0 = Instant::now();
    let input_bytes = o.sets * 3 * o.tokens * o.hidden * 2;
    if input_bytes <= L2_BYTES {
        eprintln!(
            "fa-bench: warning: the {} input sets total {:.0} MB, not more than the 50 MB L2: timings measure the cache",
            o.sets,
            input_bytes as f64 / 1e6
        );
    }
    let cfgs = configs(&o);
    let mut results = Results::new();
    let mut checks = BTreeMap::new();
    let mut dev = None;
    let mut errors = Vec::new();
    if let Err(e) = run_ours(&o, &cfgs, &mut results, &mut checks, &mut dev) {
        eprintln!("fa-bench: our kernels: error: {e}");
        errors.push(format!("our kernels: {e}"));
        for c in &cfgs {
            let row = results.entry(*c).or_default();
            for k in o.impls.iter().filter(|k| !k.starts_with("torch-")) {
                row.entry(k)
                    .or_insert_with(|| Meas::na(format!("error: {e}")));
            }
        }
    }
    let torch = if o.check_only {
        TorchInfo {
            available: false,
            version: None,
            reason: "--check-only".into(),
        }
    } else {
        run_torch(&o, &cfgs, &mut results)
    };
    if !o.check_only {
        for c in &cfgs {
            let row = results.entry(*c).or_default();
            for k in o.impls.iter().filter(|k| k.starts_with("torch-")) {
                row.entry(k).or_insert_with(|| {
                    Meas::na(if torch.reason.is_empty() {
                        "no result from PyTorch".to_string()
                    } else {
                        format!("PyTorch: {}", torch.reason)
                    })
                });
            }
        }
    }

    let dev_line = dev.as_ref().map_or("no CUDA device".to_string(), |d| {
        format!("{} (sm_{}{}, {} PTX)", d.name, d.cc.0, d.cc.1, d.arch)
    });
    let header = format!(
        "## fa-bench: {dev_line}, PyTorch {}\n\n{} tokens (batch × seqlen), hidden {} (nheads = ⌊hidden / d⌋); FLOPs = 4·B·H·N²·d, halved when causal. \
         CUDA events around each kernel, {} warm-up runs, median of {} runs, inputs random normal rotated among {} sets ({:.0} MB).",
        torch.version.as_deref().unwrap_or("n/a"),
        o.tokens,
        o.hidden,
        o.warmup,
        o.reps,
        o.sets,
        input_bytes as f64 / 1e6
    );
    let md = markdown(&o, &cfgs, &results, &checks, &header);
    let json = json_report(&o, &cfgs, &results, &checks, &dev, &torch);
    let subtitle = format!(
        "{dev_line}; PyTorch {}; median of {} runs, CUDA events",
        torch.version.as_deref().unwrap_or("n/a"),
        o.reps
    );
    match write_outputs(&o, &cfgs, &results, &md, &json, &subtitle) {
        Ok(files) => eprintln!(
            "fa-bench: wrote {} files to {}",
            files.len(),
            o.out.display()
        ),
        Err(e) => errors.push(format!("writing outputs to {}: {e}", o.out.display())),
    }
    println!("{md}");

    // One-line summary.
    let mut parts = vec![format!("fa-bench: {} configs on {dev_line}", cfgs.len())];
    if !o.check_only {
        for (k, name) in RATIOS {
            let rs: Vec<f64> = cfgs
                .iter()
                .filter_map(|c| {
                    let row = results.get(c)?;
                    ratio(
                        row.get("fa2")?.tflops(c.flops(&o)),
                        row.get(k)?.tflops(c.flops(&o)),
                    )
                })
                .collect();
            if let Some(g) = geomean(&rs) {
                let (lo, hi) = rs
                    .iter()
                    .fold((f64::MAX, 0f64), |(a, b), &x| (a.min(x), b.max(x)));
                parts.push(format!(
                    "{name} geo-mean {g:.2}× ({lo:.2}–{hi:.2}, {} configs)",
                    rs.len()
                ));
            }
        }
    }
    let nchecks: usize = checks.values().map(Vec::len).sum();
    let nfail: usize = checks.values().flatten().filter(|c| !c.ok).count();
    if o.check {
        parts.push(format!("check {}/{} ok", nchecks - nfail, nchecks));
    }
    parts.push(format!("{:.0} s", t0.elapsed().as_secs_f64()));
    parts.push(format!("outputs in {}", o.out.display()));
    for e in &errors {
        parts.push(format!("ERROR {e}"));
    }
    println!("{}", parts.join("; "));
    if nfail > 0 || !errors.is_empty() {
        std::process::exit(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn small_opts(causal: bool, d: usize) -> (Opts, Cfg) {
        let o = Opts {
            dtypes: vec![Dtype::Bf16],
            dims: vec![64],
            seqlens: vec![256],
            causal: vec![false],
            impls: vec!["fa2"],
            tokens: 512,
            hidden: 128,
            warmup: 1,
            reps: 1,
            sets: 1,
            budget_s: 1.0,
            fa1_max_seqlen: 8192,
            mem_cap_gb: 1.0,
            check: true,
            check_only: false,
            torch: false,
            python: "python3".into(),
            out: PathBuf::from("/tmp"),
            seed: 3,
        };
        (
            o,
            Cfg {
                dtype: Dtype::Bf16,
                d,
                causal,
                n: 256,
            },
        )
    }

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

    #[test]
    fn naive_attention_is_close_to_the_f64_reference() {
        for (causal, d) in [(false, 64), (true, 64), (false, 96), (true, 32)] {
            let (o, c) = small_opts(causal, d);
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
                assert!(r.lse.is_finite());
                for e in 0..c.d {
                    num += (r.naive[e] as f64 - r.o[e]).powi(2);
                    den += r.o[e].powi(2);
                }
            }
            let err = (num / den).sqrt();
            assert!(err > 1e-4 && err < 2e-2, "naive bf16 rel err {err}");
            // Row 0 of a causal head sees only key 0: its output is V[0].
            if causal {
                let r = refs.iter().find(|r| r.i == 0).unwrap();
                let v0 = Dtype::Bf16.value(host[2][(r.b * c.n * c.heads(&o) + r.h) * c.d]) as f64;
                assert!((r.o[0] - v0).abs() < 1e-12);
            }
        }
    }

    #[test]
    fn svg_has_a_line_per_measured_impl() {
        let seqlens = [512, 1024, 2048];
        let s = svg_plot(
            "t",
            "sub",
            &seqlens,
            &[
                (impl_of("fa2"), vec![Some(100.0), None, Some(300.0)]),
                (impl_of("fa1"), vec![None, None, None]),
                (
                    impl_of("torch-flash"),
                    vec![Some(1.0), Some(2.0), Some(3.0)],
                ),
            ],
        );
        let _ = std::fs::write(std::env::temp_dir().join("fa-bench-test.svg"), &s);
        assert!(s.starts_with("<svg") && s.trim_end().ends_with("</svg>"));
        assert_eq!(s.matches("<polyline").count(), 1); // fa2 has no two consecutive points
        assert!(
            s.contains("FA2 (ours)") && s.contains("PyTorch flash") && !s.contains("FA1 (ours)")
        );
    }
}
