//! `fa-run`: the project's main job (`cargo xtask run`).
//!
//! 1. Always: the FA1 tiling plan of seed 002 for the GPT-2 shape on an A100
//!    (N = 1024, d = 64, M = 192 KB: Bc = 768, Br = 64, Tc = 2, Tr = 16) and
//!    the HBM-traffic model of standard attention, FA1 and FA2 (arithmetic
//!    only, no GPU): the forward, then forward + backward as in seed 002's
//!    GPT-2 table (`flash_attn_tests::traffic`: standard's backward with dP,
//!    dS in HBM, FA1's Algorithm 4, FA2's backward with its dQ accumulator).
//! 2. On a GPU: standard attention, FA1 and FA2 with the f32 kernels, and FA2
//!    and FA1 in bf16 on the tensor cores, on the GPT-2 shape (batch 8,
//!    N = 1024, 12 heads, d = 64) and on N = 8192 (batch 1, 12 heads, d = 64),
//!    through the public API (`FlashAttention::forward_into`). Every row is
//!    checked (outputs poisoned with NaN first, every element must be written
//!    and finite) against the f64 CPU reference on a sample of rows
//!    (`--samples`, 32 random (batch, head, row) triples, computed with
//!    `flash_attn::reference::standard_attention` from the same inputs) and
//!    against the other loop order of its dtype (max |ΔO| over the whole
//!    output). Times are CUDA events around one `forward_into` call (FA1: its
//!    O/l/m initialization kernel included; Standard: its stream-ordered S/P
//!    scratch allocation included), median of at least 10 runs after
//!    warm-up, inputs rotated among `--sets` sets (each over the 50 MB L2).
//!    HBM bytes come from the model (`flash_attn::plan`, with the kernel's
//!    own Br, Bc) and, where `ncu` is installed, are measured: the binary
//!    re-runs itself under `ncu --clock-control none --metrics
//!    dram__bytes_read.sum,dram__bytes_write.sum` with `FA_RUN_NCU=1`, in
//!    which mode it launches every row exactly once and does nothing else.
//!    One table. Then forward + backward on the first shape (GPT-2): the
//!    f32 kernels in the FA2 and FA1 orders and the bf16 tensor-core backward
//!    (Hopper `wgmma` or `mma.sync`, as the library picks:
//!    `FLASH_ATTN_BACKWARD_KERNEL=tc` forces the latter), each timed as
//!    forward and backward together, then each alone (CUDA events, median,
//!    caller scratch), its gradients (poisoned with NaN first) checked
//!    against the f64 definition (`reference::attention_backward`) on
//!    `--bwd-heads` sampled (batch, head) pairs, with the modelled HBM bytes
//!    of forward + backward. Exit status non-zero if any check fails.
//! 3. Without a GPU (or with `--cpu`): says why, and runs the CPU reference
//!    (standard attention in f64 and f32, FA1 and FA2 loop orders in f32,
//!    and their backward loops in f32 against the f64 definition) on a small
//!    shape. `FA_REQUIRE_GPU=1` makes a missing GPU a failure.

