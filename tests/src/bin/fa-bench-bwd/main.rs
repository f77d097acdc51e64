//! `fa-bench-bwd`: the backward pass against PyTorch SDPA's flash
//! (FlashAttention-2) and cuDNN backward on the papers' shapes (batch·N =
//! 16384 tokens, hidden 2048, heads = 2048/d), f16/bf16 × d × causal × N,
//! plus seed 002's GPT-2-medium attention (batch 64, 16 heads, N 1024, d 64,
//! causal). TFLOP/s: backward = 10·B·H·N²·d, forward + backward = 14·B·H·N²·d,
//! halved when causal (the FlashAttention papers' counting).
//!
//! Method (shared/GPU-NOTES.md): CUDA events around the work only, warm-up
//! first, median; inputs rotated among `--sets` sets (each larger than the
//! L2 at the table's shapes); PyTorch in the same run, after our side has
//! freed the GPU. The accuracy of the gradients is the business of
//! tests/tests/gpu_backward.rs (f64 reference, FA2's rule); here each cell
//! checks that every gradient is finite and not all zero, and that dK, dV
//! (written without atomics) repeat bit for bit.
//!
//! Usage: fa-bench-bwd [--quick] [--no-torch] [--python PY] [--deterministic]
//!        [--softcap CAP] [--dtypes bf16,f16] [--dims 64,128,256] [--seqlens 4096,16384]
//!        [--out FILE.md]

use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream};
use flash_attn::{BackwardParams, BackwardScratch};
use flash_attn::{AttnElem, Extras, FlashAttention, ForwardParams, RowStats, Tensor, TensorLayout, TensorMut};
use flash_attn_tests::bench::{Meas, Res, Step, Timing, geomean_range, time_events, torch_peer};
use flash_attn_tests::{Rng, gpu};
use half::{bf16, f16};
use serde_json::json;

const SCRIPT: &str = include_str!("bench_torch_bwd.py");
const TOKENS: usize = 16384;
const HIDDEN: usize = 2048;

#[derive(Clone, Debug)]
struct Cell {
    dtype: &'static str,
    d: usize,
    causal: bool,
    n: usize,
    batch: usize,
    heads: usize,
}

impl Cell {
    fn flops(&self, per: f64) -> f64 {
        per * (self.batch * self.heads) as f64 * (self.n * self.n * self.d) as f64 / if self.causal { 2.0 } else { 1.0 }
    }
    fn key(&self) -> String {
        format!("{} d={} {} N={} B={} H={}", self.dtype, self.d, if self.causal { "causal" } else { "full" }, self.n, self.batch, self.heads)
    }
}

struct Opts {
    quick: bool,
    torch: bool,
    python: String,
    deterministic: bool,
    /// `--softcap CAP`: every timed call with this softcap (no PyTorch peer takes one).
    softcap: Option<f32>,
    dtypes: Vec<String>,
    dims: Vec<usize>,
    seqlens: Vec<usize>,
    out: Option<String>,
    sets: usize,
}

