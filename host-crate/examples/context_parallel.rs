//! Context-parallel (ring) attention across the GPUs of one machine over
//! NCCL: one process drives every GPU (one compute and one communication
//! stream each), each GPU holds a zigzag shard of the sequence, K/V shards
//! travel around the ring while each GPU attends to the one it holds.
//!
//! ```sh
//! cargo run --release -p flash-attn --features nccl --example context_parallel -- --gpus 2 --seqlen 131072
//! cargo run --release -p flash-attn --features nccl --example context_parallel -- --bench    # cargo xtask bench-cp
//! ```
//!
//! `--backward`: the ring's backward too (`ring_backward`: the K/V ring
//! again, dK/dV sums travelling home on a second ring), its dQ, dK, dV
//! checked against one GPU's backward over the whole sequence (and, with
//! `--check-ref`, against the f64 reference by FlashAttention-2's rule),
//! timed beside the forward: backward and forward + backward efficiency.
//!
//! `--ulysses`: DeepSpeed-Ulysses instead of the ring (`ulysses_forward`,
//! `ulysses_backward`: all-to-alls over heads, contiguous shards; the head
//! counts must divide by the GPUs).
//!
//! `--docs N`: a packed varlen batch of `N` documents of random lengths
//! (multiples of 128 tokens) summing to `--seqlen`, each sharded over the
//! ranks (`RingRank::new_varlen`), against one GPU's varlen attention.
//!
//! `--procs`: one process per GPU instead (this process launches one per
//! rank, each joining with `Comm::from_rank` and an NCCL id passed through
//! a file), the other way trainers launch.
//!
//! Every run checks the ring's `O` and `LSE` against one GPU's attention
//! over the whole sequence, on fresh random inputs; `--check-ref` also
//! checks both against the f64 CPU reference (a small sequence, one GQA
//! group of heads) with FlashAttention-2's rule (the ring's error at most
//! twice one GPU's). Times: CUDA events on each GPU's compute stream around
//! the whole ring (the slowest GPU counts), median of `--iters` after a
//! warm-up. The ring's transfers are also timed alone (the same NCCL groups
//! without the attention), and given as a share of the ring's time: the
//! most they can cost if none of them hides behind compute. Set
//! `NCCL_NVLS_ENABLE=0` (no NVLink multicast) on shared
//! machines; libnccl.so.2 must be on the loader's path (PyTorch's wheel
//! ships it under `nvidia/nccl/lib`).

use std::sync::Arc;

use cudarc::driver::sys::CUevent_flags;
use cudarc::driver::{CudaContext, CudaSlice, CudaStream};
use cudarc::nccl::{Comm, Id};
use flash_attn::context_parallel::nccl::{
    RingGradInputs, RingGrads, RingRank, RingShape, UlyssesRank, ring_backward, ring_forward, ulysses_backward, ulysses_forward,
};
use flash_attn::context_parallel::{ShardPlan, Sharding};
use flash_attn::{BackwardParams, Extras, FlashAttention, FlashAttnError, ForwardParams, StatsMut, Tensor, TensorLayout, TensorMut, Varlen};
use half::bf16;

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

#[derive(Clone, Debug)]
struct Args {
    gpus: usize,
    seqlen: usize,
    batch: usize,
    nheads: usize,
    nheads_k: usize,
    headdim: usize,
    sharding: Sharding,
    causal: bool,
    iters: usize,
    bench: bool,
    check_ref: bool,
    /// Also the backward: the ring's gradients against one GPU's.
    backward: bool,
    /// Ulysses (all-to-all over heads, contiguous shards) instead of the ring.
    ulysses: bool,
    /// One process per GPU (this process launches them).
    procs: bool,
    /// The inputs' seed (fresh per run unless given; passed to launched ranks).
    seed: u64,
    /// Documents of a packed varlen batch (0: one dense sequence per batch entry).
    docs: usize,
    /// A launched rank: its index and the folder of the NCCL id and results.
    child: Option<(usize, String)>,
}

fn parse_args() -> Result<Args> {
    let mut a = Args {
        gpus: 0,
        seqlen: 131072,
        batch: 1,
        nheads: 32,
        nheads_k: 8,
        headdim: 128,
        sharding: Sharding::Zigzag,
        causal: true,
        iters: 5,
        bench: false,
        check_ref: false,
        backward: false,
        ulysses: false,
        procs: false,
        seed: std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(1, |d| d.as_nanos() as u64),
        docs: 0,
        child: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut num = |name: &str| -> Result<usize> {
            let v = it.next().ok_or(format!("{name} needs a value"))?;
            Ok(v.parse().map_err(|e| format!("{name} {v}: {e}"))?)
        };
        match flag.as_str() {
            "--gpus" => a.gpus = num("--gpus")?,
            "--seqlen" => a.seqlen = num("--seqlen")?,
            "--batch" => a.batch = num("--batch")?,
            "--nheads" => a.nheads = num("--nheads")?,
            "--nheads-k" => a.nheads_k = num("--nheads-k")?,
            "--headdim" => a.headdim = num("--headdim")?,
            "--iters" => a.iters = num("--iters")?,
            "--seed" => a.seed = num("--seed")? as u64,
            "--docs" => a.docs = num("--docs")?,
            "--contiguous" => a.sharding = Sharding::Contiguous,
            "--non-causal" => a.causal = false,
            "--bench" => a.bench = true,
            "--check-ref" => a.check_ref = true,
            "--backward" => a.backward = true,
            "--ulysses" => a.ulysses = true,
            "--procs" => a.procs = true,
            "--child" => {
                let rank = num("--child")?;
                let dir = it.next().ok_or("--child needs a rank and a folder")?;
                a.child = Some((rank, dir));
            }
            "-h" | "--help" => {
                println!(
                    "context_parallel [--gpus N] [--seqlen S] [--batch B] [--nheads H] [--nheads-k HK] [--headdim D] \
                     [--contiguous] [--non-causal] [--iters I] [--bench] [--check-ref] [--procs] [--backward] [--ulysses] [--docs N]"
                );
                std::process::exit(0);
            }
            other => return Err(format!("unknown argument `{other}` (--help)").into()),
        }
    }
    if a.docs > 0 {
        if a.ulysses || a.batch != 1 {
            return Err("--docs packs one varlen batch for the ring: batch 1, no --ulysses".into());
        }
        if !a.seqlen.is_multiple_of(DOC_UNIT) || a.seqlen / DOC_UNIT < a.docs {
            return Err(format!("--docs {} needs --seqlen a multiple of {DOC_UNIT}, at least {DOC_UNIT} per document", a.docs).into());
        }
    }
    if a.ulysses {
        if a.procs {
            return Err("--ulysses runs with one process driving every GPU".into());
        }
        // Ulysses' shards are contiguous: after its all-to-all every rank holds the sequence in order.
        a.sharding = Sharding::Contiguous;
    }
    Ok(a)
}

