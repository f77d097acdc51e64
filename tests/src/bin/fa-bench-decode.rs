//! `fa-bench-decode`: decode (one query token against a KV cache) on the
//! GPU, ours against PyTorch SDPA in the same run (issue 9's grid).
//!
//! bf16, d = 128, 32 query heads over 32 (MHA) or 8 (GQA) KV heads, batch ∈
//! {1, 8, 64} × cache length ∈ {4096, 32768, 131072}, contiguous and paged
//! (page 16 and 256, pages in a random order). Per cell: the median of
//! CUDA-event-timed runs after warm-up, the L2 flushed (a 64 MB memset)
//! before every run; K/V bandwidth = K and V bytes read once / time, and
//! its share of the H100's 3.35 TB/s. Ours with automatic splits and with
//! `num_splits = 1` (our FA2 without split-KV); PyTorch SDPA flash, cuDNN and
//! efficient (GQA through `enable_gqa=True`). Cells above 40 GB of cache are
//! skipped. Output: a markdown table on stdout and in `OUT/decode.md`,
//! JSON in `OUT/decode.json`.
//!
//! Usage: `fa-bench-decode [OUT_DIR] [--quick]`

use std::process::Command;

use cudarc::driver::sys::CUevent_flags;
use cudarc::driver::{CudaSlice, DevicePtr};
use flash_attn::{BlockTable, DecodeOptions, Extras, ForwardParams, KvCache, SplitScratch, Tensor, TensorLayout};
use flash_attn_tests::{Rng, gpu};

