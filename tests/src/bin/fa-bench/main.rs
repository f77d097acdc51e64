//! `fa-bench`: our tensor-core FA2, the Hopper kernel, FA1 and standard
//! attention side by side with PyTorch SDPA's flash, cuDNN, efficient and
//! math backends, in one run, on the shapes of the FlashAttention papers.
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
//!
//! Modules: [`opts`] (the command line), [`configs`] (implementations,
//! shapes, inputs), [`measure`] (our side on the GPU), [`check`] (against
//! the f64 reference), [`torch`] (the PyTorch peers), [`report`] (table,
//! JSON, plots, summary).

mod check;
mod configs;
mod measure;
mod opts;
mod report;
mod torch;

use std::collections::BTreeMap;
use std::time::Instant;

use flash_attn_tests::bench::Meas;

use configs::OURS;
use measure::Results;
use opts::Opts;
use torch::TorchInfo;

/// H100 L2 size: the rotated input sets must exceed it.
const L2_BYTES: usize = 50 << 20;

fn main() {
    let o = Opts::get();
    let t0 = Instant::now();
    let input_bytes = o.sets * 3 * o.tokens * o.hidden * 2;
    if input_bytes <= L2_BYTES {
        eprintln!(
            "fa-bench: warning: the {} input sets total {:.0} MB, not more than the 50 MB L2: timings measure the cache",
            o.sets,
            input_bytes as f64 / 1e6
        );
    }
    let cfgs = configs::configs(&o);
    let mut results = Results::new();
    let mut checks = BTreeMap::new();
    let mut dev = None;
    let mut errors = Vec::new();
    if let Err(e) = measure::run_ours(&o, &cfgs, &mut results, &mut checks, &mut dev) {
        eprintln!("fa-bench: our kernels: error: {e}");
        errors.push(format!("our kernels: {e}"));
        for c in &cfgs {
            let row = results.entry(*c).or_default();
            for k in o.impls.iter().filter(|k| OURS.contains(k)) {
                row.entry(k)
                    .or_insert_with(|| Meas::na(format!("error: {e}")));
            }
        }
    }
    let torch = if o.check_only {
        TorchInfo::not_run("--check-only")
    } else {
        torch::run_torch(&o, &cfgs, &mut results)
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
    let torch_version = torch.version.as_deref().unwrap_or("n/a");
    let header = format!(
        "## fa-bench: {dev_line}, PyTorch {torch_version}\n\n{} tokens (batch × seqlen), hidden {} (nheads = ⌊hidden / d⌋); FLOPs = 4·B·H·N²·d, halved when causal. \
         CUDA events around each kernel, {} warm-up runs, median of {} runs, inputs random normal rotated among {} sets ({:.0} MB).",
        o.tokens,
        o.hidden,
        o.warmup,
        o.reps,
        o.sets,
        input_bytes as f64 / 1e6
    );
    let md = report::markdown(&o, &cfgs, &results, &checks, &header);
    let json = report::json_report(&o, &cfgs, &results, &checks, &dev, &torch);
    let subtitle = format!(
        "{dev_line}; PyTorch {torch_version}; median of {} runs, CUDA events",
        o.reps
    );
    match report::write_outputs(&o, &cfgs, &results, &md, &json, &subtitle) {
        Ok(files) => eprintln!(
            "fa-bench: wrote {} files to {}",
            files.len(),
            o.out.display()
        ),
        Err(e) => errors.push(format!("writing outputs to {}: {e}", o.out.display())),
    }
    println!("{md}");
    println!(
        "{}",
        report::summary(
            &o,
            &cfgs,
            &results,
            &checks,
            &dev_line,
            t0.elapsed().as_secs_f64(),
            &errors
        )
    );
    let failed = checks.values().flatten().any(|c| !c.ok);
    if failed || !errors.is_empty() {
        std::process::exit(1);
    }
}
