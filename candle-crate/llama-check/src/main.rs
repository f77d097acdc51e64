//! candle-transformers 0.11.1's Llama, unchanged, on candle's attention and
//! on ours: its `flash-attn` feature calls `candle_flash_attn::flash_attn`,
//! and the workspace's `[patch.crates-io]` makes that package ours.
//!
//! One random-weight GQA model (no files: a `VarMap` initializes every
//! weight), loaded twice from the same weights: `use_flash_attn = false`
//! (candle's matmul/softmax attention, in f32) and `true` (ours). For f32
//! and bf16: prefill, then 32 steps of KV-cache decode, logits compared.
//! With `--bench` (GPU): prefill tokens/s at 512/2048/8192 tokens and
//! decode ms/token at context 1k/8k/32k, both attentions; one layer's
//! decode attention alone, and its step with the cache update: llama.rs's
//! concatenating cache vs `flash_attn_with_kvcache` on a preallocated one
//! (output checked against `flash_attn` over the concatenation).
//!
//! `llama-check [--device cpu|cuda] [--small] [--bench]`; exits non-zero
//! when a check fails.

use std::collections::HashMap;
use std::time::Instant;

use candle_core::{DType, Device, Result, Tensor};
use candle_nn::{VarBuilder, VarMap};
use candle_transformers::models::llama::{Cache, Config, Llama};

const DECODE_STEPS: usize = 32;

/// The model: GQA (4 query heads per KV head), head dim 128.
fn config(small: bool, max_pos: usize) -> Config {
    let (hidden, heads, kv_heads, layers, inter, vocab) =
        if small { (1024, 8, 2, 2, 2816, 4096) } else { (4096, 32, 8, 4, 14336, 32000) };
    Config {
        hidden_size: hidden,
        intermediate_size: inter,
        vocab_size: vocab,
        num_hidden_layers: layers,
        num_attention_heads: heads,
        num_key_value_heads: kv_heads,
        use_flash_attn: false,
        rms_norm_eps: 1e-5,
        rope_theta: 500_000.0,
        bos_token_id: None,
        eos_token_id: None,
        rope_scaling: None,
        max_position_embeddings: max_pos,
        tie_word_embeddings: false,
    }
}

/// Deterministic token ids (a 64-bit LCG).
fn tokens(n: usize, vocab: usize, seed: u64) -> Vec<u32> {
    let mut x = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((x >> 33) % vocab as u64) as u32
        })
        .collect()
}

struct Models {
    cfg: Config,
    candle: Llama,
    ours: Llama,
}

/// Both attentions over the same weights, in `dtype`.
fn models(weights: &VarMap, cfg: &Config, dtype: DType, dev: &Device) -> Result<Models> {
    let vb = if dtype == DType::F32 {
        VarBuilder::from_varmap(weights, DType::F32, dev)
    } else {
        let data = weights.data().lock().unwrap();
        let ts: HashMap<String, Tensor> =
            data.iter().map(|(k, v)| Ok((k.clone(), v.as_tensor().to_dtype(dtype)?))).collect::<Result<_>>()?;
        VarBuilder::from_tensors(ts, dtype, dev)
    };
    let candle = Llama::load(vb.clone(), &Config { use_flash_attn: false, ..cfg.clone() })?;
    let ours = Llama::load(vb, &Config { use_flash_attn: true, ..cfg.clone() })?;
    Ok(Models { cfg: cfg.clone(), candle, ours })
}

/// Logits of the prefill and of each decode step (f32 `(vocab)` each).
fn run(model: &Llama, cfg: &Config, dtype: DType, dev: &Device, prompt: &[u32], steps: &[u32]) -> Result<Vec<Tensor>> {
    let mut cache = Cache::new(true, dtype, cfg, dev)?;
    let mut out = vec![model.forward(&Tensor::new(prompt, dev)?.unsqueeze(0)?, 0, &mut cache)?.squeeze(0)?];
    for (i, &t) in steps.iter().enumerate() {
        let x = Tensor::new(&[t], dev)?.unsqueeze(0)?;
        out.push(model.forward(&x, prompt.len() + i, &mut cache)?.squeeze(0)?);
    }
    Ok(out)
}