fn parse() -> Result<Opts, String> {
    let mut o = Opts {
        quick: false,
        torch: true,
        python: "python3".into(),
        deterministic: false,
        softcap: None,
        dtypes: vec!["bf16".into(), "f16".into()],
        dims: vec![64, 128, 256],
        seqlens: vec![4096, 16384],
        out: None,
        sets: 2,
    };
    let mut a = std::env::args().skip(1);
    let list = |s: Option<String>| -> Result<Vec<String>, String> {
        Ok(s.ok_or("missing value")?.split(',').map(str::to_string).collect())
    };
    while let Some(x) = a.next() {
        match x.as_str() {
            "--quick" => o.quick = true,
            "--no-torch" => o.torch = false,
            "--deterministic" => o.deterministic = true,
            "--softcap" => o.softcap = Some(a.next().and_then(|s| s.parse().ok()).ok_or("--softcap needs a number")?),
            "--python" => o.python = a.next().ok_or("--python needs a value")?,
            "--out" => o.out = Some(a.next().ok_or("--out needs a value")?),
            "--sets" => o.sets = a.next().and_then(|s| s.parse().ok()).ok_or("--sets needs a number")?,
            "--dtypes" => o.dtypes = list(a.next())?,
            "--dims" => o.dims = list(a.next())?.iter().map(|s| s.parse().map_err(|_| format!("bad dim {s}"))).collect::<Result<_, _>>()?,
            "--seqlens" => o.seqlens = list(a.next())?.iter().map(|s| s.parse().map_err(|_| format!("bad seqlen {s}"))).collect::<Result<_, _>>()?,
            "-h" | "--help" => return Err("usage: fa-bench-bwd [--quick] [--no-torch] [--python PY] [--deterministic] [--softcap CAP] [--dtypes bf16,f16] [--dims 64,128,256] [--seqlens 4096,16384] [--sets N] [--out FILE.md]".into()),
            _ => return Err(format!("unknown argument {x}")),
        }
    }
    Ok(o)
}

fn cells(o: &Opts) -> Vec<Cell> {
    let mut v = Vec::new();
    for dt in &o.dtypes {
        let dtype: &'static str = if dt == "f16" { "f16" } else { "bf16" };
        for &d in &o.dims {
            for causal in [false, true] {
                for &n in &o.seqlens {
                    v.push(Cell { dtype, d, causal, n, batch: (TOKENS / n).max(1), heads: HIDDEN / d });
                }
            }
        }
    }
    // Seed 002's GPT-2 medium attention.
    for dt in &o.dtypes {
        let dtype: &'static str = if dt == "f16" { "f16" } else { "bf16" };
        v.push(Cell { dtype, d: 64, causal: true, n: 1024, batch: 64, heads: 16 });
    }
    v
}

/// One input set on the device: q, k, v, dout, and the forward's out + LSE.
struct Set<T> {
    q: CudaSlice<T>,
    k: CudaSlice<T>,
    v: CudaSlice<T>,
    dout: CudaSlice<T>,
    out: CudaSlice<T>,
    stats: RowStats,
}

struct Ours {
    bwd: Meas,
    fwdbwd: Meas,
    check: String,
}

