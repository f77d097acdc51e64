//! `fa-bench-decode`: decode (one query token against a KV cache) on the
//! GPU, ours against PyTorch SDPA in the same run (issue 9's grid).
//!
//! bf16, d = 128, 32 query heads over 32 (MHA) or 8 (GQA) KV heads, batch ∈
//! {1, 8, 64} × cache length ∈ {4096, 32768, 131072}, contiguous and paged
//! (page 16 and 256, pages in a random order; `--page-order inorder|ordered|group:N|sorted:N|ranged:S:F|scattered[-ordered]:K`
//! places them otherwise). Per cell: the median of
//! CUDA-event-timed runs after warm-up (ours with automatic splits and with
//! one split in alternating halves), the L2 flushed before every run
//! outside the events (`--flush read`, the default: a kernel reads 128 MB;
//! `--flush write`: a 64 MB memset whose dirty lines are written back inside
//! the timed run — see `bench::flush`); K/V bandwidth = K and V bytes read
//! once / time, and its share of the H100's 3.35 TB/s. Ours with automatic
//! splits and with `num_splits = 1` (our FA2 without split-KV, the bar's
//! yardstick: no cell may be slower with splits than without); PyTorch SDPA
//! flash, cuDNN and efficient (GQA through `enable_gqa=True`; contiguous
//! caches only: SDPA has no paged cache) through `torch_peer.py`.
//!
//! A cell whose K+V cache exceeds `--mem-cap-gb` (60 GB: an 80 GB H100 then
//! keeps room for the split scratch and the CUDA context; PyTorch runs after
//! our buffers are freed) or the free GPU memory is skipped with the reason
//! in the table: batch 64 × 131072 × 32 KV heads needs 137 GB. The full
//! grid (51 cells run, 3 skipped) takes 23 s on the H100 with the peers.
//!
//! Output in `OUT` (default `bench-out/`): `decode.md` (the table, also on
//! stdout), `decode.json`, and `decode_gbs.svg` (GB/s against cache length:
//! ours solid per batch, heads and layout, PyTorch flash dashed).
//!
//! Usage: `fa-bench-decode [OUT] [--quick] [--batches 1,8,64] [--caches ...]
//! [--kv-heads 32,8] [--layouts contiguous,16,256] [--page-order random|inorder|ordered|group:N|sorted:N|ranged:S:F|scattered[-ordered]:K] [--reps N]
//! [--flush read|write] [--no-torch]`.

mod report;

use std::path::PathBuf;

use clap::{ArgAction, Parser};
use flash_attn_tests::bench::decode::{DecodeInputs, PageOrder};
use flash_attn_tests::bench::flush::{FlushKind, L2Flush};
use flash_attn_tests::bench::{Meas, Res, Step, Timing, time_events_runs, torch_peer};
use flash_attn_tests::{Gpu, Rng, gpu};
use serde_json::json;

const PEER: &str = include_str!("torch_peer.py");

pub use flash_attn_tests::bench::decode::{Cell, D, H};

/// fa-bench-decode: decode against a KV cache (bf16, d = 128), ours vs PyTorch SDPA
#[derive(Parser, Clone, Debug)]
#[command(name = "fa-bench-decode", args_override_self = true)]
pub struct Opts {
    /// Output folder
    #[arg(default_value = "bench-out")]
    pub out: PathBuf,
    /// Batch 1 and 8 only, 20 timed runs
    #[arg(long)]
    pub quick: bool,
    /// Batch sizes
    #[arg(long, value_name = "LIST", value_delimiter = ',', default_value = "1,8,64", action = ArgAction::Set)]
    pub batches: Vec<usize>,
    /// Cache lengths
    #[arg(long, value_name = "LIST", value_delimiter = ',', default_value = "4096,32768,131072", action = ArgAction::Set)]
    pub caches: Vec<usize>,
    /// KV heads (of 32 query heads)
    #[arg(long = "kv-heads", value_name = "LIST", value_delimiter = ',', default_value = "32,8", action = ArgAction::Set)]
    pub kv_heads: Vec<usize>,
    /// Layouts: contiguous, or a page size
    #[arg(long, value_name = "LIST", value_delimiter = ',', default_value = "contiguous,16,256", value_parser = layout, action = ArgAction::Set)]
    pub layouts: Vec<Option<usize>>,
    /// Warm-up runs per measurement
    #[arg(long, value_name = "N", default_value_t = 3)]
    pub warmup: usize,
    /// Timed runs (median) [default: 30, 20 with --quick]
    #[arg(long, value_name = "N")]
    pub reps: Option<usize>,
    /// Skip cells whose K+V cache exceeds this many GB
    #[arg(long = "mem-cap-gb", value_name = "G", default_value_t = 60.0)]
    pub mem_cap_gb: f64,
    /// Skip the PyTorch peers
    #[arg(long = "no-torch", action = ArgAction::SetFalse)]
    pub torch: bool,
    /// L2 flush before each timed run: `read` (a kernel reads 128 MB: clean
    /// lines) or `write` (a 64 MB memset: dirty lines written back inside
    /// the timed run, the earlier tables' method)
    #[arg(long, value_name = "KIND", default_value = "read", value_parser = FlushKind::parse)]
    pub flush: FlushKind,
    /// Python with torch
    #[arg(long, value_name = "PATH", default_value = "python3")]
    pub python: String,
    /// Where the pages of paged cells lie in the pool: `random` (a random
    /// permutation, as FlashAttention-2's tests draw block tables: the
    /// default), `inorder` (as FlashInfer's decode benchmark), `group:N`
    /// (shuffled within groups of N pages), `sorted:N` (random, each run of N
    /// logical pages sorted by address), `ranged:S:F` (random, each of S
    /// split shares given an address range after its first F pages),
    /// `ordered` (random, each row then through `order_block_table`) or
    /// `scattered:K` / `scattered-ordered:K` (drawn from a pool K× larger,
    /// ordered by the library or not)
    #[arg(long = "page-order", value_name = "ORDER", default_value = "random", value_parser = PageOrder::parse)]
    pub page_order: PageOrder,
    /// Turn cudarc's cross-stream event tracking off, as `fa-bench` and
    /// `fa-run` do: no event wait and record per buffer per call. Default:
    /// on, the setting of a cudarc context with a new stream and of candle
    #[arg(long = "no-event-tracking")]
    pub no_event_tracking: bool,
}