use std::fmt::Display;
use std::path::PathBuf;
use std::process::{Command, ExitCode, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cudarc::driver::sys::CUevent_flags;
use cudarc::driver::{CudaContext, CudaEvent, CudaSlice, CudaStream};
use flash_attn::advanced::dispatch::Plan;
use flash_attn::plan::{HbmTraffic, TilingPlan};
use flash_attn::reference::{self, fa1_forward, fa2_forward, standard_attention};
use flash_attn::{
    AttnElem, BackwardParams, BackwardScratch, DType, Extras, FlashAttention, ForwardParams, LoopOrder, RowStats, StatsMut,
    Tensor, TensorLayout, TensorMut,
};
use flash_attn_tests::bench::{Step, Timing, time_events};
use flash_attn_tests::{Rng, gpu_required, traffic};
use ndarray::{Array3, Array4, s};

type Res<T> = Result<T, Box<dyn std::error::Error>>;

/// Environment variable that puts the binary in its "one launch per row"
/// mode, for `ncu`.
const NCU_ENV: &str = "FA_RUN_NCU";
const NCU_METRICS: &str = "dram__bytes_read.sum,dram__bytes_write.sum";
const LN_2: f64 = std::f64::consts::LN_2;

/// (batch, seqlen, nheads, headdim).
#[derive(Clone, Copy, Debug)]
struct Shape {
    b: usize,
    n: usize,
    h: usize,
    d: usize,
}

impl Shape {
    fn elems(&self) -> usize {
        self.b * self.n * self.h * self.d
    }
    fn rows(&self) -> usize {
        self.b * self.h * self.n
    }
    fn layout(&self) -> TensorLayout {
        TensorLayout::contiguous([self.b, self.n, self.h, self.d])
    }
    fn label(&self, causal: bool) -> String {
        let name = match (self.b, self.n, self.h, self.d) {
            (8, 1024, 12, 64) => "GPT-2 ",
            _ => "",
        };
        format!("{name}B={} N={} H={} d={}{}", self.b, self.n, self.h, self.d, if causal { " causal" } else { "" })
    }
    fn flops(&self, causal: bool) -> f64 {
        let f = 4.0 * (self.b * self.h) as f64 * (self.n as f64).powi(2) * self.d as f64;
        if causal { f / 2.0 } else { f }
    }
}

fn parse_shape(flag: &str, v: &str) -> Result<Shape, String> {
    let x: Vec<usize> = v
        .split(',')
        .map(|t| t.trim().parse::<usize>())
        .collect::<Result<_, _>>()
        .map_err(|e| format!("{flag} {v}: {e}"))?;
    match x[..] {
        [b, n, h, d] if b > 0 && n > 0 && h > 0 && d > 0 => Ok(Shape { b, n, h, d }),
        _ => Err(format!("{flag} {v}: expected four positive numbers B,N,H,D")),
    }
}

struct Opts {
    shapes: Vec<Shape>,
    cpu_shape: Shape,
    cpu_block: (usize, usize),
    causal: bool,
    seed: Option<u64>,
    reps: usize,
    warmup: usize,
    sets: usize,
    samples: usize,
    bwd_heads: usize,
    budget_s: f64,
    cpu_only: bool,
    print_ncu: bool,
    no_ncu: bool,
    ncu_timeout_s: u64,
    sram_bytes: u64,
    elem_bytes: u64,
    stat_bytes: u64,
}

const HELP: &str = "usage: cargo xtask run [options]        (the binary: fa-run [options])

The FA1 tiling plan and HBM-traffic model (forward, and forward + backward) of
the GPT-2 shape; then, on a GPU, standard attention, FA1 and FA2 (f32 kernels;
FA2 and FA1 in bf16 on tensor cores) on the GPT-2 shape and on N = 8192,
checked against each other and against the f64 CPU reference on sampled rows,
in one table; and forward + backward on the first shape (f32 FA2 and FA1
orders, bf16 tensor cores), gradients checked against the f64 definition on
sampled heads, in a second. Without a GPU: the CPU reference (forward and
backward) on a small shape. Exit status 1 if a check fails.

options:
  --shape B,N,H,D    a GPU configuration (repeatable; replaces the default
                     8,1024,12,64 and 1,8192,12,64)
  --causal           causal mask (the HBM model stays the dense figure)
  --reps R           timed runs per row, at most (20; at least 10 are run)
  --warmup W         warm-up runs per row (3)
  --sets S           input sets rotated through while timing (3)
  --samples K        (batch, head, row) triples checked against f64 (32)
  --bwd-heads K      (batch, head) pairs whose gradients are checked against
                     the f64 definition in the forward + backward rows (4)
  --budget-s T       timing budget per row in seconds, bounds reps above 10 (3)
  --seed S           input seed (default: FA_SEED, else the clock)
  --cpu              skip the GPU: run the CPU path
  --cpu-shape B,N,H,D  shape of the CPU path (1,1024,4,64)
  --cpu-block BR,BC  FA1/FA2 blocks of the CPU path (64,64)
  --ncu              print the ncu command that measures the HBM bytes, and exit
  --no-ncu           do not measure HBM bytes with ncu even if it is installed
  --ncu-timeout-s T  give up on the ncu measurement after T seconds (150)
  --sram-bytes M     on-chip SRAM M of the seed's tiling plan, in the unit of
                     ceil(M/4d) as seed 002 counts it (196608, A100)
  --elem-bytes E     bytes per Q/K/V/O/S/P element in the printed model (2)
  --stat-bytes S     bytes per l/m/lse entry in the printed model (4)

env: FA_REQUIRE_GPU=1 makes a missing GPU a failure; FA_SEED sets the seed.";

fn parse() -> Result<Opts, String> {
    let mut o = Opts {
        shapes: vec![],
        cpu_shape: Shape { b: 1, n: 1024, h: 4, d: 64 },
        cpu_block: (64, 64),
        causal: false,
        seed: std::env::var("FA_SEED").ok().and_then(|s| s.parse().ok()),
        reps: 20,
        warmup: 3,
        sets: 3,
        samples: 32,
        bwd_heads: 4,
        budget_s: 3.0,
        cpu_only: false,
        print_ncu: false,
        no_ncu: false,
        ncu_timeout_s: 150,
        sram_bytes: 196_608,
        elem_bytes: 2,
        stat_bytes: 4,
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut val = |name: &str| -> Result<String, String> { args.next().ok_or(format!("{name} needs a value")) };
        let num =
            |name: &str, v: String| -> Result<u64, String> { v.parse::<u64>().map_err(|e| format!("{name} {v}: {e}")) };
        match a.as_str() {
            "--shape" => o.shapes.push(parse_shape("--shape", &val("--shape")?)?),
            "--cpu-shape" => o.cpu_shape = parse_shape("--cpu-shape", &val("--cpu-shape")?)?,
            "--cpu-block" => {
                let v = val("--cpu-block")?;
                let x: Vec<usize> = v.split(',').filter_map(|t| t.trim().parse().ok()).collect();
                match x[..] {
                    [br, bc] if br > 0 && bc > 0 => o.cpu_block = (br, bc),
                    _ => return Err(format!("--cpu-block {v}: expected BR,BC")),
                }
            }
            "--causal" => o.causal = true,
            "--reps" => o.reps = num("--reps", val("--reps")?)? as usize,
            "--warmup" => o.warmup = num("--warmup", val("--warmup")?)? as usize,
            "--sets" => o.sets = (num("--sets", val("--sets")?)? as usize).max(1),
            "--samples" => o.samples = (num("--samples", val("--samples")?)? as usize).max(1),
            "--bwd-heads" => o.bwd_heads = (num("--bwd-heads", val("--bwd-heads")?)? as usize).max(1),
            "--budget-s" => {
                let v = val("--budget-s")?;
                o.budget_s = v.parse().map_err(|e| format!("--budget-s {v}: {e}"))?;
            }
            "--seed" => o.seed = Some(num("--seed", val("--seed")?)?),
            "--cpu" => o.cpu_only = true,
            "--ncu" => o.print_ncu = true,
            "--no-ncu" => o.no_ncu = true,
            "--ncu-timeout-s" => o.ncu_timeout_s = num("--ncu-timeout-s", val("--ncu-timeout-s")?)?,
            "--sram-bytes" => o.sram_bytes = num("--sram-bytes", val("--sram-bytes")?)?,
            "--elem-bytes" => o.elem_bytes = num("--elem-bytes", val("--elem-bytes")?)?,
            "--stat-bytes" => o.stat_bytes = num("--stat-bytes", val("--stat-bytes")?)?,
            "-h" | "--help" => {
                println!("{HELP}");
                std::process::exit(0);
            }
            other => return Err(format!("unknown argument `{other}`\n\n{HELP}")),
        }
    }
    if o.shapes.is_empty() {
        o.shapes = vec![Shape { b: 8, n: 1024, h: 12, d: 64 }, Shape { b: 1, n: 8192, h: 12, d: 64 }];
    }
    o.reps = o.reps.max(10);
    Ok(o)
}

fn gb(bytes: u64) -> String {
    format!("{:.3} GB", bytes as f64 / 1e9)
}

fn mb(bytes: u64) -> String {
    format!("{:.2} MB", bytes as f64 / 1e6)
}

fn err_s<E: Display>(e: E) -> String {
    e.to_string()
}

// ---------------------------------------------------------------------------
// Inputs
// ---------------------------------------------------------------------------

/// `out` filled with standard normal values (Box-Muller over SplitMix64),
/// deterministic in `seed`, generated in parallel chunks.
fn fill_normal(seed: u64, out: &mut [f32]) {
    const CHUNK: usize = 1 << 16;
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let chunks: Vec<(usize, &mut [f32])> = out.chunks_mut(CHUNK).enumerate().collect();
    let per = chunks.len().div_ceil(threads).max(1);
    let mut groups: Vec<Vec<(usize, &mut [f32])>> = Vec::new();
    let mut it = chunks.into_iter().peekable();
    while it.peek().is_some() {
        groups.push(it.by_ref().take(per).collect());
    }
    std::thread::scope(|sc| {
        for g in groups {
            sc.spawn(move || {
                for (c, ch) in g {
                    let mut r = Rng::with_seed(seed ^ (c as u64).wrapping_mul(0xD1B5_4A32_D192_ED03));
                    for pair in ch.chunks_mut(2) {
                        let (u1, u2) = (r.unit().max(f64::MIN_POSITIVE), r.unit());
                        let rad = (-2.0 * u1.ln()).sqrt();
                        let t = std::f64::consts::TAU * u2;
                        pair[0] = (rad * t.cos()) as f32;
                        if pair.len() > 1 {
                            pair[1] = (rad * t.sin()) as f32;
                        }
                    }
                }
            });
        }
    });
}

fn input_seed(seed: u64, shape: usize, set: usize, tensor: usize) -> u64 {
    seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ ((shape as u64) << 48) ^ ((set as u64) << 32) ^ ((tensor as u64) << 16)
}

// ---------------------------------------------------------------------------
// 1. The seed's tiling plan and the HBM-traffic model (no GPU)
// ---------------------------------------------------------------------------

fn print_plan_and_model(o: &Opts, sh: Shape) -> Res<()> {
    let (n, d) = (sh.n as u64, sh.d as u64);
    let all_pairs = (sh.b * sh.h) as u64;
    let plan = TilingPlan::new(o.sram_bytes, n, n, d)?;
    println!("== FA1 tiling plan (seed 002): M = {}, N = {n}, d = {d} ==", o.sram_bytes);
    println!("  Bc = ceil(M/4d) = {}        Br = min(ceil(M/4d), d) = {}", plan.bc, plan.br);
    println!("  Tc = ceil(N/Bc) = {}          Tr = ceil(N/Br) = {}", plan.tc, plan.tr);
    println!(
        "  on chip: K_j, V_j ({}x{d}) + Q_i, O_i ({}x{d}) = {} elements <= M",
        plan.bc,
        plan.br,
        plan.on_chip_elems()
    );

    let (e, s) = (o.elem_bytes, o.stat_bytes);
    let std_t = plan.standard_traffic(e)?;
    let fa1_t = plan.fa1_traffic(e, s)?;
    let fa2_t = plan.fa2_traffic(e, s)?;
    println!(
        "\n== HBM traffic of one forward pass ({e} B per element, {s} B per l/m/lse entry; per head, and x{all_pairs} for batch {} x {} heads) ==",
        sh.b, sh.h
    );
    println!("  {:<34} {:>11} {:>11} {:>11} {:>13} {:>8}", "", "read", "write", "total", "batch total", "vs std");
    let rows: [(&str, HbmTraffic); 3] = [
        ("standard (S, P in HBM; Alg. 0)", std_t),
        ("FA1 loop order (K/V outer; Alg. 1)", fa1_t),
        ("FA2 loop order (Q outer)", fa2_t),
    ];
    for (name, t) in rows {
        let all = t.times(all_pairs)?;
        println!(
            "  {:<34} {:>11} {:>11} {:>11} {:>13} {:>7.2}x",
            name,
            mb(t.read_bytes),
            mb(t.write_bytes),
            mb(t.total()),
            gb(all.total()),
            t.total() as f64 / std_t.total() as f64
        );
    }
    println!(
        "  FA1 re-reads Q_i, O_i, l_i, m_i Tc = {} times: {} per head (Theorem 2: Θ(N²d²/M));",
        plan.tc,
        mb(plan.fa1_reread_bytes(e, s)?)
    );
    println!("  FA2 reads K, V Tr = {} times and writes O, lse once per Q block (with FA1's small Br the", plan.tr);
    println!("  K/V re-reads dominate; FA2 kernels take a larger Br, and K/V re-reads largely hit L2).");
    println!("  (The figures above are one attention forward; forward + backward below.)");
    print_fwd_bwd_model(&plan, e, s, sh)
}

/// The forward + backward rows of seed 002's table (`flash_attn_tests::traffic`).
fn print_fwd_bwd_model(plan: &TilingPlan, e: u64, s: u64, sh: Shape) -> Res<()> {
    let all_pairs = (sh.b * sh.h) as u64;
    println!(
        "\n== HBM traffic of forward + backward (seed 002's GPT-2 table; same plan, {e} B per element, {s} B per statistic) =="
    );
    println!("  {:<32} {:>11} {:>11} {:>11} {:>13} {:>8}", "", "forward", "backward", "fwd+bwd", "batch total", "vs std");
    let rows = traffic::fwd_bwd_rows(plan, e, s)?;
    let std_total = rows[0].1.total();
    for (name, t) in rows {
        println!(
            "  {:<32} {:>11} {:>11} {:>11} {:>13} {:>7.2}x",
            name,
            mb(t.forward.total()),
            mb(t.backward.total()),
            mb(t.total()),
            gb(t.times(all_pairs)?.total()),
            t.total() as f64 / std_total as f64
        );
    }
    println!("  standard's backward reads P twice, dP, dS twice and writes dP, dS (5 + 2 N×N matrices per head);");
    println!(
        "  FA1's (Algorithm 4) re-reads Q, O, dO, dQ, l, m and rewrites dQ at each of Tc = {} K/V blocks: Θ(N²d²/M) (Theorem 5);",
        plan.tc
    );
    println!("  FA2's adds each K/V block's dQ into an f32 accumulator (read + write N·d f32 per block) and writes D, dQ once.");
    println!("  Seed 002's table (GPT-2 medium, whole model, A100): standard 40.3 GB / 41.7 ms, FlashAttention 4.4 GB / 7.3 ms");
    println!(
        "  (9.2x fewer bytes); this attention alone: standard/FA1 {:.1}x, standard/FA2 {:.1}x (FA2's forward with Br = {}",
        std_total as f64 / rows[1].1.total() as f64,
        std_total as f64 / rows[2].1.total() as f64,
        plan.br
    );
    println!("  re-reads K, V Tr = {} times; FA2 kernels take larger Br, and those re-reads largely hit L2).", plan.tr);
    Ok(())
}

// ---------------------------------------------------------------------------
// 3. The CPU path (no GPU)
// ---------------------------------------------------------------------------

fn rel_err4(o: &Array4<f32>, want: &Array4<f64>) -> f64 {
    flash_attn_tests::rel_err(o.iter().map(|&x| x as f64), want.iter().copied())
}

fn lse_err(lse: &Array3<f64>, want: &Array3<f64>) -> f64 {
    lse.iter().zip(want.iter()).fold(0.0, |m, (&a, &b)| if a == b { m } else { m.max((a - b).abs()) })
}

fn run_cpu(o: &Opts, seed: u64) -> Res<()> {
    let sh = o.cpu_shape;
    let (br, bc) = o.cpu_block;
    println!(
        "\n== CPU path: shape (batch, seqlen, nheads, headdim) = ({}, {}, {}, {}), causal = {}, softmax_scale = 1/sqrt(d) ==",
        sh.b, sh.n, sh.h, sh.d, o.causal
    );
    println!("  (reference: standard attention in f64; single-threaded scalar code; `--cpu-shape` to change)");
    let shape = (sh.b, sh.n, sh.h, sh.d);
    let input = |t: usize| {
        let mut v = vec![0f32; sh.elems()];
        fill_normal(input_seed(seed, 99, 0, t), &mut v);
        Array4::from_shape_vec(shape, v).expect("shape")
    };
    let (q, k, v) = (input(0), input(1), input(2));
    let (q64, k64, v64) = (q.mapv(f64::from), k.mapv(f64::from), v.mapv(f64::from));

    let t = Instant::now();
    let want = standard_attention(q64.view(), k64.view(), v64.view(), o.causal, None)?;
    println!("  {:<44} {:>8.2} s   (reference)", "standard attention, f64", t.elapsed().as_secs_f64());

    let report = |name: &str, secs: f64, out: &Array4<f32>, lse: &Array3<f64>| {
        let e_o = rel_err4(out, &want.o);
        let e_l = lse_err(lse, &want.lse);
        println!("  {name:<44} {secs:>8.2} s   ‖ΔO‖/‖O‖ = {e_o:.2e}   max|Δlse| = {e_l:.2e}");
        (e_o, e_l)
    };
    let t = Instant::now();
    let std32 = standard_attention(q.view(), k.view(), v.view(), o.causal, None)?;
    let r_std = report("standard attention, f32", t.elapsed().as_secs_f64(), &std32.o, &std32.lse.mapv(f64::from));

    let t = Instant::now();
    let fa1 = fa1_forward(q.view(), k.view(), v.view(), o.causal, None, br, bc)?;
    let secs = t.elapsed().as_secs_f64();
    let fa1_lse = ndarray::Zip::from(&fa1.m)
        .and(&fa1.l)
        .map_collect(|&m, &l| if l == 0.0 { f64::NEG_INFINITY } else { m as f64 + (l as f64).ln() });
    let r_fa1 = report(&format!("FA1 loop order, f32, Br = {br}, Bc = {bc}"), secs, &fa1.o, &fa1_lse);

    let t = Instant::now();
    let fa2 = fa2_forward(q.view(), k.view(), v.view(), o.causal, None, br, bc)?;
    let r_fa2 = report(
        &format!("FA2 loop order, f32, Br = {br}, Bc = {bc}"),
        t.elapsed().as_secs_f64(),
        &fa2.o,
        &fa2.lse.mapv(f64::from),
    );

    // f32 paths "far under 1e-4" (shared/GPU-NOTES.md, Method).
    let worst = [r_std, r_fa1, r_fa2].iter().fold(0.0f64, |m, r| m.max(r.0));
    let nan = [&std32.o, &fa1.o, &fa2.o].iter().any(|a| a.iter().any(|x| x.is_nan()));
    if nan || worst.is_nan() || worst > 1e-5 {
        return Err(format!(
            "f32 reference paths disagree with the f64 reference: worst ‖ΔO‖/‖O‖ = {worst:.2e}, NaN: {nan}"
        )
        .into());
    }
    let bwd_worst = run_cpu_backward(o, seed, &q, &k, &v)?;
    println!(
        "\nrun: OK (CPU path): FA1 and FA2 loop orders agree with standard attention (worst ‖ΔO‖/‖O‖ = {worst:.1e} <= 1e-5),\n  \
         their backward passes with the definition's gradients (worst ‖Δg‖/‖g‖ = {bwd_worst:.1e} <= 1e-5)"
    );
    Ok(())
}

/// The backward on the CPU: FA2's Algorithm 2 and FA1's Algorithm 4 in f32
/// (from the f32 forward's O and LSE / l, m) against the f64 definition, on
/// the first 256 rows of the CPU shape's q, k, v and a standard normal dO.
/// Returns the worst ‖Δg‖/‖g‖ over dq, dk, dv.
fn run_cpu_backward(o: &Opts, seed: u64, q: &Array4<f32>, k: &Array4<f32>, v: &Array4<f32>) -> Res<f64> {
    let (br, bc) = o.cpu_block;
    let n = o.cpu_shape.n.min(256);
    let cut = |x: &Array4<f32>| x.slice(s![.., ..n, .., ..]).to_owned();
    let (q, k, v) = (cut(q), cut(k), cut(v));
    let mut dv = vec![0f32; q.len()];
    fill_normal(input_seed(seed, 99, 0, 3), &mut dv);
    let dout = Array4::from_shape_vec(q.dim(), dv)?;
    let f64_of = |x: &Array4<f32>| x.mapv(f64::from);
    let p = ForwardParams { causal: o.causal, ..Default::default() };
    let t = Instant::now();
    let want = reference::attention_backward(f64_of(&q).view(), f64_of(&k).view(), f64_of(&v).view(), f64_of(&dout).view(), &p, None)?;
    println!(
        "  {:<44} {:>8.2} s   (reference; first {n} rows, dO standard normal)",
        "backward by the definition, f64",
        t.elapsed().as_secs_f64()
    );
    let mut worst = 0.0f64;
    let mut report = |name: &str, secs: f64, g: &reference::Grads<f32>| {
        let e = [(&g.dq, &want.dq), (&g.dk, &want.dk), (&g.dv, &want.dv)]
            .map(|(a, w)| flash_attn_tests::rel_err(a.iter().map(|&x| x as f64), w.iter().copied()));
        println!("  {name:<44} {secs:>8.2} s   ‖Δg‖/‖g‖ dq {:.2e}  dk {:.2e}  dv {:.2e}", e[0], e[1], e[2]);
        worst = e.iter().fold(worst, |m, &x| if x.is_nan() || m.is_nan() { f64::NAN } else { m.max(x) });
    };
    let t = Instant::now();
    let fwd = fa2_forward(q.view(), k.view(), v.view(), o.causal, None, br, bc)?;
    let g = reference::fa2_backward(q.view(), k.view(), v.view(), fwd.o.view(), dout.view(), fwd.lse.view(), &p, None, br, bc)?;
    report(&format!("FA2 backward (Alg. 2), f32, Br = {br}, Bc = {bc}"), t.elapsed().as_secs_f64(), &g);
    let t = Instant::now();
    let fwd = fa1_forward(q.view(), k.view(), v.view(), o.causal, None, br, bc)?;
    // fa1_forward's m is natural; the backward takes base-2 units.
    let m2 = fwd.m.mapv(|m| m * std::f32::consts::LOG2_E);
    let g = reference::fa1_backward(q.view(), k.view(), v.view(), fwd.o.view(), dout.view(), fwd.l.view(), m2.view(), &p, None, br, bc)?;
    report(&format!("FA1 backward (Alg. 4), f32, Br = {br}, Bc = {bc}"), t.elapsed().as_secs_f64(), &g);
    if worst.is_nan() || worst > 1e-5 {
        return Err(format!("f32 backward loops disagree with the f64 definition: worst ‖Δg‖/‖g‖ = {worst:.2e}").into());
    }
    Ok(worst)
}

// ---------------------------------------------------------------------------
// 2. The GPU path
// ---------------------------------------------------------------------------

/// The rows of the table, per configuration.
const ROWS: [(LoopOrder, DType); 5] = [
    (LoopOrder::Standard, DType::F32),
    (LoopOrder::Fa1, DType::F32),
    (LoopOrder::Fa2, DType::F32),
    (LoopOrder::Fa2, DType::BF16),
    (LoopOrder::Fa1, DType::BF16),
];

/// Index in `ROWS` of the row whose O a row is compared with.
fn partner(i: usize) -> usize {
    match i {
        0 => 2, // standard f32 vs FA2 f32
        1 => 2, // FA1 f32 vs FA2 f32
        2 => 0, // FA2 f32 vs standard f32
        3 => 4, // FA2 bf16 vs FA1 bf16
        _ => 3, // FA1 bf16 vs FA2 bf16
    }
}

fn order_name(l: LoopOrder) -> &'static str {
    match l {
        LoopOrder::Standard => "standard",
        LoopOrder::Fa1 => "FA1",
        LoopOrder::Fa2 => "FA2",
    }
}

