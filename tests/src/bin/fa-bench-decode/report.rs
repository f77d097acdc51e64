//! The decode report: the table (ours with splits and without, PyTorch's
//! backends, bandwidth and its share of the peak), the bar's two checks in
//! a summary (splits never slower than no splits; ours against PyTorch
//! flash), the same numbers as JSON, and the GB/s-against-cache-length plot.

use std::fmt::Write as _;

use flash_attn_tests::bench::flush::{self, FlushKind};
use flash_attn_tests::bench::plot::{self, Chart, Marker, Series};
use flash_attn_tests::bench::torch_peer::Peer;
use flash_attn_tests::bench::{Meas, Res, geomean_range};
use serde_json::json;

use crate::{Cell, D, H, Opts, Row};

/// H100 SXM HBM3 bandwidth (datasheet), the "% of" column's yardstick.
const PEAK: f64 = 3.35e12;

/// Run-to-run spread of one cell's median: where auto picks one split, the
/// two columns time the same kernel and differ by up to 1% (H100, quick grid).
const NOISE: f64 = 0.02;

/// PyTorch's median for `c`'s contiguous shape and backend `imp`, in µs.
fn peer(t: &Peer, c: &Cell, imp: &str) -> Option<f64> {
    peer_meas(t, c, imp).and_then(|m| m.ms).map(|ms| ms * 1e3)
}

fn peer_meas(t: &Peer, c: &Cell, imp: &str) -> Option<Meas> {
    t.results
        .iter()
        .find(|r| {
            r["batch"] == c.batch && r["cache"] == c.cache && r["hk"] == c.hk && r["impl"] == imp
        })
        .map(Meas::from_peer)
}

fn us(m: &Meas) -> Option<f64> {
    m.ms.map(|ms| ms * 1e3)
}

/// Bandwidth of `c` at `t_us`, in bytes/s.
fn bw(c: &Cell, t_us: f64) -> f64 {
    c.bytes() / (t_us * 1e-6)
}

/// Footnotes for cells that did not run.
#[derive(Default)]
struct Notes(Vec<String>);

impl Notes {
    fn mark(&mut self, note: &str) -> String {
        let i = self.0.iter().position(|x| x == note).unwrap_or_else(|| {
            self.0.push(note.to_string());
            self.0.len() - 1
        });
        format!(
            "{} [{}]",
            if note.starts_with("skipped") {
                "skipped"
            } else {
                "n/a"
            },
            i + 1
        )
    }
    fn cell(&mut self, v: Option<f64>, m: Option<&Meas>) -> String {
        match (v, m) {
            (Some(v), _) => format!("{v:.1}"),
            // The error alone: SDPA's reasons after " / " name every shape.
            (None, Some(m)) if !m.note.is_empty() => {
                self.mark(m.note.split(" / ").next().unwrap_or_default())
            }
            _ => "n/a".into(),
        }
    }
}