/// Uniform bf16 in [−1, 1) from a SplitMix64 stream per 1 Mi-element chunk,
/// filled by every core.
fn random_bf16(len: usize, seed: u64) -> Vec<bf16> {
    let mut v = vec![bf16::ZERO; len];
    const CHUNK: usize = 1 << 20;
    std::thread::scope(|s| {
        let threads = std::thread::available_parallelism().map_or(4, |n| n.get());
        let chunks: Vec<(usize, &mut [bf16])> = v.chunks_mut(CHUNK).enumerate().collect();
        let per = chunks.len().div_ceil(threads).max(1);
        let mut rest = chunks;
        while !rest.is_empty() {
            let batch: Vec<_> = rest.drain(..per.min(rest.len())).collect();
            s.spawn(move || {
                for (i, c) in batch {
                    let mut x = seed ^ (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
                    for e in c.iter_mut() {
                        x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
                        let mut z = x;
                        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
                        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
                        z ^= z >> 31;
                        *e = bf16::from_f32((z >> 40) as f32 / (1u64 << 23) as f32 - 1.0);
                    }
                }
            });
        }
    });
    v
}

/// Rank `rank`'s shard of a `(batch, seqlen, heads, d)` host tensor (`row`
/// = heads·d elements per token).
fn shard(plan: &ShardPlan, x: &[bf16], batch: usize, seqlen: usize, row: usize, rank: usize) -> Vec<bf16> {
    let mut out = Vec::with_capacity(x.len() / plan.ranks());
    for b in 0..batch {
        for r in plan.rows_of(rank) {
            out.extend_from_slice(&x[(b * seqlen + r.start) * row..(b * seqlen + r.end) * row]);
        }
    }
    out
}

/// The whole `(batch, seqlen, ·)` tensor from the ranks' shards (the
/// inverse of [`shard`]); `row` elements per token.
fn unshard<E: Copy + Default>(plan: &ShardPlan, parts: &[Vec<E>], batch: usize, seqlen: usize, row: usize) -> Vec<E> {
    let mut out = vec![E::default(); batch * seqlen * row];
    let local = seqlen / plan.ranks();
    for (rank, part) in parts.iter().enumerate() {
        for b in 0..batch {
            let mut pos = b * local * row;
            for r in plan.rows_of(rank) {
                let n = r.len() * row;
                out[(b * seqlen + r.start) * row..][..n].copy_from_slice(&part[pos..pos + n]);
                pos += n;
            }
        }
    }
    out
}

fn timing_event(s: &Arc<CudaStream>) -> std::result::Result<cudarc::driver::CudaEvent, cudarc::driver::DriverError> {
    s.record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
}

/// The slowest GPU's time between events `t0[i]` and `t1[i]` recorded on
/// `streams[i]` (each stream synchronized first).
fn slowest_ms(streams: &[Arc<CudaStream>], t0: &[cudarc::driver::CudaEvent], t1: &[cudarc::driver::CudaEvent]) -> Result<f64> {
    let mut slowest = 0f64;
    for (s, (e0, e1)) in streams.iter().zip(t0.iter().zip(t1)) {
        s.synchronize()?;
        slowest = slowest.max(e0.elapsed_ms(e1)? as f64);
    }
    Ok(slowest)
}

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

/// `‖a − b‖ / ‖b‖` in f64.
fn rel_err(a: impl Iterator<Item = f64>, b: impl Iterator<Item = f64>) -> f64 {
    let (mut num, mut den) = (0.0, 0.0);
    for (x, y) in a.zip(b) {
        num += (x - y) * (x - y);
        den += y * y;
    }
    (num / den).sqrt()
}

/// Document lengths are multiples of this (2·N chunks for 1, 2, 4, 8 GPUs).
const DOC_UNIT: usize = 128;

/// The documents along the sequence: `[seqlen]`, or with `--docs N` N random
/// lengths (multiples of [`DOC_UNIT`], from the run's seed) summing to it.
fn doc_lengths(a: &Args) -> Vec<usize> {
    if a.docs == 0 {
        return vec![a.seqlen];
    }
    let units = a.seqlen / DOC_UNIT;
    // N − 1 distinct cut points among the units (SplitMix64 from the seed).
    let mut x = a.seed ^ 0xd0c5;
    let mut cuts = std::collections::BTreeSet::new();
    while cuts.len() < a.docs - 1 {
        x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        cuts.insert(1 + ((z ^ (z >> 31)) % (units as u64 - 1).max(1)) as usize);
    }
    let mut ends: Vec<usize> = cuts.into_iter().collect();
    ends.push(units);
    let mut prev = 0;
    ends.into_iter().map(|e| { let l = (e - prev) * DOC_UNIT; prev = e; l }).collect()
}

/// `cu_seqlens` of the documents.
fn cu_seqlens(docs: &[usize]) -> Vec<i32> {
    std::iter::once(0).chain(docs.iter().scan(0, |acc, &l| { *acc += l as i32; Some(*acc) })).collect()
}

/// Causal halves the FLOPs: `4·B·H·N²·d` (the sum over the documents of a
/// varlen batch), halved when causal (the papers' count).
fn flops(a: &Args) -> f64 {
    let n2: f64 = doc_lengths(a).iter().map(|&l| (l as f64).powi(2)).sum();
    let f = 4.0 * a.batch as f64 * a.nheads as f64 * n2 * a.headdim as f64;
    if a.causal { f / 2.0 } else { f }
}

/// The ring's sharding of the run's documents over `gpus` ranks.
fn plan_of(a: &Args, gpus: usize) -> std::result::Result<ShardPlan, FlashAttnError> {
    ShardPlan::new(a.sharding, gpus, &doc_lengths(a))
}

/// One GPU over the whole sequence: `(o, lse, median ms)`.
fn one_gpu(a: &Args, ctx: &Arc<CudaContext>, q: &[bf16], k: &[bf16], v: &[bf16]) -> Result<(Vec<bf16>, Vec<f32>, f64)> {
    let fa = FlashAttention::new(ctx)?;
    let s = ctx.new_stream()?;
    let (qd, kd, vd) = (s.clone_htod(q)?, s.clone_htod(k)?, s.clone_htod(v)?);
    let lq = TensorLayout::contiguous([a.batch, a.seqlen, a.nheads, a.headdim]);
    let lk = TensorLayout::contiguous([a.batch, a.seqlen, a.nheads_k, a.headdim]);
    let mut o = s.alloc_zeros::<bf16>(q.len())?;
    let mut lse = s.alloc_zeros::<f32>(a.batch * a.nheads * a.seqlen)?;
    let params = ForwardParams { causal: a.causal, ..Default::default() };
    let docs = doc_lengths(a);
    let cu = s.clone_htod(&cu_seqlens(&docs))?;
    let max = docs.iter().copied().max().unwrap_or(0);
    let varlen = Varlen { cu_seqlens_q: &cu, cu_seqlens_k: &cu, max_seqlen_q: max, max_seqlen_k: max, seqused_k: None };
    let (vq, vk) = (TensorLayout::varlen(a.seqlen, a.nheads, a.headdim), TensorLayout::varlen(a.seqlen, a.nheads_k, a.headdim));
    let mut times = Vec::new();
    for i in 0..a.iters + 1 {
        let t0 = timing_event(&s)?;
        if a.docs > 0 {
            let (qt, kt, vt) = (Tensor::new(&qd, vq), Tensor::new(&kd, vk), Tensor::new(&vd, vk));
            fa.forward_varlen_into(&s, qt, kt, vt, TensorMut::new(&mut o, vq), &mut lse, &varlen, &params, &Extras::default())?;
        } else {
            fa.forward_into(&s, Tensor::new(&qd, lq), Tensor::new(&kd, lk), Tensor::new(&vd, lk), TensorMut::new(&mut o, lq), StatsMut::LogSumExp(lse.as_view_mut()), &params)?;
        }
        let t1 = timing_event(&s)?;
        s.synchronize()?;
        if i > 0 {
            times.push(t0.elapsed_ms(&t1)? as f64);
        }
    }
    Ok((s.clone_dtoh(&o)?, s.clone_dtoh(&lse)?, median(times)))
}

/// The ranks of one strategy: the ring or Ulysses.
enum Ranks {
    Ring(Vec<RingRank<bf16>>),
    Ulysses(Vec<UlyssesRank<bf16>>),
}

impl Ranks {
    /// One rank per context, joined by `Comm::from_devices`.
    fn new(a: &Args, ctxs: &[Arc<CudaContext>], shape: RingShape) -> Result<Self> {
        let comm_streams = ctxs.iter().map(|c| c.new_stream()).collect::<std::result::Result<Vec<_>, _>>()?;
        let comms = Comm::from_devices(comm_streams).map_err(FlashAttnError::from)?;
        let mut ring = Vec::new();
        let mut uly = Vec::new();
        for (ctx, comm) in ctxs.iter().zip(comms) {
            if a.ulysses {
                let params = ForwardParams { causal: a.causal, ..Default::default() };
                uly.push(UlyssesRank::<bf16>::new(Arc::new(FlashAttention::new(ctx)?), comm, ctx.new_stream()?, shape, &params)?);
            } else {
                ring.push(ring_rank(a, ctx, comm, shape)?);
            }
        }
        Ok(if a.ulysses { Ranks::Ulysses(uly) } else { Ranks::Ring(ring) })
    }

    fn streams(&self) -> Vec<Arc<CudaStream>> {
        match self {
            Ranks::Ring(r) => r.iter().map(|r| r.stream().clone()).collect(),
            Ranks::Ulysses(r) => r.iter().map(|r| r.stream().clone()).collect(),
        }
    }

    fn lse(&self, i: usize) -> &CudaSlice<f32> {
        match self {
            Ranks::Ring(r) => r[i].lse(),
            Ranks::Ulysses(r) => r[i].lse(),
        }
    }

    fn forward(&mut self, inputs: &[[&CudaSlice<bf16>; 3]], outs: &mut [&mut CudaSlice<bf16>]) -> std::result::Result<(), FlashAttnError> {
        match self {
            Ranks::Ring(r) => ring_forward(r, inputs, outs),
            Ranks::Ulysses(r) => ulysses_forward(r, inputs, outs),
        }
    }

    fn backward(&mut self, inputs: &[RingGradInputs<'_, bf16>], grads: &mut [RingGrads<'_, bf16>]) -> std::result::Result<(), FlashAttnError> {
        match self {
            Ranks::Ring(r) => ring_backward(r, inputs, grads, false),
            Ranks::Ulysses(r) => ulysses_backward(r, inputs, grads, false),
        }
    }
}

/// One rank of the ring on `ctx` (a varlen rank with `--docs`).
fn ring_rank(a: &Args, ctx: &Arc<CudaContext>, comm: Comm, shape: RingShape) -> Result<RingRank<bf16>> {
    let params = ForwardParams { causal: a.causal, ..Default::default() };
    let fa = Arc::new(FlashAttention::new(ctx)?);
    let ranks = comm.world_size();
    Ok(if a.docs > 0 {
        RingRank::<bf16>::new_varlen(fa, comm, ctx.new_stream()?, shape, &plan_of(a, ranks)?, &params)?
    } else {
        RingRank::<bf16>::new(fa, comm, ctx.new_stream()?, shape, a.sharding, &params)?
    })
}

/// The ring forward `a.iters` times after a warm-up: the median over
/// iterations of the slowest rank's time (CUDA events on each compute stream).
fn time_ring(
    a: &Args,
    ranks: &mut Ranks,
    qs: &[CudaSlice<bf16>],
    ks: &[CudaSlice<bf16>],
    vs: &[CudaSlice<bf16>],
    os: &mut [CudaSlice<bf16>],
) -> Result<f64> {
    let streams = ranks.streams();
    let mut times = Vec::new();
    for i in 0..a.iters + 1 {
        let t0: Vec<_> = streams.iter().map(timing_event).collect::<std::result::Result<_, _>>()?;
        let inputs: Vec<[&CudaSlice<bf16>; 3]> = (0..streams.len()).map(|r| [&qs[r], &ks[r], &vs[r]]).collect();
        let mut outs: Vec<&mut CudaSlice<bf16>> = os.iter_mut().collect();
        ranks.forward(&inputs, &mut outs)?;
        let t1: Vec<_> = streams.iter().map(timing_event).collect::<std::result::Result<_, _>>()?;
        let slowest = slowest_ms(&streams, &t0, &t1)?;
        if i > 0 {
            times.push(slowest);
        }
    }
    Ok(median(times))
}

/// The ring over `ctxs`: `(o, lse, median ms of the slowest GPU)`, whole-sequence layouts.
fn ring(a: &Args, ctxs: &[Arc<CudaContext>], q: &[bf16], k: &[bf16], v: &[bf16]) -> Result<(Vec<bf16>, Vec<f32>, f64)> {
    let n = ctxs.len();
    let plan = plan_of(a, n)?;
    let shape = RingShape { batch: a.batch, seqlen_local: a.seqlen / n, nheads: a.nheads, nheads_k: a.nheads_k, headdim: a.headdim };
    let mut ranks = Ranks::new(a, ctxs, shape)?;
    let (mut qs, mut ks, mut vs, mut os) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let (rq, rk) = (a.nheads * a.headdim, a.nheads_k * a.headdim);
    let streams = ranks.streams();
    for (r, s) in streams.iter().enumerate() {
        qs.push(s.clone_htod(&shard(&plan, q, a.batch, a.seqlen, rq, r))?);
        ks.push(s.clone_htod(&shard(&plan, k, a.batch, a.seqlen, rk, r))?);
        vs.push(s.clone_htod(&shard(&plan, v, a.batch, a.seqlen, rk, r))?);
        os.push(s.alloc_zeros::<bf16>(a.batch * shape.seqlen_local * rq)?);
    }
    let t = time_ring(a, &mut ranks, &qs, &ks, &vs, &mut os)?;
    let o_parts: Vec<Vec<bf16>> = streams.iter().zip(&os).map(|(s, o)| s.clone_dtoh(o)).collect::<std::result::Result<_, _>>()?;
    // LSE (batch, nheads, seqlen): per (batch, head), a sequence of one value per token.
    let lse_parts: Vec<Vec<f32>> = streams.iter().enumerate().map(|(i, s)| s.clone_dtoh(ranks.lse(i))).collect::<std::result::Result<_, _>>()?;
    Ok((unshard(&plan, &o_parts, a.batch, a.seqlen, rq), unshard(&plan, &lse_parts, a.batch * a.nheads, a.seqlen, 1), t))
}

/// Fresh random q, k, v of the whole sequence (the same in every process of a run).
fn inputs(a: &Args) -> (Vec<bf16>, Vec<bf16>, Vec<bf16>) {
    let (lq, lk) = (a.batch * a.seqlen * a.nheads * a.headdim, a.batch * a.seqlen * a.nheads_k * a.headdim);
    let seed = a.seed ^ a.seqlen as u64;
    (random_bf16(lq, seed), random_bf16(lk, seed + 1), random_bf16(lk, seed + 2))
}

/// The ring with one process per GPU: this process writes an NCCL id into a
/// fresh folder and launches itself once per rank (`--child RANK DIR`);
/// each rank joins with `Comm::from_rank`, generates the same inputs, runs
/// and times its rank and writes its shards of O and LSE into the folder,
/// which this process gathers: `(o, lse, median ms of the slowest rank)`.
fn processes(a: &Args) -> Result<(Vec<bf16>, Vec<f32>, f64)> {
    let dir = launch_ranks(a)?;
    let plan = plan_of(a, a.gpus)?;
    let (mut o_parts, mut lse_parts, mut slowest) = (Vec::new(), Vec::new(), 0f64);
    for r in 0..a.gpus {
        o_parts.push(read_bf16(&dir.join(format!("o.{r}")))?);
        let lse = std::fs::read(dir.join(format!("lse.{r}")))?;
        lse_parts.push(lse.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect::<Vec<_>>());
        slowest = slowest.max(std::fs::read_to_string(dir.join(format!("time.{r}")))?.trim().parse::<f64>()?);
    }
    std::fs::remove_dir_all(&dir)?;
    let rq = a.nheads * a.headdim;
    Ok((unshard(&plan, &o_parts, a.batch, a.seqlen, rq), unshard(&plan, &lse_parts, a.batch * a.nheads, a.seqlen, 1), slowest))
}

fn read_bf16(path: &std::path::Path) -> Result<Vec<bf16>> {
    Ok(std::fs::read(path)?.chunks_exact(2).map(|b| bf16::from_le_bytes([b[0], b[1]])).collect())
}

fn write_bf16(path: &std::path::Path, x: &[bf16]) -> Result<()> {
    Ok(std::fs::write(path, x.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>())?)
}

/// Writes an NCCL id into a fresh folder, launches this program once per
/// rank (`--child RANK DIR`, with the run's arguments) and waits for them:
/// the folder, where the ranks left their results.
fn launch_ranks(a: &Args) -> Result<std::path::PathBuf> {
    let dir = std::env::temp_dir().join(format!("cp-ring-{}-{}-{}", std::process::id(), a.seqlen, a.gpus));
    std::fs::create_dir_all(&dir)?;
    let id = Id::new().map_err(FlashAttnError::from)?;
    std::fs::write(dir.join("id"), id.internal().iter().map(|&c| c as u8).collect::<Vec<u8>>())?;
    let mut args: Vec<String> = [
        ("--gpus", a.gpus),
        ("--seqlen", a.seqlen),
        ("--batch", a.batch),
        ("--nheads", a.nheads),
        ("--nheads-k", a.nheads_k),
        ("--headdim", a.headdim),
        ("--iters", a.iters),
        ("--seed", a.seed as usize),
    ]
    .iter()
    .flat_map(|(f, v)| [f.to_string(), v.to_string()])
    .collect();
    if a.sharding == Sharding::Contiguous {
        args.push("--contiguous".into());
    }
    if !a.causal {
        args.push("--non-causal".into());
    }
    if a.docs > 0 {
        args.extend(["--docs".into(), a.docs.to_string()]);
    }
    if a.backward {
        args.push("--backward".into());
    }
    let exe = std::env::current_exe()?;
    let children = (0..a.gpus)
        .map(|r| std::process::Command::new(&exe).args(&args).arg("--child").arg(r.to_string()).arg(&dir).spawn())
        .collect::<std::io::Result<Vec<_>>>()?;
    for (r, mut c) in children.into_iter().enumerate() {
        let st = c.wait()?;
        if !st.success() {
            return Err(format!("rank {r}'s process failed ({st})").into());
        }
    }
    Ok(dir)
}

/// One launched rank of [`processes`]: joins the ring with `Comm::from_rank`
/// and the id in `dir`, runs and times its shard, writes its results there.
fn child(a: &Args, rank: usize, dir: &std::path::Path) -> Result<()> {
    let raw = std::fs::read(dir.join("id"))?;
    let mut internal = [0 as std::ffi::c_char; 128];
    if raw.len() != internal.len() {
        return Err(format!("NCCL id file holds {} bytes, not 128", raw.len()).into());
    }
    for (x, &b) in internal.iter_mut().zip(&raw) {
        *x = b as std::ffi::c_char;
    }
    let ctx = CudaContext::new(rank)?;
    let comm = Comm::from_rank(ctx.new_stream()?, rank, a.gpus, Id::uninit(internal)).map_err(FlashAttnError::from)?;
    let (q, k, v) = inputs(a);
    if a.backward {
        let dout = random_bf16(q.len(), a.seed ^ 0xd0);
        let shape = RingShape { batch: a.batch, seqlen_local: a.seqlen / a.gpus, nheads: a.nheads, nheads_k: a.nheads_k, headdim: a.headdim };
        let mut ring = Ranks::Ring(vec![ring_rank(a, &ctx, comm, shape)?]);
        let (mut parts, tf, tb) = ring_bwd_ranks(a, &mut ring, &[rank], [&q, &k, &v, &dout])?;
        for (name, g) in ["dq", "dk", "dv"].iter().zip(parts.remove(0)) {
            write_bf16(&dir.join(format!("{name}.{rank}")), &g)?;
        }
        std::fs::write(dir.join(format!("time.{rank}")), format!("{tf} {tb}"))?;
        return Ok(());
    }
    let plan = plan_of(a, a.gpus)?;
    let shape = RingShape { batch: a.batch, seqlen_local: a.seqlen / a.gpus, nheads: a.nheads, nheads_k: a.nheads_k, headdim: a.headdim };
    let mut ring = Ranks::Ring(vec![ring_rank(a, &ctx, comm, shape)?]);
    let s = ring.streams()[0].clone();
    let (rq, rk) = (a.nheads * a.headdim, a.nheads_k * a.headdim);
    let qs = [s.clone_htod(&shard(&plan, &q, a.batch, a.seqlen, rq, rank))?];
    let ks = [s.clone_htod(&shard(&plan, &k, a.batch, a.seqlen, rk, rank))?];
    let vs = [s.clone_htod(&shard(&plan, &v, a.batch, a.seqlen, rk, rank))?];
    let mut os = [s.alloc_zeros::<bf16>(a.batch * shape.seqlen_local * rq)?];
    let t = time_ring(a, &mut ring, &qs, &ks, &vs, &mut os)?;
    let o = s.clone_dtoh(&os[0])?;
    let lse = s.clone_dtoh(ring.lse(0))?;
    write_bf16(&dir.join(format!("o.{rank}")), &o)?;
    std::fs::write(dir.join(format!("lse.{rank}")), lse.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>())?;
    std::fs::write(dir.join(format!("time.{rank}")), t.to_string())?;
    Ok(())
}

/// The ring's transfers alone, without the attention: per step one NCCL
/// group in which every rank sends its K and V shards to the next rank and
/// receives the previous one's (`N − 1` steps, as `ring_forward`); with
/// `backward`, those steps and, in the same groups, `N` hops of the f32
/// dK/dV sums (as `ring_backward`). Median ms of the slowest GPU's comm
/// stream over `a.iters` after a warm-up; 0 on one GPU.
fn comm_alone(a: &Args, ctxs: &[Arc<CudaContext>], backward: bool) -> Result<f64> {
    let n = ctxs.len();
    if n == 1 {
        return Ok(0.0);
    }
    let streams = ctxs.iter().map(|c| c.new_stream()).collect::<std::result::Result<Vec<_>, _>>()?;
    let comms = Comm::from_devices(streams.clone()).map_err(FlashAttnError::from)?;
    let len = a.batch * (a.seqlen / n) * a.nheads_k * a.headdim;
    let mut kv = Vec::new();
    let mut sums = Vec::new();
    for s in &streams {
        let two = || -> std::result::Result<[CudaSlice<bf16>; 2], cudarc::driver::DriverError> { Ok([s.alloc_zeros(len)?, s.alloc_zeros(len)?]) };
        kv.push([two()?, two()?]);
        let two32 = || -> std::result::Result<[CudaSlice<f32>; 2], cudarc::driver::DriverError> { Ok([s.alloc_zeros(len)?, s.alloc_zeros(len)?]) };
        sums.push(if backward { Some([two32()?, two32()?]) } else { None });
    }
    let (hops_kv, hops_sums) = (n - 1, if backward { n } else { 0 });
    let mut times = Vec::new();
    for i in 0..a.iters + 1 {
        let t0: Vec<_> = streams.iter().map(timing_event).collect::<std::result::Result<_, _>>()?;
        for step in 0..hops_kv.max(hops_sums) {
            cudarc::nccl::result::group_start().map_err(FlashAttnError::from)?;
            for (r, comm) in comms.iter().enumerate() {
                let (next, prev) = (((r + 1) % n) as i32, ((r + n - 1) % n) as i32);
                if step < hops_kv {
                    hop(comm, &mut kv[r], step, next, prev)?;
                }
                if let (true, Some(pair)) = (step < hops_sums, sums[r].as_mut()) {
                    hop(comm, pair, step, next, prev)?;
                }
            }
            cudarc::nccl::result::group_end().map_err(FlashAttnError::from)?;
        }
        let t1: Vec<_> = streams.iter().map(timing_event).collect::<std::result::Result<_, _>>()?;
        let slowest = slowest_ms(&streams, &t0, &t1)?;
        if i > 0 {
            times.push(slowest);
        }
    }
    Ok(median(times))
}

/// One hop of a pair of buffer sets inside an NCCL group: set `step % 2`
/// to rank `next`, the other one filled from rank `prev`.
fn hop<T: cudarc::nccl::NcclType>(comm: &Comm, [b0, b1]: &mut [[CudaSlice<T>; 2]; 2], step: usize, next: i32, prev: i32) -> Result<()> {
    let (src, dst) = if step.is_multiple_of(2) { (&*b0, b1) } else { (&*b1, b0) };
    for (x, y) in src.iter().zip(dst.iter_mut()) {
        comm.send(x, next).map_err(FlashAttnError::from)?;
        comm.recv(y, prev).map_err(FlashAttnError::from)?;
    }
    Ok(())
}

/// `comm` ms of transfers as a share of `t_ring` ms of the ring: what they
/// would cost at most if none of them were hidden.
fn share(comm: f64, t_ring: f64) -> String {
    if comm <= 0.0 { "—".into() } else { format!("{:.1}%", comm / t_ring * 100.0) }
}

/// One configuration: the one-GPU baseline, the ring, the check, a table row.
/// The table's sharding column: the ring's sharding, or Ulysses.
fn scheme(a: &Args) -> String {
    match (a.ulysses, a.docs) {
        (true, _) => "Ulysses".into(),
        (false, 0) => format!("{:?}", a.sharding),
        (false, docs) => format!("{:?}, {docs} documents", a.sharding),
    }
}

fn run(a: &Args, ctxs: &[Arc<CudaContext>]) -> Result<()> {
    let a = &Args { gpus: ctxs.len(), ..a.clone() };
    let (q, k, v) = inputs(a);
    let (o1, lse1, t1) = one_gpu(a, &ctxs[0], &q, &k, &v)?;
    let (on, lsen, tn) = if a.procs { processes(a)? } else { ring(a, ctxs, &q, &k, &v)? };
    let err_o = rel_err(on.iter().map(|x| x.to_f64()), o1.iter().map(|x| x.to_f64()));
    let err_lse = lsen.iter().zip(&lse1).map(|(x, y)| (x - y).abs()).fold(0f32, f32::max);
    let n = ctxs.len();
    // Strong scaling: the same sequence on n GPUs against one.
    let eff = t1 / (n as f64 * tn);
    let comm = if a.ulysses { 0.0 } else { comm_alone(a, ctxs, false)? };
    println!(
        "| {} | {} | {} | {} | {} | {:.2} | {:.1} | {:.1} | {:.1}% | {:.2} | {} | {:.2e} | {:.2e} |",
        a.seqlen,
        n,
        if a.procs { "process per GPU" } else { "one process" },
        scheme(a),
        if a.causal { "yes" } else { "no" },
        t1,
        tn,
        flops(a) / n as f64 / (tn * 1e-3) / 1e12,
        eff * 100.0,
        comm,
        share(comm, tn),
        err_o,
        err_lse
    );
    if err_o.is_nan() || err_lse.is_nan() || err_o >= 2e-2 || err_lse >= 1e-2 {
        return Err(format!("ring ≠ one GPU: rel. error of O {err_o:e}, max |ΔLSE| {err_lse:e}").into());
    }
    Ok(())
}

/// The sequence of the f64 checks: about 2048 tokens (a multiple of the
/// zigzag chunks and of [`DOC_UNIT`]), more with many `--docs`.
fn ref_seqlen(a: &Args) -> usize {
    2048usize.max(a.docs * DOC_UNIT)
}

/// The f64 check of FlashAttention-2's 2× rule on one GQA group of heads.
fn check_ref(a: &Args, ctxs: &[Arc<CudaContext>]) -> Result<()> {
    use flash_attn::reference::{attention, attention_varlen};
    use ndarray::{Array4, s};
    let a = Args { seqlen: ref_seqlen(a), batch: 1, iters: 1, ..a.clone() };
    let (lq, lk) = (a.seqlen * a.nheads * a.headdim, a.seqlen * a.nheads_k * a.headdim);
    let (q, k, v) = (random_bf16(lq, 1), random_bf16(lk, 2), random_bf16(lk, 3));
    let (o1, _, _) = one_gpu(&a, &ctxs[0], &q, &k, &v)?;
    let (on, _, _) = ring(&a, ctxs, &q, &k, &v)?;
    let to64 = |x: &[bf16], h| Array4::from_shape_vec((1, a.seqlen, h, a.headdim), x.iter().map(|e| e.to_f64()).collect());
    let (q64, k64, v64) = (to64(&q, a.nheads)?, to64(&k, a.nheads_k)?, to64(&v, a.nheads_k)?);
    let group = a.nheads / a.nheads_k;
    let params = ForwardParams { causal: a.causal, ..Default::default() };
    let (hq, hk) = (s![0, .., ..group, ..], s![0, .., ..1, ..]);
    let want = if a.docs > 0 {
        let docs = doc_lengths(&a);
        let (cu, max) = (cu_seqlens(&docs), docs.iter().copied().max().unwrap_or(0));
        attention_varlen(q64.slice(hq), k64.slice(hk), v64.slice(hk), &cu, &cu, None, max, max, &params, None)?.o
    } else {
        attention(q64.slice(s![.., .., ..group, ..]), k64.slice(s![.., .., ..1, ..]), v64.slice(s![.., .., ..1, ..]), &params, None)?.o.index_axis_move(ndarray::Axis(0), 0)
    };
    let err = |o: &[bf16]| -> Result<f64> {
        let o = to64(o, a.nheads)?;
        Ok(rel_err(o.slice(hq).iter().copied(), want.iter().copied()))
    };
    let (e1, en) = (err(&o1)?, err(&on)?);
    println!("f64 check (seqlen {}, heads 0..{group}): one GPU {e1:.3e}, ring over {} GPUs {en:.3e}", a.seqlen, ctxs.len());
    if en.is_nan() || en > 2.0 * e1.max(1e-4) {
        return Err(format!("the ring's error {en:e} exceeds twice one GPU's ({e1:e})").into());
    }
    Ok(())
}

fn main() -> Result<()> {
    let mut a = parse_args()?;
    if let Some((rank, dir)) = a.child.clone() {
        return child(&a, rank, std::path::Path::new(&dir));
    }
    let available = CudaContext::device_count()? as usize;
    if a.gpus == 0 {
        a.gpus = available;
    }
    if a.gpus > available {
        return Err(format!("--gpus {} but {available} GPUs are present", a.gpus).into());
    }
    let ctxs: Vec<_> = (0..a.gpus).map(CudaContext::new).collect::<std::result::Result<_, _>>()?;
    println!("{} × {}, NCCL_NVLS_ENABLE={:?}", a.gpus, FlashAttention::new(&ctxs[0])?.device_name(), std::env::var("NCCL_NVLS_ENABLE").ok());
    println!("batch {}, {} query / {} KV heads, d {}, bf16; times: median of {} (CUDA events, slowest GPU)", a.batch, a.nheads, a.nheads_k, a.headdim, a.iters);
    if a.backward {
        return backward_main(&a, &ctxs);
    }
    println!("\n| tokens | GPUs | launch | sharding | causal | 1 GPU ms | ring ms | TFLOP/s per GPU | scaling eff. | transfers alone ms | share of ring | rel. err O vs 1 GPU | max ΔLSE |");
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    if a.bench {
        let gpu_counts: Vec<usize> = [1, 2, 4, 8].into_iter().filter(|&g| g <= a.gpus).collect();
        for seqlen in [131072, 262144] {
            let a = Args { seqlen, ..a.clone() };
            for &g in &gpu_counts {
                run(&a, &ctxs[..g])?;
            }
        }
    } else {
        run(&a, &ctxs)?;
    }
    if a.check_ref {
        check_ref(&a, &ctxs)?;
    }
    Ok(())
}

/// Gradients gathered into whole-sequence layouts: `(dq, dk, dv)`.
type HostGrads = (Vec<bf16>, Vec<bf16>, Vec<bf16>);

/// One rank's gradient shards `[dq, dk, dv]`.
type RankGrads = [Vec<bf16>; 3];

/// One GPU over the whole sequence, forward then backward:
/// `(gradients, forward ms, backward ms)` (medians).
fn one_gpu_bwd(a: &Args, ctx: &Arc<CudaContext>, [q, k, v, dout]: [&[bf16]; 4]) -> Result<(HostGrads, f64, f64)> {
    let fa = FlashAttention::new(ctx)?;
    let s = ctx.new_stream()?;
    let (qd, kd, vd, dod) = (s.clone_htod(q)?, s.clone_htod(k)?, s.clone_htod(v)?, s.clone_htod(dout)?);
    let lq = TensorLayout::contiguous([a.batch, a.seqlen, a.nheads, a.headdim]);
    let lk = TensorLayout::contiguous([a.batch, a.seqlen, a.nheads_k, a.headdim]);
    let mut o = s.alloc_zeros::<bf16>(q.len())?;
    let mut lse = s.alloc_zeros::<f32>(a.batch * a.nheads * a.seqlen)?;
    let (mut dq, mut dk, mut dv) = (s.alloc_zeros::<bf16>(q.len())?, s.alloc_zeros::<bf16>(k.len())?, s.alloc_zeros::<bf16>(v.len())?);
    let params = ForwardParams { causal: a.causal, ..Default::default() };
    let bp = BackwardParams { forward: params, deterministic: false };
    let docs = doc_lengths(a);
    let cu = s.clone_htod(&cu_seqlens(&docs))?;
    let max = docs.iter().copied().max().unwrap_or(0);
    let varlen = Varlen { cu_seqlens_q: &cu, cu_seqlens_k: &cu, max_seqlen_q: max, max_seqlen_k: max, seqused_k: None };
    let (vq, vk) = (TensorLayout::varlen(a.seqlen, a.nheads, a.headdim), TensorLayout::varlen(a.seqlen, a.nheads_k, a.headdim));
    let (mut tf, mut tb) = (Vec::new(), Vec::new());
    for i in 0..a.iters + 1 {
        let t0 = timing_event(&s)?;
        if a.docs > 0 {
            let (qt, kt, vt) = (Tensor::new(&qd, vq), Tensor::new(&kd, vk), Tensor::new(&vd, vk));
            fa.forward_varlen_into(&s, qt, kt, vt, TensorMut::new(&mut o, vq), &mut lse, &varlen, &params, &Extras::default())?;
        } else {
            fa.forward_into(&s, Tensor::new(&qd, lq), Tensor::new(&kd, lk), Tensor::new(&vd, lk), TensorMut::new(&mut o, lq), StatsMut::LogSumExp(lse.as_view_mut()), &params)?;
        }
        let t1 = timing_event(&s)?;
        let t2 = timing_event(&s)?;
        if a.docs > 0 {
            let t = |x| Tensor::new(x, vq);
            let (kt, vt) = (Tensor::new(&kd, vk), Tensor::new(&vd, vk));
            let (gq, gk, gv) = (TensorMut::new(&mut dq, vq), TensorMut::new(&mut dk, vk), TensorMut::new(&mut dv, vk));
            fa.backward_varlen_into(&s, t(&qd), kt, vt, t(&o), t(&dod), &lse, gq, gk, gv, None, &varlen, &bp, &Extras::default())?;
        } else {
        fa.backward_into(
            &s,
            Tensor::new(&qd, lq),
            Tensor::new(&kd, lk),
            Tensor::new(&vd, lk),
            Tensor::new(&o, lq),
            Tensor::new(&dod, lq),
            &lse,
            TensorMut::new(&mut dq, lq),
            TensorMut::new(&mut dk, lk),
            TensorMut::new(&mut dv, lk),
            None,
            &bp,
            &Extras::default(),
        )?;
        }
        let t3 = timing_event(&s)?;
        s.synchronize()?;
        if i > 0 {
            tf.push(t0.elapsed_ms(&t1)? as f64);
            tb.push(t2.elapsed_ms(&t3)? as f64);
        }
    }
    Ok(((s.clone_dtoh(&dq)?, s.clone_dtoh(&dk)?, s.clone_dtoh(&dv)?), median(tf), median(tb)))
}

/// The ring over `ctxs`, forward then backward, `a.iters` times after a
/// warm-up: `(gradients, forward ms, backward ms)` (medians of the slowest
/// rank), gradients in whole-sequence layouts.
fn ring_bwd(a: &Args, ctxs: &[Arc<CudaContext>], inputs: [&[bf16]; 4]) -> Result<(HostGrads, f64, f64)> {
    let n = ctxs.len();
    let shape = RingShape { batch: a.batch, seqlen_local: a.seqlen / n, nheads: a.nheads, nheads_k: a.nheads_k, headdim: a.headdim };
    let mut ranks = Ranks::new(a, ctxs, shape)?;
    let ids: Vec<usize> = (0..n).collect();
    let (parts, tf, tb) = ring_bwd_ranks(a, &mut ranks, &ids, inputs)?;
    Ok((unshard_grads(a, n, parts)?, tf, tb))
}

/// Every rank's `[dq, dk, dv]` shards gathered into whole-sequence layouts.
fn unshard_grads(a: &Args, n: usize, parts: Vec<RankGrads>) -> Result<HostGrads> {
    let plan = plan_of(a, n)?;
    let (rq, rk) = (a.nheads * a.headdim, a.nheads_k * a.headdim);
    let mut per: [Vec<Vec<bf16>>; 3] = Default::default();
    for p in parts {
        for (dst, g) in per.iter_mut().zip(p) {
            dst.push(g);
        }
    }
    let [dq, dk, dv] = per;
    Ok((unshard(&plan, &dq, a.batch, a.seqlen, rq), unshard(&plan, &dk, a.batch, a.seqlen, rk), unshard(&plan, &dv, a.batch, a.seqlen, rk)))
}

/// The ring with one process per GPU, forward then backward (see
/// [`processes`]): `(gradients, forward ms, backward ms)` of the slowest rank.
fn processes_bwd(a: &Args) -> Result<(HostGrads, f64, f64)> {
    let dir = launch_ranks(a)?;
    let (mut parts, mut tf, mut tb) = (Vec::new(), 0f64, 0f64);
    for r in 0..a.gpus {
        let g = ["dq", "dk", "dv"].map(|name| read_bf16(&dir.join(format!("{name}.{r}"))));
        let [dq, dk, dv] = g;
        parts.push([dq?, dk?, dv?]);
        let t = std::fs::read_to_string(dir.join(format!("time.{r}")))?;
        let mut it = t.split_whitespace().map(str::parse::<f64>);
        let (f, b) = (it.next().ok_or("no forward time")??, it.next().ok_or("no backward time")??);
        (tf, tb) = (tf.max(f), tb.max(b));
    }
    std::fs::remove_dir_all(&dir)?;
    Ok((unshard_grads(a, a.gpus, parts)?, tf, tb))
}

/// The ring forward then backward of `ranks` (ring ranks `ids`, all of
/// them or this process's one), `a.iters` times after a warm-up: each
/// rank's `[dq, dk, dv]` shards and the medians of the slowest rank's
/// forward and backward times.
fn ring_bwd_ranks(a: &Args, ranks: &mut Ranks, ids: &[usize], [q, k, v, dout]: [&[bf16]; 4]) -> Result<(Vec<RankGrads>, f64, f64)> {
    let n = a.gpus;
    let plan = plan_of(a, n)?;
    let local = a.seqlen / n;
    let (rq, rk) = (a.nheads * a.headdim, a.nheads_k * a.headdim);
    let streams = ranks.streams();
    let mut bufs: Vec<[CudaSlice<bf16>; 8]> = Vec::new();
    let mut lses = Vec::new();
    for (&r, s) in ids.iter().zip(&streams) {
        let up = |x: &[bf16], row| s.clone_htod(&shard(&plan, x, a.batch, a.seqlen, row, r));
        let (ql, kl) = (a.batch * local * rq, a.batch * local * rk);
        // q, k, v, dout, out, dq, dk, dv
        bufs.push([up(q, rq)?, up(k, rk)?, up(v, rk)?, up(dout, rq)?, s.alloc_zeros(ql)?, s.alloc_zeros(ql)?, s.alloc_zeros(kl)?, s.alloc_zeros(kl)?]);
        lses.push(s.alloc_zeros::<f32>(a.batch * a.nheads * local)?);
    }
    let (mut tf, mut tb) = (Vec::new(), Vec::new());
    for i in 0..a.iters + 1 {
        let ev = || streams.iter().map(timing_event).collect::<std::result::Result<Vec<_>, _>>();
        let t0 = ev()?;
        {
            let (ins, mut outs): (Vec<[&CudaSlice<bf16>; 3]>, Vec<&mut CudaSlice<bf16>>) =
                bufs.iter_mut().map(|[q, k, v, _, o, ..]| ([&*q, &*k, &*v], o)).unzip();
            ranks.forward(&ins, &mut outs)?;
        }
        // Keep the forward's LSE (the next forward would overwrite the rank's).
        for (j, (s, l)) in streams.iter().zip(lses.iter_mut()).enumerate() {
            s.memcpy_dtod(ranks.lse(j), l)?;
        }
        let t1 = ev()?;
        {
            let mut ins = Vec::new();
            let mut gs = Vec::new();
            for (b, lse) in bufs.iter_mut().zip(&lses) {
                let [q, k, v, dout, out, dq, dk, dv] = b;
                ins.push(RingGradInputs { q: &*q, k: &*k, v: &*v, out: &*out, dout: &*dout, lse });
                gs.push(RingGrads { dq, dk, dv });
            }
            ranks.backward(&ins, &mut gs)?;
        }
        let t2 = ev()?;
        let (f, b) = (slowest_ms(&streams, &t0, &t1)?, slowest_ms(&streams, &t1, &t2)?);
        if i > 0 {
            tf.push(f);
            tb.push(b);
        }
    }
    let mut parts = Vec::new();
    for (s, b) in streams.iter().zip(&bufs) {
        parts.push([s.clone_dtoh(&b[5])?, s.clone_dtoh(&b[6])?, s.clone_dtoh(&b[7])?]);
    }
    Ok((parts, median(tf), median(tb)))
}

fn grad_errs(g: &HostGrads, want: &HostGrads) -> [f64; 3] {
    let e = |x: &[bf16], y: &[bf16]| rel_err(x.iter().map(|e| e.to_f64()), y.iter().map(|e| e.to_f64()));
    [e(&g.0, &want.0), e(&g.1, &want.1), e(&g.2, &want.2)]
}

/// `--backward`: per sequence length, one GPU's forward + backward over the
/// whole sequence once, then the ring on each GPU count; a table row each.
fn backward_main(a: &Args, ctxs: &[Arc<CudaContext>]) -> Result<()> {
    println!("\n| tokens | GPUs | sharding | causal | 1 GPU fwd ms | 1 GPU bwd ms | ring fwd ms | ring bwd ms | bwd TFLOP/s per GPU | bwd eff. | fwd+bwd eff. | transfers alone fwd / bwd ms | share of ring fwd / bwd | rel. err dQ, dK, dV vs 1 GPU |");
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    let seqlens: Vec<usize> = if a.bench { vec![131072, 262144] } else { vec![a.seqlen] };
    let counts: Vec<usize> = if a.bench { [1, 2, 4, 8].into_iter().filter(|&g| g <= ctxs.len()).collect() } else { vec![ctxs.len()] };
    for seqlen in seqlens {
        let a = &Args { seqlen, ..a.clone() };
        let (q, k, v) = inputs(a);
        let dout = random_bf16(q.len(), a.seed ^ 0xd0);
        let (g1, f1, b1) = one_gpu_bwd(a, &ctxs[0], [&q, &k, &v, &dout])?;
        for &n in &counts {
            let a = &Args { gpus: n, ..a.clone() };
            let (gn, fnn, bn) = if a.procs { processes_bwd(a)? } else { ring_bwd(a, &ctxs[..n], [&q, &k, &v, &dout])? };
            let errs = grad_errs(&gn, &g1);
            let (cf, cb) = if a.ulysses { (0.0, 0.0) } else { (comm_alone(a, &ctxs[..n], false)?, comm_alone(a, &ctxs[..n], true)?) };
            println!(
                "| {} | {} | {} | {} | {:.2} | {:.2} | {:.2} | {:.2} | {:.1} | {:.1}% | {:.1}% | {:.2} / {:.2} | {} / {} | {:.2e}, {:.2e}, {:.2e} |",
                a.seqlen,
                n,
                if a.procs { format!("{}, process per GPU", scheme(a)) } else { scheme(a) },
                if a.causal { "yes" } else { "no" },
                f1,
                b1,
                fnn,
                bn,
                2.5 * flops(a) / n as f64 / (bn * 1e-3) / 1e12,
                b1 / (n as f64 * bn) * 100.0,
                (f1 + b1) / (n as f64 * (fnn + bn)) * 100.0,
                cf,
                cb,
                share(cf, fnn),
                share(cb, bn),
                errs[0],
                errs[1],
                errs[2]
            );
            if errs.iter().any(|e| e.is_nan() || *e >= 2e-2) {
                return Err(format!("ring gradients ≠ one GPU's: rel. errors {errs:?}").into());
            }
        }
    }
    if a.check_ref {
        check_ref_bwd(a, ctxs)?;
    }
    Ok(())
}

/// The f64 check of the ring's gradients (FlashAttention-2's rule: at most
/// twice one GPU's error) on one GQA group of heads.
fn check_ref_bwd(a: &Args, ctxs: &[Arc<CudaContext>]) -> Result<()> {
    use flash_attn::reference::{attention_backward, varlen_attention_backward};
    use ndarray::{Array4, s};
    let a = Args { seqlen: ref_seqlen(a), batch: 1, iters: 1, gpus: ctxs.len(), ..a.clone() };
    let (lq, lk) = (a.seqlen * a.nheads * a.headdim, a.seqlen * a.nheads_k * a.headdim);
    let (q, k, v, dout) = (random_bf16(lq, 11), random_bf16(lk, 12), random_bf16(lk, 13), random_bf16(lq, 14));
    let (g1, _, _) = one_gpu_bwd(&a, &ctxs[0], [&q, &k, &v, &dout])?;
    let (gn, _, _) = ring_bwd(&a, ctxs, [&q, &k, &v, &dout])?;
    let to64 = |x: &[bf16], h| Array4::from_shape_vec((1, a.seqlen, h, a.headdim), x.iter().map(|e| e.to_f64()).collect());
    let group = a.nheads / a.nheads_k;
    let (q64, k64, v64, do64) = (to64(&q, a.nheads)?, to64(&k, a.nheads_k)?, to64(&v, a.nheads_k)?, to64(&dout, a.nheads)?);
    let params = ForwardParams { causal: a.causal, ..Default::default() };
    let hq = s![0, .., ..group, ..];
    let hk = s![0, .., ..1, ..];
    let want = if a.docs > 0 {
        let docs = doc_lengths(&a);
        let (cu, max) = (cu_seqlens(&docs), docs.iter().copied().max().unwrap_or(0));
        let g = varlen_attention_backward(q64.slice(hq), k64.slice(hk), v64.slice(hk), do64.slice(hq), &cu, &cu, None, max, max, &params, None)?;
        [g.dq, g.dk, g.dv]
    } else {
        let (hq, hk) = (s![.., .., ..group, ..], s![.., .., ..1, ..]);
        let g = attention_backward(q64.slice(hq), k64.slice(hk), v64.slice(hk), do64.slice(hq), &params, None)?;
        [g.dq, g.dk, g.dv].map(|x| x.index_axis_move(ndarray::Axis(0), 0))
    };
    let errs = |g: &HostGrads| -> Result<[f64; 3]> {
        let (dq, dk, dv) = (to64(&g.0, a.nheads)?, to64(&g.1, a.nheads_k)?, to64(&g.2, a.nheads_k)?);
        Ok([
            rel_err(dq.slice(hq).iter().copied(), want[0].iter().copied()),
            rel_err(dk.slice(hk).iter().copied(), want[1].iter().copied()),
            rel_err(dv.slice(hk).iter().copied(), want[2].iter().copied()),
        ])
    };
    let (e1, en) = (errs(&g1)?, errs(&gn)?);
    println!(
        "f64 check of the gradients (seqlen {}, heads 0..{group}): one GPU dQ {:.3e} dK {:.3e} dV {:.3e}; ring over {} GPUs dQ {:.3e} dK {:.3e} dV {:.3e}",
        a.seqlen, e1[0], e1[1], e1[2], ctxs.len(), en[0], en[1], en[2]
    );
    for ((name, x), y) in ["dQ", "dK", "dV"].iter().zip(en).zip(e1) {
        if x.is_nan() || x > 2.0 * y.max(1e-4) {
            return Err(format!("the ring's {name} error {x:e} exceeds twice one GPU's ({y:e})").into());
        }
    }
    Ok(())
}