const PEER: &str = r#"
import json, sys, torch
import torch.nn.functional as F
from torch.nn.attention import sdpa_kernel, SDPBackend
cfgs = json.load(open(sys.argv[1])); out = []
flush = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")
B = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION}
for c in cfgs:
    b, L, h, hk, d = c["batch"], c["cache"], c["h"], c["hk"], c["d"]
    row = dict(c)
    try:
        q = torch.randn(b, 1, h, d, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
        k = torch.randn(b, L, hk, d, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
        v = torch.randn(b, L, hk, d, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
    except Exception as e:
        for n in B: row[n] = None; row[n + "_note"] = "alloc: " + str(e)[:80]
        out.append(row); continue
    for name, be in B.items():
        try:
            with sdpa_kernel([be]):
                f = lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=(h != hk))
                for _ in range(3): f()
                ts = []
                for _ in range(c["reps"]):
                    flush.zero_(); a = torch.cuda.Event(enable_timing=True); z = torch.cuda.Event(enable_timing=True)
                    a.record(); f(); z.record(); torch.cuda.synchronize(); ts.append(a.elapsed_time(z))
            ts.sort(); row[name] = ts[len(ts) // 2] * 1e3
        except Exception as e:
            row[name] = None; row[name + "_note"] = str(e).split("\n")[0][:80]
    del q, k, v; torch.cuda.empty_cache(); out.append(row)
json.dump(out, open(sys.argv[2], "w"))
"#;

struct Cell {
    batch: usize,
    cache: usize,
    hk: usize,
    page: Option<usize>,
}

const H: usize = 32;
const D: usize = 128;
const PEAK: f64 = 3.35e12;

fn bytes(c: &Cell) -> f64 {
    (2 * c.batch * c.cache * c.hk * D * 2) as f64
}

type Res<T> = Result<T, Box<dyn std::error::Error>>;

fn main() -> Res<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let quick = args.iter().any(|a| a == "--quick");
    let out_dir = std::path::PathBuf::from(args.iter().find(|a| !a.starts_with("--")).cloned().unwrap_or("bench-out".into()));
    std::fs::create_dir_all(&out_dir)?;
    let Some(g) = gpu("fa-bench-decode") else { return Ok(()) };
    let (s, reps) = (&g.stream, if quick { 20 } else { 30 });
    let mut cells = Vec::new();
    for batch in [1, 8, 64] {
        for cache in [4096, 32768, 131072] {
            for hk in [32, 8] {
                for page in [None, Some(16), Some(256)] {
                    let c = Cell { batch, cache, hk, page };
                    if bytes(&c) <= 40e9 && !(quick && batch == 64) {
                        cells.push(c);
                    }
                }
            }
        }
    }
    let mut rng = Rng::with_seed(1);
    let flush: CudaSlice<u8> = s.alloc_zeros(64 << 20)?;
    let mut flush = flush;
    let max_splits = 128;
    let mut rows = Vec::new();
    for c in &cells {
        let (n_rows, rows_per) = match c.page {
            None => (c.batch, c.cache),
            Some(p) => (c.batch * c.cache / p, p),
        };
        let elems = n_rows * rows_per * c.hk * D;
        let init: Vec<half::bf16> = (0..elems.min(1 << 22)).map(|_| half::bf16::from_f32(rng.nonzero(1.0))).collect();
        let mut kc: CudaSlice<half::bf16> = s.alloc_zeros(elems)?;
        let mut vc: CudaSlice<half::bf16> = s.alloc_zeros(elems)?;
        for buf in [&mut kc, &mut vc] {
            let mut off = 0;
            while off < elems {
                let n = init.len().min(elems - off);
                s.memcpy_htod(&init[..n], &mut buf.slice_mut(off..off + n))?;
                off += n;
            }
        }
        let q: CudaSlice<half::bf16> = s.clone_htod(&(0..c.batch * H * D).map(|_| half::bf16::from_f32(rng.nonzero(1.0))).collect::<Vec<_>>())?;
        let seqlens = s.clone_htod(&vec![c.cache as i32; c.batch])?;
        let per = c.cache.div_ceil(rows_per);
        let mut perm: Vec<i32> = (0..n_rows as i32).collect();
        for i in (1..perm.len()).rev() {
            perm.swap(i, rng.below(i + 1));
        }
        let table = s.clone_htod(&perm)?;
        let mut o_acc: CudaSlice<f32> = s.alloc_zeros(max_splits * c.batch * H * D)?;
        let mut l_acc: CudaSlice<f32> = s.alloc_zeros(max_splits * c.batch * H)?;
        let layout = TensorLayout::contiguous([n_rows, rows_per, c.hk, D]);
        let mut time = |splits: Option<usize>| -> Res<f64> {
            let mut ts = Vec::new();
            for i in 0..reps + 3 {
                s.memset_zeros(&mut flush)?;
                let cache = KvCache {
                    k_cache: &mut kc,
                    v_cache: &mut vc,
                    layout,
                    cache_seqlens: &seqlens,
                    cache_batch_idx: None,
                    block_table: c.page.map(|_| BlockTable { table: &table as &dyn DevicePtr<i32>, max_blocks_per_seq: per }),
                    k_new: None,
                    v_new: None,
                };
                let scratch = SplitScratch { o_accum: &mut o_acc, lse_accum: &mut l_acc, max_splits };
                let (a, z) = (g.ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?, g.ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?);
                a.record(s)?;
                let out = g.fa.forward_kvcache::<half::bf16, _>(
                    s,
                    Tensor::new(&q, TensorLayout::contiguous([c.batch, 1, H, D])),
                    cache,
                    &ForwardParams::default(),
                    &Extras::default(),
                    DecodeOptions { num_splits: splits, scratch: Some(scratch) },
                )?;
                z.record(s)?;
                s.synchronize()?;
                drop(out);
                if i >= 3 {
                    ts.push(a.elapsed_ms(&z)? as f64 * 1e3);
                }
            }
            ts.sort_by(f64::total_cmp);
            Ok(ts[ts.len() / 2])
        };
        let auto = time(None)?;
        let one = time(Some(1))?;
        eprintln!("batch {} cache {} heads 32/{} page {:?}: {auto:.1} µs (split 1: {one:.1} µs)", c.batch, c.cache, c.hk, c.page);
        rows.push((auto, one));
    }
    // PyTorch in the same run (contiguous cells only: SDPA has no paged cache).
    let cfg: Vec<serde_json::Value> = cells
        .iter()
        .filter(|c| c.page.is_none())
        .map(|c| serde_json::json!({"batch": c.batch, "cache": c.cache, "h": H, "hk": c.hk, "d": D, "reps": reps}))
        .collect();
    let (cfg_path, res_path, py) = (out_dir.join("decode_peer_in.json"), out_dir.join("decode_peer_out.json"), out_dir.join("decode_peer.py"));
    std::fs::write(&cfg_path, serde_json::to_string(&cfg)?)?;
    std::fs::write(&py, PEER)?;
    let ok = Command::new("python3").arg(&py).arg(&cfg_path).arg(&res_path).status().map(|s| s.success()).unwrap_or(false);
    let peer: Vec<serde_json::Value> = if ok { serde_json::from_str(&std::fs::read_to_string(&res_path)?)? } else { vec![] };
    let find = |c: &Cell, k: &str| -> Option<f64> {
        peer.iter().find(|r| r["batch"] == c.batch && r["cache"] == c.cache && r["hk"] == c.hk).and_then(|r| r[k].as_f64())
    };
    let mut md = String::from(
        "| batch | cache | heads q/kv | layout | ours µs | ours TB/s | % of 3.35 | ours split=1 µs | torch flash µs (TB/s) | cuDNN µs | efficient µs | ours / flash |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    let mut json = Vec::new();
    for (c, &(auto, one)) in cells.iter().zip(&rows) {
        let tbs = bytes(c) / (auto * 1e-6) / 1e12;
        let lay = c.page.map_or("contiguous".to_string(), |p| format!("paged {p}"));
        let pc = if c.page.is_none() { c } else { &Cell { page: None, ..*c } };
        let (fl, cu, ef) = (find(pc, "flash"), find(pc, "cudnn"), find(pc, "efficient"));
        let f = |x: Option<f64>| x.map_or("n/a".into(), |x| format!("{x:.1}"));
        let fl_s = fl.map_or("n/a".into(), |x| format!("{x:.1} ({:.2})", bytes(c) / (x * 1e-6) / 1e12));
        let ratio = fl.map_or("n/a".into(), |x| format!("{:.2}×", x / auto));
        md += &format!(
            "| {} | {} | 32/{} | {lay} | {auto:.1} | {tbs:.2} | {:.0}% | {one:.1} | {fl_s} | {} | {} | {ratio} |\n",
            c.batch,
            c.cache,
            c.hk,
            100.0 * tbs * 1e12 / PEAK,
            f(cu),
            f(ef)
        );
        json.push(serde_json::json!({"batch": c.batch, "cache": c.cache, "hk": c.hk, "page": c.page, "ours_us": auto, "ours_split1_us": one, "ours_tbs": tbs, "flash_us": fl, "cudnn_us": cu, "efficient_us": ef}));
    }
    println!("{md}");
    std::fs::write(out_dir.join("decode.md"), &md)?;
    std::fs::write(out_dir.join("decode.json"), serde_json::to_string_pretty(&json)?)?;
    Ok(())
}
