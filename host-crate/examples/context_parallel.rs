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
//! warm-up. Set `NCCL_NVLS_ENABLE=0` (no NVLink multicast) on shared
//! machines; libnccl.so.2 must be on the loader's path (PyTorch's wheel
//! ships it under `nvidia/nccl/lib`).

use std::sync::Arc;

use cudarc::driver::sys::CUevent_flags;
use cudarc::driver::{CudaContext, CudaSlice, CudaStream};
use cudarc::nccl::{Comm, Id};
use flash_attn::context_parallel::nccl::{RingRank, RingShape, ring_forward};
use flash_attn::context_parallel::{ShardPlan, Sharding};
use flash_attn::{FlashAttention, FlashAttnError, ForwardParams, StatsMut, Tensor, TensorLayout, TensorMut};
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
    /// One process per GPU (this process launches them).
    procs: bool,
    /// The inputs' seed (fresh per run unless given; passed to launched ranks).
    seed: u64,
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
        procs: false,
        seed: std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(1, |d| d.as_nanos() as u64),
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
            "--contiguous" => a.sharding = Sharding::Contiguous,
            "--non-causal" => a.causal = false,
            "--bench" => a.bench = true,
            "--check-ref" => a.check_ref = true,
            "--procs" => a.procs = true,
            "--child" => {
                let rank = num("--child")?;
                let dir = it.next().ok_or("--child needs a rank and a folder")?;
                a.child = Some((rank, dir));
            }
            "-h" | "--help" => {
                println!(
                    "context_parallel [--gpus N] [--seqlen S] [--batch B] [--nheads H] [--nheads-k HK] [--headdim D] \
                     [--contiguous] [--non-causal] [--iters I] [--bench] [--check-ref] [--procs]"
                );
                std::process::exit(0);
            }
            other => return Err(format!("unknown argument `{other}` (--help)").into()),
        }
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

/// Causal halves the FLOPs: `4·B·H·N²·d`, halved when causal (the papers' count).
fn flops(a: &Args) -> f64 {
    let f = 4.0 * a.batch as f64 * a.nheads as f64 * (a.seqlen as f64).powi(2) * a.headdim as f64;
    if a.causal { f / 2.0 } else { f }
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
    let mut times = Vec::new();
    for i in 0..a.iters + 1 {
        let t0 = timing_event(&s)?;
        fa.forward_into(&s, Tensor::new(&qd, lq), Tensor::new(&kd, lk), Tensor::new(&vd, lk), TensorMut::new(&mut o, lq), StatsMut::LogSumExp(lse.as_view_mut()), &params)?;
        let t1 = timing_event(&s)?;
        s.synchronize()?;
        if i > 0 {
            times.push(t0.elapsed_ms(&t1)? as f64);
        }
    }
    Ok((s.clone_dtoh(&o)?, s.clone_dtoh(&lse)?, median(times)))
}

/// The ring forward `a.iters` times after a warm-up: the median over
/// iterations of the slowest rank's time (CUDA events on each compute stream).
fn time_ring(
    a: &Args,
    ranks: &mut [RingRank<bf16>],
    qs: &[CudaSlice<bf16>],
    ks: &[CudaSlice<bf16>],
    vs: &[CudaSlice<bf16>],
    os: &mut [CudaSlice<bf16>],
) -> Result<f64> {
    let mut times = Vec::new();
    for i in 0..a.iters + 1 {
        let t0: Vec<_> = ranks.iter().map(|r| timing_event(r.stream())).collect::<std::result::Result<_, _>>()?;
        let inputs: Vec<[&CudaSlice<bf16>; 3]> = (0..ranks.len()).map(|r| [&qs[r], &ks[r], &vs[r]]).collect();
        let mut outs: Vec<&mut CudaSlice<bf16>> = os.iter_mut().collect();
        ring_forward(ranks, &inputs, &mut outs)?;
        let t1: Vec<_> = ranks.iter().map(|r| timing_event(r.stream())).collect::<std::result::Result<_, _>>()?;
        let mut slowest = 0f64;
        for (r, (a0, a1)) in ranks.iter().zip(t0.iter().zip(&t1)) {
            r.stream().synchronize()?;
            slowest = slowest.max(a0.elapsed_ms(a1)? as f64);
        }
        if i > 0 {
            times.push(slowest);
        }
    }
    Ok(median(times))
}