fn run_cell<T: AttnElem>(fa: &FlashAttention, stream: &Arc<CudaStream>, ctx: &Arc<cudarc::driver::CudaContext>, c: &Cell, o: &Opts, rng: &mut Rng) -> Res<Ours> {
    let layout = TensorLayout::contiguous([c.batch, c.n, c.heads, c.d]);
    let len = layout.required_len().ok_or("size")?;
    let fwd = ForwardParams { causal: c.causal, softcap: o.softcap, ..Default::default() };
    let params = BackwardParams { forward: fwd, deterministic: o.deterministic };
    let host = |rng: &mut Rng| -> Vec<T> { (0..len).map(|_| T::from_f32(rng.sym(1.0) as f32)).collect() };
    let mut sets = Vec::new();
    for _ in 0..o.sets {
        let (q, k, v, dout) = (
            stream.clone_htod(&host(rng))?,
            stream.clone_htod(&host(rng))?,
            stream.clone_htod(&host(rng))?,
            stream.clone_htod(&host(rng))?,
        );
        let f = fa.forward::<T, _, _, _>(stream, Tensor::new(&q, layout), Tensor::new(&k, layout), Tensor::new(&v, layout), &fwd)?;
        sets.push(Set { q, k, v, dout, out: f.o, stats: f.stats });
    }
    let mut dq = stream.alloc_zeros::<T>(len)?;
    let mut dk = stream.alloc_zeros::<T>(len)?;
    let mut dv = stream.alloc_zeros::<T>(len)?;
    let sizes = fa.backward_scratch_sizes::<T>(&layout, &layout, &params)?;
    let mut scratch = BackwardScratch::new(stream, sizes)?;
    let ext = Extras::default();
    let bwd = |i: usize, dq: &mut CudaSlice<T>, dk: &mut CudaSlice<T>, dv: &mut CudaSlice<T>, scratch: &mut BackwardScratch| -> Res<()> {
        let s = &sets[i % sets.len()];
        fa.backward_into::<T, _, _, _, _, _, _, _, _>(
            stream,
            Tensor::new(&s.q, layout),
            Tensor::new(&s.k, layout),
            Tensor::new(&s.v, layout),
            Tensor::new(&s.out, layout),
            Tensor::new(&s.dout, layout),
            &s.stats,
            TensorMut::new(dq, layout),
            TensorMut::new(dk, layout),
            TensorMut::new(dv, layout),
            Some(scratch),
            &params,
            &ext,
        )?;
        Ok(())
    };
    // Check: finite gradients; dK, dV (no atomics) identical over two runs.
    bwd(0, &mut dq, &mut dk, &mut dv, &mut scratch)?;
    let (dk1, dv1): (Vec<T>, Vec<T>) = (stream.clone_dtoh(&dk)?, stream.clone_dtoh(&dv)?);
    let dq1: Vec<T> = stream.clone_dtoh(&dq)?;
    bwd(0, &mut dq, &mut dk, &mut dv, &mut scratch)?;
    let (dk2, dv2): (Vec<T>, Vec<T>) = (stream.clone_dtoh(&dk)?, stream.clone_dtoh(&dv)?);
    let finite = dq1.iter().chain(&dk1).chain(&dv1).all(|x| x.to_f32().is_finite());
    let same = dk1.iter().zip(&dk2).all(|(a, b)| a.to_f32().to_bits() == b.to_f32().to_bits())
        && dv1.iter().zip(&dv2).all(|(a, b)| a.to_f32().to_bits() == b.to_f32().to_bits());
    let nonzero = dq1.iter().any(|x| x.to_f32() != 0.0) && dk1.iter().any(|x| x.to_f32() != 0.0);
    let check = format!("{}{}{}", if finite { "finite" } else { "NON-FINITE" }, if same { ", dK/dV repeat" } else { ", dK/dV DIFFER" }, if nonzero { "" } else { ", ZERO grads" });
    let t = if o.quick { Timing { warmup: 2, reps: 10, budget_s: 2.0 } } else { Timing { warmup: 3, reps: 30, budget_s: 4.0 } };
    let mb = time_events(ctx, stream, t, |s| match s {
        Step::Setup(_) => Ok(()),
        Step::Timed(i) => bwd(i, &mut dq, &mut dk, &mut dv, &mut scratch),
    })?;
    // Forward + backward: the forward into each set's own out/LSE, then the backward.
    let mut outs: Vec<(CudaSlice<T>, CudaSlice<f32>)> = (0..sets.len())
        .map(|_| Ok((stream.alloc_zeros::<T>(len)?, stream.alloc_zeros::<f32>(c.batch * c.heads * c.n)?)))
        .collect::<Res<_>>()?;
    let mfb = time_events(ctx, stream, t, |s| match s {
        Step::Setup(_) => Ok(()),
        Step::Timed(i) => {
            let j = i % sets.len();
            let s = &sets[j];
            let (o_buf, lse) = &mut outs[j];
            fa.forward_into::<T, _, _, _, _>(
                stream,
                Tensor::new(&s.q, layout),
                Tensor::new(&s.k, layout),
                Tensor::new(&s.v, layout),
                TensorMut::new(o_buf, layout),
                flash_attn::StatsMut::LogSumExp(lse.as_view_mut()),
                &fwd,
            )?;
            fa.backward_into::<T, _, _, _, _, _, _, _, _>(
                stream,
                Tensor::new(&s.q, layout),
                Tensor::new(&s.k, layout),
                Tensor::new(&s.v, layout),
                Tensor::new(&*o_buf, layout),
                Tensor::new(&s.dout, layout),
                &*lse,
                TensorMut::new(&mut dq, layout),
                TensorMut::new(&mut dk, layout),
                TensorMut::new(&mut dv, layout),
                Some(&mut scratch),
                &params,
                &ext,
            )?;
            Ok(())
        }
    })?;
    Ok(Ours { bwd: mb, fwdbwd: mfb, check })
}