fn tolerance(dt: DType) -> f64 {
    if dt == DType::F32 { 1e-4 } else { 2e-2 }
}

struct Gpu {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    fa: FlashAttention,
}

fn open_gpu() -> Result<Gpu, String> {
    let ctx = flash_attn::try_default_context().map_err(err_s)?;
    let fa = std::panic::catch_unwind(|| FlashAttention::new(&ctx))
        .map_err(|_| "the CUDA driver bindings panicked while loading the kernels".to_string())?
        .map_err(|e| format!("FlashAttention::new: {e}"))?;
    // One stream only: no cross-stream tracking needed, and no event records
    // of cudarc's inside the timed region.
    // SAFETY: every buffer of this program is used on `stream` alone.
    unsafe { ctx.disable_event_tracking() };
    let stream = ctx.new_stream().map_err(err_s)?;
    Ok(Gpu { ctx, stream, fa })
}

/// The device buffers of one configuration in one dtype.
struct Bufs<T> {
    sets: Vec<[CudaSlice<T>; 3]>,
    o: CudaSlice<T>,
}

/// Row statistics buffers (lse or l, and m), shared by every row.
struct StatBufs {
    a: CudaSlice<f32>,
    m: CudaSlice<f32>,
}

fn upload<T: AttnElem>(g: &Gpu, host: &[[Vec<f32>; 3]]) -> Res<Bufs<T>> {
    let mut sets = Vec::new();
    for set in host {
        let conv = |v: &Vec<f32>| v.iter().map(|&x| T::from_f32(x)).collect::<Vec<T>>();
        sets.push([
            g.stream.clone_htod(&conv(&set[0]))?,
            g.stream.clone_htod(&conv(&set[1]))?,
            g.stream.clone_htod(&conv(&set[2]))?,
        ]);
    }
    let len = host[0][0].len();
    let o = g.stream.alloc_zeros::<T>(len)?;
    Ok(Bufs { sets, o })
}

fn params(order: LoopOrder, causal: bool) -> ForwardParams {
    ForwardParams { causal, softmax_scale: None, loop_order: order, block: None, ..Default::default() }
}

