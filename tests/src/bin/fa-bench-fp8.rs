//! `fa-bench-fp8`: the FP8 (e4m3) Hopper forward beside our bf16 Hopper
//! forward and PyTorch's SDPA (FlashAttention-2 and cuDNN in bf16, and
//! cuDNN on float8_e4m3fn inputs where PyTorch takes them) on the forward
//! table's cells: batch·N = 16384 tokens, hidden 2048 (heads = 2048/d),
//! d ∈ {64, 128, 256} × causal × N ∈ {4096, 16384}. TFLOP/s = 4·B·H·N²·d,
//! halved when causal (the FlashAttention papers' counting).
//!
//! Method (shared/GPU-NOTES.md): CUDA events around the launches only,
//! warm-up first, median of the timed runs; inputs rotated among `--sets`
//! sets; PyTorch in the same run, after our side has freed the GPU. The
//! FP8 inputs are the e4m3 codes of N(0, 1) values with one scale per
//! (sequence, KV head) (amax/448 of each); "err vs bf16" is max |O_fp8 −
//! O_bf16| over the first set, the bf16 run on the same values — what FP8
//! costs in accuracy (the kernel's own accuracy is `gpu_fp8_prefill`'s).
//!
//! Output: the markdown table on stdout and in `OUT/fp8_prefill.md`.

use std::path::PathBuf;

use clap::{ArgAction, Parser};
use cudarc::driver::CudaSlice;
use flash_attn::reference::fp8::{e4m3_from_f32, scale_for_amax};
use flash_attn::{ForwardParams, Fp8Descales, Tensor, TensorLayout, TensorMut};
use flash_attn_tests::bench::{Meas, Res, Step, Timing, time_events, torch_peer};
use flash_attn_tests::{Rng, gpu};
use half::bf16;
use serde_json::json;

const SCRIPT: &str = include_str!("bench_torch_fp8.py");
const TOKENS: usize = 16384;
const HIDDEN: usize = 2048;

/// fa-bench-fp8: FP8 (e4m3) attention forward vs bf16 (ours, PyTorch)
#[derive(Parser, Clone, Debug)]
#[command(name = "fa-bench-fp8")]
struct Opts {
    /// Output folder
    #[arg(default_value = "bench-out")]
    out: PathBuf,
    #[arg(long, value_delimiter = ',', default_value = "64,128,256", action = ArgAction::Set)]
    dims: Vec<usize>,
    #[arg(long, value_delimiter = ',', default_value = "4096,16384", action = ArgAction::Set)]
    seqlens: Vec<usize>,
    #[arg(long, default_value_t = 2)]
    sets: usize,
    #[arg(long, default_value_t = 3)]
    warmup: usize,
    #[arg(long, default_value_t = 20)]
    reps: usize,
    /// Skip the PyTorch peers
    #[arg(long = "no-torch")]
    no_torch: bool,
    #[arg(long, default_value = "python3")]
    python: String,
}

#[derive(Clone, Debug)]
struct Cell {
    d: usize,
    causal: bool,
    n: usize,
    batch: usize,
    heads: usize,
}

impl Cell {
    fn flops(&self) -> f64 {
        4.0 * (self.batch * self.heads) as f64 * (self.n * self.n * self.d) as f64 / if self.causal { 2.0 } else { 1.0 }
    }
}

struct Ours {
    fp8: Meas,
    bf16: Meas,
    err: f64,
}