/// `max |a − b|` and `max |b|` over all steps, and how many argmaxes agree.
fn diff(a: &[Tensor], b: &[Tensor]) -> Result<(f32, f32, usize)> {
    let (mut d, mut m, mut agree) = (0f32, 0f32, 0);
    for (x, y) in a.iter().zip(b) {
        d = d.max((x - y)?.abs()?.max_all()?.to_scalar::<f32>()?);
        m = m.max(y.abs()?.max_all()?.to_scalar::<f32>()?);
        agree += (x.argmax(0)?.to_scalar::<u32>()? == y.argmax(0)?.to_scalar::<u32>()?) as usize;
    }
    Ok((d, m, agree))
}

fn compare(weights: &VarMap, cfg: &Config, dev: &Device, prompt_len: usize) -> Result<bool> {
    let prompt = tokens(prompt_len, cfg.vocab_size, 1);
    let steps = tokens(DECODE_STEPS, cfg.vocab_size, 2);
    let n = 1 + DECODE_STEPS;
    println!(
        "## Logits: candle-transformers Llama ({} layers, {} q / {} kv heads, d = {}), prefill {prompt_len} + {DECODE_STEPS} decode steps\n",
        cfg.num_hidden_layers,
        cfg.num_attention_heads,
        cfg.num_key_value_heads,
        cfg.hidden_size / cfg.num_attention_heads
    );
    println!("| dtype | compared | max abs diff | max abs logit | rel | argmax agree | limit | ok |");
    println!("|---|---|---|---|---|---|---|---|");
    let f32m = models(weights, cfg, DType::F32, dev)?;
    let ref32 = run(&f32m.candle, &f32m.cfg, DType::F32, dev, &prompt, &steps)?;
    let ours32 = run(&f32m.ours, &f32m.cfg, DType::F32, dev, &prompt, &steps)?;
    drop(f32m);
    let (d, m, a) = diff(&ours32, &ref32)?;
    let ok32 = d <= 1e-4 * m.max(1.0);
    println!("| f32 | ours vs candle | {d:.3e} | {m:.3} | {:.2e} | {a}/{n} | rel 1e-4 | {} |", d / m, mark(ok32));

    let bf = models(weights, cfg, DType::BF16, dev)?;
    let cand16 = run(&bf.candle, &bf.cfg, DType::BF16, dev, &prompt, &steps)?;
    let ours16 = run(&bf.ours, &bf.cfg, DType::BF16, dev, &prompt, &steps)?;
    let (d, m, a) = diff(&ours16, &cand16)?;
    println!("| bf16 | ours vs candle (bf16) | {d:.3e} | {m:.3} | {:.2e} | {a}/{n} | (see next rows) | |", d / m);
    // The project's rule for 16-bit results: our bf16 model may be at most
    // twice as far from the f32 model as candle's own bf16 model is.
    let (dc, m32, ac) = diff(&cand16, &ref32)?;
    let (do_, _, ao) = diff(&ours16, &ref32)?;
    let limit = 2.0 * dc + 1e-3 * m32;
    let ok16 = do_ <= limit;
    println!("| bf16 | candle bf16 vs f32 | {dc:.3e} | {m32:.3} | {:.2e} | {ac}/{n} | | |", dc / m32);
    println!("| bf16 | ours bf16 vs f32 | {do_:.3e} | {m32:.3} | {:.2e} | {ao}/{n} | 2x candle's + 1e-3 | {} |\n", do_ / m32, mark(ok16));
    Ok(ok32 && ok16)
}

fn mark(ok: bool) -> &'static str {
    if ok { "yes" } else { "**NO**" }
}

/// Mean seconds of `reps` calls of `f` after one warm-up, synchronized.
fn time<T>(dev: &Device, reps: usize, f: impl FnMut() -> Result<T>) -> Result<f64> {
    timed(dev, reps, f, true)
}

