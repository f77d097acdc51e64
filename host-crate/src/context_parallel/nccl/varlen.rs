//! The ring over packed varlen shards (documents of a packed batch, each
//! sharded by [`ShardPlan`]): a rank's local shard is its chunks of every
//! document, in document order ([`ShardPlan::local_docs`]), and so is every
//! K/V shard travelling the ring. Each step's block ([`ring_block`], the
//! same per document) runs as **one** varlen call over the whole local
//! shard: [`varlen_segments`] pairs the block's query rows of each document
//! with its key rows and puts every other row in a segment with no keys
//! (`O = 0`, `LSE = −∞`: the merge's identity) or no queries (`dK = dV =
//! 0`), so the step's partials cover every local row and merge (or add)
//! whole, as the dense ring's do. The prefix sums of the few block kinds a
//! rank meets are uploaded once, by [`RingRank::new_varlen`].

use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream};
use cudarc::nccl::{Comm, NcclType};

use super::backward::block_params;
use super::{RingRank, RingShape, block_forward_params, held};
use crate::backward::ScratchSizes;
use crate::context_parallel::schedule::{RingBlock, Span, ring_block, varlen_segments};
use crate::context_parallel::sharding::ShardPlan;
use crate::device::FlashAttention;
use crate::error::{FlashAttnError, Result};
use crate::params::ForwardParams;
use crate::tensor::{AttnElem, Extras, Tensor, TensorLayout, TensorMut, Varlen};

/// One block kind's segments on the device.
struct DeviceSegments {
    spans: (Span, Span),
    cu_q: CudaSlice<i32>,
    cu_k: CudaSlice<i32>,
    max_q: usize,
    max_k: usize,
}

impl DeviceSegments {
    fn varlen(&self) -> Varlen<'_> {
        Varlen { cu_seqlens_q: &self.cu_q, cu_seqlens_k: &self.cu_k, max_seqlen_q: self.max_q, max_seqlen_k: self.max_k, seqused_k: None }
    }

    /// Sequences of the varlen call.
    fn batch(&self) -> usize {
        self.cu_q.len() - 1
    }
}

/// A varlen rank's documents: the segments of every block kind its steps
/// compute.
pub(super) struct RingDocs {
    blocks: Vec<DeviceSegments>,
}

impl RingDocs {
    /// The segments of each distinct block of rank `rank`'s steps, uploaded
    /// on `stream`.
    fn new(stream: &Arc<CudaStream>, plan: &ShardPlan, causal: bool, rank: usize) -> Result<Self> {
        let local = plan.local_docs();
        let mut blocks: Vec<DeviceSegments> = Vec::new();
        for step in 0..plan.ranks() {
            let Some(block) = ring_block(plan.sharding(), causal, plan.ranks(), rank, step) else { continue };
            if blocks.iter().any(|b| b.spans == (block.q, block.k)) {
                continue;
            }
            let s = varlen_segments(&local, &block);
            blocks.push(DeviceSegments {
                spans: (block.q, block.k),
                cu_q: stream.clone_htod(&s.cu_seqlens_q)?,
                cu_k: stream.clone_htod(&s.cu_seqlens_k)?,
                max_q: s.max_seqlen_q,
                max_k: s.max_seqlen_k,
            });
        }
        Ok(Self { blocks })
    }

    fn of(&self, block: &RingBlock) -> &DeviceSegments {
        // Every block of the rank's schedule was uploaded by `new`.
        self.blocks.iter().find(|b| b.spans == (block.q, block.k)).expect("segments of every scheduled block")
    }
}

impl<T: AttnElem + NcclType> RingRank<T> {
    /// A rank of the ring over a packed varlen batch: `plan` says the
    /// documents (their global lengths, each a multiple of the chunk count)
    /// and the sharding; `shape` is `batch: 1`, `seqlen_local` the rank's
    /// packed rows ([`ShardPlan::local_len`]). The shards (and
    /// [`RingRank::lse`], `(nheads, seqlen_local)`) are packed as
    /// [`ShardPlan::shard`] cuts them, and [`super::ring_forward`] and
    /// [`super::ring_backward`] take them as for a dense rank: document `i`
    /// attends to itself only (causal or not), its tokens spread over every
    /// rank.
    ///
    /// Errors: those of [`RingRank::new`], a `batch` other than 1, a plan
    /// for another number of ranks than `comm`'s or another local length.
    pub fn new_varlen(
        fa: Arc<FlashAttention>,
        comm: Comm,
        compute: Arc<CudaStream>,
        shape: RingShape,
        plan: &ShardPlan,
        params: &ForwardParams,
    ) -> Result<Self> {
        if shape.batch != 1 {
            return Err(FlashAttnError::InvalidArgument {
                argument: "shape",
                value: format!("batch {}", shape.batch),
                reason: "a varlen ring packs its documents into one sequence: batch must be 1",
            });
        }
        if plan.ranks() != comm.world_size() || plan.local_len() != shape.seqlen_local {
            return Err(FlashAttnError::InvalidArgument {
                argument: "plan",
                value: format!("{} ranks, {} local rows", plan.ranks(), plan.local_len()),
                reason: "the plan must shard over the communicator's ranks into the shape's seqlen_local rows",
            });
        }
        let rank = comm.rank();
        let mut r = Self::new(fa, comm, compute, shape, plan.sharding(), params)?;
        r.docs = Some(RingDocs::new(&r.compute, plan, params.causal, rank)?);
        Ok(r)
    }

