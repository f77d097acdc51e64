//! Reports: one markdown table per group (TFLOP/s and median ms of ours and
//! of each PyTorch peer, the check of ours), the ratios issue 8 asks for,
//! and the same numbers as JSON. Files: `bench-infer.md`, `bench-infer.json`.

use std::fmt::Write as _;

use serde_json::{Value, json};

use crate::configs::{Group, Shape};
use crate::measure::{Meas, Res};
use crate::torch::TorchInfo;
use crate::{Opts, Row};

const PEERS: &[(&str, &str)] = &[
    ("torch-flash", "PyTorch flash"),
    ("torch-cudnn", "cuDNN"),
    ("torch-efficient", "PyTorch efficient"),
    ("torch-njt-flash", "PyTorch NJT (flash)"),
    ("torch-varlen-aten", "PyTorch varlen (aten flash)"),
];

/// Footnotes for "n/a" cells.
#[derive(Default)]
struct Notes(Vec<String>);

impl Notes {
    fn ix(&mut self, n: &str) -> usize {
        match self.0.iter().position(|x| x == n) {
            Some(i) => i + 1,
            None => {
                self.0.push(n.to_string());
                self.0.len()
            }
        }
    }
    fn cell(&mut self, m: Option<&Meas>, flops: f64) -> String {
        match m {
            None => "—".into(),
            Some(m) => match m.tflops(flops) {
                Some(t) => format!("{t:.1} ({:.3} ms)", m.ms.unwrap()),
                None => format!("n/a [{}]", self.ix(&m.note)),
            },
        }
    }
}

fn tf(m: Option<&Meas>, flops: f64) -> Option<f64> {
    m.and_then(|m| m.tflops(flops))
}

fn peer<'a>(t: &'a TorchInfo, id: &str, imp: &str) -> Option<&'a Meas> {
    t.results.get(&(id.to_string(), imp.to_string()))
}

fn find<'a>(rows: &'a [Row], id: &str) -> Option<&'a Row> {
    rows.iter().find(|r| r.case.id == id)
}

fn check_cell(r: &Row) -> String {
    match &r.check {
        None => "—".into(),
        Some(c) => format!(
            "{} {:.1e} / {:.1e} (max abs {:.1e})",
            if c.ok { "ok" } else { "**FAIL**" },
            c.rel_err,
            c.naive_rel_err,
            c.max_abs_err
        ),
    }
}

fn table(s: &mut String, notes: &mut Notes, rows: &[&Row], t: &TorchInfo) {
    let peers: Vec<_> = PEERS.iter().filter(|(k, _)| rows.iter().any(|r| r.case.torch.contains(k))).collect();
    let mut head = "| row | dtype | causal | shape | ours |".to_string();
    let mut sep = "| --- | --- | --- | --- | --- |".to_string();
    for (_, label) in &peers {
        head += &format!(" {label} |");
        sep += " --- |";
    }
    head += " ours / best peer | check of ours: rel err / naive (max abs) |";
    sep += " --- | --- |";
    writeln!(s, "{head}\n{sep}").unwrap();
    for r in rows {
        let c = &r.case;
        let mut line = format!(
            "| {} | {} | {} | {} | {} |",
            c.what,
            c.dtype.name(),
            if c.causal { "yes" } else { "no" },
            c.shape.describe() + &c.block.map_or(String::new(), |(br, bc)| format!(" Br={br} Bc={bc}")),
            notes.cell(Some(&r.ours), c.flops)
        );
        let mut best: Option<f64> = None;
        for (k, _) in &peers {
            let m = peer(t, &c.id, k);
            if let Some(x) = tf(m, c.flops) {
                best = Some(best.map_or(x, |b: f64| b.max(x)));
            }
            // "—": not a peer of this row; "not run": a peer that left no result.
            let cell = if c.torch.contains(k) && m.is_none() { "not run".into() } else { notes.cell(m, c.flops) };
            line += &format!(" {cell} |");
        }
        let ratio = match (tf(Some(&r.ours), c.flops), best) {
            (Some(a), Some(b)) => format!("{:.2}", a / b),
            _ => "—".into(),
        };
        writeln!(s, "{line} {ratio} | {} |", check_cell(r)).unwrap();
    }
    writeln!(s).unwrap();
}