/// Mean host seconds to enqueue `reps` calls (the GPU drained before, not after).
fn enqueue<T>(dev: &Device, reps: usize, f: impl FnMut() -> Result<T>) -> Result<f64> {
    timed(dev, reps, f, false)
}

/// `reps` calls after one warm-up and a synchronization; the clock stops
/// after a second synchronization (`until_done`) or when the last call returns.
fn timed<T>(dev: &Device, reps: usize, mut f: impl FnMut() -> Result<T>, until_done: bool) -> Result<f64> {
    f()?;
    dev.synchronize()?;
    let t = Instant::now();
    for _ in 0..reps {
        f()?;
    }
    if until_done {
        dev.synchronize()?;
    }
    let s = t.elapsed().as_secs_f64() / reps as f64;
    dev.synchronize()?;
    Ok(s)
}

fn bench(weights: &VarMap, cfg: &Config, dev: &Device) -> Result<bool> {
    let m = models(weights, cfg, DType::BF16, dev)?;
    println!("## Benchmark: bf16, batch 1, candle's attention vs ours (same model, same weights)\n");
    println!("| phase | tokens / context | candle attention | ours | speed-up |");
    println!("|---|---|---|---|---|");
    for n in [512usize, 2048, 8192] {
        let x = Tensor::new(tokens(n, cfg.vocab_size, 3).as_slice(), dev)?.unsqueeze(0)?;
        let mut tps = [0f64; 2];
        for (i, model) in [&m.candle, &m.ours].into_iter().enumerate() {
            let s = time(dev, 3, || {
                let mut cache = Cache::new(true, DType::BF16, &m.cfg, dev)?;
                model.forward(&x, 0, &mut cache)
            })?;
            tps[i] = n as f64 / s;
        }
        println!("| prefill | {n} | {:.0} tok/s | {:.0} tok/s | {:.2}x |", tps[0], tps[1], tps[1] / tps[0]);
    }
    const STEPS: usize = 16;
    for ctx in [1024usize, 8192, 32768] {
        // The context is filled by our attention (candle's would need a
        // 32k x 32k score matrix per head); both then decode from copies
        // of the same cache.
        let mut filled = Cache::new(true, DType::BF16, &m.cfg, dev)?;
        m.ours.forward(&Tensor::new(tokens(ctx, cfg.vocab_size, 4).as_slice(), dev)?.unsqueeze(0)?, 0, &mut filled)?;
        let steps = tokens(STEPS + 1, cfg.vocab_size, 5);
        let mut ms = [0f64; 2];
        for (i, model) in [&m.candle, &m.ours].into_iter().enumerate() {
            let mut cache = filled.clone();
            let x0 = Tensor::new(&[steps[0]], dev)?.unsqueeze(0)?;
            model.forward(&x0, ctx, &mut cache)?; // warm-up
            dev.synchronize()?;
            let t = Instant::now();
            for (j, &tok) in steps[1..].iter().enumerate() {
                model.forward(&Tensor::new(&[tok], dev)?.unsqueeze(0)?, ctx + 1 + j, &mut cache)?;
            }
            dev.synchronize()?;
            ms[i] = t.elapsed().as_secs_f64() * 1e3 / STEPS as f64;
        }
        println!("| decode | {ctx} | {:.2} ms/tok | {:.2} ms/tok | {:.2}x |", ms[0], ms[1], ms[0] / ms[1]);
    }
    println!();
    attention_only(cfg, dev)
}