fn run_cell(g: &flash_attn_tests::Gpu, c: &Cell, o: &Opts, rng: &mut Rng) -> Res<Ours> {
    let st = &g.stream;
    let layout = TensorLayout::contiguous([c.batch, c.n, c.heads, c.d]);
    let len = c.batch * c.n * c.heads * c.d;
    let params = ForwardParams { causal: c.causal, ..Default::default() };
    let t = Timing { warmup: o.warmup, reps: o.reps, budget_s: 4.0 };
    // Per set: bf16 values, and their codes with one scale per (sequence, head).
    let mut bf = Vec::new();
    let mut f8 = Vec::new();
    for _ in 0..o.sets {
        let mut codes_and_scales = Vec::new();
        let mut vals = Vec::new();
        for _ in 0..3 {
            let x: Vec<f32> = (0..len).map(|_| bf16::from_f64(rng.sym(1.0) * 1.7).to_f32()).collect();
            let per = c.n * c.heads * c.d;
            let mut scales = vec![0f32; c.batch * c.heads];
            let mut codes = vec![0u8; len];
            for b in 0..c.batch {
                for h in 0..c.heads {
                    let idx = |i: usize, e: usize| b * per + (i * c.heads + h) * c.d + e;
                    let amax = (0..c.n).flat_map(|i| (0..c.d).map(move |e| (i, e))).map(|(i, e)| x[idx(i, e)].abs()).fold(0f32, f32::max);
                    let s = scale_for_amax(amax);
                    scales[b * c.heads + h] = s;
                    for i in 0..c.n {
                        for e in 0..c.d {
                            codes[idx(i, e)] = e4m3_from_f32(x[idx(i, e)] / s);
                        }
                    }
                }
            }
            codes_and_scales.push((st.clone_htod(&codes)?, st.clone_htod(&scales)?));
            vals.push(st.clone_htod(&x.iter().map(|&v| bf16::from_f32(v)).collect::<Vec<_>>())?);
        }
        f8.push(codes_and_scales);
        bf.push(vals);
    }
    let mut o8: CudaSlice<bf16> = st.alloc_zeros(len)?;
    let mut o16: CudaSlice<bf16> = st.alloc_zeros(len)?;
    let mut lse: CudaSlice<f32> = st.alloc_zeros(c.batch * c.heads * c.n)?;
    let run8 = |i: usize, o8: &mut CudaSlice<bf16>, lse: &mut CudaSlice<f32>| -> Res<()> {
        let s = &f8[i % o.sets];
        let ds = Fp8Descales { q_descale: Some(&s[0].1), k_descale: Some(&s[1].1), v_descale: Some(&s[2].1) };
        g.fa.forward_fp8_into::<bf16, _, _, _, _>(st, Tensor::new(&s[0].0, layout), Tensor::new(&s[1].0, layout), Tensor::new(&s[2].0, layout), &ds, TensorMut::new(o8, layout), lse, &params)?;
        Ok(())
    };
    let run16 = |i: usize, o16: &mut CudaSlice<bf16>, lse: &mut CudaSlice<f32>| -> Res<()> {
        let s = &bf[i % o.sets];
        g.fa.forward_into::<bf16, _, _, _, _>(st, Tensor::new(&s[0], layout), Tensor::new(&s[1], layout), Tensor::new(&s[2], layout), TensorMut::new(o16, layout), flash_attn::StatsMut::LogSumExp(lse.as_view_mut()), &params)?;
        Ok(())
    };
    // Accuracy of FP8 against bf16 on the same values (set 0).
    run8(0, &mut o8, &mut lse)?;
    run16(0, &mut o16, &mut lse)?;
    let (a, b) = (st.clone_dtoh(&o8)?, st.clone_dtoh(&o16)?);
    let mut err = 0f64;
    for (x, y) in a.iter().zip(&b) {
        let (x, y) = (x.to_f32() as f64, y.to_f32() as f64);
        if !x.is_finite() {
            return Err("non-finite FP8 output".into());
        }
        err = err.max((x - y).abs());
    }
    let fp8 = time_events(&g.ctx, st, t, |s| match s {
        Step::Setup(_) => Ok(()),
        Step::Timed(i) => run8(i, &mut o8, &mut lse),
    })?;
    let bf16m = time_events(&g.ctx, st, t, |s| match s {
        Step::Setup(_) => Ok(()),
        Step::Timed(i) => run16(i, &mut o16, &mut lse),
    })?;
    Ok(Ours { fp8, bf16: bf16m, err })
}

