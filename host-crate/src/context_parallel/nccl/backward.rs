//! The ring's backward over NCCL: the same K/V ring as [`super::ring_forward`],
//! each step's gradients of the held shard computed from the *merged* `O`
//! and `LSE` of the forward (`P = exp(S − LSE)`, `D = rowsum(dO ∘ O)`, both
//! global: the partial gradients of disjoint key sets then simply add up),
//! `dQ` summed at home, and the held shard's `dK`/`dV` sums travelling on a
//! second ring with it, home after `N` hops. The schedule and its CPU
//! simulation are [`crate::context_parallel::cp_backward`]'s.
//!
//! Per step `s` (one NCCL group over the ranks, then the compute):
//!
//! 1. the comm stream sends the held K/V shard on and receives step
//!    `s + 1`'s (as the forward); it sends step `s − 1`'s `dK`/`dV` sums on
//!    and receives the sums of the shard held at step `s`;
//! 2. the compute stream runs the backward of the step's [`RingBlock`]
//!    ([`FlashAttention::backward_into`], gradients in `T` into partial
//!    buffers), then adds them in f32 ([`FlashAttention::ring_grad_add`]):
//!    `dQ` into the rank's own sum, `dK`/`dV` into the received sums (only
//!    this add waits for them, through the event recorded after the
//!    group, see [`super`]: their transfer hides behind the backward of the
//!    same step).
//!
//! After the last step one more hop brings every shard's sums home; they
//! are rounded once into the caller's `dq`, `dk`, `dv`
//! (as ring-flash-attention sums its per-step gradients in f32).
//!
//! [`RingBlock`]: crate::context_parallel::RingBlock

use cudarc::driver::CudaSlice;
use cudarc::nccl::NcclType;
use cudarc::nccl::result::{group_end, group_start};

use super::{RingRank, RingShape, block_forward_params, check_counts, check_shard_lens, held};
use crate::backward::{BackwardParams, BackwardScratch, ScratchSizes};
use crate::context_parallel::gpu_merge::AccShape;
use crate::context_parallel::schedule::{Mask, Span, grad_sums_buffer, grad_sums_home, ring_block};
use crate::context_parallel::sharding::Sharding;
use crate::error::Result;
use crate::params::ForwardParams;
use crate::tensor::{AttnElem, Extras, Tensor, TensorLayout, TensorMut};

/// One rank's inputs to [`ring_backward`], all its shards on its GPU,
/// contiguous: `q`, `out` (the ring forward's merged output), `dout`
/// `(batch, seqlen_local, nheads, headdim)`; `k`, `v` `(batch,
/// seqlen_local, nheads_k, headdim)`; `lse` the forward's merged LSE f32
/// `(batch, nheads, seqlen_local)` (a copy of [`RingRank::lse`] taken after
/// [`super::ring_forward`]).
#[derive(Clone, Copy)]
pub struct RingGradInputs<'a, T> {
    /// This rank's query shard.
    pub q: &'a CudaSlice<T>,
    /// This rank's key shard.
    pub k: &'a CudaSlice<T>,
    /// This rank's value shard.
    pub v: &'a CudaSlice<T>,
    /// The ring forward's output for this rank's queries.
    pub out: &'a CudaSlice<T>,
    /// ∂loss/∂out for this rank's queries.
    pub dout: &'a CudaSlice<T>,
    /// The ring forward's merged logsumexp for this rank's queries.
    pub lse: &'a CudaSlice<f32>,
}

/// One rank's gradient outputs, contiguous and shaped like its `q`, `k`,
/// `v` shards.
pub struct RingGrads<'a, T> {
    /// dQ of this rank's queries.
    pub dq: &'a mut CudaSlice<T>,
    /// dK of this rank's keys.
    pub dk: &'a mut CudaSlice<T>,
    /// dV of this rank's values.
    pub dv: &'a mut CudaSlice<T>,
}