/// One decode step's attention alone (one layer, bf16): candle's as llama.rs
/// runs it (repeat_kv, f32 matmul/softmax/matmul), ours after repeat_kv (what
/// the patched model runs), and ours on the unrepeated GQA cache. Then the
/// whole step with its cache update: llama.rs's (`Tensor::cat` of the cache
/// and the new key, repeat_kv, attention) with candle's attention and with
/// ours, against `flash_attn_with_kvcache` on a preallocated cache (the new
/// key appended in place, attention over the GQA cache as it is), whose
/// output is checked against ours over the concatenation. Returns false if
/// that check fails.
fn attention_only(cfg: &Config, dev: &Device) -> Result<bool> {
    let (h, hk) = (cfg.num_attention_heads, cfg.num_key_value_heads);
    let d = cfg.hidden_size / h;
    let scale = 1.0 / (d as f64).sqrt();
    let repeat = |x: &Tensor| -> Result<Tensor> {
        // (1, s, hk, d) -> llama.rs's repeat_kv on (1, hk, s, d) -> back.
        let x = x.transpose(1, 2)?;
        let (b, hk, s, d) = x.dims4()?;
        Tensor::cat(&vec![&x; h / hk], 2)?.reshape((b, h, s, d))?.transpose(1, 2)
    };
    let candle_attn = |q: &Tensor, k: &Tensor, v: &Tensor| -> Result<Tensor> {
        let (q, k, v) = (q.transpose(1, 2)?, repeat(k)?.transpose(1, 2)?, repeat(v)?.transpose(1, 2)?);
        let (q, k, v) = (q.to_dtype(DType::F32)?, k.to_dtype(DType::F32)?, v.to_dtype(DType::F32)?);
        let att = (q.matmul(&k.t()?)? * scale)?;
        let att = candle_nn::ops::softmax_last_dim(&att)?;
        att.matmul(&v.contiguous()?)?.to_dtype(DType::BF16)
    };
    println!("## One decode step's attention, one layer (bf16, {h} q / {hk} kv heads, d = {d}), µs\n");
    println!("| context | candle (repeat_kv + f32 matmul/softmax) | ours after repeat_kv | ours, GQA cache as is |");
    println!("|---|---|---|---|");
    let mut rows = vec![];
    let mut breakdown = vec![];
    let mut ok = true;
    for ctx in [1024usize, 8192, 32768] {
        let q = Tensor::randn(0f32, 1., (1, 1, h, d), dev)?.to_dtype(DType::BF16)?;
        let k = Tensor::randn(0f32, 1., (1, ctx, hk, d), dev)?.to_dtype(DType::BF16)?;
        let v = Tensor::randn(0f32, 1., (1, ctx, hk, d), dev)?.to_dtype(DType::BF16)?;
        let candle = time(dev, 20, || candle_attn(&q, &k, &v))?;
        let ours_rep = time(dev, 20, || candle_flash_attn::flash_attn(&q, &repeat(&k)?, &repeat(&v)?, scale as f32, false))?;
        let ours_gqa = time(dev, 20, || candle_flash_attn::flash_attn(&q, &k, &v, scale as f32, false))?;
        println!("| {ctx} | {:.0} | {:.0} | {:.0} |", candle * 1e6, ours_rep * 1e6, ours_gqa * 1e6);

        // The step with its cache update: the cache holds ctx − 1 keys,
        // one new key and value arrive.
        let (k_new, v_new) = (k.narrow(1, ctx - 1, 1)?.contiguous()?, v.narrow(1, ctx - 1, 1)?.contiguous()?);
        let (k_old, v_old) = (k.narrow(1, 0, ctx - 1)?.contiguous()?, v.narrow(1, 0, ctx - 1)?.contiguous()?);
        let cat_candle = time(dev, 20, || {
            let (kc, vc) = (Tensor::cat(&[&k_old, &k_new], 1)?, Tensor::cat(&[&v_old, &v_new], 1)?);
            candle_attn(&q, &kc, &vc)
        })?;
        let cat_ours = time(dev, 20, || {
            let (kc, vc) = (Tensor::cat(&[&k_old, &k_new], 1)?, Tensor::cat(&[&v_old, &v_new], 1)?);
            candle_flash_attn::flash_attn(&q, &repeat(&kc)?, &repeat(&vc)?, scale as f32, true)
        })?;
        // Preallocated for ctx + 64 keys; every timed call appends at row ctx − 1.
        let cap = ctx + 64;
        let k_cache = Tensor::zeros((1, cap, hk, d), DType::BF16, dev)?;
        let v_cache = Tensor::zeros((1, cap, hk, d), DType::BF16, dev)?;
        k_cache.slice_set(&k_old, 1, 0)?;
        v_cache.slice_set(&v_old, 1, 0)?;
        let lens = Tensor::new(&[(ctx - 1) as u32], dev)?;
        let step = || {
            flash_attn_candle::flash_attn_with_kvcache(&q, &k_cache, &v_cache, Some(&k_new), Some(&v_new), Some(&lens), None, scale as f32, true)
        };
        let kvcache = time(dev, 20, step)?;
        let want = candle_flash_attn::flash_attn(&q, &k, &v, scale as f32, true)?;
        let diff = (step()?.to_dtype(DType::F32)? - want.to_dtype(DType::F32)?)?.abs()?.max_all()?.to_scalar::<f32>()?;
        let row_ok = diff <= 1e-2;
        ok &= row_ok;
        rows.push((ctx, cat_candle, cat_ours, kvcache, diff, row_ok));
        // Where the step's time goes: host time to enqueue it, and attending
        // alone (the cache holds ctx keys) through the adapter and through
        // the core's own call on the same buffers.
        let full = Tensor::new(&[ctx as u32], dev)?;
        let attend = || {
            let op = flash_attn_candle::FlashAttnKvCache {
                softmax_scale: scale as f32,
                alibi_slopes: None,
                window_size_left: None,
                window_size_right: Some(0),
                softcap: None,
                num_splits: None,
            };
            let args = flash_attn_candle::KvCacheArgs { k_new: None, v_new: None, cache_seqlens: &full, cache_batch_idx: None, block_table: None };
            op.forward(&q, &k_cache, &v_cache, args).map(|(o, _)| o)
        };
        let core = core_attend(&q, &k_cache, &v_cache, ctx, scale as f32, true)?;
        let core_nomask = core_attend(&q, &k_cache, &v_cache, ctx, scale as f32, false)?;
        breakdown.push((
            ctx,
            enqueue(dev, 20, step)?,
            time(dev, 20, attend)?,
            time(dev, 20, || core.run())?,
            time(dev, 20, || core_nomask.run())?,
            enqueue(dev, 20, || core_nomask.run())?,
        ));
    }
    println!();
    println!("## One decode step with its cache update, one layer (bf16), µs\n");
    println!("| context | candle: cat + repeat_kv + attention | ours: cat + repeat_kv + flash_attn | ours: flash_attn_with_kvcache (in-place append, GQA) | speed-up vs candle | max diff vs flash_attn over the concatenation |");
    println!("|---|---|---|---|---|---|");
    for (ctx, a, b, c, diff, row_ok) in rows {
        println!("| {ctx} | {:.0} | {:.0} | {:.0} | {:.1}x | {diff:.1e} {} |", a * 1e6, b * 1e6, c * 1e6, a / c, mark(row_ok));
    }
    println!();
    println!("## Where the KV-cache step's time goes (µs per call)\n");
    println!("| context | step: host enqueue only | attend only (adapter, causal) | core `forward_kvcache_ref`, causal = true | core, no mask | core: host enqueue only |");
    println!("|---|---|---|---|---|---|");
    for (ctx, enq, attend, core, nomask, core_enq) in breakdown {
        println!("| {ctx} | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} |", enq * 1e6, attend * 1e6, core * 1e6, nomask * 1e6, core_enq * 1e6);
    }
    println!();
    Ok(ok)
}