fn main() -> Res<()> {
    let o = Opts::parse();
    let Some(g) = gpu("fa-bench-fp8") else { return Err("no GPU".into()) };
    std::fs::create_dir_all(&o.out)?;
    let mut rng = Rng::fresh("fa-bench-fp8");
    let mut cells = Vec::new();
    for &d in &o.dims {
        for causal in [false, true] {
            for &n in &o.seqlens {
                cells.push(Cell { d, causal, n, batch: (TOKENS / n).max(1), heads: HIDDEN / d });
            }
        }
    }
    let mut ours = Vec::new();
    for c in &cells {
        let r = run_cell(g, c, &o, &mut rng);
        if let Err(e) = &r {
            eprintln!("d={} causal={} N={}: {e}", c.d, c.causal, c.n);
        }
        ours.push(r.ok());
    }
    let peer = if o.no_torch {
        None
    } else {
        let configs: Vec<_> = cells.iter().map(|c| json!({"d": c.d, "causal": c.causal, "seqlen": c.n, "batch": c.batch, "nheads": c.heads})).collect();
        let cfg = json!({"sets": o.sets, "warmup": o.warmup, "reps": o.reps, "budget_s": 4.0, "seed": 1,
                         "impls": ["torch-flash", "torch-cudnn", "torch-cudnn-fp8"], "configs": configs});
        Some(torch_peer::run(&o.python, "fa-bench-fp8", ("bench_torch_fp8.py", SCRIPT), &cfg))
    };
    let find = |c: &Cell, imp: &str| -> Meas {
        let Some(p) = &peer else { return Meas::na("not run") };
        p.results
            .iter()
            .find(|r| r["impl"] == imp && r["d"] == c.d && r["causal"] == c.causal && r["seqlen"] == c.n)
            .map(Meas::from_peer)
            .unwrap_or_else(|| Meas::na(if p.available { "no record" } else { p.reason.as_str() }))
    };
    let tf = |m: &Meas, c: &Cell| m.tflops(c.flops()).map_or("—".to_string(), |x| format!("{x:.0}"));
    let mut md = String::new();
    md.push_str(&format!("GPU: {} (cc {:?}); PyTorch {}\n\n", g.fa.device_name(), g.fa.compute_capability(), peer.as_ref().and_then(|p| p.version.clone()).unwrap_or_else(|| "not run".into())));
    md.push_str("| d | causal | N | B×H | ours e4m3 ms | TFLOP/s | ours bf16 ms | TFLOP/s | e4m3 / bf16 | torch flash bf16 | cuDNN bf16 | cuDNN e4m3 | e4m3 / cuDNN bf16 | err vs bf16 |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    let mut notes = Vec::new();
    for (c, r) in cells.iter().zip(&ours) {
        let (fl, cu, cu8) = (find(c, "torch-flash"), find(c, "torch-cudnn"), find(c, "torch-cudnn-fp8"));
        for m in [&fl, &cu, &cu8] {
            if m.ms.is_none() && !m.note.is_empty() && !notes.contains(&m.note) {
                notes.push(m.note.clone());
            }
        }
        let Some(r) = r else {
            md.push_str(&format!("| {} | {} | {} | {}×{} | failed | | | | | | | | | |\n", c.d, c.causal, c.n, c.batch, c.heads));
            continue;
        };
        let ratio = |a: &Meas, b: &Meas| match (a.ms, b.ms) {
            (Some(x), Some(y)) => format!("{:.2}×", y / x),
            _ => "—".into(),
        };
        md.push_str(&format!(
            "| {} | {} | {} | {}×{} | {:.3} | {} | {:.3} | {} | {} | {} | {} | {} | {} | {:.2e} |\n",
            c.d, c.causal, c.n, c.batch, c.heads,
            r.fp8.ms.unwrap_or(f64::NAN), tf(&r.fp8, c),
            r.bf16.ms.unwrap_or(f64::NAN), tf(&r.bf16, c),
            ratio(&r.fp8, &r.bf16),
            tf(&fl, c), tf(&cu, c), tf(&cu8, c),
            ratio(&r.fp8, &cu), r.err
        ));
    }
    if !notes.is_empty() {
        md.push_str("\nPeer notes:\n");
        for n in notes {
            md.push_str(&format!("- {n}\n"));
        }
    }
    print!("{md}");
    std::fs::write(o.out.join("fp8_prefill.md"), md)?;
    Ok(())
}
