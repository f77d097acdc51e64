//! `decode-tune`: every compiled decode kernel for bf16, d = 128 (the
//! flash-decoding configurations and the `fa2d` tile) on batch-1 and
//! batch-8 decode cells, automatic splits (or `--splits N,...`: a column
//! per kernel and split count, 0 = automatic), the L2 flushed
//! before every run (`--flush read|write`, as `fa-bench-decode`), the
//! median of CUDA-event timings from the shared timing loop. The
//! measurement behind the flash-decoding default
//! (`host-crate/src/decode/kernels.rs`, docs/perf-notes.md).
//!
//! Usage: `decode-tune [--quick] [--flush read|write] [--splits N,...]
//! [--kernels SUBSTR,...] [--layouts P,...] [--cells B:CACHE:HK,...] [--page-order random|inorder|group:N,...]
//! [--no-fused] [--schedules default,static] [--no-event-tracking]
//! [--timeline [--timeline-csv FILE]] [--append] [--graph] [--order-cost]`
//! (prints a markdown table). `--graph` (with `--no-event-tracking`)
//! instead times back-to-back decode steps per cell, eager and replayed
//! from a CUDA graph.

use clap::Parser;
use flash_attn::advanced::decode::DEC_KERNELS;
use flash_attn_tests::bench::decode::{Cell, D, DecodeInputs, H, PageOrder};
use flash_attn_tests::bench::flush::{FlushKind, L2Flush};
use flash_attn::advanced::decode::timeline::WORDS as TIMELINE_WORDS;
use flash_attn_tests::bench::timeline;
use flash_attn_tests::bench::{Res, Step, Timing, time_events};
use flash_attn_tests::{Rng, gpu};

/// decode-tune: every bf16 d = 128 decode kernel side by side
#[derive(Parser, Debug)]
struct Opts {
    /// Fewer cells (no page 16) and 10 timed runs
    #[arg(long)]
    quick: bool,
    /// L2 flush before each run: read or write
    #[arg(long, default_value = "read", value_parser = FlushKind::parse)]
    flush: FlushKind,
    /// Force num_splits: a column per value, 0 = the heuristic (default: 0)
    #[arg(long, value_delimiter = ',')]
    splits: Vec<usize>,
    /// Combine split-KV partials in a second launch (no fused combine)
    #[arg(long)]
    no_fused: bool,
    /// Split schedules, a column each: `default` (the library's: key-block
    /// tickets where eligible) and `static` (`DecodeOptions::deterministic`:
    /// fixed shares); default: `default` only
    #[arg(long, value_delimiter = ',', value_parser = ["default", "static"])]
    schedules: Vec<String>,
    /// Only page sizes in this list (0: contiguous); default: all
    #[arg(long, value_delimiter = ',')]
    layouts: Vec<usize>,
    /// Only kernels whose name contains one of these
    #[arg(long, value_delimiter = ',')]
    kernels: Vec<String>,
    /// Turn cudarc's cross-stream event tracking off (as `fa-bench`)
    #[arg(long = "no-event-tracking")]
    no_event_tracking: bool,
    /// After each timing, one more call recording the flash-decoding
    /// kernel's per-block timeline; prints where the call's time goes
    #[arg(long)]
    timeline: bool,
    /// With --timeline: also write every block's record as CSV to this file
    #[arg(long, value_name = "FILE")]
    timeline_csv: Option<std::path::PathBuf>,
    /// Also time `append_kv` of one token per sequence (the append launch of
    /// a decode step with new keys), and a whole step with and without new
    /// keys and values (the default kernel), per cell
    #[arg(long)]
    append: bool,
    /// Where the pages of paged cells lie: `random` (the benchmark's
    /// permutation of the pool), `inorder`, `group:N` (shuffled within
    /// groups of N pages), `sorted:N` (random, then each run of N logical
    /// pages sorted by address) or `ranged:S:F` (random, then each of S
    /// split shares of a sequence given an address range after its first F
    /// pages), `ordered` (random, then each row through the library's
    /// `order_block_table`) or `scattered:K` / `scattered-ordered:K` (drawn
    /// from a pool K× larger, ordered or not); a row per order (default:
    /// random)
    #[arg(long, value_delimiter = ',', value_parser = PageOrder::parse)]
    page_order: Vec<PageOrder>,
    /// Instead of the kernel columns: per cell, 200 back-to-back decode
    /// steps (the library's kernel and splits, `forward_kvcache_into`, no
    /// flush) called eagerly, then the same call captured in a CUDA graph
    /// and replayed 200 times — µs per step by CUDA events and by the
    /// host's clock (what a call costs the CPU; and what validation and
    /// planning alone cost it: calls that fail just before their launch).
    /// Needs --no-event-tracking
    #[arg(long)]
    graph: bool,
    /// Per paged cell, also time `FlashAttention::order_block_table` on
    /// the device over the cell's table (the L2 flushed before each run)
    #[arg(long)]
    order_cost: bool,
    /// Only these cells, as batch:cache:kv_heads (default: all)
    #[arg(long, value_delimiter = ',', value_parser = parse_cell)]
    cells: Vec<(usize, usize, usize)>,
}