/// Writes `decode.md`, `decode.json` and `decode_gbs.svg` to `o.out`; returns the markdown.
pub fn write(o: &Opts, device: &str, rows: &[Row], t: &Peer) -> Res<String> {
    let torch = match (&t.version, t.available) {
        (Some(v), true) => format!("PyTorch {v}"),
        _ => format!("PyTorch: not run ({})", t.reason),
    };
    let mut notes = Notes::default();
    let mut md = format!(
        "## fa-bench-decode: {device}, {torch}\n\n\
         bf16, d = {D}, one query token, {H} query heads; K/V bytes read once / time. CUDA events, {} warm-up runs, median of {} runs, \
         {} run; cudarc's event tracking {}. \"no split\": our kernel with num_splits = 1 (ours and no split timed in alternating halves); \"no split / ours\" ≥ 1 means split-KV is not slower. \
         PyTorch has no paged cache: its contiguous time stands beside our paged rows. Paged cells: {}.\n\n",
        o.timing().warmup,
        o.reps(),
        o.flush.describe(),
        if o.no_event_tracking { "off" } else { "on" },
        o.page_order.describe()
    );
    md += "| batch | cache | heads q/kv | layout | ours µs | ours TB/s | % of 3.35 | ours no split µs | no split / ours | PyTorch flash µs (TB/s) | cuDNN µs | efficient µs | ours / flash |\n";
    md += "|---|---|---|---|---|---|---|---|---|---|---|---|---|\n";
    let mut json_rows = Vec::new();
    let (mut slower, mut vs_flash, mut least_gain) = (Vec::new(), Vec::new(), f64::INFINITY);
    for r in rows {
        let c = &r.cell;
        let pc = c.contiguous();
        let (auto, one) = (us(&r.auto), us(&r.no_split));
        let (fl, cu, ef) = (
            peer(t, &pc, "torch-flash"),
            peer(t, &pc, "torch-cudnn"),
            peer(t, &pc, "torch-efficient"),
        );
        let tbs = auto.map(|a| bw(c, a) / 1e12);
        let split_gain = auto.zip(one).map(|(a, n)| n / a);
        let ratio = auto.zip(fl).map(|(a, f)| f / a);
        if let Some(g) = split_gain {
            least_gain = least_gain.min(g);
            if g < 1.0 - NOISE {
                slower.push(format!(
                    "batch {} cache {} 32/{} {} ({g:.3})",
                    c.batch,
                    c.cache,
                    c.hk,
                    c.layout()
                ));
            }
        }
        if let (Some(x), None) = (ratio, c.page) {
            vs_flash.push(x);
        }
        let fl_meas = peer_meas(t, &pc, "torch-flash");
        let fl_s = match fl {
            Some(f) => format!("{f:.1} ({:.2})", bw(c, f) / 1e12),
            None => notes.cell(None, fl_meas.as_ref()),
        };
        let f2 = |x: Option<f64>, fmt: &dyn Fn(f64) -> String| x.map_or("n/a".to_string(), fmt);
        writeln!(
            md,
            "| {} | {} | {H}/{} | {} | {} | {} | {} | {} | {} | {fl_s} | {} | {} | {} |",
            c.batch,
            c.cache,
            c.hk,
            c.layout(),
            notes.cell(auto, Some(&r.auto)),
            f2(tbs, &|x| format!("{x:.2}")),
            f2(tbs, &|x| format!("{:.0}%", 100.0 * x * 1e12 / PEAK)),
            notes.cell(one, Some(&r.no_split)),
            f2(split_gain, &|x| format!("{x:.2}×")),
            notes.cell(cu, peer_meas(t, &pc, "torch-cudnn").as_ref()),
            notes.cell(ef, peer_meas(t, &pc, "torch-efficient").as_ref()),
            f2(ratio, &|x| format!("{x:.2}×")),
        )
        .unwrap();
        json_rows.push(json!({
            "batch": c.batch, "cache": c.cache, "hk": c.hk, "page": c.page, "bytes": c.bytes(),
            "ours_us": auto, "ours_split1_us": one, "ours_tbs": tbs, "nosplit_over_ours": split_gain,
            "flash_us": fl, "cudnn_us": cu, "efficient_us": ef, "flash_over_ours": ratio,
            "note": if r.auto.ms.is_none() { r.auto.note.clone() } else { String::new() },
            "ours_reps": r.auto.reps, "ours_min_us": auto.map(|_| r.auto.min_ms * 1e3), "ours_max_us": auto.map(|_| r.auto.max_ms * 1e3),
        }));
    }
    if !notes.0.is_empty() {
        md += "\n";
        for (i, n) in notes.0.iter().enumerate() {
            writeln!(md, "[{}] {n}  ", i + 1).unwrap();
        }
    }
    let measured = rows
        .iter()
        .filter(|r| r.auto.ms.is_some() && r.no_split.ms.is_some())
        .count();
    let noise = format!("{:.0}%, the run-to-run spread", NOISE * 100.0);
    let mut summary = vec![if slower.is_empty() {
        format!(
            "split-KV not slower than no split in any of the {measured} measured cells (least no split / ours: {least_gain:.3}; slower means by more than {noise})"
        )
    } else {
        format!(
            "split-KV slower than no split by more than {noise}, in {} of {measured} cells: {}",
            slower.len(),
            slower.join("; ")
        )
    }];
    if let Some(g) = geomean_range(&vs_flash, "cells") {
        summary.push(format!("ours / PyTorch flash (contiguous) {g}"));
    }
    md += "\n";
    for s in &summary {
        writeln!(md, "- {s}").unwrap();
    }
    let json = json!({
        "tool": "fa-bench-decode", "device": device, "torch": t.version, "torch_available": t.available, "torch_reason": t.reason,
        "method": {"warmup": o.timing().warmup, "reps": o.reps(), "l2_flush": o.flush.name(), "l2_flush_bytes": match o.flush { FlushKind::Read => flush::READ_BYTES, FlushKind::Write => flush::WRITE_BYTES }, "mem_cap_gb": o.mem_cap_gb, "page_order": o.page_order.name(), "h": H, "d": D},
        "rows": json_rows, "summary": summary,
    });
    std::fs::write(o.out.join("decode.md"), &md)?;
    std::fs::write(
        o.out.join("decode.json"),
        serde_json::to_string_pretty(&json)?,
    )?;
    std::fs::write(
        o.out.join("decode_gbs.svg"),
        gbs_plot(device, &torch, rows, t, o.flush)?,
    )?;
    Ok(md)
}

