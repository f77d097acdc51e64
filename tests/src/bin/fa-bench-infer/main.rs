//! `fa-bench-infer`: issue 8's benchmark rows, ours beside PyTorch in one run
//! (`cargo xtask bench-infer`).
//!
//! 1. **GQA prefill**, Llama-3-8B shape: 32 query heads over 8 KV heads,
//!    d = 128, causal, bf16, N = 4096 and 16384 (batch·N = 16384 tokens):
//!    our GQA against our MHA (32 KV heads) at the same shape and PyTorch
//!    SDPA (`enable_gqa=True`) flash / cuDNN / efficient.
//! 2. **Varlen**: 16 sequences, lengths uniform in 128..=8192 (fixed seed),
//!    bf16, d = 128, 32 heads, causal and not: ours packed
//!    (`forward_varlen_into`) against ours padded to the longest and two
//!    dense batches of similar work (same tokens at the mean length; same
//!    FLOPs at the RMS length); PyTorch padded (flash, cuDNN), on nested
//!    jagged tensors and through `aten._flash_attention_forward` with
//!    cu_seqlens. FLOPs are counted over the real tokens, Σ 4·H·Lᵢ²·d
//!    (halved when causal), for the padded runs too.
//! 3. **Head dims** 32, 40, 80, 96, 160, 192, 224 (bf16 and f16, causal and
//!    not, N = 4096, batch·N = 16384, heads = 2048/d rounded) beside PyTorch
//!    flash; on an H100 the Hopper kernels, zero-padded to 64/128/192/256
//!    (`FA_BENCH_FAMILY=mma-sync`: the mma.sync kernels).
//!
//! Every row of ours is checked first (`check`: poisoned outputs, sampled
//! rows against an f64 CPU attention). Timing: CUDA events, warm-up, median,
//! rotating input sets (`measure`). PyTorch runs after ours in a subprocess
//! (`torch`). Outputs in `--out` (default `bench-infer-out/`):
//! `bench-infer.md` and `bench-infer.json` (`report`). Exit status non-zero
//! if a check fails or there is no GPU.

mod check;
mod configs;
mod measure;
mod report;
mod torch;

use std::path::PathBuf;
use std::process::ExitCode;

use configs::{Case, Group};
use measure::{Gpu, Meas};

#[derive(Clone, Debug)]
pub struct Opts {
    pub groups: Vec<Group>,
    pub tokens: usize,
    pub hidden: usize,
    pub varlen_batch: usize,
    pub varlen_seed: u64,
    pub warmup: usize,
    pub reps: usize,
    pub sets: usize,
    pub budget_s: f64,
    pub seed: u64,
    pub check: bool,
    pub torch: bool,
    pub python: String,
    pub out: PathBuf,
}

const USAGE: &str = "\
fa-bench-infer: issue 8's rows (GQA prefill, varlen, head dims 32..224), ours vs PyTorch

USAGE: fa-bench-infer [FLAGS]
  --groups LIST     gqa,varlen,headdim                 [all three]
  --tokens N        batch x seqlen of the dense rows   [16384]
  --hidden N        heads x d of the head-dim rows     [2048]
  --varlen-batch N  sequences in the packed batch      [16]
  --varlen-seed N   seed of their lengths (128..=8192) [8]
  --warmup N        warm-up runs per measurement       [3]
  --reps N          timed runs (median)                [30]
  --sets N          rotated input sets                 [3]
  --budget-s S      time budget per measurement: fewer runs (>= 5) past it [3]
  --seed N          input seed                         [1]
  --no-check        skip the correctness pass
  --no-torch        skip the PyTorch peers
  --python PATH     python with torch                  [python3]
  --out DIR         output folder                      [bench-infer-out]
";

