//! The training proof (issue 30, item 7): a small GPT (candle-nn layers,
//! causal self-attention) trained on a synthetic copy task twice from the
//! same initialization and the same batches: once with our attention
//! (`flash_attn_candle::flash_attn`, whose `CustomOp3::bwd` runs the
//! backward kernels) and once with candle's own attention (matmul, mask,
//! softmax, matmul, through candle's autograd). Prints both loss curves
//! every 10 steps and the tokens/s of both.
//!
//! The task: each sequence is `L` random tokens followed by the same `L`
//! tokens again; the loss is on the second half (which only attention can
//! predict: the induction/copy pattern).
//!
//! ```text
//! cargo run --release --example train_gpt -- --device cpu --steps 20     # tiny, f32 (CI smoke test)
//! cargo run --release --no-default-features --features cuda --example train_gpt -- --device cuda   # bf16
//! ```

use std::collections::HashMap;
use std::time::Instant;

use candle_core::{D, DType, Device, Result, Tensor};
use candle_nn::{AdamW, Embedding, Linear, Module, Optimizer, ParamsAdamW, VarBuilder, VarMap};

/// Model and run sizes.
#[derive(Clone, Copy, Debug)]
struct Config {
    vocab: usize,
    seq: usize,
    batch: usize,
    dim: usize,
    heads: usize,
    layers: usize,
    steps: usize,
    lr: f64,
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Attention {
    Ours,
    Candle,
}

/// LayerNorm over the last axis from candle-core ops (so autograd sees every step).
struct Norm {
    w: Tensor,
    b: Tensor,
}

impl Norm {
    fn new(vb: VarBuilder, dim: usize) -> Result<Self> {
        Ok(Self { w: vb.get_with_hints(dim, "weight", candle_nn::Init::Const(1.0))?, b: vb.get_with_hints(dim, "bias", candle_nn::Init::Const(0.0))? })
    }

    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let dt = x.dtype();
        let x = x.to_dtype(DType::F32)?;
        let mu = x.mean_keepdim(D::Minus1)?;
        let xc = x.broadcast_sub(&mu)?;
        let var = xc.sqr()?.mean_keepdim(D::Minus1)?;
        let y = xc.broadcast_div(&(var + 1e-5)?.sqrt()?)?.to_dtype(dt)?;
        y.broadcast_mul(&self.w)?.broadcast_add(&self.b)
    }
}

struct Block {
    ln1: Norm,
    qkv: Linear,
    proj: Linear,
    ln2: Norm,
    fc: Linear,
    out: Linear,
}

struct Gpt {
    tok: Embedding,
    pos: Embedding,
    blocks: Vec<Block>,
    ln: Norm,
    head: Linear,
    cfg: Config,
    /// `(seq, seq)`: 0 where a query sees a key, −inf above the diagonal
    /// (candle's attention).
    mask: Tensor,
}

