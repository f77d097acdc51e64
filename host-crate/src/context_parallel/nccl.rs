//! The ring over NCCL (feature `nccl`): each GPU a rank holding its shard
//! of Q, K, V (sharded as [`super::ShardPlan`] says), K/V shards sent to the
//! next rank on a communication stream while the compute stream attends to
//! the shard in hand (two receive buffers, so step `s + 1`'s shard arrives
//! while step `s` computes), each step's partial `(O, LSE)` merged into an
//! f32 accumulator by `ring_merge_*`, the result rounded once at the end.
//! The schedule is [`super::ring_block`], the one the CPU simulation
//! ([`super::cp_forward`]) checks against one-rank attention. Its backward
//! is [`ring_backward`]; the other strategy, Ulysses' all-to-all over
//! heads, is [`UlyssesRank`] with [`ulysses_forward`] and
//! [`ulysses_backward`].
//!
//! Both ways trainers launch:
//!
//! * one process driving N GPUs: `Comm::from_devices` (one comm stream per
//!   GPU), one [`RingRank`] per GPU, [`ring_forward`] over all of them (NCCL
//!   calls of all ranks in one group per step);
//! * one process per GPU: `Comm::from_rank` with the NCCL [`cudarc::nccl::Id`]
//!   passed between processes, one [`RingRank`], [`ring_forward`] over a
//!   slice of one.
//!
//! Cross-stream order: cudarc records an event per buffer use and makes the
//! next user on another stream wait for it, so a shard is sent only once
//! written, and a receive buffer is overwritten only once the attention
//! that read it has finished. The other direction needs more: inside an
//! NCCL group cudarc records a receive's event when the call is made, but
//! NCCL enqueues the transfer only at the group's end, so that event would
//! not cover it. After each step's group every rank records an event on its
//! comm stream, and its compute stream waits for it
//! once the step's attention is enqueued: the next step's shard is there
//! before it is read, and the transfers still overlap the attention.
//!
//! ```no_run
//! # use std::sync::Arc;
//! # use cudarc::driver::CudaContext;
//! # use cudarc::nccl::Comm;
//! # use flash_attn::{FlashAttention, ForwardParams};
//! # use flash_attn::context_parallel::{Sharding, nccl::{RingRank, RingShape, ring_forward}};
//! # fn main() -> Result<(), flash_attn::FlashAttnError> {
//! let gpus = 2;
//! let shape = RingShape { batch: 1, seqlen_local: 65536, nheads: 32, nheads_k: 8, headdim: 128 };
//! let ctxs: Vec<_> = (0..gpus).map(CudaContext::new).collect::<Result<_, _>>()?;
//! let comm_streams = ctxs.iter().map(|c| c.new_stream()).collect::<Result<Vec<_>, _>>()?;
//! let comms = Comm::from_devices(comm_streams)?;
//! let params = ForwardParams { causal: true, ..Default::default() };
//! let mut ranks = Vec::new();
//! for (ctx, comm) in ctxs.iter().zip(comms) {
//!     let fa = Arc::new(FlashAttention::new(ctx)?);
//!     ranks.push(RingRank::<half::bf16>::new(fa, comm, ctx.new_stream()?, shape, Sharding::Zigzag, &params)?);
//! }
//! // q, k, v: each rank's zigzag shard on its GPU; o: each rank's output.
//! # let (q, k, v, mut o): (Vec<cudarc::driver::CudaSlice<half::bf16>>, Vec<_>, Vec<_>, Vec<_>) = todo!();
//! let inputs: Vec<_> = (0..gpus).map(|r| [&q[r], &k[r], &v[r]]).collect();
//! let mut outs: Vec<_> = o.iter_mut().collect();
//! ring_forward(&mut ranks, &inputs, &mut outs)?;             // ranks[r].lse(): the merged LSE
//! # Ok(()) }
//! ```

mod backward;
mod ulysses;
mod varlen;

use std::sync::Arc;

use cudarc::driver::sys::CUevent_flags;
use cudarc::driver::{CudaEvent, CudaSlice, CudaStream};
use cudarc::nccl::result::{group_end, group_start};
use cudarc::nccl::{Comm, NcclType};

use super::gpu_merge::AccShape;
use super::schedule::{Mask, ring_block};
use super::sharding::Sharding;
use crate::tensor::{AttnElem, StatsMut, Tensor, TensorLayout, TensorMut};
use crate::device::FlashAttention;
use crate::error::{FlashAttnError, Result};
use crate::params::ForwardParams;
use crate::varlen::check_gqa;