/// The ring over `ctxs`: `(o, lse, median ms of the slowest GPU)`, whole-sequence layouts.
fn ring(a: &Args, ctxs: &[Arc<CudaContext>], q: &[bf16], k: &[bf16], v: &[bf16]) -> Result<(Vec<bf16>, Vec<f32>, f64)> {
    let n = ctxs.len();
    let plan = ShardPlan::new(a.sharding, n, &[a.seqlen])?;
    let shape = RingShape { batch: a.batch, seqlen_local: a.seqlen / n, nheads: a.nheads, nheads_k: a.nheads_k, headdim: a.headdim };
    let params = ForwardParams { causal: a.causal, ..Default::default() };
    let comm_streams = ctxs.iter().map(|c| c.new_stream()).collect::<std::result::Result<Vec<_>, _>>()?;
    let comms = Comm::from_devices(comm_streams).map_err(FlashAttnError::from)?;
    let mut ranks = Vec::new();
    let (mut qs, mut ks, mut vs, mut os) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let (rq, rk) = (a.nheads * a.headdim, a.nheads_k * a.headdim);
    for (r, (ctx, comm)) in ctxs.iter().zip(comms).enumerate() {
        let fa = Arc::new(FlashAttention::new(ctx)?);
        let rank = RingRank::<bf16>::new(fa, comm, ctx.new_stream()?, shape, a.sharding, &params)?;
        let s = rank.stream().clone();
        qs.push(s.clone_htod(&shard(&plan, q, a.batch, a.seqlen, rq, r))?);
        ks.push(s.clone_htod(&shard(&plan, k, a.batch, a.seqlen, rk, r))?);
        vs.push(s.clone_htod(&shard(&plan, v, a.batch, a.seqlen, rk, r))?);
        os.push(s.alloc_zeros::<bf16>(a.batch * shape.seqlen_local * rq)?);
        ranks.push(rank);
    }
    let t = time_ring(a, &mut ranks, &qs, &ks, &vs, &mut os)?;
    let o_parts: Vec<Vec<bf16>> = ranks.iter().zip(&os).map(|(r, o)| r.stream().clone_dtoh(o)).collect::<std::result::Result<_, _>>()?;
    // LSE (batch, nheads, seqlen): per (batch, head), a sequence of one value per token.
    let lse_parts: Vec<Vec<f32>> = ranks.iter().map(|r| r.stream().clone_dtoh(r.lse())).collect::<std::result::Result<_, _>>()?;
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
    let dir = std::env::temp_dir().join(format!("cp-ring-{}-{}", std::process::id(), a.seqlen));
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
    let plan = ShardPlan::new(a.sharding, a.gpus, &[a.seqlen])?;
    let (mut o_parts, mut lse_parts, mut slowest) = (Vec::new(), Vec::new(), 0f64);
    for r in 0..a.gpus {
        let o = std::fs::read(dir.join(format!("o.{r}")))?;
        o_parts.push(o.chunks_exact(2).map(|b| bf16::from_le_bytes([b[0], b[1]])).collect::<Vec<_>>());
        let lse = std::fs::read(dir.join(format!("lse.{r}")))?;
        lse_parts.push(lse.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect::<Vec<_>>());
        slowest = slowest.max(std::fs::read_to_string(dir.join(format!("time.{r}")))?.trim().parse::<f64>()?);
    }
    std::fs::remove_dir_all(&dir)?;
    let rq = a.nheads * a.headdim;
    Ok((unshard(&plan, &o_parts, a.batch, a.seqlen, rq), unshard(&plan, &lse_parts, a.batch * a.nheads, a.seqlen, 1), slowest))
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
    let plan = ShardPlan::new(a.sharding, a.gpus, &[a.seqlen])?;
    let shape = RingShape { batch: a.batch, seqlen_local: a.seqlen / a.gpus, nheads: a.nheads, nheads_k: a.nheads_k, headdim: a.headdim };
    let params = ForwardParams { causal: a.causal, ..Default::default() };
    let fa = Arc::new(FlashAttention::new(&ctx)?);
    let mut ring = [RingRank::<bf16>::new(fa, comm, ctx.new_stream()?, shape, a.sharding, &params)?];
    let s = ring[0].stream().clone();
    let (rq, rk) = (a.nheads * a.headdim, a.nheads_k * a.headdim);
    let qs = [s.clone_htod(&shard(&plan, &q, a.batch, a.seqlen, rq, rank))?];
    let ks = [s.clone_htod(&shard(&plan, &k, a.batch, a.seqlen, rk, rank))?];
    let vs = [s.clone_htod(&shard(&plan, &v, a.batch, a.seqlen, rk, rank))?];
    let mut os = [s.alloc_zeros::<bf16>(a.batch * shape.seqlen_local * rq)?];
    let t = time_ring(a, &mut ring, &qs, &ks, &vs, &mut os)?;
    let o = s.clone_dtoh(&os[0])?;
    let lse = s.clone_dtoh(ring[0].lse())?;
    std::fs::write(dir.join(format!("o.{rank}")), o.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>())?;
    std::fs::write(dir.join(format!("lse.{rank}")), lse.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>())?;
    std::fs::write(dir.join(format!("time.{rank}")), t.to_string())?;
    Ok(())
}