/// The core's `forward_kvcache_ref` on copies of candle's buffers (bf16,
/// contiguous cache of batch 1, `ctx` keys), without the adapter. One query
/// row: causal or not gives the same result; the core packs the GQA heads
/// into one tile only without the mask.
struct CoreAttend {
    stream: std::sync::Arc<candle_core::cuda_backend::cudarc::driver::CudaStream>,
    fa: std::sync::Arc<flash_attn::FlashAttention>,
    q: candle_core::cuda_backend::cudarc::driver::CudaSlice<half::bf16>,
    k: candle_core::cuda_backend::cudarc::driver::CudaSlice<half::bf16>,
    v: candle_core::cuda_backend::cudarc::driver::CudaSlice<half::bf16>,
    lens: candle_core::cuda_backend::cudarc::driver::CudaSlice<i32>,
    q_layout: flash_attn::TensorLayout,
    layout: flash_attn::TensorLayout,
    params: flash_attn::ForwardParams,
}

fn core_attend(q: &Tensor, k_cache: &Tensor, v_cache: &Tensor, ctx: usize, scale: f32, causal: bool) -> Result<CoreAttend> {
    let Device::Cuda(dev) = q.device() else { candle_core::bail!("core_attend: needs the GPU") };
    let stream = dev.cuda_stream();
    let fa = flash_attn_candle::cuda::kernels(&stream)?;
    let copy = |t: &Tensor| -> Result<candle_core::cuda_backend::cudarc::driver::CudaSlice<half::bf16>> {
        let (st, _) = t.storage_and_layout();
        let candle_core::Storage::Cuda(st) = &*st else { candle_core::bail!("core_attend: needs the GPU") };
        stream.clone_dtod(st.as_cuda_slice::<half::bf16>()?).map_err(candle_core::Error::wrap)
    };
    let lens = stream.clone_htod(&[ctx as i32]).map_err(candle_core::Error::wrap)?;
    let (_, h, d) = (q.dim(0)?, q.dim(2)?, q.dim(3)?);
    let (_, cap, hk, _) = k_cache.dims4()?;
    Ok(CoreAttend {
        q: copy(q)?,
        k: copy(k_cache)?,
        v: copy(v_cache)?,
        lens,
        q_layout: flash_attn::TensorLayout::contiguous([1, 1, h, d]),
        layout: flash_attn::TensorLayout::contiguous([1, cap, hk, d]),
        params: flash_attn::ForwardParams { softmax_scale: Some(scale), causal, ..Default::default() },
        stream,
        fa,
    })
}