fn parse_args() -> Result<Opts, String> {
    let mut o = Opts {
        groups: vec![Group::Gqa, Group::Varlen, Group::HeadDim],
        tokens: 16384,
        hidden: 2048,
        varlen_batch: 16,
        varlen_seed: 8,
        warmup: 3,
        reps: 30,
        sets: 3,
        budget_s: 3.0,
        seed: 1,
        check: true,
        torch: true,
        python: "python3".into(),
        out: PathBuf::from("bench-infer-out"),
    };
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let (flag, inline) = match a.split_once('=') {
            Some((f, v)) if f.starts_with("--") => (f.to_string(), Some(v.to_string())),
            _ => (a.clone(), None),
        };
        let mut val = || inline.clone().or_else(|| it.next().cloned()).ok_or_else(|| format!("{flag} needs a value"));
        let num = |s: String| s.parse::<usize>().map_err(|_| format!("{flag}: bad number `{s}`"));
        match flag.as_str() {
            "-h" | "--help" => {
                print!("{USAGE}");
                std::process::exit(0);
            }
            "--groups" => {
                o.groups = val()?
                    .split(',')
                    .map(|g| match g.trim() {
                        "gqa" => Ok(Group::Gqa),
                        "varlen" => Ok(Group::Varlen),
                        "headdim" | "hdim" => Ok(Group::HeadDim),
                        x => Err(format!("--groups: unknown `{x}` (gqa, varlen, headdim)")),
                    })
                    .collect::<Result<_, _>>()?
            }
            "--tokens" => o.tokens = num(val()?)?,
            "--hidden" => o.hidden = num(val()?)?,
            "--varlen-batch" => o.varlen_batch = num(val()?)?,
            "--varlen-seed" => o.varlen_seed = num(val()?)? as u64,
            "--warmup" => o.warmup = num(val()?)?,
            "--reps" => o.reps = num(val()?)?,
            "--sets" => o.sets = num(val()?)?,
            "--budget-s" => o.budget_s = val()?.parse().map_err(|_| "--budget-s: bad number".to_string())?,
            "--seed" => o.seed = num(val()?)? as u64,
            "--no-check" => o.check = false,
            "--no-torch" => o.torch = false,
            "--python" => o.python = val()?,
            "--out" => o.out = PathBuf::from(val()?),
            other => return Err(format!("unknown argument `{other}` (see --help)")),
        }
    }
    if o.reps == 0 || o.warmup == 0 || o.sets == 0 || o.varlen_batch == 0 {
        return Err("--reps, --warmup, --sets and --varlen-batch must be >= 1".into());
    }
    if [4096, 16384].iter().any(|&n| !o.tokens.is_multiple_of(n)) {
        return Err(format!("--tokens {} must be a multiple of 16384 (N = 4096 and 16384)", o.tokens));
    }
    Ok(o)
}

/// One case's outcome on our side.
pub struct Row {
    pub case: Case,
    pub ours: Meas,
    pub check: Option<check::Check>,
}

fn run_case(gpu: &Gpu, o: &Opts, c: &Case, ix: usize) -> Row {
    let mut row = Row { case: c.clone(), ours: Meas::na("not run"), check: None };
    let r = (|| -> measure::Res<()> {
        let mut inp = gpu.inputs(o, c, ix)?;
        if o.check {
            let ch = check::check(gpu, o, c, &mut inp)?;
            eprintln!(
                "[check] {:28} rel err {:.2e} (naive {:.2e}), max abs {:.2e}, lse {:.1e}, {} rows{} {}",
                c.id,
                ch.rel_err,
                ch.naive_rel_err,
                ch.max_abs_err,
                ch.lse_abs_err,
                ch.rows,
                if ch.nonfinite > 0 { format!(", {} non-finite outputs", ch.nonfinite) } else { String::new() },
                if ch.ok { "ok" } else { "FAIL" }
            );
            row.check = Some(ch);
        }
        row.ours = gpu.time(o, c, &mut inp)?;
        Ok(())
    })();
    if let Err(e) = r {
        row.ours = Meas::na(format!("error: {e}"));
    }
    match row.ours.tflops(c.flops) {
        Some(t) => eprintln!("[ours ] {:28} {:9.3} ms {t:7.1} TFLOP/s ({} runs)", c.id, row.ours.ms.unwrap(), row.ours.reps),
        None => eprintln!("[ours ] {:28} n/a ({})", c.id, row.ours.note),
    }
    row
}

fn main() -> ExitCode {
    let o = match parse_args() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("fa-bench-infer: {e}");
            return ExitCode::FAILURE;
        }
    };
    let cases = configs::cases(&o);
    let mut failed = false;
    let mut device = None;
    let rows: Vec<Row> = match Gpu::new() {
        Ok(gpu) => {
            eprintln!("fa-bench-infer: {} (sm_{}{}), {} cases", gpu.name, gpu.cc.0, gpu.cc.1, cases.len());
            device = Some(format!("{} (sm_{}{})", gpu.name, gpu.cc.0, gpu.cc.1));
            cases.iter().enumerate().map(|(i, c)| run_case(&gpu, &o, c, i)).collect()
            // `gpu` drops here: our buffers are freed before PyTorch runs.
        }
        Err(e) => {
            eprintln!("fa-bench-infer: no GPU run: {e}");
            failed = true;
            cases.iter().map(|c| Row { case: c.clone(), ours: Meas::na(format!("no GPU: {e}")), check: None }).collect()
        }
    };
    failed |= rows.iter().any(|r| r.check.as_ref().is_some_and(|c| !c.ok) || r.ours.note.starts_with("error"));
    let torch = torch::run(&o, &cases);
    match report::write(&o, &rows, &torch, device.as_deref()) {
        Ok(md) => print!("{md}"),
        Err(e) => {
            eprintln!("fa-bench-infer: cannot write the report: {e}");
            failed = true;
        }
    }
    let checked = rows.iter().filter(|r| r.check.is_some()).count();
    let bad = rows.iter().filter(|r| r.check.as_ref().is_some_and(|c| !c.ok)).count();
    println!("fa-bench-infer: {} rows, {checked} checked, {bad} failed checks; outputs in {}", rows.len(), o.out.display());
    if failed { ExitCode::FAILURE } else { ExitCode::SUCCESS }
}
