//! `fa-bench-fp8-decode`: decode against an FP8 (e4m3) KV cache beside the
//! same decode against the bf16 cache it was quantized from, in the same run.
//!
//! The grid of `fa-bench-decode` (bf16 q, d = 128, 32 query heads over 32 or
//! 8 KV heads, batch ∈ {1, 8, 64} × cache ∈ {4096, 32768, 131072},
//! contiguous and paged 16/256 with pages in a random order). Per cell: the
//! bf16 cache (random values), its e4m3 codes (one scale per tensor,
//! amax/448, `reference::fp8::e4m3_from_f32`), one query token per sequence;
//! ours over each, automatic splits, in alternating halves after warm-up,
//! CUDA events, the L2 flushed (a 128 MB read) before every run outside the
//! events. Bandwidth counts the K and V bytes read once (2 bytes per element
//! for bf16, 1 for e4m3) over the time; the speed-up is bf16 time / e4m3
//! time; "quant. error" is max |O_e4m3 − O_bf16| over the cell's outputs
//! (the quantization's cost, not the kernel's: the kernel's own accuracy
//! against the f64 reference of the dequantized cache is `gpu_fp8_decode`'s).
//!
//! Output: the markdown table on stdout and in `OUT/fp8_decode.md`.

use std::path::PathBuf;

use clap::{ArgAction, Parser};
use cudarc::driver::CudaSlice;
use flash_attn::reference::fp8::{e4m3_from_f32, scale_for_amax};
use flash_attn::{BlockTable, DecodeOptions, Extras, ForwardParams, KvCache, KvCacheFp8, SplitScratch, Tensor, TensorLayout};
use flash_attn_tests::bench::flush::{FlushKind, L2Flush};
use flash_attn_tests::bench::{Meas, Res, Step, Timing, time_events_runs};
use flash_attn_tests::{Gpu, Rng, gpu};

const H: usize = 32;
const D: usize = 128;
const MAX_SPLITS: usize = 128;

/// fa-bench-fp8-decode: decode over an e4m3 KV cache vs its bf16 original
#[derive(Parser, Clone, Debug)]
#[command(name = "fa-bench-fp8-decode")]
struct Opts {
    /// Output folder
    #[arg(default_value = "bench-out")]
    out: PathBuf,
    #[arg(long, value_delimiter = ',', default_value = "1,8,64", action = ArgAction::Set)]
    batches: Vec<usize>,
    #[arg(long, value_delimiter = ',', default_value = "4096,32768,131072", action = ArgAction::Set)]
    caches: Vec<usize>,
    #[arg(long = "kv-heads", value_delimiter = ',', default_value = "32,8", action = ArgAction::Set)]
    kv_heads: Vec<usize>,
    /// Page sizes; 0: contiguous
    #[arg(long, value_delimiter = ',', default_value = "0,16,256", action = ArgAction::Set)]
    layouts: Vec<usize>,
    #[arg(long, default_value_t = 3)]
    warmup: usize,
    #[arg(long, default_value_t = 30)]
    reps: usize,
    /// Skip cells whose bf16 + e4m3 caches exceed this many GB
    #[arg(long = "mem-cap-gb", default_value_t = 100.0)]
    mem_cap_gb: f64,
    /// FP8 kernels to time, by name (`DEC_F8_KERNELS`); default: the
    /// library's choice
    #[arg(long = "fp8-kernels", value_delimiter = ',', action = ArgAction::Set)]
    fp8_kernels: Vec<String>,
}

/// One cell's device buffers: the bf16 cache and its e4m3 codes (same
/// layout, element for element), q, lengths, block table, split scratch.
struct Inputs {
    kc: CudaSlice<half::bf16>,
    vc: CudaSlice<half::bf16>,
    k8: CudaSlice<u8>,
    v8: CudaSlice<u8>,
    scale: CudaSlice<f32>,
    q: CudaSlice<half::bf16>,
    seqlens: CudaSlice<i32>,
    table: CudaSlice<i32>,
    o_acc: CudaSlice<f32>,
    l_acc: CudaSlice<f32>,
    counters: CudaSlice<u32>,
    layout: TensorLayout,
    per: usize,
    batch: usize,
    paged: bool,
}