/// One `forward_into` on input set `set`.
fn forward<T: AttnElem>(
    g: &Gpu,
    b: &mut Bufs<T>,
    st: &mut StatBufs,
    sh: Shape,
    p: &ForwardParams,
    set: usize,
) -> Res<()> {
    let l = sh.layout();
    let s = &b.sets[set % b.sets.len()];
    let stats = match p.loop_order {
        LoopOrder::Fa1 => StatsMut::Fa1 { l: st.a.as_view_mut(), m: st.m.as_view_mut() },
        _ => StatsMut::LogSumExp(st.a.as_view_mut()),
    };
    g.fa.forward_into(
        &g.stream,
        Tensor::new(&s[0], l),
        Tensor::new(&s[1], l),
        Tensor::new(&s[2], l),
        TensorMut::new(&mut b.o, l),
        stats,
        p,
    )?;
    Ok(())
}

/// The plan the library picks for a row (kernels, Br, Bc).
fn plan_of<T: AttnElem>(g: &Gpu, sh: Shape, p: &ForwardParams) -> Res<Plan> {
    let l = sh.layout();
    let n = sh.elems();
    let problem = flash_attn::advanced::validate::validate((&l, n), (&l, n), (&l, n), (&l, n), p)?;
    Ok(g.fa.plan::<T>(&problem, p, false, false)?)
}

fn plan_blocks(p: &Plan) -> Option<(usize, usize)> {
    match p {
        Plan::Fa1 { br, bc, .. } | Plan::Fa2 { br, bc, .. } => Some((*br, *bc)),
        Plan::TcFa2 { kernel, .. } | Plan::TcFa1 { kernel, .. } => Some((kernel.br(), kernel.bc)),
        Plan::Hopper { kernel, .. } => Some((kernel.br(), kernel.bc)),
        Plan::Standard { .. } => None,
    }
}

/// The kernels one forward pass launches, in order.
fn plan_kernels(p: &Plan) -> Vec<&'static str> {
    match p {
        Plan::Fa1 { init, main, .. } | Plan::TcFa1 { init, main, .. } => vec![init.kernel, main.kernel],
        Plan::Fa2 { main, .. } | Plan::TcFa2 { main, .. } | Plan::Hopper { main, .. } => vec![main.kernel],
        Plan::Standard { scores, softmax, pv, .. } => vec![scores.kernel, softmax.kernel, pv.kernel],
    }
}

/// HBM bytes of one forward pass from `flash_attn::plan`, all heads.
fn model_bytes(sh: Shape, order: LoopOrder, dt: DType, blocks: Option<(usize, usize)>) -> Res<u64> {
    let (n, d) = (sh.n as u64, sh.d as u64);
    let e = if dt == DType::F32 { 4 } else { 2 };
    let t = match (order, blocks) {
        // The f32 standard kernels keep S and P in f32, as Q, K, V, O.
        (LoopOrder::Standard, _) => HbmTraffic::standard(n, n, d, e)?,
        (LoopOrder::Fa1, Some((br, bc))) => {
            TilingPlan::from_blocks(n, n, d, br as u64, bc as u64)?.fa1_traffic(e, 4)?
        }
        (LoopOrder::Fa2, Some((br, bc))) => {
            TilingPlan::from_blocks(n, n, d, br as u64, bc as u64)?.fa2_traffic(e, 4)?
        }
        _ => return Err("no block sizes for a flash loop order".into()),
    };
    Ok(t.times((sh.b * sh.h) as u64)?.total())
}

/// What one row measured.
struct RowOut {
    order: LoopOrder,
    dtype: DType,
    blocks: Option<(usize, usize)>,
    kernels: Vec<&'static str>,
    /// Median ms, runs.
    ms: f64,
    reps: usize,
    /// O of input set 0, as f32.
    o: Vec<f32>,
    /// Natural-log logsumexp per (batch, head, row).
    lse: Vec<f64>,
    /// O elements that are NaN/inf (poisoned with NaN before the run).
    nonfinite: usize,
    model_bytes: u64,
}

/// Checks, then times, one row.
#[allow(clippy::too_many_arguments)]
fn run_row<T: AttnElem>(
    o: &Opts,
    g: &Gpu,
    b: &mut Bufs<T>,
    st: &mut StatBufs,
    sh: Shape,
    order: LoopOrder,
    ncu_mode: bool,
) -> Res<RowOut> {
    let p = params(order, o.causal);
    let plan = plan_of::<T>(g, sh, &p)?;
    let blocks = plan_blocks(&plan);
    let mut out = RowOut {
        order,
        dtype: T::DTYPE,
        blocks,
        kernels: plan_kernels(&plan),
        ms: f64::NAN,
        reps: 0,
        o: vec![],
        lse: vec![],
        nonfinite: 0,
        model_bytes: model_bytes(sh, order, T::DTYPE, blocks)?,
    };
    if ncu_mode {
        // Exactly one forward pass per row, nothing else.
        forward(g, b, st, sh, &p, 0)?;
        g.stream.synchronize()?;
        return Ok(out);
    }

    // Check run: poison O and the statistics, run on set 0, read back.
    g.stream.memcpy_htod(&vec![T::from_f32(f32::NAN); sh.elems()], &mut b.o)?;
    let nan_rows = vec![f32::NAN; sh.rows()];
    g.stream.memcpy_htod(&nan_rows, &mut st.a)?;
    g.stream.memcpy_htod(&nan_rows, &mut st.m)?;
    forward(g, b, st, sh, &p, 0)?;
    g.stream.synchronize()?;
    out.o = g.stream.clone_dtoh(&b.o)?.into_iter().map(|x| x.to_f32()).collect();
    out.nonfinite = out.o.iter().filter(|x| !x.is_finite()).count();
    let a = g.stream.clone_dtoh(&st.a)?;
    out.lse = if order == LoopOrder::Fa1 {
        // FA1's m is in base-2 units: lse = m·ln 2 + ln l.
        let m = g.stream.clone_dtoh(&st.m)?;
        a.iter()
            .zip(&m)
            .map(|(&l, &m)| if l == 0.0 { f64::NEG_INFINITY } else { m as f64 * LN_2 + (l as f64).ln() })
            .collect()
    } else {
        a.iter().map(|&x| x as f64).collect()
    };

    // Timing: CUDA events around one forward pass.
    let ev = || g.ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT));
    let mut t_min = f64::INFINITY;
    let mut spent = 0.0;
    for i in 0..o.warmup.max(1) {
        let (e0, e1) = (ev()?, ev()?);
        e0.record(&g.stream)?;
        forward(g, b, st, sh, &p, i + 1)?;
        e1.record(&g.stream)?;
        let t = e0.elapsed_ms(&e1)? as f64;
        t_min = t_min.min(t);
        spent += t;
        if spent > 500.0 * o.budget_s {
            break;
        }
    }
    let reps = ((o.budget_s * 1e3 / t_min.max(1e-3)) as usize).clamp(10, o.reps.max(10));
    let evs: Vec<(CudaEvent, CudaEvent)> =
        (0..reps).map(|_| Ok::<_, cudarc::driver::DriverError>((ev()?, ev()?))).collect::<Result<_, _>>()?;
    for (i, (e0, e1)) in evs.iter().enumerate() {
        e0.record(&g.stream)?;
        forward(g, b, st, sh, &p, i)?;
        e1.record(&g.stream)?;
    }
    g.stream.synchronize()?;
    let mut ts: Vec<f64> = evs.iter().map(|(a, z)| a.elapsed_ms(z).map(f64::from)).collect::<Result<_, _>>()?;
    ts.sort_by(|x, y| x.total_cmp(y));
    out.ms = if reps % 2 == 1 { ts[reps / 2] } else { 0.5 * (ts[reps / 2 - 1] + ts[reps / 2]) };
    out.reps = reps;
    Ok(out)
}

/// One sampled row of the f64 reference.
struct RefRow {
    b: usize,
    h: usize,
    i: usize,
    o: Vec<f64>,
    lse: f64,
}

fn sample_triples(sh: Shape, k: usize, seed: u64) -> Vec<(usize, usize, usize)> {
    let mut r = Rng::with_seed(seed ^ 0x5A3F_17C3);
    let mut v = vec![(0, 0, 0), (sh.b - 1, sh.h - 1, sh.n - 1)];
    while v.len() < k.max(2) {
        v.push((r.below(sh.b), r.below(sh.h), r.below(sh.n)));
    }
    v.truncate(k.max(1));
    v
}

/// f64 reference rows from `host` (set 0: q, k, v as f32 values; for the bf16
/// rows, the bf16-rounded values), by the project's CPU reference
/// (`standard_attention` in f64 on the row's query and the keys it sees).
fn reference_rows(
    sh: Shape,
    causal: bool,
    host: &[Vec<f32>; 3],
    triples: &[(usize, usize, usize)],
) -> Res<Vec<RefRow>> {
    let shape = (sh.b, sh.n, sh.h, sh.d);
    let q = ndarray::ArrayView4::from_shape(shape, &host[0][..])?;
    let k = ndarray::ArrayView4::from_shape(shape, &host[1][..])?;
    let v = ndarray::ArrayView4::from_shape(shape, &host[2][..])?;
    let one = |&(b, h, i): &(usize, usize, usize)| -> Result<RefRow, String> {
        let lim = if causal { i + 1 } else { sh.n };
        let qi = q.slice(s![b..b + 1, i..i + 1, h..h + 1, ..]).mapv(f64::from);
        let kk = k.slice(s![b..b + 1, ..lim, h..h + 1, ..]).mapv(f64::from);
        let vv = v.slice(s![b..b + 1, ..lim, h..h + 1, ..]).mapv(f64::from);
        let r = standard_attention(qi.view(), kk.view(), vv.view(), false, None).map_err(err_s)?;
        Ok(RefRow { b, h, i, o: r.o.iter().copied().collect(), lse: r.lse[[0, 0, 0]] })
    };
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let per = triples.len().div_ceil(threads).max(1);
    let rows: Result<Vec<RefRow>, String> = std::thread::scope(|sc| {
        let hs: Vec<_> =
            triples.chunks(per).map(|ch| sc.spawn(move || ch.iter().map(one).collect::<Result<Vec<_>, _>>())).collect();
        let mut all = Vec::new();
        for hnd in hs {
            all.extend(hnd.join().map_err(|_| "reference thread panicked".to_string())??);
        }
        Ok(all)
    });
    Ok(rows?)
}