impl CoreAttend {
    fn run(&self) -> Result<()> {
        let cache = flash_attn::KvCacheRef::new(&self.k, &self.v, self.layout, &self.lens);
        let q = flash_attn::Tensor::new(&self.q, self.q_layout);
        self.fa
            .forward_kvcache_ref(&self.stream, q, cache, &self.params, &flash_attn::Extras::default(), flash_attn::DecodeOptions::default())
            .map(|_| ())
            .map_err(candle_core::Error::wrap)
    }
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let has = |f: &str| args.iter().any(|a| a == f);
    let dev = match args.iter().position(|a| a == "--device").and_then(|i| args.get(i + 1)).map(String::as_str) {
        Some("cpu") => Device::Cpu,
        Some("cuda") => Device::new_cuda(0)?,
        Some(other) => candle_core::bail!("--device {other}: expected cpu or cuda"),
        None => Device::cuda_if_available(0)?,
    };
    let small = has("--small") || dev.is_cpu();
    let bench_on = has("--bench");
    // Room for the 32k decode context (and its steps) when benchmarking.
    let max_pos = if bench_on { 32768 + 64 } else { 1024 };
    let cfg = config(small, max_pos);
    println!("llama-check on {dev:?}: hidden {}, {} layers\n", cfg.hidden_size, cfg.num_hidden_layers);
    let _ = dev.set_seed(299792458);
    // The weights, f32: a VarMap initializes each one on first load.
    let weights = VarMap::new();
    Llama::load(VarBuilder::from_varmap(&weights, DType::F32, &dev), &cfg)?;
    let t = Instant::now();
    let mut ok = compare(&weights, &cfg, &dev, if small { 64 } else { 256 })?;
    println!("comparison: {:.1} s", t.elapsed().as_secs_f64());
    if bench_on {
        ok &= bench(&weights, &cfg, &dev)?;
    }
    if !ok {
        candle_core::bail!("llama-check: a check failed (logits beyond the limits, or the KV-cache step; see the tables)");
    }
    println!("llama-check: ok");
    Ok(())
}