impl Inputs {
    fn new(g: &Gpu, batch: usize, cache: usize, hk: usize, page: Option<usize>, rng: &mut Rng) -> Res<Self> {
        let s = &g.stream;
        let (n_rows, rows_per) = match page {
            None => (batch, cache),
            Some(p) => (batch * cache / p, p),
        };
        let elems = n_rows * rows_per * hk * D;
        let pattern: Vec<half::bf16> = (0..elems.min(1 << 22)).map(|_| half::bf16::from_f32(rng.nonzero(1.0))).collect();
        let amax = pattern.iter().map(|x| x.to_f32().abs()).fold(0.0, f32::max);
        let scale = scale_for_amax(amax);
        let codes: Vec<u8> = pattern.iter().map(|x| e4m3_from_f32(x.to_f32() / scale)).collect();
        let (pattern, codes) = (s.clone_htod(&pattern)?, s.clone_htod(&codes)?);
        // SAFETY: filled right below, before any read.
        let (mut kc, mut vc) = unsafe { (s.alloc::<half::bf16>(elems)?, s.alloc::<half::bf16>(elems)?) };
        let (mut k8, mut v8) = unsafe { (s.alloc::<u8>(elems)?, s.alloc::<u8>(elems)?) };
        let n = pattern.len();
        let mut off = 0;
        while off < elems {
            let k = n.min(elems - off);
            for buf in [&mut kc, &mut vc] {
                s.memcpy_dtod(&pattern.slice(0..k), &mut buf.slice_mut(off..off + k))?;
            }
            for buf in [&mut k8, &mut v8] {
                s.memcpy_dtod(&codes.slice(0..k), &mut buf.slice_mut(off..off + k))?;
            }
            off += k;
        }
        let per = cache.div_ceil(rows_per);
        let mut table: Vec<i32> = (0..n_rows as i32).collect();
        for i in (1..table.len()).rev() {
            table.swap(i, rng.below(i + 1));
        }
        let q: Vec<half::bf16> = (0..batch * H * D).map(|_| half::bf16::from_f32(rng.nonzero(1.0))).collect();
        Ok(Inputs {
            kc,
            vc,
            k8,
            v8,
            scale: s.clone_htod(&[scale])?,
            q: s.clone_htod(&q)?,
            seqlens: s.clone_htod(&vec![cache as i32; batch])?,
            table: s.clone_htod(&table)?,
            o_acc: s.alloc_zeros(MAX_SPLITS * batch * H * D)?,
            l_acc: s.alloc_zeros(MAX_SPLITS * batch * H)?,
            counters: s.alloc_zeros(batch * H)?,
            layout: TensorLayout::contiguous([n_rows, rows_per, hk, D]),
            per,
            batch,
            paged: page.is_some(),
        })
    }

    /// One decode call over the bf16 cache (`fp8` false) or the e4m3 one;
    /// O returned (stream-ordered).
    fn call(&mut self, g: &Gpu, fp8: Option<Option<&'static str>>) -> Res<CudaSlice<half::bf16>> {
        let q = Tensor::new(&self.q, TensorLayout::contiguous([self.batch, 1, H, D]));
        let block_table = self.paged.then(|| BlockTable::new(&self.table, self.per));
        let scratch = SplitScratch { o_accum: &mut self.o_acc, lse_accum: &mut self.l_acc, max_splits: MAX_SPLITS, counters: Some(&mut self.counters) };
        let opts = DecodeOptions { scratch: Some(scratch), kernel: fp8.flatten(), ..Default::default() };
        let (p, e) = (ForwardParams::default(), Extras::default());
        let out = if fp8.is_some() {
            let cache = KvCacheFp8 {
                k_cache: &mut self.k8,
                v_cache: &mut self.v8,
                layout: self.layout,
                k_scale: &self.scale,
                v_scale: &self.scale,
                cache_seqlens: &self.seqlens,
                cache_batch_idx: None,
                block_table,
                k_new: None,
                v_new: None,
            };
            g.fa.forward_kvcache_fp8(&g.stream, q, cache, &p, &e, opts)?
        } else {
            let cache = KvCache { k_cache: &mut self.kc, v_cache: &mut self.vc, layout: self.layout, cache_seqlens: &self.seqlens, cache_batch_idx: None, block_table, k_new: None, v_new: None };
            g.fa.forward_kvcache(&g.stream, q, cache, &p, &e, opts)?
        };
        Ok(out.o)
    }
}