fn layout(s: &str) -> Result<Option<usize>, String> {
    match s.trim() {
        "contiguous" | "contig" | "0" => Ok(None),
        p => p
            .parse()
            .ok()
            .filter(|&p: &usize| p > 0)
            .map(Some)
            .ok_or_else(|| format!("`{s}`: contiguous or a page size")),
    }
}

impl Opts {
    pub fn reps(&self) -> usize {
        self.reps.unwrap_or(if self.quick { 20 } else { 30 })
    }
    fn timing(&self) -> Timing {
        // No time budget: every cell gets all its runs.
        Timing {
            warmup: self.warmup.max(1),
            reps: self.reps().max(1),
            budget_s: f64::INFINITY,
        }
    }
}

/// A cell's outcome on our side: with splits, without, or why not run.
pub struct Row {
    pub cell: Cell,
    pub auto: Meas,
    pub no_split: Meas,
}

pub fn grid(o: &Opts) -> Vec<Cell> {
    let mut cells = Vec::new();
    for &batch in &o.batches {
        if o.quick && batch > 8 {
            continue;
        }
        for &cache in &o.caches {
            for &hk in &o.kv_heads {
                for &page in &o.layouts {
                    cells.push(Cell {
                        batch,
                        cache,
                        hk,
                        page,
                    });
                }
            }
        }
    }
    cells
}

/// Why `c` cannot run here, if it cannot.
fn skip_reason(o: &Opts, c: &Cell, free: usize) -> Option<String> {
    // The pool of a paged cell may hold more pages than the cell reads.
    let gb = c.bytes() * c.page.map_or(1, |_| o.page_order.pool_factor()) as f64 / 1e9;
    if !H.is_multiple_of(c.hk) {
        return Some(format!(
            "skipped: {H} query heads are not a multiple of {} KV heads",
            c.hk
        ));
    }
    if c.page.is_some_and(|p| !c.cache.is_multiple_of(p)) {
        return Some(format!(
            "skipped: cache {} is not a multiple of the page",
            c.cache
        ));
    }
    if gb > o.mem_cap_gb {
        return Some(format!(
            "skipped: the K+V cache needs {gb:.1} GB > --mem-cap-gb {}",
            o.mem_cap_gb
        ));
    }
    if gb * 1e9 + 2e9 > free as f64 {
        return Some(format!(
            "skipped: the K+V cache needs {gb:.1} GB, {:.1} GB free",
            free as f64 / 1e9
        ));
    }
    None
}

/// Times one cell, with automatic splits and with `num_splits = 1`, in two
/// alternating halves each (auto, one split, auto, one split; each half
/// after its own warm-up): timed back to back, the second of two identical
/// configurations (the heuristic's own one-split calls) measured up to 2.3%
/// apart (session 12, calls 5 and 9), enough to flag a call as "slower with
/// splits" that runs no split at all.
fn measure(g: &Gpu, o: &Opts, c: &Cell, rng: &mut Rng, flush: &mut L2Flush) -> Res<(Meas, Meas)> {
    let mut inputs = DecodeInputs::with_page_order(g, *c, rng, o.page_order)?;
    let t = o.timing();
    let half = Timing { reps: t.reps.div_ceil(2), ..t };
    let mut time = |splits: Option<usize>| -> Res<Vec<f64>> {
        time_events_runs(&g.ctx, &g.stream, half, |step| match step {
            Step::Setup(_) => flush.run(&g.stream),
            Step::Timed(_) => inputs.run(g, splits, None),
        })
    };
    let (mut auto, mut one) = (time(None)?, time(Some(1))?);
    auto.extend(time(None)?);
    one.extend(time(Some(1))?);
    Ok((Meas::from_times(auto, t.reps), Meas::from_times(one, t.reps)))
}