/// Max over the sampled rows of `‖O_row − ref‖/‖ref‖`, and max |Δlse|.
fn check_rows(sh: Shape, out: &RowOut, refs: &[RefRow]) -> (f64, f64) {
    let (mut worst, mut lse_worst) = (0.0f64, 0.0f64);
    for r in refs {
        let base = ((r.b * sh.n + r.i) * sh.h + r.h) * sh.d;
        let got = out.o[base..base + sh.d].iter().map(|&x| x as f64);
        let e = flash_attn_tests::rel_err(got, r.o.iter().copied());
        worst = if e.is_nan() || worst.is_nan() { f64::NAN } else { worst.max(e) };
        let gl = out.lse[(r.b * sh.h + r.h) * sh.n + r.i];
        let el = if gl.is_finite() { (gl - r.lse).abs() } else { f64::INFINITY };
        lse_worst = if el.is_nan() { f64::NAN } else { lse_worst.max(el) };
    }
    (worst, lse_worst)
}

/// Max |a − b| over all elements (NaN if either has a NaN), and max |b|.
fn max_abs_diff(a: &[f32], b: &[f32]) -> (f64, f64) {
    let (mut d, mut m) = (0.0f64, 0.0f64);
    for (&x, &y) in a.iter().zip(b) {
        let e = (x as f64 - y as f64).abs();
        if e.is_nan() {
            return (f64::NAN, m);
        }
        d = d.max(e);
        m = m.max((y as f64).abs());
    }
    (d, m)
}

/// One table row.
struct Line {
    config: String,
    r: RowOut,
    tflops: f64,
    err: f64,
    lse_err: f64,
    cross: f64,
    cross_rel: f64,
    vs: &'static str,
    measured: Option<u64>,
    ok: bool,
}

/// Runs every configuration; in ncu mode only launches each row once.
fn run_gpu(o: &Opts, g: &Gpu, seed: u64, ncu_mode: bool) -> Res<Vec<Line>> {
    let mut lines = Vec::new();
    for (si, &sh) in o.shapes.iter().enumerate() {
        let t0 = Instant::now();
        let sets = if ncu_mode { 1 } else { o.sets };
        let mut host: Vec<[Vec<f32>; 3]> = Vec::new();
        for set in 0..sets {
            let one = |t: usize| {
                let mut v = vec![0f32; sh.elems()];
                fill_normal(input_seed(seed, si, set, t), &mut v);
                v
            };
            host.push([one(0), one(1), one(2)]);
        }
        let mut b32 = upload::<f32>(g, &host)?;
        let mut b16 = upload::<half::bf16>(g, &host)?;
        let mut st =
            StatBufs { a: g.stream.alloc_zeros::<f32>(sh.rows())?, m: g.stream.alloc_zeros::<f32>(sh.rows())? };
        g.stream.synchronize()?;
        let label = sh.label(o.causal);
        if !ncu_mode {
            eprintln!(
                "fa-run: {label}: {sets} input sets generated and uploaded in {:.1} s",
                t0.elapsed().as_secs_f64()
            );
        }
        let mut outs = Vec::new();
        for (order, dt) in ROWS {
            let t = Instant::now();
            let r = match dt {
                DType::F32 => run_row::<f32>(o, g, &mut b32, &mut st, sh, order, ncu_mode)?,
                _ => run_row::<half::bf16>(o, g, &mut b16, &mut st, sh, order, ncu_mode)?,
            };
            if !ncu_mode {
                eprintln!(
                    "fa-run: {label}: {} {}: {:.3} ms median of {} ({:.1} s)",
                    order_name(order),
                    dt.name(),
                    r.ms,
                    r.reps,
                    t.elapsed().as_secs_f64()
                );
            }
            outs.push(r);
        }
        drop((b32, b16, st));
        if ncu_mode {
            lines.extend(outs.into_iter().map(|r| Line {
                config: label.clone(),
                r,
                tflops: f64::NAN,
                err: f64::NAN,
                lse_err: f64::NAN,
                cross: f64::NAN,
                cross_rel: f64::NAN,
                vs: "",
                measured: None,
                ok: true,
            }));
            continue;
        }

        // References: f32 inputs, and the same inputs rounded to bf16.
        let t = Instant::now();
        let triples = sample_triples(sh, o.samples, seed ^ si as u64);
        let ref32 = reference_rows(sh, o.causal, &host[0], &triples)?;
        let round = |v: &Vec<f32>| v.iter().map(|&x| half::bf16::from_f32(x).to_f32()).collect::<Vec<f32>>();
        let h16 = [round(&host[0][0]), round(&host[0][1]), round(&host[0][2])];
        let ref16 = reference_rows(sh, o.causal, &h16, &triples)?;
        eprintln!("fa-run: {label}: f64 reference on {} rows in {:.1} s", triples.len(), t.elapsed().as_secs_f64());

        let mut cross = Vec::new();
        for i in 0..outs.len() {
            let (d, m) = max_abs_diff(&outs[i].o, &outs[partner(i)].o);
            cross.push((d, d / m.max(f64::MIN_POSITIVE)));
        }
        for (i, r) in outs.into_iter().enumerate() {
            let refs = if r.dtype == DType::F32 { &ref32 } else { &ref16 };
            let (err, lse_err) = check_rows(sh, &r, refs);
            let tol = tolerance(r.dtype);
            let (cross_abs, cross_rel) = cross[i];
            let ok = r.nonfinite == 0 && err <= tol && lse_err <= 1e-3 && cross_rel <= tol && r.ms.is_finite();
            lines.push(Line {
                config: label.clone(),
                tflops: sh.flops(o.causal) / (r.ms * 1e-3) / 1e12,
                err,
                lse_err,
                cross: cross_abs,
                cross_rel,
                vs: order_name(ROWS[partner(i)].0),
                measured: None,
                ok,
                r,
            });
        }
    }
    Ok(lines)
}

// ---------------------------------------------------------------------------
// 2b. Forward + backward on the first shape (GPT-2)
// ---------------------------------------------------------------------------

/// The forward + backward rows: the f32 kernels in both loop orders, and
/// the 16-bit backward (FA2 order: the Hopper `wgmma` kernel or the
/// `mma.sync` one, as the library selects) in bf16.
const BWD_ROWS: [(LoopOrder, DType); 3] = [(LoopOrder::Fa2, DType::F32), (LoopOrder::Fa1, DType::F32), (LoopOrder::Fa2, DType::BF16)];

/// One forward + backward row.
struct BwdLine {
    config: String,
    order: LoopOrder,
    dtype: DType,
    /// The backward's main kernel, and its Bc.
    kernel: String,
    fwd_ms: f64,
    bwd_ms: f64,
    total_ms: f64,
    reps: usize,
    /// Max over the sampled heads of ‖g − ref‖/‖ref‖ for dq, dk, dv.
    err: [f64; 3],
    /// Non-finite gradient elements (poisoned with NaN before the run).
    nonfinite: usize,
    model_bytes: u64,
    ok: bool,
}

/// The f64 gradients of one (batch, head): dq, dk, dv as `n × d` row-major.
struct HeadGrads {
    b: usize,
    h: usize,
    g: [Vec<f64>; 3],
}

/// `k` (batch, head) pairs: the first, the last, then random ones.
fn sample_heads(sh: Shape, k: usize, seed: u64) -> Vec<(usize, usize)> {
    let mut r = Rng::with_seed(seed ^ 0x0BAC_4A2D);
    let mut v = vec![(0, 0), (sh.b - 1, sh.h - 1)];
    while v.len() < k.max(2) {
        v.push((r.below(sh.b), r.below(sh.h)));
    }
    v.truncate(k.max(1));
    v
}

/// f64 gradients (`reference::attention_backward`, the definition) of the
/// sampled heads of `host` (q, k, v, dout), one thread per head.
fn reference_heads(sh: Shape, causal: bool, host: &[Vec<f32>; 4], heads: &[(usize, usize)]) -> Res<Vec<HeadGrads>> {
    let shape = (sh.b, sh.n, sh.h, sh.d);
    let views = host.each_ref().map(|x| ndarray::ArrayView4::from_shape(shape, &x[..]));
    let [q, k, v, dout] = [&views[0], &views[1], &views[2], &views[3]].map(|x| x.as_ref().map_err(err_s));
    let (q, k, v, dout) = (q?, k?, v?, dout?);
    let p = ForwardParams { causal, ..Default::default() };
    let one = |&(b, h): &(usize, usize)| -> Result<HeadGrads, String> {
        let head = |x: &ndarray::ArrayView4<f32>| x.slice(s![b..b + 1, .., h..h + 1, ..]).mapv(f64::from);
        let g = reference::attention_backward(head(q).view(), head(k).view(), head(v).view(), head(dout).view(), &p, None)
            .map_err(err_s)?;
        Ok(HeadGrads { b, h, g: [g.dq, g.dk, g.dv].map(|a| a.iter().copied().collect()) })
    };
    std::thread::scope(|sc| {
        let hs: Vec<_> = heads.iter().map(|bh| sc.spawn(move || one(bh))).collect();
        hs.into_iter().map(|t| Ok(t.join().map_err(|_| "reference thread panicked")??)).collect()
    })
}

/// The forward into `out`/`stats` (FA1: `l`, `m`; else the LSE).
fn stats_mut(stats: &mut RowStats) -> StatsMut<'_> {
    match stats {
        RowStats::Fa1 { l, m } => StatsMut::Fa1 { l: l.as_view_mut(), m: m.as_view_mut() },
        RowStats::LogSumExp(a) => StatsMut::LogSumExp(a.as_view_mut()),
    }
}