/// Gradients of a small problem (batch 2, 3 query rows fewer than keys,
/// GQA 4/2 heads) against the f64 reference of the definition
/// (`flash_attn::reference::attention_backward`), as ‖g − g_ref‖ / ‖g_ref‖
/// for dq, dk, dv; f32 runs the f32 kernels, f16/bf16 the tensor cores.
fn check_small<T: AttnElem>(fa: &FlashAttention, stream: &Arc<CudaStream>, d: usize, causal: bool, deterministic: bool, rng: &mut Rng) -> Res<[f64; 3]> {
    let (b, sq, sk, h, hk) = (2, 157, 160, 4, 2);
    let (lq, lk) = (TensorLayout::contiguous([b, sq, h, d]), TensorLayout::contiguous([b, sk, hk, d]));
    let rand_vec = |n: usize, rng: &mut Rng| -> Vec<T> { (0..n).map(|_| T::from_f32(rng.sym(1.0) as f32)).collect() };
    let (hq, hk_, hv, hdo) = (rand_vec(b * sq * h * d, rng), rand_vec(b * sk * hk * d, rng), rand_vec(b * sk * hk * d, rng), rand_vec(b * sq * h * d, rng));
    let (q, k, v, dout) = (stream.clone_htod(&hq)?, stream.clone_htod(&hk_)?, stream.clone_htod(&hv)?, stream.clone_htod(&hdo)?);
    let fwd = ForwardParams { causal, ..Default::default() };
    let f = fa.forward::<T, _, _, _>(stream, Tensor::new(&q, lq), Tensor::new(&k, lk), Tensor::new(&v, lk), &fwd)?;
    let params = BackwardParams { forward: fwd, deterministic };
    let g = fa.backward::<T, _, _, _, _, _>(stream, Tensor::new(&q, lq), Tensor::new(&k, lk), Tensor::new(&v, lk), Tensor::new(&f.o, lq), Tensor::new(&dout, lq), &f.stats, &params, &Extras::default())?;
    let to64 = |x: &[T], shape: [usize; 4]| ndarray::Array4::from_shape_vec(shape, x.iter().map(|v| v.to_f32() as f64).collect()).unwrap();
    let r = flash_attn::reference::attention_backward(
        to64(&hq, [b, sq, h, d]).view(),
        to64(&hk_, [b, sk, hk, d]).view(),
        to64(&hv, [b, sk, hk, d]).view(),
        to64(&hdo, [b, sq, h, d]).view(),
        &fwd,
        None,
    )?;
    let err = |dev: &CudaSlice<T>, r: &ndarray::Array4<f64>| -> Res<f64> {
        let x: Vec<T> = stream.clone_dtoh(dev)?;
        Ok(flash_attn_tests::rel_err(x.iter().map(|v| v.to_f32() as f64), r.iter().copied()))
    };
    Ok([err(&g.dq, &r.dq)?, err(&g.dk, &r.dk)?, err(&g.dv, &r.dv)?])
}

fn fmt(m: &Meas, flops: f64) -> String {
    match (m.ms, m.tflops(flops)) {
        (Some(ms), Some(tf)) => format!("{ms:.3} ms {tf:.0}"),
        _ => format!("n/a ({})", m.note),
    }
}