/// The comparisons issue 8 names, as (text, JSON) pairs.
fn summary(o: &Opts, rows: &[Row], t: &TorchInfo) -> Vec<(String, Value)> {
    let mut v = Vec::new();
    let ours = |id: &str| find(rows, id).and_then(|r| tf(Some(&r.ours), r.case.flops));
    let ms = |id: &str| find(rows, id).and_then(|r| r.ours.ms);
    for n in [4096, 16384] {
        let (g, m) = (ours(&format!("gqa-n{n}-hk8")), ours(&format!("gqa-n{n}-hk32")));
        if let (Some(g), Some(m)) = (g, m) {
            let best = find(rows, &format!("gqa-n{n}-hk8"))
                .and_then(|r| crate::configs::GQA_TORCH.iter().filter_map(|k| tf(peer(t, &r.case.id, k), r.case.flops)).reduce(f64::max));
            let vs = best.map_or(String::new(), |b| format!("; ours / best PyTorch GQA = {:.2}", g / b));
            v.push((
                format!("GQA N={n}: ours GQA {g:.1} vs ours MHA {m:.1} TFLOP/s: GQA/MHA = {:.2} (target ≥ 1){vs}", g / m),
                json!({"what": "gqa_vs_mha", "n": n, "gqa_tflops": g, "mha_tflops": m, "ratio": g / m, "best_torch_gqa_tflops": best}),
            ));
        }
    }
    if o.groups.contains(&Group::Varlen) {
        for c in ["full", "causal"] {
            let id = |x: &str| format!("varlen-{c}-{x}");
            let (p, pad, dm, dr) = (ours(&id("packed")), ms(&id("padded")), ours(&id("dense-mean")), ours(&id("dense-rms")));
            let (Some(p), Some(pms), Some(pad)) = (p, ms(&id("packed")), pad) else { continue };
            let mut text = format!("varlen {c}: packed {pms:.3} ms vs padded {pad:.3} ms: {:.2}× faster; packed {p:.1} TFLOP/s (real tokens)", pad / pms);
            if let (Some(dm), Some(dr)) = (dm, dr) {
                write!(text, " = {:.0}% of dense at the mean length ({dm:.1}), {:.0}% of dense at equal FLOPs ({dr:.1}) (target ≥ 85%)", 100.0 * p / dm, 100.0 * p / dr).unwrap();
            }
            let (pu, dv) = (ours(&id("packed-uniform")), ours(&id("dense-mean-vtile")));
            if let (Some(pu), Some(dv), Some(dm)) = (pu, dv, dm) {
                write!(
                    text,
                    ". Diagnostics: the dense kernel with the varlen tile runs {dv:.1} ({:.0}% of its default tile); the varlen kernel on {} equal lengths {pu:.1} ({:.0}% of that)",
                    100.0 * dv / dm,
                    o.varlen_batch,
                    100.0 * pu / dv
                )
                .unwrap();
            }
            v.push((
                text,
                json!({"what": "varlen", "causal": c == "causal", "packed_ms": pms, "padded_ms": pad, "speedup_vs_padded": pad / pms,
                       "packed_tflops": p, "dense_mean_tflops": dm, "dense_rms_tflops": dr,
                       "vs_dense_mean": dm.map(|d| p / d), "vs_dense_rms": dr.map(|d| p / d),
                       "packed_uniform_tflops": pu, "dense_mean_varlen_tile_tflops": dv}),
            ));
        }
    }
    v
}

fn meas_json(m: &Meas, flops: f64) -> Value {
    json!({"ms": m.ms, "min_ms": m.min_ms, "max_ms": m.max_ms, "reps": m.reps, "tflops": m.tflops(flops), "note": m.note})
}