/// The backward's main kernel and Bc, as the library picks them
/// (`host-crate/src/backward/`: f32 by the plan; 16-bit: the Hopper kernel
/// on an sm_90a build at d 64/128 unless `FLASH_ATTN_BACKWARD_KERNEL=tc`,
/// else the `mma.sync` kernel).
fn bwd_kernel<T: AttnElem>(g: &Gpu, sh: Shape, bp: &BackwardParams) -> Res<(String, usize)> {
    let (l, n) = (sh.layout(), sh.elems());
    let problem = flash_attn::advanced::validate::validate((&l, n), (&l, n), (&l, n), (&l, n), &bp.forward)?;
    let plan = g.fa.plan_backward::<T>(&problem, bp, None)?;
    if let Some(main) = plan.main {
        return Ok((format!("{} Bc {}", main.kernel, plan.bc), plan.bc));
    }
    let hopper = g.fa.ptx_build().arch == "sm_90a"
        && g.fa.compute_capability().0 == 9
        && (sh.d == 64 || sh.d == 128)
        && std::env::var("FLASH_ATTN_BACKWARD_KERNEL").map_or(true, |v| v != "tc");
    Ok(if hopper { ("Hopper wgmma Bc 128".into(), 128) } else { (format!("mma.sync Bc {}", plan.bc), plan.bc) })
}

/// Checks, then times, one forward + backward row on `host` (q, k, v, dout
/// as f32 values; rounded to `T` on upload).
fn run_bwd_row<T: AttnElem>(o: &Opts, g: &Gpu, sh: Shape, host: &[Vec<f32>; 4], order: LoopOrder, refs: &[HeadGrads]) -> Res<BwdLine> {
    let (l, n) = (sh.layout(), sh.elems());
    let up = |x: &Vec<f32>| g.stream.clone_htod(&x.iter().map(|&v| T::from_f32(v)).collect::<Vec<T>>());
    let (q, k, v, dout) = (up(&host[0])?, up(&host[1])?, up(&host[2])?, up(&host[3])?);
    let mut out = g.stream.alloc_zeros::<T>(n)?;
    let rows = || g.stream.alloc_zeros::<f32>(sh.rows());
    let mut stats = if order == LoopOrder::Fa1 { RowStats::Fa1 { l: rows()?, m: rows()? } } else { RowStats::LogSumExp(rows()?) };
    let (mut dq, mut dk, mut dv) = (g.stream.alloc_zeros::<T>(n)?, g.stream.alloc_zeros::<T>(n)?, g.stream.alloc_zeros::<T>(n)?);
    let p = params(order, o.causal);
    let bp = BackwardParams { forward: p, deterministic: false };
    let mut scratch = BackwardScratch::new(&g.stream, g.fa.backward_scratch_sizes::<T>(&l, &l, &bp)?)?;
    let (kernel, bc) = bwd_kernel::<T>(g, sh, &bp)?;
    let ext = Extras::default();
    let fwd = |out: &mut CudaSlice<T>, stats: &mut RowStats| -> Res<()> {
        let t = |x| Tensor::new(x, l);
        g.fa.forward_into(&g.stream, t(&q), t(&k), t(&v), TensorMut::new(out, l), stats_mut(stats), &p)?;
        Ok(())
    };
    // Check run: gradients poisoned with NaN, forward then backward.
    let blocks = plan_blocks(&plan_of::<T>(g, sh, &p)?);
    let fwd_model = model_bytes(sh, order, T::DTYPE, blocks)?;
    let e = if T::DTYPE == DType::F32 { 4 } else { 2 };
    let (nn, d) = (sh.n as u64, sh.d as u64);
    let bwd_model = match order {
        LoopOrder::Fa1 => traffic::fa1_backward(nn, nn, d, bc as u64, e, 4)?,
        _ => HbmTraffic::fa2_backward(nn, nn, d, bc as u64, e, 4)?,
    };
    let nan = vec![T::from_f32(f32::NAN); n];
    fwd(&mut out, &mut stats)?;
    g.stream.synchronize()?;
    for buf in [&mut dq, &mut dk, &mut dv] {
        g.stream.memcpy_htod(&nan, buf)?;
    }
    let mut bwd = |out: &CudaSlice<T>, stats: &RowStats, dq: &mut CudaSlice<T>, dk: &mut CudaSlice<T>, dv: &mut CudaSlice<T>| -> Res<()> {
        let t = |x| Tensor::new(x, l);
        g.fa.backward_into(
            &g.stream,
            t(&q),
            t(&k),
            t(&v),
            t(out),
            t(&dout),
            stats,
            TensorMut::new(dq, l),
            TensorMut::new(dk, l),
            TensorMut::new(dv, l),
            Some(&mut scratch),
            &bp,
            &ext,
        )?;
        Ok(())
    };
    bwd(&out, &stats, &mut dq, &mut dk, &mut dv)?;
    g.stream.synchronize()?;
    let got = [&dq, &dk, &dv].map(|b| g.stream.clone_dtoh(b).map(|x| x.into_iter().map(|y| y.to_f32()).collect::<Vec<f32>>()));
    let [gq, gk, gv] = got;
    let got = [gq?, gk?, gv?];
    let nonfinite = got.iter().map(|x| x.iter().filter(|y| !y.is_finite()).count()).sum();
    let mut err = [0.0f64; 3];
    for r in refs {
        for (w, (gg, want)) in got.iter().zip(&r.g).enumerate() {
            let one = (0..sh.n).flat_map(|i| {
                let base = ((r.b * sh.n + i) * sh.h + r.h) * sh.d;
                gg[base..base + sh.d].iter().map(|&x| x as f64)
            });
            let e = flash_attn_tests::rel_err(one, want.iter().copied());
            err[w] = if e.is_nan() || err[w].is_nan() { f64::NAN } else { err[w].max(e) };
        }
    }

    // Timing: forward + backward, then the backward alone, CUDA events.
    let t = Timing { warmup: o.warmup.max(1), reps: o.reps, budget_s: o.budget_s };
    let both = time_events(&g.ctx, &g.stream, t, |st| match st {
        Step::Setup(_) => Ok(()),
        Step::Timed(_) => {
            fwd(&mut out, &mut stats)?;
            bwd(&out, &stats, &mut dq, &mut dk, &mut dv)
        }
    })?;
    let fwd_only = time_events(&g.ctx, &g.stream, t, |st| match st {
        Step::Setup(_) => Ok(()),
        Step::Timed(_) => fwd(&mut out, &mut stats),
    })?;
    let bwd_only = time_events(&g.ctx, &g.stream, t, |st| match st {
        Step::Setup(_) => Ok(()),
        Step::Timed(_) => bwd(&out, &stats, &mut dq, &mut dk, &mut dv),
    })?;
    let tol = tolerance(T::DTYPE);
    let total_ms = both.ms.unwrap_or(f64::NAN);
    Ok(BwdLine {
        config: sh.label(o.causal),
        order,
        dtype: T::DTYPE,
        kernel,
        fwd_ms: fwd_only.ms.unwrap_or(f64::NAN),
        bwd_ms: bwd_only.ms.unwrap_or(f64::NAN),
        total_ms,
        reps: both.reps,
        err,
        nonfinite,
        model_bytes: fwd_model + bwd_model.times((sh.b * sh.h) as u64)?.total(),
        ok: nonfinite == 0 && err.iter().all(|&e| e <= tol) && total_ms.is_finite(),
    })
}

/// The forward + backward rows on the first shape (seed 002's GPT-2
/// table), checked against the f64 gradients of sampled heads.
fn run_bwd(o: &Opts, g: &Gpu, seed: u64) -> Res<Vec<BwdLine>> {
    let sh = o.shapes[0];
    let t0 = Instant::now();
    let host: [Vec<f32>; 4] = std::array::from_fn(|t| {
        let mut v = vec![0f32; sh.elems()];
        fill_normal(input_seed(seed, 0, 0, t), &mut v);
        v
    });
    let heads = sample_heads(sh, o.bwd_heads, seed);
    let ref32 = reference_heads(sh, o.causal, &host, &heads)?;
    let h16 = host.each_ref().map(|v| v.iter().map(|&x| half::bf16::from_f32(x).to_f32()).collect::<Vec<f32>>());
    let ref16 = reference_heads(sh, o.causal, &h16, &heads)?;
    let label = sh.label(o.causal);
    eprintln!("fa-run: {label}: f64 gradients of {} heads in {:.1} s", heads.len(), t0.elapsed().as_secs_f64());
    let mut lines = Vec::new();
    for (order, dt) in BWD_ROWS {
        let t = Instant::now();
        let r = match dt {
            DType::F32 => run_bwd_row::<f32>(o, g, sh, &host, order, &ref32)?,
            _ => run_bwd_row::<half::bf16>(o, g, sh, &host, order, &ref16)?,
        };
        eprintln!(
            "fa-run: {label}: forward + backward {} {}: {:.3} ms ({:.1} s)",
            order_name(order),
            dt.name(),
            r.total_ms,
            t.elapsed().as_secs_f64()
        );
        lines.push(r);
    }
    Ok(lines)
}