fn main() {
    let o = match parse() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(2);
        }
    };
    let Some(g) = gpu("fa-bench-bwd") else { return };
    let mut rng = Rng::fresh("fa-bench-bwd");
    // Correctness first: small problems against the f64 reference.
    let mut checks = String::from("## Gradient check (f64 reference of the definition; ‖g − ref‖/‖ref‖)\n\n| dtype | d | causal | dq | dk | dv |\n|---|---|---|---|---|---|\n");
    let mut bad = 0;
    for d in [32usize, 64, 128] {
        for causal in [false, true] {
            for dt in ["f32", "bf16", "f16"] {
                let r = match dt {
                    "f32" => check_small::<f32>(&g.fa, &g.stream, d, causal, o.deterministic, &mut rng),
                    "bf16" => check_small::<bf16>(&g.fa, &g.stream, d, causal, o.deterministic, &mut rng),
                    _ => check_small::<f16>(&g.fa, &g.stream, d, causal, o.deterministic, &mut rng),
                };
                let tol = if dt == "f32" { 1e-4 } else { 2e-2 };
                let line = match r {
                    Ok(e) => {
                        if !e.iter().all(|x| *x < tol) { bad += 1 }
                        format!("| {dt} | {d} | {causal} | {:.2e} | {:.2e} | {:.2e} |{}\n", e[0], e[1], e[2], if e.iter().all(|x| *x < tol) { "" } else { " FAIL" })
                    }
                    Err(e) => { bad += 1; format!("| {dt} | {d} | {causal} | error: {e} | | |\n") }
                };
                eprint!("[check] {line}");
                checks += &line;
            }
        }
    }
    println!("{checks}\n{} of the checks failed\n", bad);
    let cs = cells(&o);
    let mut ours = Vec::new();
    for c in &cs {
        let r = if c.dtype == "f16" {
            run_cell::<f16>(&g.fa, &g.stream, &g.ctx, c, &o, &mut rng)
        } else {
            run_cell::<bf16>(&g.fa, &g.stream, &g.ctx, c, &o, &mut rng)
        };
        let r = r.unwrap_or_else(|e| Ours { bwd: Meas::na(e.to_string()), fwdbwd: Meas::na("-"), check: "error".into() });
        eprintln!("[ours] {:40} bwd {:>18}  fwd+bwd {:>18}  {}", c.key(), fmt(&r.bwd, c.flops(10.0)), fmt(&r.fwdbwd, c.flops(14.0)), r.check);
        ours.push(r);
    }
    // PyTorch, after our side is done (its buffers were freed at each cell's end).
    let mut peers: std::collections::HashMap<(String, String), Meas> = Default::default();
    let mut torch_line = "PyTorch: not run (--no-torch)".to_string();
    if o.torch && o.softcap.is_none() {
        let mut configs = Vec::new();
        for c in &cs {
            for mode in ["bwd", "fwdbwd"] {
                configs.push(json!({"dtype": c.dtype, "d": c.d, "causal": c.causal, "seqlen": c.n, "batch": c.batch, "nheads": c.heads, "mode": mode}));
            }
        }
        let t = if o.quick { (2, 10, 2.0) } else { (3, 30, 4.0) };
        let cfg = json!({"sets": o.sets, "warmup": t.0, "reps": t.1, "budget_s": t.2, "seed": 1,
            "impls": ["torch-flash", "torch-cudnn"], "configs": configs});
        let peer = torch_peer::run(&o.python, "fa-bench-bwd", ("bench_torch_bwd.py", SCRIPT), &cfg);
        torch_line = if peer.available {
            format!("PyTorch {} in the same run", peer.version.clone().unwrap_or_default())
        } else {
            format!("PyTorch: not available ({})", peer.reason)
        };
        for r in &peer.results {
            let c = Cell {
                dtype: if r["dtype"] == "f16" { "f16" } else { "bf16" },
                d: r["d"].as_u64().unwrap_or(0) as usize,
                causal: r["causal"].as_bool().unwrap_or(false),
                n: r["seqlen"].as_u64().unwrap_or(0) as usize,
                batch: r["batch"].as_u64().unwrap_or(0) as usize,
                heads: r["nheads"].as_u64().unwrap_or(0) as usize,
            };
            let key = format!("{} {} {}", c.key(), r["mode"].as_str().unwrap_or(""), r["impl"].as_str().unwrap_or(""));
            peers.insert((key, String::new()), Meas::from_peer(r));
        }
    }
    let peer = |c: &Cell, mode: &str, imp: &str| peers.get(&(format!("{} {mode} {imp}", c.key()), String::new())).cloned().unwrap_or_else(|| Meas::na("not run"));
    let mut md = String::new();
    md += &format!("{checks}\n{bad} of the checks failed\n\n");
    let softcap = o.softcap.map_or(String::new(), |c| format!(", softcap {c}"));
    md += &format!("# Backward pass on {} ({torch_line}){}{softcap}\n\n", g.fa.device_name(), if o.deterministic { ", deterministic" } else { "" });
    md += "TFLOP/s: backward 10·B·H·N²·d, forward+backward 14·B·H·N²·d, halved when causal; median of CUDA-event-timed runs, inputs rotated.\n\n";
    md += "| dtype | d | causal | N | B×H | ours bwd ms | ours TFLOP/s | flash TFLOP/s | cuDNN TFLOP/s | ours/flash | ours/cuDNN | ours fwd+bwd ms | flash fwd+bwd ms | cuDNN fwd+bwd ms | check |\n";
    md += "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n";
    let (mut vs_flash, mut vs_cudnn) = (Vec::new(), Vec::new());
    for (c, r) in cs.iter().zip(&ours) {
        let f = c.flops(10.0);
        let (pf, pc) = (peer(c, "bwd", "torch-flash"), peer(c, "bwd", "torch-cudnn"));
        let (ff, fc) = (peer(c, "fwdbwd", "torch-flash"), peer(c, "fwdbwd", "torch-cudnn"));
        let ratio = |a: &Meas, b: &Meas| match (a.ms, b.ms) {
            (Some(x), Some(y)) => Some(y / x),
            _ => None,
        };
        let (rf, rc) = (ratio(&r.bwd, &pf), ratio(&r.bwd, &pc));
        if let Some(x) = rf { vs_flash.push(x) }
        if let Some(x) = rc { vs_cudnn.push(x) }
        let tf = |m: &Meas| m.tflops(f).map(|x| format!("{x:.0}")).unwrap_or_else(|| "n/a".into());
        let ms = |m: &Meas| m.ms.map(|x| format!("{x:.3}")).unwrap_or_else(|| "n/a".into());
        let rr = |x: Option<f64>| x.map(|x| format!("{x:.2}×")).unwrap_or_else(|| "n/a".into());
        md += &format!(
            "| {} | {} | {} | {} | {}×{} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |\n",
            c.dtype, c.d, if c.causal { "yes" } else { "no" }, c.n, c.batch, c.heads,
            ms(&r.bwd), tf(&r.bwd), tf(&pf), tf(&pc), rr(rf), rr(rc), ms(&r.fwdbwd), ms(&ff), ms(&fc), r.check
        );
    }
    md += "\n";
    if let Some(s) = geomean_range(&vs_flash, "cells") { md += &format!("ours/flash backward: {s}\n\n") }
    if let Some(s) = geomean_range(&vs_cudnn, "cells") { md += &format!("ours/cuDNN backward: {s}\n\n") }
    for r in &ours {
        if !r.bwd.note.is_empty() && r.bwd.ms.is_none() { md += &format!("- error: {}\n", r.bwd.note) }
    }
    println!("{md}");
    if let Some(p) = &o.out
        && let Err(e) = std::fs::write(p, &md)
    {
        eprintln!("cannot write {p}: {e}");
    }
}