pub fn write(o: &Opts, rows: &[Row], t: &TorchInfo, device: Option<&str>) -> Res<String> {
    let mut s = String::new();
    let mut notes = Notes::default();
    let torch = match (&t.version, t.available) {
        (Some(v), true) => format!("PyTorch {v}"),
        _ => format!("PyTorch: not run ({})", t.reason),
    };
    writeln!(s, "# fa-bench-infer: issue 8's rows\n").unwrap();
    writeln!(s, "{}; {torch}. TFLOP/s (median ms) over the real tokens: 4·H·ΣL²·d, halved when causal (padded rows too). CUDA events, {} warm-up runs, median of up to {} runs, {} rotating input sets.\n", device.unwrap_or("no GPU"), o.warmup, o.reps, o.sets).unwrap();
    for (g, title) in [(Group::Gqa, "GQA prefill (Llama-3-8B: 32 query heads, 8 KV heads, d = 128)"), (Group::Varlen, "Varlen (packed batch)"), (Group::HeadDim, "Head dims 32..224 (heads = 2048/d rounded)")] {
        let rs: Vec<&Row> = rows.iter().filter(|r| r.case.group == g).collect();
        if rs.is_empty() {
            continue;
        }
        writeln!(s, "## {title}\n").unwrap();
        if g == Group::Varlen
            && let Some(Shape::Varlen(p)) = rs.first().map(|r| &r.case.shape)
        {
            writeln!(s, "Lengths (seed {}): {:?}; {} tokens, max {}.\n", o.varlen_seed, p.lens, p.total(), p.max()).unwrap();
        }
        table(&mut s, &mut notes, &rs, t);
    }
    let sum = summary(o, rows, t);
    if !sum.is_empty() {
        writeln!(s, "## Summary\n").unwrap();
        for (line, _) in &sum {
            writeln!(s, "- {line}").unwrap();
        }
        writeln!(s).unwrap();
    }
    if !notes.0.is_empty() {
        writeln!(s, "Notes:\n").unwrap();
        for (i, n) in notes.0.iter().enumerate() {
            writeln!(s, "{}. {n}", i + 1).unwrap();
        }
        writeln!(s).unwrap();
    }
    let json = json!({
        "device": device, "torch": t.version, "torch_available": t.available, "torch_reason": t.reason,
        "method": {"warmup": o.warmup, "reps": o.reps, "sets": o.sets, "budget_s": o.budget_s, "seed": o.seed, "varlen_seed": o.varlen_seed},
        "rows": rows.iter().map(|r| {
            let c = &r.case;
            let shape = match &c.shape {
                Shape::Dense(d) => json!({"kind": "dense", "b": d.b, "n": d.n, "h": d.h, "hk": d.hk, "d": d.d}),
                Shape::Varlen(p) => json!({"kind": "varlen", "lens": p.lens, "h": p.h, "d": p.d}),
            };
            let peers: serde_json::Map<String, Value> = c.torch.iter()
                .filter_map(|k| peer(t, &c.id, k).map(|m| (k.to_string(), meas_json(m, c.flops)))).collect();
            json!({"id": c.id, "group": c.group.key(), "what": c.what, "dtype": c.dtype.name(), "causal": c.causal,
                   "shape": shape, "flops": c.flops, "ours": meas_json(&r.ours, c.flops), "torch": peers,
                   "check": r.check.as_ref().map(|k| json!({"ok": k.ok, "rows": k.rows, "rel_err": k.rel_err, "naive_rel_err": k.naive_rel_err,
                        "max_abs_err": k.max_abs_err, "lse_abs_err": k.lse_abs_err, "nonfinite": k.nonfinite}))})
        }).collect::<Vec<_>>(),
        "summary": sum.iter().map(|(_, j)| j.clone()).collect::<Vec<_>>(),
    });
    std::fs::create_dir_all(&o.out)?;
    std::fs::write(o.out.join("bench-infer.md"), &s)?;
    std::fs::write(o.out.join("bench-infer.json"), serde_json::to_string_pretty(&json)?)?;
    Ok(s)
}