fn print_bwd_table(o: &Opts, lines: &[BwdLine]) {
    let Some(first) = lines.first() else { return };
    let sh = o.shapes[0];
    println!("\n== Forward + backward on {} (seed 002's GPT-2 table), causal = {} ==", first.config, o.causal);
    println!(
        "  {:<10} {:<7} {:<34} {:>9} {:>9} {:>11} {:>9} {:>28} {:>9} {:>6}",
        "loop order", "dtype", "backward kernel", "fwd ms", "bwd ms", "fwd+bwd ms", "TFLOP/s", "max rel err dq / dk / dv", "HBM GB", "check"
    );
    // FLOPs: forward 4·B·H·N²·d, backward 2.5× that (5 GEMMs against 2).
    let flops = sh.flops(o.causal) * 3.5;
    for l in lines {
        println!(
            "  {:<10} {:<7} {:<34} {:>9.3} {:>9.3} {:>11.3} {:>9.2} {:>28} {:>9.3} {:>6}",
            order_name(l.order),
            if l.dtype == DType::F32 { "f32" } else { "bf16 TC" },
            l.kernel,
            l.fwd_ms,
            l.bwd_ms,
            l.total_ms,
            flops / (l.total_ms * 1e-3) / 1e12,
            format!("{:.1e} / {:.1e} / {:.1e}", l.err[0], l.err[1], l.err[2]),
            l.model_bytes as f64 / 1e9,
            if l.ok { "ok" } else { "FAIL" }
        );
    }
    println!(
        "time: CUDA events, median of up to {} runs (forward + backward timed together; fwd and bwd also alone); the backward\n  \
         uses caller scratch (no allocation timed); one input set, dO standard normal.",
        lines.iter().map(|l| l.reps).max().unwrap_or(0)
    );
    println!("TFLOP/s = 3.5 · 4·B·H·N²·d / (fwd+bwd time){} (the FA papers' counting).", if o.causal { " / 2 (causal)" } else { "" });
    println!(
        "max rel err: over {} sampled (batch, head) of ‖g − ref‖/‖ref‖ for the whole head, ref = the f64 definition\n  \
         (reference::attention_backward) on the same inputs (bf16: rounded); tolerance f32 1e-4, bf16 2e-2. Gradients were\n  \
         poisoned with NaN before the checked run and must come back finite. FA2's rule itself: tests/tests/gpu_backward.rs.",
        o.bwd_heads
    );
    println!(
        "HBM model: forward as in the table above + the backward's (FA2: HbmTraffic::fa2_backward, FA1: Algorithm 4,\n  \
         flash_attn_tests::traffic) with the kernel's Bc, all heads, counted dense. Standard attention has no backward kernel here:\n  \
         its model row is in the forward + backward model above."
    );
}

// ---------------------------------------------------------------------------
// ncu
// ---------------------------------------------------------------------------

fn find_ncu() -> Option<PathBuf> {
    let mut dirs: Vec<PathBuf> =
        std::env::var_os("PATH").map(|p| std::env::split_paths(&p).collect()).unwrap_or_default();
    dirs.push("/usr/local/cuda/bin".into());
    dirs.into_iter().map(|d| d.join("ncu")).find(|p| p.is_file())
}

fn ncu_args(log: &str) -> Vec<String> {
    ["--clock-control", "none", "--metrics", NCU_METRICS, "--csv", "--print-units", "base", "--log-file", log]
        .iter()
        .map(|s| s.to_string())
        .collect()
}

fn shell_quote(s: &str) -> String {
    if !s.is_empty() && s.chars().all(|c| c.is_ascii_alphanumeric() || "-_./,=:+".contains(c)) {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', "'\\''"))
    }
}

/// The command line that measures the table's HBM bytes.
fn ncu_command_line(ncu: &str, log: &str) -> String {
    let exe = std::env::current_exe().map(|p| p.display().to_string()).unwrap_or_else(|_| "fa-run".into());
    let mut parts = vec![format!("{NCU_ENV}=1"), ncu.to_string()];
    parts.extend(ncu_args(log));
    parts.push(exe);
    parts.extend(std::env::args().skip(1).filter(|a| a != "--ncu"));
    parts.iter().map(|s| shell_quote(s)).collect::<Vec<_>>().join(" ")
}

/// Splits one CSV line (double-quoted fields, `""` inside quotes).
fn csv_fields(line: &str) -> Vec<String> {
    let (mut out, mut cur, mut q) = (Vec::new(), String::new(), false);
    let mut it = line.chars().peekable();
    while let Some(c) = it.next() {
        match (c, q) {
            ('"', true) if it.peek() == Some(&'"') => {
                cur.push('"');
                it.next();
            }
            ('"', _) => q = !q,
            (',', false) => out.push(std::mem::take(&mut cur)),
            _ => cur.push(c),
        }
    }
    out.push(cur);
    out
}

/// Kernels in launch order with (name, dram bytes read + written), from
/// ncu's CSV.
fn parse_ncu_csv(text: &str) -> Result<Vec<(String, f64)>, String> {
    let mut col: Option<(usize, usize, usize, usize)> = None;
    let mut kernels: Vec<(String, String, f64)> = Vec::new();
    for line in text.lines().filter(|l| l.starts_with('"')) {
        let f = csv_fields(line);
        if let Some(&(id, name, metric, value)) = col.as_ref() {
            if f.len() <= id.max(name).max(metric).max(value) {
                continue;
            }
            if !f[metric].starts_with("dram__bytes_") {
                continue;
            }
            let v: f64 = f[value].replace(',', "").parse().map_err(|e| format!("ncu value {:?}: {e}", f[value]))?;
            match kernels.last_mut() {
                Some(k) if k.0 == f[id] => k.2 += v,
                _ => kernels.push((f[id].clone(), f[name].clone(), v)),
            }
        } else {
            let pos = |n: &str| f.iter().position(|x| x == n);
            if let (Some(a), Some(b), Some(c), Some(d)) =
                (pos("ID"), pos("Kernel Name"), pos("Metric Name"), pos("Metric Value"))
            {
                col = Some((a, b, c, d));
            }
        }
    }
    if col.is_none() {
        return Err("no CSV header in ncu's output".into());
    }
    Ok(kernels.into_iter().map(|(_, n, v)| (n, v)).collect())
}

/// Re-runs this binary under ncu (one launch per row) and fills
/// `Line::measured`; returns a note on what happened.
fn measure_with_ncu(o: &Opts, ncu: &PathBuf, lines: &mut [Line]) -> String {
    let log = std::env::temp_dir().join(format!("fa-run-ncu-{}.csv", std::process::id()));
    let log_s = log.display().to_string();
    let exe = match std::env::current_exe() {
        Ok(e) => e,
        Err(e) => return format!("not measured: current_exe: {e}"),
    };
    let mut cmd = Command::new(ncu);
    cmd.args(ncu_args(&log_s)).arg(&exe).args(std::env::args().skip(1)).env(NCU_ENV, "1");
    let out_log = std::env::temp_dir().join(format!("fa-run-ncu-{}.out", std::process::id()));
    match std::fs::File::create(&out_log).and_then(|f| Ok((f.try_clone()?, f))) {
        Ok((a, b)) => {
            cmd.stdout(Stdio::from(a)).stderr(Stdio::from(b));
        }
        Err(_) => {
            cmd.stdout(Stdio::null()).stderr(Stdio::null());
        }
    }
    let t = Instant::now();
    eprintln!("fa-run: measuring HBM bytes: {}", ncu_command_line(&ncu.display().to_string(), &log_s));
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => return format!("not measured: cannot start ncu: {e}"),
    };
    let status = loop {
        match child.try_wait() {
            Ok(Some(st)) => break st,
            Ok(None) if t.elapsed() > Duration::from_secs(o.ncu_timeout_s) => {
                let _ = child.kill();
                let _ = child.wait();
                return format!("not measured: ncu did not finish in {} s (--ncu-timeout-s)", o.ncu_timeout_s);
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(200)),
            Err(e) => return format!("not measured: waiting for ncu: {e}"),
        }
    };
    // ncu writes its report to the log file; the program's own output (and,
    // should ncu put its report there instead, the report) to `out_log`.
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    let out_text = std::fs::read_to_string(&out_log).unwrap_or_default();
    let _ = std::fs::remove_file(&log);
    let _ = std::fs::remove_file(&out_log);
    if !status.success() {
        let all = format!("{out_text}\n{text}");
        let tail: Vec<&str> = all.lines().filter(|l| !l.trim().is_empty()).collect();
        let tail = tail[tail.len().saturating_sub(6)..].join(" | ");
        return format!("not measured: ncu exited with {status}: {tail}");
    }
    let kernels = match parse_ncu_csv(&text).or_else(|_| parse_ncu_csv(&out_text)) {
        Ok(k) => k,
        Err(e) => return format!("not measured: {e}"),
    };
    let expected: Vec<(usize, &'static str)> =
        lines.iter().enumerate().flat_map(|(i, l)| l.r.kernels.iter().map(move |&k| (i, k))).collect();
    if kernels.len() != expected.len() {
        return format!("not measured: ncu profiled {} kernels, the rows launch {}", kernels.len(), expected.len());
    }
    let mut sums = vec![0f64; lines.len()];
    for ((name, bytes), (i, want)) in kernels.iter().zip(&expected) {
        if !name.contains(want) {
            return format!("not measured: ncu's kernel `{name}` is not the expected `{want}`");
        }
        sums[*i] += bytes;
    }
    for (l, s) in lines.iter_mut().zip(sums) {
        l.measured = Some(s.round() as u64);
    }
    format!(
        "measured by ncu ({} kernels in {:.0} s; each kernel once, caches flushed before it: ncu's default --cache-control all)",
        kernels.len(),
        t.elapsed().as_secs_f64()
    )
}

// ---------------------------------------------------------------------------
// The table
// ---------------------------------------------------------------------------