fn parse_cell(s: &str) -> Result<(usize, usize, usize), String> {
    let v: Vec<usize> = s.split(':').map(|x| x.parse().map_err(|e| format!("{s}: {e}"))).collect::<Result<_, _>>()?;
    match v[..] {
        [b, c, h] if b > 0 && c > 0 && h > 0 && H.is_multiple_of(h) => Ok((b, c, h)),
        _ => Err(format!("{s}: want batch:cache:kv_heads (kv_heads dividing {H})")),
    }
}

fn main() -> Res<()> {
    let o = Opts::parse();
    let Some(g) = gpu("decode-tune") else {
        return Ok(());
    };
    if o.no_event_tracking {
        // SAFETY: every buffer of this program is used on `g.stream` alone.
        unsafe { g.ctx.disable_event_tracking() };
    }
    if o.graph && !o.no_event_tracking {
        return Err("--graph needs --no-event-tracking (a graph cannot wait on events recorded outside it)".into());
    }
    let reps = if o.quick { 10 } else { 25 };
    let fa2d = {
        let f = flash_attn::advanced::dispatch::Features {
            varlen: true,
            mods: true,
            decode: true,
        };
        flash_attn::advanced::tc::TcKernel::default_for(flash_attn::advanced::tc::TcLoop::Fa2, true, D, f)
            .unwrap()
            .name
    };
    // Each configuration's full entry (336-byte AttnParams), then its
    // compact one (184-byte DecodeParams, `…_c`) where compiled.
    let mut kernels: Vec<&'static str> = DEC_KERNELS
        .iter()
        .filter(|k| k.bf16 && k.d == D)
        .flat_map(|k| std::iter::once(k.name).chain(k.compact))
        .collect();
    kernels.push(fa2d);
    kernels.retain(|k| o.kernels.is_empty() || o.kernels.iter().any(|s| k.contains(s.as_str())));
    let mut cells = vec![];
    let shapes: Vec<(usize, usize, usize)> = if o.cells.is_empty() {
        [(1, 4096), (1, 32768), (1, 131072), (8, 32768)].iter().flat_map(|&(b, c)| [(b, c, 32), (b, c, 8)]).collect()
    } else {
        o.cells.clone()
    };
    let splits: Vec<Option<usize>> = if o.splits.is_empty() { vec![None] } else { o.splits.iter().map(|&s| (s > 0).then_some(s)).collect() };
    let schedules: Vec<bool> = if o.schedules.is_empty() { vec![false] } else { o.schedules.iter().map(|s| s == "static").collect() };
    let mut columns: Vec<(&'static str, Option<usize>, bool)> = vec![];
    for &k in &kernels {
        for &s in &splits {
            columns.extend(schedules.iter().map(|&det| (k, s, det)));
        }
    }
    let label = |(k, s, det): (&str, Option<usize>, bool)| {
        let k = match (splits.len(), s) {
            (1, _) => k.to_string(),
            (_, None) => format!("{k} auto"),
            (_, Some(s)) => format!("{k} s{s}"),
        };
        match (schedules.len(), det) {
            (1, _) => k,
            (_, true) => format!("{k} static"),
            (_, false) => format!("{k} default"),
        }
    };
    for (batch, cache, hk) in shapes {
        for page in [None, Some(16), Some(256)] {
            if !o.quick || page != Some(16) {
                cells.push(Cell { batch, cache, hk, page });
            }
        }
    }
    let mut rng = Rng::with_seed(7);
    let mut flush = L2Flush::new(&g.ctx, &g.stream, o.flush)?;
    let timing = Timing {
        warmup: 3,
        reps,
        budget_s: f64::INFINITY,
    };
    eprintln!(
        "decode-tune: flush {}, splits {:?} (0: heuristic), fused combine {}, event tracking {}",
        o.flush.name(),
        splits,
        !o.no_fused,
        !o.no_event_tracking
    );
    let mut md = format!(
        "| batch | cache | heads | layout | {} | max abs diff to the first |\n|---|---|---|---|{}---|\n",
        columns.iter().map(|&c| label(c)).collect::<Vec<_>>().join(" | "),
        "---|".repeat(columns.len())
    );
    let mut timelines = vec![];
    let mut graph_md = String::from("| batch | cache | heads | layout | eager µs/step (events) | eager host µs/call | of which validation + plan | graph µs/step (events) | graph host µs/launch |\n|---|---|---|---|---|---|---|---|---|\n");
    let mut csv = String::from("batch,cache,kv_heads,layout,kernel,sm,split,last,start_ns,start_clk,prologue_ns,prologue_clk,loop_end_ns,loop_end_clk,stored_ns,stored_clk,counted_ns,counted_clk,end_ns,end_clk\n");
    let orders = if o.page_order.is_empty() { vec![PageOrder::Random] } else { o.page_order.clone() };
    let cells: Vec<(Cell, PageOrder)> = cells
        .into_iter()
        .flat_map(|c| {
            let n = if c.page.is_some() { orders.len() } else { 1 };
            orders[..n].iter().map(move |&po| (c, po))
        })
        .collect();
    for (c, order) in cells {
        if !o.layouts.is_empty() && !o.layouts.contains(&c.page.unwrap_or(0)) {
            continue;
        }
        let mut inputs = DecodeInputs::with_page_order(g, c, &mut rng, order)?;
        inputs.fused = !o.no_fused;
        // The placement by its `PageOrder` name (`inorder`, `group:N`,
        // `sorted:N`); the benchmark's random permutation unnamed.
        let layout = match (c.page, order) {
            (Some(_), PageOrder::Random) | (None, _) => c.layout(),
            (Some(_), _) => format!("{} {}", c.layout(), order.name()),
        };
        let mut line = format!(
            "| {} | {} | 32/{} | {} |",
            c.batch,
            c.cache,
            c.hk,
            layout
        );
        if o.graph {
            let [(ee, eh), (ge, gh), (_, ph)] = graph_rates(g, &mut inputs, 200)?;
            let row = format!("| {} | {} | 32/{} | {} | {ee:.1} | {eh:.1} | {ph:.1} | {ge:.1} | {gh:.1} |\n", c.batch, c.cache, c.hk, layout);
            eprint!("{row}");
            graph_md += &row;
            continue;
        }
        if o.append {
            let m = time_events(&g.ctx, &g.stream, timing, |step| match step {
                Step::Setup(_) => flush.run(&g.stream),
                Step::Timed(_) => inputs.append(g),
            })?;
            eprintln!("append {} {} 32/{} {}: {:.2} µs", c.batch, c.cache, c.hk, c.layout(), m.ms.unwrap_or(f64::NAN) * 1e3);
            // A whole step with new keys and values (append + attention,
            // the default kernel) beside the same step without them.
            let mut step = |with_new: bool| {
                time_events(&g.ctx, &g.stream, timing, |st| match st {
                    Step::Setup(_) => flush.run(&g.stream),
                    Step::Timed(_) if with_new => inputs.run_with_new(g),
                    Step::Timed(_) => inputs.run(g, None, None),
                })
            };
            let (with, without) = (step(true)?, step(false)?);
            eprintln!(
                "step {} {} 32/{} {}: with new k/v {:.2} µs, without {:.2} µs",
                c.batch,
                c.cache,
                c.hk,
                c.layout(),
                with.ms.unwrap_or(f64::NAN) * 1e3,
                without.ms.unwrap_or(f64::NAN) * 1e3
            );
        }
        // Every kernel's O against the first kernel's (same inputs): a
        // broken configuration shows as a large difference.
        let mut first: Option<Vec<f32>> = None;
        let mut diff = 0f32;
        for &(name, ns, det) in &columns {
            inputs.deterministic = det;
            let out = inputs.output(g, ns, Some(name))?;
            match &first {
                None => first = Some(out),
                Some(f) => diff = f.iter().zip(&out).fold(diff, |m, (a, b)| m.max((a - b).abs())),
            }
            let m = time_events(&g.ctx, &g.stream, timing, |step| match step {
                Step::Setup(_) => flush.run(&g.stream),
                Step::Timed(_) => inputs.run(g, ns, Some(name)),
            })?;
            let us = m.ms.unwrap_or(f64::NAN) * 1e3;
            line += &format!(" {us:.1} µs {:.2} TB/s |", c.bytes() / (us * 1e-6) / 1e12);
            // The timeline needs the full parameter block (a compact entry
            // cannot carry it).
            if o.timeline && !name.contains("fa2d") && !name.ends_with("_c") {
                let (summary, recs) = timeline_of(g, &mut flush, &mut inputs, ns, name)?;
                let kernel = format!("{}{}", name.trim_start_matches("flash_fwd_tc_dec_"), if det { " static" } else { "" });
                for r in &recs {
                    csv += &format!("{},{},{},{},{},{},{},{}", c.batch, c.cache, c.hk, layout, kernel, r.sm, r.split, r.last as u8);
                    for k in 0..6 {
                        csv += &format!(",{},{}", r.ns[k], r.clk[k]);
                    }
                    csv.push('\n');
                }
                timelines.push((c, layout.clone(), kernel, ns, us, summary));
            }
        }
        // Last: it reorders the cell's table (the columns above read it as placed).
        if o.order_cost && c.page.is_some() {
            let m = time_events(&g.ctx, &g.stream, timing, |step| match step {
                Step::Setup(_) => flush.run(&g.stream),
                Step::Timed(_) => inputs.order_table(g),
            })?;
            // And back to back, the table and code warm in the L2.
            let w = time_events(&g.ctx, &g.stream, timing, |step| match step {
                Step::Setup(_) => Ok(()),
                Step::Timed(_) => inputs.order_table(g),
            })?;
            eprintln!(
                "order_block_table {} {} 32/{} {}: {:.2} µs after the flush, {:.2} µs warm",
                c.batch,
                c.cache,
                c.hk,
                layout,
                m.ms.unwrap_or(f64::NAN) * 1e3,
                w.ms.unwrap_or(f64::NAN) * 1e3
            );
        }
        line += &format!(" {diff:.1e} |");
        eprintln!("{line}");
        md += &line;
        md.push('\n');
    }
    if o.graph {
        println!("## Back-to-back decode steps, eager and from a CUDA graph (200 each, no flush)\n\n{graph_md}");
        return Ok(());
    }
    println!("{md}");
    if let Some(path) = &o.timeline_csv {
        std::fs::write(path, &csv)?;
    }
    if let Some((_, _, _, _, _, first)) = timelines.first() {
        let mut t = format!(
            "| batch | cache | heads | layout | kernel | splits | event µs | {} |\n|---|---|---|---|---|---|---|{}\n",
            first.iter().map(|(k, _)| *k).collect::<Vec<_>>().join(" | "),
            "---|".repeat(first.len())
        );
        for (c, layout, name, ns, us, s) in &timelines {
            t += &format!(
                "| {} | {} | 32/{} | {} | {} | {} | {us:.1} | {} |\n",
                c.batch,
                c.cache,
                c.hk,
                layout,
                name,
                ns.map_or("auto".to_string(), |n| n.to_string()),
                s.iter().map(|(_, v)| format!("{v:.2}")).collect::<Vec<_>>().join(" | ")
            );
        }
        println!("## Timeline (µs from the first block's start; durations inside a block by the SM clock)\n\n{t}");
    }
    Ok(())
}

/// One flushed call with a per-block timeline, summed up.
#[allow(clippy::type_complexity)]
fn timeline_of(g: &flash_attn_tests::Gpu, flush: &mut L2Flush, inputs: &mut DecodeInputs, ns: Option<usize>, name: &'static str) -> Res<(Vec<(&'static str, f64)>, Vec<timeline::Block>)> {
    let mut words = g.stream.alloc_zeros::<u64>(TIMELINE_WORDS * 65536)?;
    flush.run(&g.stream)?;
    inputs.run_timeline(g, ns, Some(name), &mut words)?;
    let host = g.stream.clone_dtoh(&words)?;
    let recs = timeline::blocks(&host);
    Ok((timeline::summary(&recs), recs))
}