fn main() -> Res<()> {
    let o = Opts::parse();
    std::fs::create_dir_all(&o.out)?;
    let Some(g) = gpu("fa-bench-fp8-decode") else { return Ok(()) };
    if !g.fa.has_fp8_kv_cache() {
        return Err(format!("{}: no FP8 KV-cache kernels on this device", g.fa.device_name()).into());
    }
    // SAFETY: every buffer of this program is used on `g.stream` alone.
    unsafe { g.ctx.disable_event_tracking() };
    let device = format!("{} (sm_{}{})", g.ctx.name()?, g.ctx.compute_capability()?.0, g.ctx.compute_capability()?.1);
    let mut rng = Rng::with_seed(1);
    let mut flush = L2Flush::new(&g.ctx, &g.stream, FlushKind::Read)?;
    let t = Timing { warmup: o.warmup.max(1), reps: o.reps.div_ceil(2).max(1), budget_s: f64::INFINITY };
    // The FP8 kernels timed: the library's choice, or those named.
    let names: Vec<&'static str> = o.fp8_kernels.iter().map(|n| &*n.clone().leak()).collect();
    let variants: Vec<Option<&'static str>> = if names.is_empty() { vec![None] } else { names.iter().map(|n| Some(*n)).collect() };
    let head: String = variants.iter().map(|v| format!(" e4m3 µs{0} | e4m3 TB/s{0} | speed-up{0} |", v.map_or(String::new(), |n| format!(" ({n})")))).collect();
    let rule: String = variants.iter().map(|_| "---|---|---|").collect();
    let mut md = format!(
        "## Decode over an FP8 (e4m3) KV cache vs bf16 — {device}\n\nbf16 q, d {D}, {H} query heads, one token per sequence, automatic splits; median of {} CUDA-event-timed runs per cache type (alternating halves), L2 flushed before each. TB/s: K+V bytes read once / time.\n\n| batch | cache | KV heads | layout | bf16 µs | bf16 TB/s |{head} quant. error |\n|---|---|---|---|---|---|{rule}---|\n",
        2 * t.reps
    );
    for &batch in &o.batches {
        for &cache in &o.caches {
            for &hk in &o.kv_heads {
                for &lay in &o.layouts {
                    let page = (lay > 0).then_some(lay);
                    let elems = (batch * cache * hk * D) as f64;
                    let label = format!("| {batch} | {cache} | {hk} | {} |", page.map_or("contiguous".into(), |p| format!("paged {p}")));
                    let gb = elems * 2.0 * 3.0 / 1e9;
                    let (free, _) = g.ctx.mem_get_info()?;
                    if gb > o.mem_cap_gb || gb * 1e9 + 4e9 > free as f64 {
                        md += &format!("{label} skipped: the caches need {gb:.0} GB | | | | | |\n");
                        continue;
                    }
                    let mut inp = Inputs::new(g, batch, cache, hk, page, &mut rng)?;
                    let mut time = |fp8: Option<Option<&'static str>>, inp: &mut Inputs| -> Res<Vec<f64>> {
                        time_events_runs(&g.ctx, &g.stream, t, |step| match step {
                            Step::Setup(_) => flush.run(&g.stream),
                            Step::Timed(_) => inp.call(g, fp8).map(drop),
                        })
                    };
                    // bf16, then each FP8 kernel, twice over in that order.
                    let mut runs: Vec<Vec<f64>> = vec![Vec::new(); 1 + variants.len()];
                    for _ in 0..2 {
                        runs[0].extend(time(None, &mut inp)?);
                        for (k, v) in variants.iter().enumerate() {
                            runs[1 + k].extend(time(Some(*v), &mut inp)?);
                        }
                    }
                    let ms: Vec<f64> = runs.into_iter().map(|r| Meas::from_times(r, 2 * t.reps).ms.unwrap_or(f64::NAN)).collect();
                    let ob: Vec<half::bf16> = g.stream.clone_dtoh(&inp.call(g, None)?)?;
                    let of: Vec<half::bf16> = g.stream.clone_dtoh(&inp.call(g, Some(variants[0]))?)?;
                    let err = ob.iter().zip(&of).map(|(x, y)| (x.to_f32() - y.to_f32()).abs()).fold(0.0f32, f32::max);
                    let tb = ms[0];
                    let cols: String = ms[1..].iter().map(|tf| format!(" {:.1} | {:.2} | {:.2}× |", tf * 1e3, 2.0 * elems / (tf * 1e-3) / 1e12, tb / tf)).collect();
                    let row = format!("{label} {:.1} | {:.2} |{cols} {err:.2e} |\n", tb * 1e3, 2.0 * elems * 2.0 / (tb * 1e-3) / 1e12);
                    eprint!("{row}");
                    md += &row;
                }
            }
        }
    }
    std::fs::write(o.out.join("fp8_decode.md"), &md)?;
    println!("{md}");
    Ok(())
}