fn print_table(o: &Opts, lines: &[Line], dev: &str, ncu_note: &str, ncu_cmd: &str) {
    let head = [
        "config",
        "loop order",
        "dtype",
        "Br x Bc",
        "time ms",
        "TFLOP/s",
        "max row err vs f64",
        "max abs ΔO vs other order",
        "HBM model GB",
        "HBM ncu GB",
        "check",
    ];
    let mut rows: Vec<Vec<String>> = Vec::new();
    for l in lines {
        let r = &l.r;
        let kind = if r.dtype == DType::F32 { "f32" } else { "bf16 TC" };
        rows.push(vec![
            l.config.clone(),
            order_name(r.order).to_string(),
            kind.to_string(),
            r.blocks.map_or("S,P in HBM".to_string(), |(a, b)| format!("{a} x {b}")),
            format!("{:.3}", r.ms),
            format!("{:.2}", l.tflops),
            format!("{:.1e}", l.err),
            format!("{:.1e} ({})", l.cross, l.vs),
            format!("{:.3}", r.model_bytes as f64 / 1e9),
            l.measured.map_or("n/m".to_string(), |b| format!("{:.3}", b as f64 / 1e9)),
            (if l.ok { "ok" } else { "FAIL" }).to_string(),
        ]);
    }
    let w: Vec<usize> = (0..head.len())
        .map(|c| rows.iter().map(|r| r[c].chars().count()).chain([head[c].chars().count()]).max().unwrap_or(0))
        .collect();
    let fmt = |cells: Vec<String>| {
        let mut s = String::from("|");
        for (c, cell) in cells.iter().enumerate() {
            let pad = w[c] - cell.chars().count();
            if c < 3 {
                s += &format!(" {cell}{} |", " ".repeat(pad))
            } else {
                s += &format!(" {}{cell} |", " ".repeat(pad))
            }
        }
        s
    };
    println!("\n== GPU run on {dev}: forward pass, causal = {}, softmax_scale = 1/sqrt(d) ==", o.causal);
    println!("{}", fmt(head.iter().map(|s| s.to_string()).collect()));
    println!("{}", fmt(w.iter().map(|&n| "-".repeat(n)).collect()));
    for r in rows {
        println!("{}", fmt(r));
    }
    let reps: Vec<usize> = lines.iter().map(|l| l.r.reps).collect();
    println!(
        "time: CUDA events around one forward_into call (FA1: its O/l/m init kernel included; standard: its stream-ordered\n  \
         S/P scratch allocation included), median of {}..{} runs after {} warm-up, inputs rotated among {} sets (>50 MB L2 each).",
        reps.iter().min().unwrap_or(&0),
        reps.iter().max().unwrap_or(&0),
        o.warmup,
        o.sets
    );
    println!("TFLOP/s = 4·B·H·N²·d / time{}.", if o.causal { " / 2 (causal)" } else { "" });
    println!(
        "max row err: max over {} sampled (batch, head, row) of ‖O_row − ref‖/‖ref‖, ref = f64 standard attention on the same\n  \
         inputs (bf16 rows: the bf16-rounded inputs); tolerance f32 1e-4, bf16 2e-2; also |Δlse| <= 1e-3 (worst here {:.1e}).",
        o.samples,
        lines.iter().map(|l| l.lse_err).fold(0.0f64, f64::max)
    );
    println!(
        "max abs ΔO: over every output element against the named row of the same config and dtype; must be <= tolerance × max|O|.\n  \
         Every O element was poisoned with NaN before the checked run and must come back finite."
    );
    println!(
        "HBM model: flash_attn::plan with the kernel's Br, Bc (f32: 4 B elements, S/P in f32; bf16: 2 B; l/m/lse 4 B), all heads;\n  \
         FA2 counts every K/V re-read as HBM (most hit the 50 MB L2), bf16 FA1 keeps its running O in f32 (model counts 2 B),\n  \
         causal runs are counted dense."
    );
    println!("HBM ncu: {ncu_note}.");
    if lines.iter().any(|l| l.measured.is_some()) {
        println!(
            "  ncu counts DRAM traffic during each kernel: output still in the 50 MB L2 when it ends is not counted, so a\n  \
             figure can fall below the compulsory Q, K, V, O bytes; the model ignores L2, the measurement does not."
        );
    }
    println!("  to measure by hand: {ncu_cmd}");
    println!(
        "FA1 (both dtypes) runs one thread block per (batch, head), as in the FA1 paper: B·H blocks for the whole GPU."
    );
}

// ---------------------------------------------------------------------------

fn run() -> Res<bool> {
    let o = parse()?;
    let ncu_mode = std::env::var(NCU_ENV).is_ok_and(|v| !v.is_empty() && v != "0");
    let ncu = find_ncu();
    let ncu_name = ncu.as_ref().map_or("ncu".to_string(), |p| p.display().to_string());
    if o.print_ncu {
        println!("{}", ncu_command_line(&ncu_name, "fa-run-ncu.csv"));
        return Ok(true);
    }
    let seed = o.seed.unwrap_or_else(|| {
        let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(1);
        (t as u64) ^ ((t >> 64) as u64)
    });

    if ncu_mode {
        // Under ncu: one launch per row, nothing else.
        let g = open_gpu()?;
        let lines = run_gpu(&o, &g, seed, true)?;
        println!("fa-run ({NCU_ENV}=1): launched {} rows once each", lines.len());
        return Ok(true);
    }

    print_plan_and_model(&o, o.shapes[0])?;
    println!("\ninputs: standard normal, FA_SEED={seed} (`--seed` or FA_SEED replays them)");

    let gpu = if o.cpu_only { Err("--cpu was given".to_string()) } else { open_gpu() };
    let g = match gpu {
        Ok(g) => g,
        Err(reason) => {
            if gpu_required() && !o.cpu_only {
                return Err(format!("FA_REQUIRE_GPU=1 but no GPU can be used: {reason}").into());
            }
            println!("\nno GPU run: {reason}; running the CPU path on a small shape instead");
            run_cpu(&o, seed)?;
            return Ok(true);
        }
    };
    let dev = format!(
        "{} (sm_{}{}, {} PTX)",
        g.fa.device_name(),
        g.fa.compute_capability().0,
        g.fa.compute_capability().1,
        g.fa.ptx_build().arch
    );
    eprintln!("fa-run: GPU {dev}");
    let mut lines = run_gpu(&o, &g, seed, false)?;
    let ncu_cmd = ncu_command_line(&ncu_name, "fa-run-ncu.csv");
    let ncu_note = match (&ncu, o.no_ncu) {
        (_, true) => "not measured (--no-ncu)".to_string(),
        (None, _) => "not measured (ncu is not installed: not on PATH nor in /usr/local/cuda/bin)".to_string(),
        (Some(p), false) => measure_with_ncu(&o, p, &mut lines),
    };
    print_table(&o, &lines, &dev, &ncu_note, &ncu_cmd);
    let bwd_lines = run_bwd(&o, &g, seed)?;
    print_bwd_table(&o, &bwd_lines);
    let mut failed: Vec<String> = lines
        .iter()
        .filter(|l| !l.ok)
        .map(|l| format!("{} {} {}", l.config, order_name(l.r.order), l.r.dtype.name()))
        .collect();
    for l in bwd_lines.iter().filter(|l| !l.ok) {
        eprintln!(
            "fa-run: FAIL forward + backward {} {} {}: non-finite gradients {}, rel err dq/dk/dv {:.2e}/{:.2e}/{:.2e} (tolerance {:.0e})",
            l.config,
            order_name(l.order),
            l.dtype.name(),
            l.nonfinite,
            l.err[0],
            l.err[1],
            l.err[2],
            tolerance(l.dtype)
        );
        failed.push(format!("{} forward + backward {} {}", l.config, order_name(l.order), l.dtype.name()));
    }
    for l in lines.iter().filter(|l| !l.ok) {
        eprintln!(
            "fa-run: FAIL {} {} {}: non-finite O {} of {}, row err {:.2e}, |Δlse| {:.2e}, cross rel {:.2e} (tolerance {:.0e})",
            l.config,
            order_name(l.r.order),
            l.r.dtype.name(),
            l.r.nonfinite,
            l.r.o.len(),
            l.err,
            l.lse_err,
            l.cross_rel,
            tolerance(l.r.dtype)
        );
    }
    if failed.is_empty() {
        println!("\nrun: OK: {} rows, every check passed", lines.len() + bwd_lines.len());
        Ok(true)
    } else {
        println!("\nrun: FAILED: {}", failed.join("; "));
        Ok(false)
    }
}

fn main() -> ExitCode {
    match run() {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("fa-run: {e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_ncu_csv() {
        let text = r#"==PROF== Connected to process 1234 (/x/fa-run)
"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size","Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"
"0","1234","fa-run","127.0.0.1","fa1_init_f32","1","13","(256, 1, 1)","(1024, 1, 1)","0","9.0","Command line profiler metrics","dram__bytes_read.sum","byte","1,024"
"0","1234","fa-run","127.0.0.1","fa1_init_f32","1","13","(256, 1, 1)","(1024, 1, 1)","0","9.0","Command line profiler metrics","dram__bytes_write.sum","byte","2,048"
"1","1234","fa-run","127.0.0.1","fa1_forward_f32","1","13","(256, 1, 1)","(96, 1, 1)","0","9.0","Command line profiler metrics","dram__bytes_read.sum","byte","10"
"1","1234","fa-run","127.0.0.1","fa1_forward_f32","1","13","(256, 1, 1)","(96, 1, 1)","0","9.0","Command line profiler metrics","dram__bytes_write.sum","byte","5"
==PROF== Disconnected from process 1234
"#;
        let k = parse_ncu_csv(text).unwrap();
        assert_eq!(k, vec![("fa1_init_f32".to_string(), 3072.0), ("fa1_forward_f32".to_string(), 15.0)]);
        assert!(parse_ncu_csv("nothing").is_err());
        assert_eq!(csv_fields(r#""a,b","c""d",e"#), vec!["a,b", "c\"d", "e"]);
    }

    #[test]
    fn sampled_triples_are_in_range() {
        let sh = Shape { b: 2, n: 7, h: 3, d: 4 };
        let t = sample_triples(sh, 32, 5);
        assert_eq!(t.len(), 32);
        assert!(t.iter().all(|&(b, h, i)| b < 2 && h < 3 && i < 7));
    }

    #[test]
    fn reference_rows_match_the_full_reference() {
        let sh = Shape { b: 2, n: 9, h: 3, d: 5 };
        let mut host: [Vec<f32>; 3] = Default::default();
        for (t, v) in host.iter_mut().enumerate() {
            *v = vec![0.0; sh.elems()];
            fill_normal(input_seed(7, 0, 0, t), v);
        }
        for causal in [false, true] {
            let shape = (sh.b, sh.n, sh.h, sh.d);
            let a = |v: &Vec<f32>| Array4::from_shape_vec(shape, v.iter().map(|&x| x as f64).collect()).unwrap();
            let full =
                standard_attention(a(&host[0]).view(), a(&host[1]).view(), a(&host[2]).view(), causal, None).unwrap();
            let triples = sample_triples(sh, 12, 3);
            for r in reference_rows(sh, causal, &host, &triples).unwrap() {
                for c in 0..sh.d {
                    assert!((r.o[c] - full.o[[r.b, r.i, r.h, c]]).abs() < 1e-12);
                }
                assert!((r.lse - full.lse[[r.b, r.h, r.i]]).abs() < 1e-12);
            }
        }
    }
}