/// `n` back-to-back decode steps of `inputs` (`DecodeInputs::run_into`)
/// called eagerly, then the same call captured in a CUDA graph and replayed
/// `n` times: (µs per step by CUDA events, µs per call or launch by the
/// host's clock) for each; third, `n` calls that validate and plan and then
/// fail before their launch ([`DecodeInputs::plan_only`]: the host's own
/// share of a call).
fn graph_rates(g: &flash_attn_tests::Gpu, inputs: &mut DecodeInputs, n: usize) -> Res<[(f64, f64); 3]> {
    let s = &g.stream;
    let rate = |launch: &mut dyn FnMut() -> Res<()>| -> Res<(f64, f64)> {
        launch()?;
        s.synchronize()?;
        let ev = || g.ctx.new_event(Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT));
        let (a, z) = (ev()?, ev()?);
        a.record(s)?;
        let t = std::time::Instant::now();
        for _ in 0..n {
            launch()?;
        }
        let host = t.elapsed().as_secs_f64() * 1e6 / n as f64;
        z.record(s)?;
        s.synchronize()?;
        Ok((a.elapsed_ms(&z)? as f64 * 1e3 / n as f64, host))
    };
    let eager = rate(&mut || inputs.run_into(g))?;
    let plan = rate(&mut || inputs.plan_only(g))?;
    s.begin_capture(cudarc::driver::sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)?;
    let captured = inputs.run_into(g);
    let graph = s.end_capture(cudarc::driver::sys::CUgraphInstantiate_flags(0));
    captured?;
    let graph = graph?.ok_or("stream capture gave no graph")?;
    graph.upload()?;
    let replay = rate(&mut || Ok(graph.launch()?))?;
    Ok([eager, replay, plan])
}