/// One colour per (batch, KV heads).
const COLORS: &[&str] = &[
    "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
    "#bcbd22", "#17becf",
];

/// GB/s against cache length: ours solid (one line per batch, heads and
/// layout; the marker tells the layout), PyTorch flash dashed.
fn gbs_plot(
    device: &str,
    torch: &str,
    rows: &[Row],
    t: &Peer,
    flush: FlushKind,
) -> Result<String, String> {
    let mut caches: Vec<usize> = rows.iter().map(|r| r.cell.cache).collect();
    caches.sort();
    caches.dedup();
    let mut groups: Vec<(usize, usize)> = Vec::new();
    for r in rows {
        if !groups.contains(&(r.cell.batch, r.cell.hk)) {
            groups.push((r.cell.batch, r.cell.hk));
        }
    }
    let mut layouts: Vec<Option<usize>> = rows.iter().map(|r| r.cell.page).collect();
    layouts.sort();
    layouts.dedup();
    // GB/s of one line: `time` (µs) of each cache length, for one batch, heads and layout.
    let line = |batch, hk, page, time: &dyn Fn(&Cell) -> Option<f64>| -> Vec<Option<f64>> {
        let cell = |cache| Cell {
            batch,
            cache,
            hk,
            page,
        };
        caches
            .iter()
            .map(|&cache| time(&cell(cache)).map(|t| bw(&cell(cache), t) / 1e9))
            .collect()
    };
    let ours = |c: &Cell| rows.iter().find(|r| r.cell == *c).and_then(|r| us(&r.auto));
    let flash = |c: &Cell| peer(t, c, "torch-flash");
    let mut series = Vec::new();
    for (gi, &(batch, hk)) in groups.iter().enumerate() {
        let color = COLORS[gi % COLORS.len()];
        for &page in &layouts {
            let marker = match page {
                None => Marker::Circle,
                Some(p) if p <= 16 => Marker::Triangle,
                Some(_) => Marker::Square,
            };
            let label = format!(
                "ours b{batch} {H}/{hk} {}",
                page.map_or("contig".into(), |p| format!("page {p}"))
            );
            series.push(Series {
                label,
                color,
                dashed: false,
                marker,
                values: line(batch, hk, page, &ours),
            });
        }
        let label = format!("PyTorch flash b{batch} {H}/{hk}");
        series.push(Series {
            label,
            color,
            dashed: true,
            marker: Marker::Circle,
            values: line(batch, hk, None, &flash),
        });
    }
    let subtitle = format!(
        "{device}; {torch}; bf16 d={D}, one query token, L2 flushed ({}); median of CUDA-event-timed runs",
        flush.name()
    );
    let chart = Chart {
        title: "Decode: K/V bandwidth against cache length (ours solid, PyTorch flash dashed)",
        subtitle: &subtitle,
        x_label: "cache length (tokens per sequence)",
        y_label: "GB/s (K and V bytes read once / time)",
        x: &caches,
        reference: Some((PEAK / 1e9, "H100 HBM3 peak 3350 GB/s")),
        size: (980, 560),
    };
    plot::svg(&chart, &series)
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;
    use crate::grid;

    #[test]
    fn table_plot_and_summary_of_a_small_grid() {
        let dir = std::env::temp_dir().join(format!("fa-bench-decode-test-{}", std::process::id()));
        let o = Opts::parse_from([
            "fa-bench-decode",
            dir.to_str().unwrap(),
            "--batches",
            "1,64",
            "--caches",
            "4096,131072",
            "--kv-heads",
            "32",
        ]);
        // Times from the bandwidth model at 2.5 TB/s (paged 20% slower), no split 3× slower at batch 1, 5% faster at batch 64.
        let rows: Vec<Row> = grid(&o)
            .into_iter()
            .map(|c| {
                if c.bytes() / 1e9 > o.mem_cap_gb {
                    let m = Meas::na("skipped: too big");
                    return Row {
                        cell: c,
                        auto: m.clone(),
                        no_split: m,
                    };
                }
                let ms = c.bytes() / 2.5e12 * 1e3 * if c.page.is_some() { 1.2 } else { 1.0 };
                let one = if c.batch == 1 { 3.0 * ms } else { ms * 0.95 };
                Row {
                    cell: c,
                    auto: Meas::from_times(vec![ms], 1),
                    no_split: Meas::from_times(vec![one], 1),
                }
            })
            .collect();
        let flash = |b: usize, l: usize| json!({"batch": b, "cache": l, "hk": 32, "impl": "torch-flash", "ms": Cell { batch: b, cache: l, hk: 32, page: None }.bytes() / 2.0e12 * 1e3});
        let peer = Peer {
            available: true,
            version: Some("2.x".into()),
            reason: String::new(),
            results: vec![
                flash(1, 4096),
                flash(1, 131072),
                flash(64, 4096),
                json!({"batch": 1, "cache": 4096, "hk": 32, "impl": "torch-cudnn", "ms": null, "note": "RuntimeError: no / because [1, 4096]"}),
            ],
        };
        std::fs::create_dir_all(&dir).unwrap();
        let md = write(&o, "GPU", &rows, &peer).unwrap();
        assert_eq!(
            md.lines().filter(|l| l.starts_with("| ")).count(),
            1 + 12,
            "{md}"
        );
        assert!(
            md.contains("| 64 | 131072 | 32/32 | contiguous | skipped [2] |")
                && md.contains("[2] skipped: too big"),
            "{md}"
        );
        assert!(
            md.contains("[1] RuntimeError: no  \n")
                && md.contains("| 2.50 | 75% |")
                && md.contains("| 1.25× |"),
            "{md}"
        );
        // Batch 64 at 4096 is 5% slower with splits: named in the summary.
        assert!(
            md.contains("in 3 of 9 cells: batch 64 cache 4096 32/32 contiguous (0.950)"),
            "{md}"
        );
        let svg = std::fs::read_to_string(dir.join("decode_gbs.svg")).unwrap();
        assert!(
            svg.contains("ours b64 32/32 page 16")
                && svg.contains("PyTorch flash b1 32/32")
                && svg.contains("\n128k\n")
        );
        let json: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("decode.json")).unwrap())
                .unwrap();
        assert_eq!(json["rows"].as_array().unwrap().len(), 12);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
