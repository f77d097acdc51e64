//! Reports: the markdown table (TFLOP/s and median ms of every
//! implementation, the ratio columns, footnotes for what did not run, the
//! check), the same numbers as JSON, one TFLOP/s-against-N plot per
//! (dtype, d, causal), and the one-line summary.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::PathBuf;

use flash_attn_tests::bench::plot::{self, Chart, Marker, Series};
use flash_attn_tests::bench::{Res, geomean_range};
use serde_json::{Value, json};

use crate::check::Check;
use crate::configs::{Cfg, impl_of};
use crate::measure::{DeviceInfo, Results};
use crate::opts::Opts;
use crate::torch::TorchInfo;

fn ratio(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    match (a, b) {
        (Some(a), Some(b)) if b > 0.0 => Some(a / b),
        _ => None,
    }
}

/// Ratio columns of the Hopper kernel (TFLOP/s of ours over the other).
const HOPPER_RATIOS: &[(&str, &str)] = &[
    ("torch-flash", "Hopper/flash"),
    ("torch-cudnn", "Hopper/cuDNN"),
    ("fa2", "Hopper/FA2"),
];

const RATIOS: &[(&str, &str)] = &[
    ("torch-flash", "FA2/flash"),
    ("torch-cudnn", "FA2/cuDNN"),
    ("fa1", "FA2/FA1"),
    ("standard", "FA2/std"),
];

/// The ratio columns whose two implementations both run: (ours, other, name).
fn ratio_columns(o: &Opts) -> Vec<(&'static str, &'static str, &'static str)> {
    let mut v = Vec::new();
    for (ours, table) in [("fa2", RATIOS), ("hopper", HOPPER_RATIOS)] {
        for &(k, name) in table {
            if o.impls.contains(&ours) && o.impls.contains(&k) {
                v.push((ours, k, name));
            }
        }
    }
    v
}

pub fn markdown(
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
        let cols = ratio_columns(o);
        for (_, _, name) in &cols {
            head += &format!(" {name} |");
            sep += " --- |";
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
            let tf = |k: &str| row.get(k).and_then(|m| m.tflops(flops));
            for (ours, k, _) in &cols {
                match ratio(tf(ours), tf(k)) {
                    Some(r) => line += &format!(" {r:.2}× |"),
                    None => line += " – |",
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
            let list: Vec<String> = kernels.iter().map(|k| format!("`{k}`")).collect();
            writeln!(s, "\nOur kernels: {}", list.join(", ")).unwrap();
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

pub fn json_report(
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
                .map(|ch| {
                    json!({"impl": ch.imp, "rel_err": ch.rel_err, "naive_rel_err": ch.naive_rel_err,
                                 "lse_abs_err": ch.lse_abs_err, "nonfinite": ch.nonfinite, "ok": ch.ok})
                })
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

/// `bench.md`, `bench.json` and one `tflops_<dtype>_d<d>_<causal|full>.svg`
/// per (dtype, d, causal) in `--out`; the paths written.
pub fn write_outputs(
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
    let mut plots: Vec<_> = cfgs.iter().map(Cfg::plot).collect();
    plots.dedup();
    for (dtype, d, causal) in plots {
        let series: Vec<Series> = o
            .impls
            .iter()
            .map(|k| {
                let values = o
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
                let i = impl_of(k);
                Series {
                    label: i.label.into(),
                    color: i.color,
                    dashed: false,
                    marker: Marker::Circle,
                    values,
                }
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
        let chart = Chart {
            title: &title,
            subtitle,
            x_label: "sequence length N (batch × N = const)",
            y_label: "TFLOP/s",
            x: &o.seqlens,
            reference: None,
            size: (760, 450),
        };
        let path = o.out.join(format!(
            "tflops_{}_d{}_{}.svg",
            dtype.name(),
            d,
            if causal { "causal" } else { "full" }
        ));
        std::fs::write(&path, plot::svg(&chart, &series)?)?;
        files.push(path);
    }
    Ok(files)
}

/// The last line on stdout: geo-mean ratios, the check count, time, errors.
pub fn summary(
    o: &Opts,
    cfgs: &[Cfg],
    results: &Results,
    checks: &BTreeMap<Cfg, Vec<Check>>,
    dev_line: &str,
    secs: f64,
    errors: &[String],
) -> String {
    let mut parts = vec![format!("fa-bench: {} configs on {dev_line}", cfgs.len())];
    if !o.check_only {
        for (k, name) in RATIOS {
            let rs: Vec<f64> = cfgs
                .iter()
                .filter_map(|c| {
                    let row = results.get(c)?;
                    ratio(
                        row.get("fa2")?.tflops(c.flops(o)),
                        row.get(k)?.tflops(c.flops(o)),
                    )
                })
                .collect();
            if let Some(g) = geomean_range(&rs, "configs") {
                parts.push(format!("{name} {g}"));
            }
        }
    }
    let nchecks: usize = checks.values().map(Vec::len).sum();
    let nfail: usize = checks.values().flatten().filter(|c| !c.ok).count();
    if o.check {
        parts.push(format!("check {}/{} ok", nchecks - nfail, nchecks));
    }
    parts.push(format!("{secs:.0} s"));
    parts.push(format!("outputs in {}", o.out.display()));
    for e in errors {
        parts.push(format!("ERROR {e}"));
    }
    parts.join("; ")
}