pub use backward::{RingGradInputs, RingGrads, ring_backward};
pub use ulysses::{UlyssesRank, ulysses_backward, ulysses_forward};

/// The shape of one rank's shard: `q`, `o` `(batch, seqlen_local, nheads,
/// headdim)`, `k`, `v` `(batch, seqlen_local, nheads_k, headdim)`, all
/// contiguous (`seqlen_local` = the global sequence / ranks).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RingShape {
    /// Sequences.
    pub batch: usize,
    /// Tokens of each rank's shard (the global sequence / ranks).
    pub seqlen_local: usize,
    /// Query heads.
    pub nheads: usize,
    /// Key/value heads (dividing `nheads`).
    pub nheads_k: usize,
    /// Head dim.
    pub headdim: usize,
}

impl RingShape {
    /// `(argument, length, expected)` of a forward's `q, k, v, o`.
    fn lens_fwd(&self, [q, k, v, o]: [usize; 4]) -> [(&'static str, usize, usize); 4] {
        [("q", q, self.q_len()), ("k", k, self.kv_len()), ("v", v, self.kv_len()), ("o", o, self.q_len())]
    }
    fn q_len(&self) -> usize {
        self.batch * self.seqlen_local * self.nheads * self.headdim
    }
    fn kv_len(&self) -> usize {
        self.batch * self.seqlen_local * self.nheads_k * self.headdim
    }
    fn acc(&self) -> AccShape {
        AccShape { batch: self.batch, seqlen: self.seqlen_local, nheads: self.nheads, headdim: self.headdim }
    }
}

/// Checks `(argument, length, expected)` triples: a rank's shards are
/// contiguous and exactly their [`RingShape`]'s sizes.
fn check_shard_lens(lens: &[(&'static str, usize, usize)]) -> Result<()> {
    for &(argument, len, want) in lens {
        if len != want {
            return Err(FlashAttnError::InvalidArgument {
                argument,
                value: format!("{len} elements, expected {want}"),
                reason: "a rank's shard is contiguous and exactly its RingShape's size (the LSE: batch·nheads·seqlen_local)",
            });
        }
    }
    Ok(())
}

/// One input set and one output set per rank: `what` names the outputs,
/// `reason` the entry point's shapes.
fn check_counts(ranks: usize, inputs: usize, outputs: usize, what: &str, reason: &'static str) -> Result<()> {
    if inputs != ranks || outputs != ranks {
        return Err(FlashAttnError::InvalidArgument { argument: "inputs", value: format!("{inputs} inputs, {outputs} {what} for {ranks} ranks"), reason });
    }
    Ok(())
}

/// The end of a rank's last NCCL group, for its compute stream to wait for.
#[derive(Default)]
struct Transfers(Option<CudaEvent>);

impl Transfers {
    /// Records, on the comm stream, the end of the NCCL group just ended
    /// (call after `group_end`, whose transfers NCCL enqueues only then).
    fn record(&mut self, comm: &Comm) -> Result<()> {
        self.0 = Some(comm.stream().record_event(Some(CUevent_flags::CU_EVENT_DISABLE_TIMING))?);
        Ok(())
    }

    /// Makes `compute` wait for the recorded group's transfers (what it
    /// enqueues next may read what they received).
    fn wait(&mut self, compute: &CudaStream) -> Result<()> {
        if let Some(e) = self.0.take() {
            compute.wait(&e)?;
        }
        Ok(())
    }
}

/// The K/V shard a rank holds at step `step`: its own (`k`, `v`) at step
/// 0, else the receive buffer the previous step filled.
fn held<'a, T>(kv: &'a [[CudaSlice<T>; 2]; 2], step: usize, k: &'a CudaSlice<T>, v: &'a CudaSlice<T>) -> (&'a CudaSlice<T>, &'a CudaSlice<T>) {
    if step == 0 { (k, v) } else { (&kv[(step + 1) % 2][0], &kv[(step + 1) % 2][1]) }
}

/// The forward parameters of one ring block: its mask, the call's scale.
fn block_forward_params(params: &ForwardParams, mask: Mask) -> ForwardParams {
    ForwardParams { causal: mask == Mask::Causal, softmax_scale: params.softmax_scale, ..Default::default() }
}

/// One rank of the ring: its GPU's kernels, its NCCL communicator (whose
/// stream carries the transfers), its compute stream, and the buffers of
/// the ring (two K/V receive buffers, one step's partial, the f32
/// accumulator): `4·kv + q` elements of `T` plus `(headdim + 2)` f32 per
/// query row.
pub struct RingRank<T> {
    fa: Arc<FlashAttention>,
    comm: Comm,
    compute: Arc<CudaStream>,
    shape: RingShape,
    sharding: Sharding,
    params: ForwardParams,
    /// `kv[i] = [k, v]`: the receive buffers, alternating by step.
    kv: [[CudaSlice<T>; 2]; 2],
    o_part: CudaSlice<T>,
    lse_part: CudaSlice<f32>,
    o_acc: CudaSlice<f32>,
    lse_acc: CudaSlice<f32>,
    /// The backward's buffers, allocated by the first [`ring_backward`].
    bwd: Option<backward::BwdBuffers<T>>,
    /// The end of the last step's NCCL group.
    transfers: Transfers,
    /// The documents of a varlen rank ([`RingRank::new_varlen`]).
    docs: Option<varlen::RingDocs>,
}

impl<T: AttnElem + NcclType> RingRank<T> {
    /// Allocates the ring's buffers on `compute`. `params`: `causal` and
    /// `softmax_scale` (no window, no softcap); `comm`'s stream and `compute`
    /// must belong to `fa`'s context.
    ///
    /// Errors: a zero-sized shape, `nheads % nheads_k != 0`, an odd
    /// `seqlen_local` with zigzag sharding (two equal chunks per rank),
    /// windows or softcap, streams of another context, allocation.
    pub fn new(
        fa: Arc<FlashAttention>,
        comm: Comm,
        compute: Arc<CudaStream>,
        shape: RingShape,
        sharding: Sharding,
        params: &ForwardParams,
    ) -> Result<Self> {
        fa.check_stream("compute", &compute)?;
        fa.check_stream("comm", &comm.stream())?;
        if params.has_window_or_softcap() {
            return Err(FlashAttnError::InvalidArgument {
                argument: "params",
                value: format!("{params:?}"),
                reason: "context-parallel attention supports causal and softmax_scale (no window, no softcap)",
            });
        }
        let dims = [shape.batch, shape.seqlen_local, shape.nheads, shape.headdim];
        if let Some(a) = dims.iter().position(|&x| x == 0) {
            return Err(FlashAttnError::ZeroSizedDim { argument: "shape", axis: ["batch", "seqlen", "nheads", "headdim"][a], shape: dims });
        }
        check_gqa(shape.nheads, shape.nheads_k)?;
        if sharding == Sharding::Zigzag && !shape.seqlen_local.is_multiple_of(2) {
            return Err(FlashAttnError::InvalidArgument {
                argument: "seqlen_local",
                value: shape.seqlen_local.to_string(),
                reason: "zigzag sharding gives each rank two equal chunks: the local length must be even",
            });
        }
        let (kv, q) = (shape.kv_len(), shape.q_len());
        let alloc = |n| compute.alloc_zeros::<T>(n);
        let kv = [[alloc(kv)?, alloc(kv)?], [alloc(kv)?, alloc(kv)?]];
        let (o_part, o_acc) = (alloc(q)?, compute.alloc_zeros::<f32>(q)?);
        let acc = shape.acc();
        let (lse_part, lse_acc) = (compute.alloc_zeros::<f32>(acc.lse_len())?, compute.alloc_zeros::<f32>(acc.lse_len())?);
        Ok(Self { fa, comm, compute, shape, sharding, params: *params, kv, o_part, lse_part, o_acc, lse_acc, bwd: None, transfers: Transfers::default(), docs: None })
    }

    /// This rank's index in the communicator.
    pub fn rank(&self) -> usize {
        self.comm.rank()
    }

    /// The ranks of the communicator.
    pub fn ranks(&self) -> usize {
        self.comm.world_size()
    }

    /// The compute stream (where [`ring_forward`]'s results are ready).
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.compute
    }

    /// The merged logsumexp of the last [`ring_forward`], f32 `(batch,
    /// nheads, seqlen_local)`.
    pub fn lse(&self) -> &CudaSlice<f32> {
        &self.lse_acc
    }

    fn check_inputs(&self, [q, k, v]: [&CudaSlice<T>; 3], o: &CudaSlice<T>) -> Result<()> {
        check_shard_lens(&self.shape.lens_fwd([q.len(), k.len(), v.len(), o.len()]))
    }

    /// Step `step`'s transfers (inside the caller's NCCL group): the held
    /// K/V shard to the next rank, the next one from the previous rank into
    /// the receive buffer not in use.
    fn exchange(&mut self, step: usize, [_, k, v]: [&CudaSlice<T>; 3]) -> Result<()> {
        let n = self.ranks();
        let (next, prev) = (((self.rank() + 1) % n) as i32, ((self.rank() + n - 1) % n) as i32);
        let [b0, b1] = &mut self.kv;
        let (held, recv) = if step.is_multiple_of(2) { (&*b1, b0) } else { (&*b0, b1) };
        let (k, v) = if step == 0 { (k, v) } else { (&held[0], &held[1]) };
        self.comm.send(k, next)?;
        self.comm.send(v, next)?;
        let [rk, rv] = recv;
        self.comm.recv(rk, prev)?;
        self.comm.recv(rv, prev)?;
        Ok(())
    }

    /// Step `step`'s attention on the held shard and its merge.
    fn compute_step(&mut self, step: usize, [q, k, v]: [&CudaSlice<T>; 3]) -> Result<()> {
        let (n, rank) = (self.ranks(), self.rank());
        let Some(block) = ring_block(self.sharding, self.params.causal, n, rank, step) else { return Ok(()) };
        if self.docs.is_some() {
            return self.compute_step_varlen(step, &block, [q, k, v]);
        }
        let (k, v) = held(&self.kv, step, k, v);
        let RingShape { batch: b, seqlen_local: s, nheads: h, nheads_k: hk, headdim: d } = self.shape;
        let (qr, kr) = (block.q.range(s), block.k.range(s));
        let (nq, nk) = (qr.len(), kr.len());
        let lq = TensorLayout::new([b, nq, h, d], [s * h * d, h * d, d]);
        let lk = TensorLayout::new([b, nk, hk, d], [s * hk * d, hk * d, d]);
        let (qv, kv, vv) = (q.slice(qr.start * h * d..), k.slice(kr.start * hk * d..), v.slice(kr.start * hk * d..));
        let lo = TensorLayout::contiguous([b, nq, h, d]);
        let params = block_forward_params(&self.params, block.mask);
        self.fa.forward_into(
            &self.compute,
            Tensor::new(&qv, lq),
            Tensor::new(&kv, lk),
            Tensor::new(&vv, lk),
            TensorMut::new(&mut self.o_part.slice_mut(..b * nq * h * d), lo),
            StatsMut::LogSumExp(self.lse_part.slice_mut(..b * h * nq)),
            &params,
        )?;
        let (o_part, lse_part) = (self.o_part.slice(..b * nq * h * d), self.lse_part.slice(..b * h * nq));
        self.fa.ring_merge::<T>(&self.compute, self.shape.acc(), (&mut self.o_acc, &mut self.lse_acc), (&o_part, &lse_part), (qr.start, nq), step == 0)
    }
}

/// The ring forward of every rank in `ranks` (all the ring's ranks when one
/// process drives every GPU, or this process's one rank): `inputs[i] = [q,
/// k, v]` and `outs[i]` are rank `ranks[i]`'s shards on its GPU. Enqueues
/// the work on each rank's streams; [`RingRank::stream`] orders the results
/// (`outs[i]` and [`RingRank::lse`]).
///
/// Errors: slices of the wrong length, mismatched rank counts, and every
/// error of the forward, the merge and NCCL.
pub fn ring_forward<T: AttnElem + NcclType>(
    ranks: &mut [RingRank<T>],
    inputs: &[[&CudaSlice<T>; 3]],
    outs: &mut [&mut CudaSlice<T>],
) -> Result<()> {
    check_counts(ranks.len(), inputs.len(), outs.len(), "outputs", "one [q, k, v] and one output per rank")?;
    let Some(n) = ranks.first().map(RingRank::ranks) else { return Ok(()) };
    for ((r, &inp), out) in ranks.iter().zip(inputs).zip(outs.iter()) {
        r.check_inputs(inp, out)?;
    }
    for step in 0..n {
        if step + 1 < n {
            // One group per step: NCCL matches every send with its receive
            // however the ranks are spread over threads and processes.
            group_start()?;
            let sent: Result<()> = ranks.iter_mut().zip(inputs).try_for_each(|(r, &inp)| r.exchange(step, inp));
            group_end()?;
            sent?;
            ranks.iter_mut().try_for_each(|r| r.transfers.record(&r.comm))?;
        }
        for (r, &inp) in ranks.iter_mut().zip(inputs) {
            r.compute_step(step, inp)?;
            // The next step's shard arrives while this step computes.
            r.transfers.wait(&r.compute)?;
        }
    }
    for (r, out) in ranks.iter_mut().zip(outs.iter_mut()) {
        r.fa.ring_finalize::<T>(&r.compute, r.shape.acc(), &r.o_acc, *out)?;
    }
    Ok(())
}