fn us(m: &Meas) -> String {
    m.ms.map_or(format!("n/a ({})", m.note), |ms| {
        format!("{:.1} µs", ms * 1e3)
    })
}

fn main() -> Res<()> {
    let o = Opts::parse();
    std::fs::create_dir_all(&o.out)?;
    let Some(g) = gpu("fa-bench-decode") else {
        return Ok(());
    };
    if o.no_event_tracking {
        // SAFETY: every buffer of this program is used on `g.stream` alone.
        unsafe { g.ctx.disable_event_tracking() };
    }
    let cells = grid(&o);
    let device = format!(
        "{} (sm_{}{})",
        g.ctx.name()?,
        g.ctx.compute_capability()?.0,
        g.ctx.compute_capability()?.1
    );
    eprintln!(
        "fa-bench-decode: {device}, {} cells, {} timed runs each",
        cells.len(),
        o.reps()
    );
    let mut rng = Rng::with_seed(1);
    let mut flush = L2Flush::new(&g.ctx, &g.stream, o.flush)?;
    let mut rows = Vec::new();
    for (i, c) in cells.iter().enumerate() {
        let (free, _) = g.ctx.mem_get_info()?;
        let (auto, no_split) = match skip_reason(&o, c, free) {
            Some(why) => (Meas::na(why.clone()), Meas::na(why)),
            None => match measure(g, &o, c, &mut rng, &mut flush) {
                Ok(r) => r,
                Err(e) => (
                    Meas::na(format!("error: {e}")),
                    Meas::na(format!("error: {e}")),
                ),
            },
        };
        eprintln!(
            "[ours {:2}/{}] batch {:2} cache {:6} heads {H}/{:<2} {:10}: {} (no split: {})",
            i + 1,
            cells.len(),
            c.batch,
            c.cache,
            c.hk,
            c.layout(),
            us(&auto),
            us(&no_split)
        );
        rows.push(Row {
            cell: *c,
            auto,
            no_split,
        });
    }
    drop(flush);
    // PyTorch in the same run, after ours: contiguous shapes that ran on our side.
    let mut peers: Vec<Cell> = rows
        .iter()
        .filter(|r| r.auto.ms.is_some())
        .map(|r| r.cell.contiguous())
        .collect();
    peers.dedup();
    let torch = if !o.torch {
        torch_peer::Peer {
            reason: "--no-torch".into(),
            ..Default::default()
        }
    } else {
        let t = o.timing();
        let cfg = json!({
            "warmup": t.warmup, "reps": t.reps, "budget_s": 1e9, "seed": 1, "h": H, "d": D, "flush": o.flush.name(),
            "cells": peers.iter().map(|c| json!({"batch": c.batch, "cache": c.cache, "hk": c.hk})).collect::<Vec<_>>(),
        });
        torch_peer::run(&o.python, "fa-bench-decode", ("torch_peer.py", PEER), &cfg)
    };
    let md = report::write(&o, &device, &rows, &torch)?;
    println!("{md}");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_full_grid_and_the_quick_one() {
        let o = Opts::parse_from(["fa-bench-decode", "out"]);
        let cells = grid(&o);
        assert_eq!(cells.len(), 54);
        assert_eq!(o.reps(), 30);
        // Only batch 64 × 131072 × 32 KV heads is over the 60 GB cap (137 GB).
        let over: Vec<_> = cells
            .iter()
            .filter(|c| skip_reason(&o, c, usize::MAX).is_some())
            .collect();
        assert_eq!(over.len(), 3);
        assert!(
            over.iter()
                .all(|c| c.batch == 64 && c.cache == 131072 && c.hk == 32)
        );
        let q = Opts::parse_from(["fa-bench-decode", "--quick"]);
        assert_eq!(
            (grid(&q).len(), q.reps(), q.out.to_str()),
            (36, 20, Some("bench-out"))
        );
        let one = Opts::parse_from([
            "fa-bench-decode",
            "--batches",
            "64",
            "--caches",
            "131072",
            "--kv-heads",
            "8",
            "--layouts",
            "contiguous,16",
        ]);
        assert_eq!(
            grid(&one),
            [
                Cell {
                    batch: 64,
                    cache: 131072,
                    hk: 8,
                    page: None
                },
                Cell {
                    batch: 64,
                    cache: 131072,
                    hk: 8,
                    page: Some(16)
                }
            ]
        );
        assert!(Opts::try_parse_from(["fa-bench-decode", "--layouts", "x"]).is_err());
    }
}