/// `(argument, length, expected)` of a backward's inputs and gradients.
pub(super) fn grad_lens<T>(s: RingShape, x: &RingGradInputs<'_, T>, g: &RingGrads<'_, T>) -> [(&'static str, usize, usize); 9] {
    [
        ("q", x.q.len(), s.q_len()),
        ("k", x.k.len(), s.kv_len()),
        ("v", x.v.len(), s.kv_len()),
        ("out", x.out.len(), s.q_len()),
        ("dout", x.dout.len(), s.q_len()),
        ("softmax_lse", x.lse.len(), s.batch * s.nheads * s.seqlen_local),
        ("dq", g.dq.len(), s.q_len()),
        ("dk", g.dk.len(), s.kv_len()),
        ("dv", g.dv.len(), s.kv_len()),
    ]
}

/// The backward's buffers of a rank, allocated by its first
/// [`ring_backward`]: `2·(dk + dv)` travelling f32 sums, the f32 `dQ` sum,
/// one step's partials in `T`, the LSE of the whole shard and of its second
/// half (the exact-length statistics each block's backward takes), and the
/// backward's scratch.
pub(super) struct BwdBuffers<T> {
    /// `dkv[i] = [dk, dv]` f32 sums, alternating by step like `kv`.
    dkv: [[CudaSlice<f32>; 2]; 2],
    dq_acc: CudaSlice<f32>,
    pub(super) dq_part: CudaSlice<T>,
    pub(super) dk_part: CudaSlice<T>,
    pub(super) dv_part: CudaSlice<T>,
    pub(super) lse_whole: CudaSlice<f32>,
    lse_second: CudaSlice<f32>,
    pub(super) scratch: BackwardScratch,
}

/// The buffer `send` (read) and the other one, `recv` (written), of a pair.
fn two<X>(pair: &mut [X; 2], send: usize, recv: usize) -> (&X, &mut X) {
    debug_assert_ne!(send, recv);
    let [b0, b1] = pair;
    if send == 0 { (&*b0, b1) } else { (&*b1, b0) }
}

/// The parameters of one block's backward.
pub(super) fn block_params(params: &ForwardParams, mask: Mask, deterministic: bool) -> BackwardParams {
    BackwardParams { forward: block_forward_params(params, mask), deterministic }
}

impl<T: AttnElem + NcclType> RingRank<T> {
    /// Allocates the backward's buffers on the first call.
    fn bwd_buffers(&mut self) -> Result<()> {
        if self.bwd.is_some() {
            return Ok(());
        }
        let s = self.shape;
        let RingShape { batch: b, seqlen_local: n, nheads: h, nheads_k: hk, headdim: d } = s;
        // The scratch of the largest block of each kind (whole × whole
        // causal or full, whole × half, half × whole; a varlen rank's
        // block kinds, `super::varlen`).
        let need = if self.docs.is_some() {
            self.varlen_scratch(&block_params(&self.params, Mask::Causal, true))?
        } else {
            let mut need = ScratchSizes { delta: 0, dq_accum: 0, semaphores: 0 };
            for (nq, nk, mask) in [(n, n, Mask::Causal), (n, n, Mask::Full), (n, n / 2, Mask::Full), (n / 2, n, Mask::Full)] {
                if nq == 0 || nk == 0 {
                    continue;
                }
                let lq = TensorLayout::new([b, nq, h, d], [n * h * d, h * d, d]);
                let lk = TensorLayout::new([b, nk, hk, d], [n * hk * d, hk * d, d]);
                need = need.max(self.fa.backward_scratch_sizes::<T>(&lq, &lk, &block_params(&self.params, mask, true))?);
            }
            need
        };
        let c = &self.compute;
        let f32s = |len| c.alloc_zeros::<f32>(len);
        let (q, kv) = (s.q_len(), s.kv_len());
        self.bwd = Some(BwdBuffers {
            dkv: [[f32s(kv)?, f32s(kv)?], [f32s(kv)?, f32s(kv)?]],
            dq_acc: f32s(q)?,
            dq_part: c.alloc_zeros::<T>(q)?,
            dk_part: c.alloc_zeros::<T>(kv)?,
            dv_part: c.alloc_zeros::<T>(kv)?,
            lse_whole: f32s(b * h * n)?,
            lse_second: f32s((b * h * (n / 2)).max(1))?,
            scratch: BackwardScratch::new(c, need)?,
        });
        Ok(())
    }

    fn check_grad_inputs(&self, x: &RingGradInputs<'_, T>, g: &RingGrads<'_, T>) -> Result<()> {
        check_shard_lens(&grad_lens(self.shape, x, g))
    }

    /// Copies the forward's LSE into the whole-shard statistics and the
    /// second half's (zigzag's late chunk, the queries of the blocks of
    /// later owners).
    fn load_lse(&mut self, lse: &CudaSlice<f32>) -> Result<()> {
        let (b, h, n) = (self.shape.batch, self.shape.nheads, self.shape.seqlen_local);
        let compute = self.compute.clone();
        let bufs = self.bwd.as_mut().expect("allocated by bwd_buffers");
        let (whole, second) = (&mut bufs.lse_whole, &mut bufs.lse_second);
        compute.memcpy_dtod(lse, whole)?;
        if self.sharding == Sharding::Zigzag && self.params.causal && self.docs.is_none() {
            let half = n / 2;
            for row in 0..b * h {
                compute.memcpy_dtod(&lse.slice(row * n + half..(row + 1) * n), &mut second.slice_mut(row * half..(row + 1) * half))?;
            }
        }
        Ok(())
    }

    /// Step `step`'s transfers of the backward (inside the caller's NCCL
    /// group): K/V for step `step + 1` as the forward, and the sums of step
    /// `step − 1`'s shard on to the next rank, this step's in.
    fn exchange_bwd(&mut self, step: usize, kv_in: [&CudaSlice<T>; 3]) -> Result<()> {
        if step + 1 < self.ranks() {
            self.exchange(step, kv_in)?;
        }
        if step >= 1 {
            self.pass_sums(grad_sums_buffer(step - 1), grad_sums_buffer(step))?;
        }
        Ok(())
    }

    /// The sums in buffer `send` to the next rank, the previous rank's into
    /// buffer `recv` (inside the caller's NCCL group; nothing on one rank).
    /// The last hop (`send` the last step's, `recv` = [`grad_sums_home`])
    /// brings every rank's own sums home.
    fn pass_sums(&mut self, send: usize, recv: usize) -> Result<()> {
        let n = self.ranks();
        if n == 1 {
            return Ok(());
        }
        let (next, prev) = (((self.rank() + 1) % n) as i32, ((self.rank() + n - 1) % n) as i32);
        let bufs = self.bwd.as_mut().expect("allocated by bwd_buffers");
        let (send, recv) = two(&mut bufs.dkv, send, recv);
        self.comm.send(&send[0], next)?;
        self.comm.send(&send[1], next)?;
        let [rk, rv] = recv;
        self.comm.recv(rk, prev)?;
        self.comm.recv(rv, prev)?;
        Ok(())
    }

    /// Step `step`'s backward on the held shard and its sums.
    fn backward_step(&mut self, step: usize, x: &RingGradInputs<'_, T>, deterministic: bool) -> Result<()> {
        let (n, rank) = (self.ranks(), self.rank());
        let Some(block) = ring_block(self.sharding, self.params.causal, n, rank, step) else {
            // Nothing of this shard is visible: its sums pass on unchanged
            // (the comm stream orders their receive before their send).
            return self.transfers.wait(&self.compute);
        };
        if self.docs.is_some() {
            return self.backward_step_varlen(step, &block, [x.q, x.k, x.v, x.out, x.dout], deterministic);
        }
        let (k, v) = held(&self.kv, step, x.k, x.v);
        let RingShape { batch: b, seqlen_local: s, nheads: h, nheads_k: hk, headdim: d } = self.shape;
        let (qr, kr) = (block.q.range(s), block.k.range(s));
        let (nq, nk) = (qr.len(), kr.len());
        let lq = TensorLayout::new([b, nq, h, d], [s * h * d, h * d, d]);
        let lk = TensorLayout::new([b, nk, hk, d], [s * hk * d, hk * d, d]);
        let q0 = qr.start * h * d;
        let (qv, ov, dov) = (x.q.slice(q0..), x.out.slice(q0..), x.dout.slice(q0..));
        let (kv, vv) = (k.slice(kr.start * hk * d..), v.slice(kr.start * hk * d..));
        let bufs = self.bwd.as_mut().expect("allocated by bwd_buffers");
        let stats = match block.q {
            Span::Whole => &bufs.lse_whole,
            Span::SecondHalf => &bufs.lse_second,
            Span::FirstHalf => unreachable!("ring_block never gives the first half of the queries"),
        };
        let (lgq, lgk) = (TensorLayout::contiguous([b, nq, h, d]), TensorLayout::contiguous([b, nk, hk, d]));
        self.fa.backward_into(
            &self.compute,
            Tensor::new(&qv, lq),
            Tensor::new(&kv, lk),
            Tensor::new(&vv, lk),
            Tensor::new(&ov, lq),
            Tensor::new(&dov, lq),
            stats,
            TensorMut::new(&mut bufs.dq_part.slice_mut(..b * nq * h * d), lgq),
            TensorMut::new(&mut bufs.dk_part.slice_mut(..b * nk * hk * d), lgk),
            TensorMut::new(&mut bufs.dv_part.slice_mut(..b * nk * hk * d), lgk),
            Some(&mut bufs.scratch),
            &block_params(&self.params, block.mask, deterministic),
            &Extras::default(),
        )?;
        self.add_step_grads(step, qr, kr)
    }

    /// Adds step `step`'s partial gradients (of local query rows `qr` and
    /// key rows `kr`, packed at the partials' start) into the sums: `dQ`
    /// at home, `dK`/`dV` into the travelling sums, which this step's
    /// transfers brought (waited for here, after the step's backward has
    /// been enqueued so that the transfers overlap it).
    pub(super) fn add_step_grads(&mut self, step: usize, qr: std::ops::Range<usize>, kr: std::ops::Range<usize>) -> Result<()> {
        self.transfers.wait(&self.compute)?;
        let RingShape { batch: b, seqlen_local: s, nheads: h, nheads_k: hk, headdim: d } = self.shape;
        let (nq, nk) = (qr.len(), kr.len());
        let bufs = self.bwd.as_mut().expect("allocated by bwd_buffers");
        let init = step == 0;
        let acc_q = AccShape { batch: b, seqlen: s, nheads: h, headdim: d };
        let acc_k = AccShape { nheads: hk, ..acc_q };
        let fa = &self.fa;
        fa.ring_grad_add::<T>(&self.compute, acc_q, &mut bufs.dq_acc, &bufs.dq_part.slice(..b * nq * h * d), (qr.start, nq), init)?;
        let [dk_acc, dv_acc] = &mut bufs.dkv[grad_sums_buffer(step)];
        fa.ring_grad_add::<T>(&self.compute, acc_k, dk_acc, &bufs.dk_part.slice(..b * nk * hk * d), (kr.start, nk), init)?;
        fa.ring_grad_add::<T>(&self.compute, acc_k, dv_acc, &bufs.dv_part.slice(..b * nk * hk * d), (kr.start, nk), init)
    }

    /// Rounds the sums into the caller's gradients.
    fn finalize_grads(&mut self, g: &mut RingGrads<'_, T>) -> Result<()> {
        let n = self.ranks();
        let s = self.shape;
        let acc_q = AccShape { batch: s.batch, seqlen: s.seqlen_local, nheads: s.nheads, headdim: s.headdim };
        let acc_k = AccShape { nheads: s.nheads_k, ..acc_q };
        let bufs = self.bwd.as_ref().expect("allocated by bwd_buffers");
        let [dk, dv] = &bufs.dkv[grad_sums_home(n)];
        self.fa.ring_finalize::<T>(&self.compute, acc_q, &bufs.dq_acc, g.dq)?;
        self.fa.ring_finalize::<T>(&self.compute, acc_k, dk, g.dk)?;
        self.fa.ring_finalize::<T>(&self.compute, acc_k, dv, g.dv)
    }
}

/// The ring backward of every rank in `ranks` (all the ring's ranks when
/// one process drives every GPU, or this process's one rank): `inputs[i]`
/// and `grads[i]` are rank `ranks[i]`'s shards on its GPU, with the same
/// sharding, causality and scale as the forward. `deterministic`: each
/// step's backward in its deterministic mode (the ring's sums are in a
/// fixed order already), so the gradients are the same bits on every run.
/// Enqueues the work on each rank's streams; [`RingRank::stream`] orders
/// the results.
///
/// Errors: slices of the wrong length, mismatched rank counts, an f32
/// element type (the merge's sums take f16/bf16 partials), and every error
/// of the backward, the sums and NCCL.
pub fn ring_backward<T: AttnElem + NcclType>(
    ranks: &mut [RingRank<T>],
    inputs: &[RingGradInputs<'_, T>],
    grads: &mut [RingGrads<'_, T>],
    deterministic: bool,
) -> Result<()> {
    check_counts(ranks.len(), inputs.len(), grads.len(), "gradient sets", "one RingGradInputs and one RingGrads per rank")?;
    let Some(n) = ranks.first().map(RingRank::ranks) else { return Ok(()) };
    for ((r, x), g) in ranks.iter_mut().zip(inputs).zip(grads.iter()) {
        r.check_grad_inputs(x, g)?;
        r.bwd_buffers()?;
        r.load_lse(x.lse)?;
    }
    for step in 0..n {
        if n > 1 && (step + 1 < n || step >= 1) {
            group_start()?;
            let sent: Result<()> = ranks.iter_mut().zip(inputs).try_for_each(|(r, x)| r.exchange_bwd(step, [x.q, x.k, x.v]));
            group_end()?;
            sent?;
            ranks.iter_mut().try_for_each(|r| r.transfers.record(&r.comm))?;
        }
        for (r, x) in ranks.iter_mut().zip(inputs) {
            r.backward_step(step, x, deterministic)?;
        }
    }
    if n > 1 {
        group_start()?;
        let sent: Result<()> = ranks.iter_mut().try_for_each(|r| r.pass_sums(grad_sums_buffer(n - 1), grad_sums_home(n)));
        group_end()?;
        sent?;
        ranks.iter_mut().try_for_each(|r| r.transfers.record(&r.comm))?;
    }
    // Every rank's own sums are home before they are rounded.
    ranks.iter_mut().try_for_each(|r| r.transfers.wait(&r.compute))?;
    for (r, g) in ranks.iter_mut().zip(grads.iter_mut()) {
        r.finalize_grads(g)?;
    }
    Ok(())
}