    /// Step `step`'s attention of a varlen rank (`[q, k, v]` its own
    /// shards): `block` over every document in one varlen call, merged over
    /// every local row.
    pub(super) fn compute_step_varlen(&mut self, step: usize, block: &RingBlock, [q, k, v]: [&CudaSlice<T>; 3]) -> Result<()> {
        let RingShape { seqlen_local: s, nheads: h, nheads_k: hk, headdim: d, .. } = self.shape;
        let (k, v) = held(&self.kv, step, k, v);
        let seg = self.docs.as_ref().expect("a varlen rank").of(block);
        let (lq, lk) = (TensorLayout::varlen(s, h, d), TensorLayout::varlen(s, hk, d));
        self.fa.forward_varlen_into(
            &self.compute,
            Tensor::new(q, lq),
            Tensor::new(k, lk),
            Tensor::new(v, lk),
            TensorMut::new(&mut self.o_part, lq),
            &mut self.lse_part,
            &seg.varlen(),
            &block_forward_params(&self.params, block.mask),
            &Extras::default(),
        )?;
        self.fa.ring_merge::<T>(&self.compute, self.shape.acc(), (&mut self.o_acc, &mut self.lse_acc), (&self.o_part, &self.lse_part), (0, s), step == 0)
    }

    /// The largest scratch of the varlen backward's block kinds.
    pub(super) fn varlen_scratch(&self, params: &crate::backward::BackwardParams) -> Result<ScratchSizes> {
        let RingShape { seqlen_local: s, nheads: h, nheads_k: hk, headdim: d, .. } = self.shape;
        let (lq, lk) = (TensorLayout::varlen(s, h, d), TensorLayout::varlen(s, hk, d));
        let mut need = ScratchSizes { delta: 0, dq_accum: 0, semaphores: 0 };
        for seg in &self.docs.as_ref().expect("a varlen rank").blocks {
            need = need.max(self.fa.backward_varlen_scratch_sizes::<T>(&lq, &lk, seg.batch(), (seg.max_q, seg.max_k), params)?);
        }
        Ok(need)
    }

    /// Step `step`'s backward of a varlen rank (`[q, k, v, out, dout]` its
    /// own shards): `block`'s partial gradients of every local row in one
    /// varlen call, added into the sums.
    pub(super) fn backward_step_varlen(
        &mut self,
        step: usize,
        block: &RingBlock,
        [q, k, v, out, dout]: [&CudaSlice<T>; 5],
        deterministic: bool,
    ) -> Result<()> {
        let RingShape { seqlen_local: s, nheads: h, nheads_k: hk, headdim: d, .. } = self.shape;
        let (k, v) = held(&self.kv, step, k, v);
        let seg = self.docs.as_ref().expect("a varlen rank").of(block);
        let (lq, lk) = (TensorLayout::varlen(s, h, d), TensorLayout::varlen(s, hk, d));
        let bufs = self.bwd.as_mut().expect("allocated by bwd_buffers");
        let params = block_params(&self.params, block.mask, deterministic);
        self.fa.backward_varlen_into(
            &self.compute,
            Tensor::new(q, lq),
            Tensor::new(k, lk),
            Tensor::new(v, lk),
            Tensor::new(out, lq),
            Tensor::new(dout, lq),
            &bufs.lse_whole,
            TensorMut::new(&mut bufs.dq_part, lq),
            TensorMut::new(&mut bufs.dk_part, lk),
            TensorMut::new(&mut bufs.dv_part, lk),
            Some(&mut bufs.scratch),
            &seg.varlen(),
            &params,
            &Extras::default(),
        )?;
        self.add_step_grads(step, 0..s, 0..s)
    }
}
