//! `decode-tune`: every compiled decode kernel for bf16, d = 128 (the
//! flash-decoding configurations and the `fa2d` tile) on batch-1 and
//! batch-8 decode cells, automatic splits, L2 flushed before every run,
//! median of CUDA-event timings. The measurement behind the flash-decoding
//! default (`host-crate/src/decode_kernels.rs`, docs/perf-notes.md).
//!
//! Usage: `decode-tune [--quick]` (prints a markdown table).

use cudarc::driver::sys::CUevent_flags;
use cudarc::driver::{CudaSlice, DevicePtr};
use flash_attn::decode_kernels::DEC_KERNELS;
use flash_attn::{BlockTable, DecodeOptions, Extras, ForwardParams, KvCache, SplitScratch, Tensor, TensorLayout};
use flash_attn_tests::{Rng, gpu};

type Res<T> = Result<T, Box<dyn std::error::Error>>;

fn main() -> Res<()> {
    let quick = std::env::args().any(|a| a == "--quick");
    let Some(g) = gpu("decode-tune") else { return Ok(()) };
    let s = &g.stream;
    let (h, d, reps) = (32, 128, if quick { 10 } else { 25 });
    let fa2d = {
        let f = flash_attn::dispatch::Features { varlen: true, mods: true, decode: true };
        flash_attn::tc::TcKernel::default_for(flash_attn::tc::TcLoop::Fa2, true, d, f).unwrap().name
    };
    let mut kernels: Vec<&'static str> = DEC_KERNELS.iter().filter(|k| k.bf16 && k.d == d).map(|k| k.name).collect();
    kernels.push(fa2d);
    let mut cells = vec![];
    for (batch, cache) in [(1, 4096), (1, 32768), (1, 131072), (8, 32768)] {
        for hk in [32, 8] {
            for page in [None, Some(16), Some(256)] {
                if !quick || page != Some(16) {
                    cells.push((batch, cache, hk, page));
                }
            }
        }
    }
    let mut rng = Rng::with_seed(7);
    let mut flush: CudaSlice<u8> = s.alloc_zeros(64 << 20)?;
    let max_splits = 128;
    let mut md = format!("| batch | cache | heads | layout | {} |\n|---|---|---|---|{}\n", kernels.join(" | "), "---|".repeat(kernels.len()));
    for (batch, cache, hk, page) in cells {
        let (n_rows, rows_per) = match page {
            None => (batch, cache),
            Some(p) => (batch * cache / p, p),
        };
        let elems = n_rows * rows_per * hk * d;
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
        let q: CudaSlice<half::bf16> = s.clone_htod(&(0..batch * h * d).map(|_| half::bf16::from_f32(rng.nonzero(1.0))).collect::<Vec<_>>())?;
        let seqlens = s.clone_htod(&vec![cache as i32; batch])?;
        let mut perm: Vec<i32> = (0..n_rows as i32).collect();
        for i in (1..perm.len()).rev() {
            perm.swap(i, rng.below(i + 1));
        }
        let table = s.clone_htod(&perm)?;
        let per = cache.div_ceil(rows_per);
        let mut o_acc: CudaSlice<f32> = s.alloc_zeros(max_splits * batch * h * d)?;
        let mut l_acc: CudaSlice<f32> = s.alloc_zeros(max_splits * batch * h)?;
        let layout = TensorLayout::contiguous([n_rows, rows_per, hk, d]);
        let bytes = (2 * batch * cache * hk * d * 2) as f64;
        let mut line = format!("| {batch} | {cache} | 32/{hk} | {} |", page.map_or("contiguous".into(), |p| format!("paged {p}")));
        for &name in &kernels {
            let mut ts = vec![];
            for i in 0..reps + 3 {
                s.memset_zeros(&mut flush)?;
                let kv = KvCache {
                    k_cache: &mut kc,
                    v_cache: &mut vc,
                    layout,
                    cache_seqlens: &seqlens,
                    cache_batch_idx: None,
                    block_table: page.map(|_| BlockTable { table: &table as &dyn DevicePtr<i32>, max_blocks_per_seq: per }),
                    k_new: None,
                    v_new: None,
                };
                let scratch = SplitScratch { o_accum: &mut o_acc, lse_accum: &mut l_acc, max_splits };
                let (a, z) = (g.ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?, g.ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?);
                a.record(s)?;
                let out = g.fa.forward_kvcache::<half::bf16, _>(
                    s,
                    Tensor::new(&q, TensorLayout::contiguous([batch, 1, h, d])),
                    kv,
                    &ForwardParams::default(),
                    &Extras::default(),
                    DecodeOptions { num_splits: None, scratch: Some(scratch), kernel: Some(name) },
                )?;
                z.record(s)?;
                s.synchronize()?;
                drop(out);
                if i >= 3 {
                    ts.push(a.elapsed_ms(&z)? as f64 * 1e3);
                }
            }
            ts.sort_by(f64::total_cmp);
            let us = ts[ts.len() / 2];
            line += &format!(" {us:.1} µs {:.2} TB/s |", bytes / (us * 1e-6) / 1e12);
        }
        eprintln!("{line}");
        md += &line;
        md.push('\n');
    }
    println!("{md}");
    Ok(())
}