impl Gpt {
    fn new(vb: VarBuilder, cfg: Config, dev: &Device, dtype: DType) -> Result<Self> {
        let c = cfg.dim;
        let blocks = (0..cfg.layers)
            .map(|i| {
                let vb = vb.pp(format!("h{i}"));
                Ok(Block {
                    ln1: Norm::new(vb.pp("ln1"), c)?,
                    qkv: candle_nn::linear(c, 3 * c, vb.pp("qkv"))?,
                    proj: candle_nn::linear(c, c, vb.pp("proj"))?,
                    ln2: Norm::new(vb.pp("ln2"), c)?,
                    fc: candle_nn::linear(c, 4 * c, vb.pp("fc"))?,
                    out: candle_nn::linear(4 * c, c, vb.pp("out"))?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let t = cfg.seq;
        let mask: Vec<f32> = (0..t * t).map(|ij| if ij % t > ij / t { f32::NEG_INFINITY } else { 0.0 }).collect();
        Ok(Self {
            tok: candle_nn::embedding(cfg.vocab, c, vb.pp("tok"))?,
            pos: candle_nn::embedding(t, c, vb.pp("pos"))?,
            blocks,
            ln: Norm::new(vb.pp("ln"), c)?,
            head: candle_nn::linear(c, cfg.vocab, vb.pp("head"))?,
            cfg,
            mask: Tensor::from_vec(mask, (t, t), dev)?.to_dtype(dtype)?,
        })
    }

    /// Causal self-attention of `(b, t, h, d)` q, k, v.
    fn attention(&self, q: &Tensor, k: &Tensor, v: &Tensor, which: Attention) -> Result<Tensor> {
        let d = q.dim(3)?;
        let scale = 1.0 / (d as f64).sqrt();
        match which {
            Attention::Ours => flash_attn_candle::flash_attn(q, k, v, scale as f32, true),
            Attention::Candle => {
                let (q, k, v) = (q.transpose(1, 2)?.contiguous()?, k.transpose(1, 2)?.contiguous()?, v.transpose(1, 2)?.contiguous()?);
                let att = (q.matmul(&k.t()?)? * scale)?.broadcast_add(&self.mask)?;
                let p = candle_nn::ops::softmax(&att, D::Minus1)?;
                p.matmul(&v)?.transpose(1, 2)
            }
        }
    }

    /// Logits `(b·t, vocab)` of token ids `(b, t)`.
    fn forward(&self, ids: &Tensor, which: Attention) -> Result<Tensor> {
        let (b, t) = ids.dims2()?;
        let (c, h) = (self.cfg.dim, self.cfg.heads);
        let pos = Tensor::arange(0u32, t as u32, ids.device())?;
        let mut x = self.tok.forward(ids)?.broadcast_add(&self.pos.forward(&pos)?)?;
        for blk in &self.blocks {
            let qkv = blk.qkv.forward(&blk.ln1.forward(&x)?)?.reshape((b, t, 3, h, c / h))?;
            let (q, k, v) = (qkv.narrow(2, 0, 1)?.squeeze(2)?, qkv.narrow(2, 1, 1)?.squeeze(2)?, qkv.narrow(2, 2, 1)?.squeeze(2)?);
            let y = self.attention(&q, &k, &v, which)?.reshape((b, t, c))?;
            x = (x + blk.proj.forward(&y)?)?;
            let m = blk.out.forward(&blk.fc.forward(&blk.ln2.forward(&x)?)?.gelu()?)?;
            x = (x + m)?;
        }
        self.head.forward(&self.ln.forward(&x)?)?.reshape((b * t, self.cfg.vocab))
    }
}

/// SplitMix64 for the synthetic data (the same batches for both runs).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

/// One batch of the copy task: inputs `(b, t)`, targets `(b·(t/2 − 1))` of
/// the second half and the positions whose logits predict them.
fn batch(rng: &mut Rng, cfg: &Config, dev: &Device) -> Result<(Tensor, Tensor, Tensor)> {
    let (b, t, half) = (cfg.batch, cfg.seq, cfg.seq / 2);
    let mut ids = vec![0u32; b * t];
    for r in 0..b {
        for i in 0..half {
            let tok = (rng.next() % cfg.vocab as u64) as u32;
            ids[r * t + i] = tok;
            ids[r * t + half + i] = tok;
        }
    }
    // Position p (p ≥ half) predicts token p + 1 (both in the second half).
    let (mut at, mut target) = (Vec::new(), Vec::new());
    for r in 0..b {
        for p in half..t - 1 {
            at.push((r * t + p) as u32);
            target.push(ids[r * t + p + 1]);
        }
    }
    let n = at.len();
    Ok((Tensor::from_vec(ids, (b, t), dev)?, Tensor::from_vec(at, n, dev)?, Tensor::from_vec(target, n, dev)?))
}

/// Trains from `init`; returns the losses every 10 steps (and the last) and
/// tokens/s over the steps after the first.
fn train(model: &Gpt, varmap: &VarMap, init: &HashMap<String, Tensor>, which: Attention, dev: &Device) -> Result<(Vec<(usize, f32)>, f64)> {
    let vars = {
        let data = varmap.data().lock().unwrap_or_else(|e| e.into_inner());
        for (name, var) in data.iter() {
            var.set(&init[name])?;
        }
        data.values().cloned().collect::<Vec<_>>()
    };
    let mut opt = AdamW::new(vars, ParamsAdamW { lr: model.cfg.lr, weight_decay: 0.0, ..Default::default() })?;
    let mut rng = Rng(2026);
    let mut losses = Vec::new();
    let cfg = model.cfg;
    // Tokens/s from the second step on: the first loads (and, for PTX
    // without prebuilt machine code, JIT-compiles) each path's kernels.
    let mut start = Instant::now();
    for step in 0..cfg.steps {
        if step == 1 {
            dev.synchronize()?;
            start = Instant::now();
        }
        let (ids, at, target) = batch(&mut rng, &cfg, dev)?;
        let logits = model.forward(&ids, which)?.index_select(&at, 0)?.to_dtype(DType::F32)?;
        let loss = candle_nn::loss::cross_entropy(&logits, &target)?;
        opt.backward_step(&loss)?;
        if step % 10 == 0 || step + 1 == cfg.steps {
            losses.push((step, loss.to_scalar::<f32>()?));
        }
    }
    dev.synchronize()?;
    let tokens = (cfg.steps.saturating_sub(1) * cfg.batch * cfg.seq) as f64;
    Ok((losses, tokens / start.elapsed().as_secs_f64()))
}

/// Both runs on `device` (`cpu`: tiny, f32; `cuda`: bf16); prints the
/// curves and tokens/s; returns the largest |Δloss| and the first and last
/// losses of ours.
fn run(device: &str, steps: Option<usize>) -> Result<(f32, f32, f32)> {
    let (dev, dtype, mut cfg) = match device {
        "cpu" => (Device::Cpu, DType::F32, Config { vocab: 16, seq: 16, batch: 8, dim: 32, heads: 2, layers: 2, steps: 200, lr: 3e-3 }),
        "cuda" => (Device::new_cuda(0)?, DType::BF16, Config { vocab: 64, seq: 256, batch: 32, dim: 256, heads: 4, layers: 4, steps: 200, lr: 1e-3 }),
        other => return Err(candle_core::Error::Msg(format!("--device {other}: expected cpu or cuda"))),
    };
    if let Some(s) = steps {
        cfg.steps = s;
    }
    println!("train_gpt on {device} ({dtype:?}): {cfg:?}");
    let varmap = VarMap::new();
    let vb = VarBuilder::from_varmap(&varmap, dtype, &dev);
    let model = Gpt::new(vb, cfg, &dev, dtype)?;
    // The initialization both runs start from.
    let init: HashMap<String, Tensor> = varmap
        .data()
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
        .map(|(n, v)| Ok((n.clone(), v.as_tensor().copy()?)))
        .collect::<Result<_>>()?;
    let (ours, ours_tps) = train(&model, &varmap, &init, Attention::Ours, &dev)?;
    let (theirs, theirs_tps) = train(&model, &varmap, &init, Attention::Candle, &dev)?;
    println!("{:>5}  {:>10}  {:>10}  {:>9}", "step", "ours", "candle", "|Δ|");
    let mut worst = 0.0f32;
    for ((step, a), (_, b)) in ours.iter().zip(&theirs) {
        worst = worst.max((a - b).abs());
        println!("{step:>5}  {a:>10.4}  {b:>10.4}  {:>9.4}", (a - b).abs());
    }
    let (first, last) = (ours[0].1, ours.last().map_or(f32::NAN, |l| l.1));
    println!("largest |Δloss| {worst:.4}; first loss {first:.4}, last: ours {last:.4}, candle {:.4}", theirs.last().map_or(f32::NAN, |l| l.1));
    println!("tokens/s (whole training step): ours {ours_tps:.0}, candle {theirs_tps:.0} ({:.2}x)", ours_tps / theirs_tps);
    Ok((worst, first, last))
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let arg = |name: &str| args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).cloned();
    let device = arg("--device").unwrap_or_else(|| "cpu".into());
    let steps = match arg("--steps") {
        Some(s) => Some(s.parse().map_err(|e| candle_core::Error::Msg(format!("--steps {s}: {e}")))?),
        None => None,
    };
    let (worst, first, last) = run(&device, steps)?;
    let learned = last < first; // false for NaN too
    if !learned || !worst.is_finite() {
        return Err(candle_core::Error::Msg("training did not lower the loss".into()));
    }
    Ok(())
}

/// The CI smoke test (`cargo test` runs it: `test = true` in Cargo.toml):
/// 60 steps on the CPU, both curves equal within f32 rounding, the loss down.
#[test]
fn cpu_smoke() -> Result<()> {
    let (worst, first, last) = run("cpu", Some(60))?;
    assert!(worst < 1e-2, "the two loss curves differ by {worst}");
    assert!(last < first, "the loss did not go down: {first} → {last}");
    Ok(())
}