/// One configuration: the one-GPU baseline, the ring, the check, a table row.
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
    println!(
        "| {} | {} | {} | {:?} | {} | {:.2} | {:.1} | {:.1} | {:.1}% | {:.2e} | {:.2e} |",
        a.seqlen,
        n,
        if a.procs { "process per GPU" } else { "one process" },
        a.sharding,
        if a.causal { "yes" } else { "no" },
        t1,
        tn,
        flops(a) / n as f64 / (tn * 1e-3) / 1e12,
        eff * 100.0,
        err_o,
        err_lse
    );
    if err_o.is_nan() || err_lse.is_nan() || err_o >= 2e-2 || err_lse >= 1e-2 {
        return Err(format!("ring ≠ one GPU: rel. error of O {err_o:e}, max |ΔLSE| {err_lse:e}").into());
    }
    Ok(())
}

/// The f64 check of FlashAttention-2's 2× rule on one GQA group of heads.
fn check_ref(a: &Args, ctxs: &[Arc<CudaContext>]) -> Result<()> {
    use flash_attn::reference::attention;
    use ndarray::{Array4, s};
    let a = Args { seqlen: 2048, batch: 1, iters: 1, ..a.clone() };
    let (lq, lk) = (a.seqlen * a.nheads * a.headdim, a.seqlen * a.nheads_k * a.headdim);
    let (q, k, v) = (random_bf16(lq, 1), random_bf16(lk, 2), random_bf16(lk, 3));
    let (o1, _, _) = one_gpu(&a, &ctxs[0], &q, &k, &v)?;
    let (on, _, _) = ring(&a, ctxs, &q, &k, &v)?;
    let to64 = |x: &[bf16], h| Array4::from_shape_vec((1, a.seqlen, h, a.headdim), x.iter().map(|e| e.to_f64()).collect());
    let (q64, k64, v64) = (to64(&q, a.nheads)?, to64(&k, a.nheads_k)?, to64(&v, a.nheads_k)?);
    let group = a.nheads / a.nheads_k;
    let params = ForwardParams { causal: a.causal, ..Default::default() };
    let want = attention(q64.slice(s![.., .., ..group, ..]), k64.slice(s![.., .., ..1, ..]), v64.slice(s![.., .., ..1, ..]), &params, None)?;
    let err = |o: &[bf16]| -> Result<f64> {
        let o = to64(o, a.nheads)?;
        Ok(rel_err(o.slice(s![.., .., ..group, ..]).iter().copied(), want.o.iter().copied()))
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
    println!("\n| tokens | GPUs | launch | sharding | causal | 1 GPU ms | ring ms | TFLOP/s per GPU | scaling eff. | rel. err O vs 1 GPU | max ΔLSE |");
    println!("|---|---|---|---|---|---|---|---|---|---|---|");
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
