//! The CPU simulation: `ranks` threads, each a rank holding its shard of
//! Q, K and V, exchanging shards over channels exactly as the GPUs do over
//! NCCL (the same [`ring_block`] schedule, the same [`merge_partial`]
//! formula), each computing its local attention with the f64/f32 CPU
//! reference. It is the executable specification of the GPU path, and
//! runs in CI.
//!
//! * Ring forward: at step `s` a rank sends the K/V shard it holds to the
//!   next rank (before computing, as the GPU overlaps the two), attends its
//!   queries to the shard ([`ring_block`], per document), merges the partial
//!   `(O, LSE)` into its accumulator, and receives the next shard.
//! * Ring backward: the same K/V ring, each step's gradients computed from
//!   the *merged* `O` and `LSE` (FlashAttention-2's backward recomputes
//!   `P = exp(S − LSE)` and `D = rowsum(dO ∘ O)`, both global); `dQ` stays
//!   home, `dK`/`dV` of the held shard travel on a second ring with it and
//!   arrive at their owner after `ranks` hops.
//! * Ulysses: an all-to-all turns each rank's sequence shard of every head
//!   into the whole sequence of `nheads / ranks` query heads (and
//!   `nheads_k / ranks` KV heads), attention runs locally, a second
//!   all-to-all returns `O` and `LSE` (the backward moves `Q, K, V, O, dO,
//!   LSE` in and `dQ, dK, dV` back).

use std::sync::mpsc::{Receiver, Sender, channel};

use flash_attn_common::Real;
use ndarray::{Array3, Array4, ArrayD, ArrayView3, ArrayView4, ArrayViewMut4, Axis, Ix3, Ix4, Slice, Zip, concatenate, s};

use super::merge::merge_partial;
use super::schedule::{Mask, RingBlock, ring_block};
use super::sharding::{ShardPlan, Sharding, docs_of_cu_seqlens};
use crate::error::{FlashAttnError, Result};
use crate::params::ForwardParams;
use crate::reference::features::{check_dense, dim4, same};
use crate::reference::{AttnOutput, DEFAULT_BLOCK, Grads, VarlenGrads, VarlenOutput, attention, fa2_backward};

/// How the sequence is spread over the ranks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Strategy {
    /// K/V shards travel around a ring; any head count, `ranks − 1` hops of
    /// each shard.
    #[default]
    Ring,
    /// All-to-all over heads (DeepSpeed-Ulysses): needs `nheads` and
    /// `nheads_k` to be multiples of `ranks`; each token's Q, K, V and O
    /// cross the links once.
    Ulysses,
}

impl Strategy {
    /// The rule: Ulysses where both head counts divide evenly among the
    /// ranks (each rank's Q, K, V and O cross the links once per
    /// all-to-all, where the ring moves every K/V shard `ranks − 1` times),
    /// the ring otherwise (no head constraint, transfers hidden behind
    /// compute).
    pub fn choose(nheads: usize, nheads_k: usize, ranks: usize) -> Strategy {
        if ranks > 1 && nheads.is_multiple_of(ranks) && nheads_k.is_multiple_of(ranks) { Strategy::Ulysses } else { Strategy::Ring }
    }
}

/// A context-parallel configuration: rank count, sharding, strategy.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ContextParallel {
    /// Ranks (simulated GPUs), ≥ 1.
    pub ranks: usize,
    /// How tokens are split among the ranks.
    pub sharding: Sharding,
    /// Ring (K/V shards passed around) or Ulysses (all-to-all over heads).
    pub strategy: Strategy,
}

impl ContextParallel {
    /// A ring over `ranks` ranks with zigzag sharding.
    pub fn ring(ranks: usize) -> Self {
        Self { ranks, sharding: Sharding::Zigzag, strategy: Strategy::Ring }
    }
}

// ---------------------------------------------------------------------------
// Ranks and links.
// ---------------------------------------------------------------------------

/// One message: a bundle of tensors.
type Msg<F> = Vec<ArrayD<F>>;

/// Why a rank stopped.
enum RankError {
    /// A peer stopped first (its channel closed): the peer's error is the one to report.
    Peer,
    Fail(FlashAttnError),
}

impl<E: Into<FlashAttnError>> From<E> for RankError {
    fn from(e: E) -> Self {
        RankError::Fail(e.into())
    }
}

type RankResult<T> = std::result::Result<T, RankError>;

/// A full mesh of point-to-point links, one rank's ends: `tx[dst]`, `rx[src]`
/// (one FIFO per ordered pair, as NCCL's send/recv between two ranks).
struct Comm<F> {
    rank: usize,
    ranks: usize,
    tx: Vec<Sender<Msg<F>>>,
    rx: Vec<Receiver<Msg<F>>>,
}

impl<F> Comm<F> {
    fn mesh(ranks: usize) -> Vec<Comm<F>> {
        let mut rx: Vec<Vec<Option<Receiver<Msg<F>>>>> = (0..ranks).map(|_| (0..ranks).map(|_| None).collect()).collect();
        let mut comms: Vec<Comm<F>> = (0..ranks).map(|rank| Comm { rank, ranks, tx: Vec::new(), rx: Vec::new() }).collect();
        for (src, comm) in comms.iter_mut().enumerate() {
            for rx_dst in rx.iter_mut() {
                let (t, r) = channel();
                comm.tx.push(t);
                rx_dst[src] = Some(r);
            }
        }
        for (comm, rx) in comms.iter_mut().zip(rx) {
            comm.rx = rx.into_iter().flatten().collect();
        }
        comms
    }

    fn next(&self) -> usize {
        (self.rank + 1) % self.ranks
    }

    fn prev(&self) -> usize {
        (self.rank + self.ranks - 1) % self.ranks
    }

    fn send(&self, dst: usize, msg: Msg<F>) -> RankResult<()> {
        self.tx[dst].send(msg).map_err(|_| RankError::Peer)
    }

    fn recv(&self, src: usize) -> RankResult<Msg<F>> {
        self.rx[src].recv().map_err(|_| RankError::Peer)
    }

    /// `parts[dst]` to every rank (itself included); returns what each rank sent here.
    fn all_to_all(&self, parts: Vec<Msg<F>>) -> RankResult<Vec<Msg<F>>> {
        for (dst, part) in parts.into_iter().enumerate() {
            self.send(dst, part)?;
        }
        (0..self.ranks).map(|src| self.recv(src)).collect()
    }
}

/// One rank's links: the K/V ring (and all-to-all) and the second ring of
/// the backward's `dK`/`dV`.
struct Rank<F> {
    comm: Comm<F>,
    comm_grad: Comm<F>,
}

/// Runs `body` on `ranks` threads; the first rank error (not a peer's
/// closed channel) is the result's.
fn run_ranks<F: Send, T: Send>(ranks: usize, body: impl Fn(Rank<F>) -> RankResult<T> + Sync) -> Result<Vec<T>> {
    let ranks_of: Vec<Rank<F>> =
        Comm::mesh(ranks).into_iter().zip(Comm::mesh(ranks)).map(|(comm, comm_grad)| Rank { comm, comm_grad }).collect();
    let results: Vec<RankResult<T>> = std::thread::scope(|scope| {
        let body = &body;
        let handles: Vec<_> = ranks_of.into_iter().map(|r| scope.spawn(move || body(r))).collect();
        handles.into_iter().map(|h| h.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic))).collect()
    });
    let mut out = Vec::with_capacity(ranks);
    let mut peer_stopped = false;
    for r in results {
        match r {
            Ok(x) => out.push(x),
            Err(RankError::Fail(e)) => return Err(e),
            Err(RankError::Peer) => peer_stopped = true,
        }
    }
    if peer_stopped {
        return Err(FlashAttnError::InvalidArgument {
            argument: "ranks",
            value: ranks.to_string(),
            reason: "a rank's link closed while no rank reported an error",
        });
    }
    Ok(out)
}

fn to_dyn4<F>(x: Array4<F>) -> ArrayD<F> {
    x.into_dyn()
}

/// The next tensor of a message, as `D` (its sender's tensor, in order).
fn next_of<F, D: ndarray::Dimension>(msg: &mut impl Iterator<Item = ArrayD<F>>) -> RankResult<ndarray::Array<F, D>> {
    let x = msg.next().ok_or(RankError::Fail(FlashAttnError::InvalidArgument {
        argument: "message",
        value: "too few tensors".into(),
        reason: "a rank received a shorter message than its peer sends",
    }))?;
    Ok(x.into_dimensionality::<D>()?)
}

fn add_into<F: Real>(mut acc: ArrayViewMut4<F>, x: ArrayView4<F>) {
    Zip::from(&mut acc).and(&x).for_each(|a, &b| *a = *a + b);
}

// ---------------------------------------------------------------------------
// Validation.
// ---------------------------------------------------------------------------

/// A validated call: the shard plan and the per-block parameters.
struct Setup {
    plan: ShardPlan,
    cp: ContextParallel,
    causal: bool,
    softmax_scale: Option<f32>,
}

impl Setup {
    /// `docs`: the documents along q's sequence axis (one per dense call).
    fn new<F: Real>(q: &ArrayView4<F>, k: &ArrayView4<F>, v: &ArrayView4<F>, docs: &[usize], params: &ForwardParams, cp: &ContextParallel) -> Result<Self> {
        if params.has_window_or_softcap() {
            return Err(FlashAttnError::InvalidArgument {
                argument: "params",
                value: format!("{params:?}"),
                reason: "context-parallel attention supports causal and softmax_scale (no window, no softcap)",
            });
        }
        check_dense(q, k, v, params, None)?;
        let (qs, ks) = (dim4(q), dim4(k));
        same("k", "seqlen", ks[1], qs[1], "context parallelism shards one sequence: q, k and v share it")?;
        if cp.strategy == Strategy::Ulysses {
            for (argument, heads) in [("q", qs[2]), ("k", ks[2])] {
                if !heads.is_multiple_of(cp.ranks) {
                    return Err(FlashAttnError::InvalidArgument {
                        argument,
                        value: format!("{heads} heads over {} ranks", cp.ranks),
                        reason: "Ulysses gives every rank nheads / ranks query heads and nheads_k / ranks KV heads: both must divide evenly (use Strategy::Ring)",
                    });
                }
            }
        }
        let plan = ShardPlan::new(cp.sharding, cp.ranks, docs)?;
        Ok(Self { plan, cp: *cp, causal: params.causal, softmax_scale: params.softmax_scale })
    }

    fn block_params(&self, causal: bool) -> ForwardParams {
        ForwardParams { causal, softmax_scale: self.softmax_scale, ..Default::default() }
    }

    /// `(offset, length)` of the documents in the whole sequence.
    fn global_docs(&self) -> Vec<(usize, usize)> {
        let mut off = 0;
        self.plan.docs().iter().map(|&len| {
            off += len;
            (off - len, len)
        }).collect()
    }

    fn shard4<F: Real>(&self, x: &ArrayView4<F>, rank: usize) -> Array4<F> {
        self.plan.shard(x.view(), Axis(1), rank)
    }
}

// ---------------------------------------------------------------------------
// Forward.
// ---------------------------------------------------------------------------

/// Context-parallel attention forward of `q (batch, seqlen, nheads, d)`,
/// `k`, `v (batch, seqlen, nheads_k, d)` on `cp.ranks` simulated ranks:
/// shards, runs the ranks, and returns the whole sequence's `O` and `LSE`
/// (as [`crate::reference::attention`] would). `params`: `causal` and
/// `softmax_scale` (no window or softcap).
///
/// Errors: the reference's shape rules, `seqlen` not a multiple of `ranks`
/// (contiguous) or `2·ranks` (zigzag), Ulysses with head counts that are
/// not multiples of `ranks`, `ranks == 0`.
pub fn cp_forward<F: Real + Send + Sync>(
    q: ArrayView4<F>,
    k: ArrayView4<F>,
    v: ArrayView4<F>,
    params: &ForwardParams,
    cp: &ContextParallel,
) -> Result<AttnOutput<F>> {
    let setup = Setup::new(&q, &k, &v, &[q.dim().1], params, cp)?;
    forward(&setup, q, k, v)
}

/// [`cp_forward`] of a packed varlen batch, `q (total, nheads, d)`, `k`, `v
/// (total, nheads_k, d)`, documents delimited by `cu_seqlens` (the same for
/// queries and keys); every document is sharded on its own (each a multiple
/// of the chunk count). Returns `O (total, nheads, d)`, `LSE (nheads,
/// total)` as [`crate::reference::attention_varlen`].
pub fn cp_forward_varlen<F: Real + Send + Sync>(
    q: ArrayView3<F>,
    k: ArrayView3<F>,
    v: ArrayView3<F>,
    cu_seqlens: &[i32],
    params: &ForwardParams,
    cp: &ContextParallel,
) -> Result<VarlenOutput<F>> {
    let docs = docs_of_cu_seqlens(cu_seqlens, q.dim().0)?;
    let (q, k, v) = (q.insert_axis(Axis(0)), k.insert_axis(Axis(0)), v.insert_axis(Axis(0)));
    let setup = Setup::new(&q, &k, &v, &docs, params, cp)?;
    let out = forward(&setup, q, k, v)?;
    Ok(VarlenOutput { o: out.o.index_axis_move(Axis(0), 0), lse: out.lse.index_axis_move(Axis(0), 0) })
}

fn forward<F: Real + Send + Sync>(setup: &Setup, q: ArrayView4<F>, k: ArrayView4<F>, v: ArrayView4<F>) -> Result<AttnOutput<F>> {
    let parts = run_ranks(setup.cp.ranks, |rank: Rank<F>| {
        let r = rank.comm.rank;
        let (q, k, v) = (setup.shard4(&q, r), setup.shard4(&k, r), setup.shard4(&v, r));
        match setup.cp.strategy {
            Strategy::Ring => ring_forward_rank(setup, &rank.comm, q, k, v),
            Strategy::Ulysses => ulysses_forward_rank(setup, &rank.comm, q, k, v),
        }
    })?;
    let o: Vec<_> = parts.iter().map(|(o, _)| o.view()).collect();
    let lse: Vec<_> = parts.iter().map(|(_, l)| l.view()).collect();
    Ok(AttnOutput { o: setup.plan.unshard(&o, Axis(1))?, lse: setup.plan.unshard(&lse, Axis(2))? })
}

/// Query and key rows of `block` for each local document.
fn block_rows(setup: &Setup, block: &RingBlock) -> Vec<(std::ops::Range<usize>, std::ops::Range<usize>)> {
    setup.plan.local_docs().into_iter().filter(|&(_, len)| len > 0).map(|(off, len)| {
        let (qr, kr) = (block.q.range(len), block.k.range(len));
        (off + qr.start..off + qr.end, off + kr.start..off + kr.end)
    }).collect()
}

fn ring_forward_rank<F: Real>(setup: &Setup, comm: &Comm<F>, q: Array4<F>, k: Array4<F>, v: Array4<F>) -> RankResult<(Array4<F>, Array3<F>)> {
    let (batch, seqlen, nheads, d) = q.dim();
    let mut o = Array4::from_elem((batch, seqlen, nheads, d), F::ZERO);
    let mut lse = Array3::from_elem((batch, nheads, seqlen), F::NEG_INFINITY);
    let (mut k, mut v) = (k, v);
    let ranks = setup.cp.ranks;
    for step in 0..ranks {
        let last = step + 1 == ranks;
        if !last {
            comm.send(comm.next(), vec![to_dyn4(k.clone()), to_dyn4(v.clone())])?;
        }
        if let Some(block) = ring_block(setup.cp.sharding, setup.causal, ranks, comm.rank, step) {
            let params = setup.block_params(block.mask == Mask::Causal);
            for (qr, kr) in block_rows(setup, &block) {
                let part = attention(
                    q.slice(s![.., qr.clone(), .., ..]),
                    k.slice(s![.., kr.clone(), .., ..]),
                    v.slice(s![.., kr, .., ..]),
                    &params,
                    None,
                )?;
                merge_partial(o.slice_mut(s![.., qr.clone(), .., ..]), lse.slice_mut(s![.., .., qr]), part.o.view(), part.lse.view())?;
            }
        }
        if !last {
            let mut msg = comm.recv(comm.prev())?.into_iter();
            (k, v) = (next_of::<_, Ix4>(&mut msg)?, next_of::<_, Ix4>(&mut msg)?);
        }
    }
    Ok((o, lse))
}

/// The heads of rank `dst` out of `nheads` (contiguous groups).
fn heads_of(nheads: usize, ranks: usize, dst: usize) -> Slice {
    let per = nheads / ranks;
    Slice::from(dst * per..(dst + 1) * per)
}

/// Ulysses' first all-to-all: every rank's sequence shard of `xs`' head
/// groups out, the whole sequence of this rank's head group back.
/// `head_axis[i]` and `seq_axis[i]` are tensor `i`'s axes.
fn heads_to_sequence<F: Real>(setup: &Setup, comm: &Comm<F>, xs: &[ArrayD<F>], head_axis: &[usize], seq_axis: &[usize]) -> RankResult<Vec<ArrayD<F>>> {
    let ranks = comm.ranks;
    let parts = (0..ranks)
        .map(|dst| {
            xs.iter().zip(head_axis).map(|(x, &ha)| x.slice_axis(Axis(ha), heads_of(x.shape()[ha], ranks, dst)).to_owned()).collect()
        })
        .collect();
    let got = comm.all_to_all(parts)?;
    (0..xs.len())
        .map(|i| {
            let views: Vec<_> = got.iter().map(|m| m[i].view()).collect();
            Ok(setup.plan.unshard(&views, Axis(seq_axis[i]))?)
        })
        .collect()
}

/// Ulysses' second all-to-all: this rank's head group of the whole
/// sequence out (each rank its shard), every head of the local shard back.
fn sequence_to_heads<F: Real>(setup: &Setup, comm: &Comm<F>, xs: &[ArrayD<F>], head_axis: &[usize], seq_axis: &[usize]) -> RankResult<Vec<ArrayD<F>>> {
    let parts = (0..comm.ranks)
        .map(|dst| xs.iter().zip(seq_axis).map(|(x, &sa)| setup.plan.shard(x.view(), Axis(sa), dst)).collect())
        .collect();
    let got = comm.all_to_all(parts)?;
    (0..xs.len())
        .map(|i| {
            let views: Vec<_> = got.iter().map(|m| m[i].view()).collect();
            Ok(concatenate(Axis(head_axis[i]), &views)?)
        })
        .collect()
}

fn ulysses_forward_rank<F: Real>(setup: &Setup, comm: &Comm<F>, q: Array4<F>, k: Array4<F>, v: Array4<F>) -> RankResult<(Array4<F>, Array3<F>)> {
    let mut full = heads_to_sequence(setup, comm, &[q.into_dyn(), k.into_dyn(), v.into_dyn()], &[2, 2, 2], &[1, 1, 1])?.into_iter();
    let (q, k, v) = (next_of::<_, Ix4>(&mut full)?, next_of::<_, Ix4>(&mut full)?, next_of::<_, Ix4>(&mut full)?);
    let (batch, seqlen, nheads, d) = q.dim();
    let mut o = Array4::from_elem((batch, seqlen, nheads, d), F::ZERO);
    let mut lse = Array3::from_elem((batch, nheads, seqlen), F::NEG_INFINITY);
    let params = setup.block_params(setup.causal);
    for (off, len) in setup.global_docs().into_iter().filter(|&(_, len)| len > 0) {
        let rows = off..off + len;
        let part = attention(q.slice(s![.., rows.clone(), .., ..]), k.slice(s![.., rows.clone(), .., ..]), v.slice(s![.., rows.clone(), .., ..]), &params, None)?;
        o.slice_mut(s![.., rows.clone(), .., ..]).assign(&part.o);
        lse.slice_mut(s![.., .., rows]).assign(&part.lse);
    }
    let mut back = sequence_to_heads(setup, comm, &[o.into_dyn(), lse.into_dyn()], &[2, 1], &[1, 2])?.into_iter();
    Ok((next_of::<_, Ix4>(&mut back)?, next_of::<_, Ix3>(&mut back)?))
}

// ---------------------------------------------------------------------------
// Backward.
// ---------------------------------------------------------------------------

/// Context-parallel backward: `dQ`, `dK`, `dV` of [`cp_forward`] given the
/// forward's merged `out (batch, seqlen, nheads, d)` and `lse (batch,
/// nheads, seqlen)` and the output gradient `dout` (like `out`), the whole
/// sequence in, the whole sequence out. Errors: [`cp_forward`]'s, and
/// `out`, `dout`, `lse` shapes.
#[allow(clippy::too_many_arguments)]
pub fn cp_backward<'a, F: Real + Send + Sync>(
    q: ArrayView4<'a, F>,
    k: ArrayView4<'a, F>,
    v: ArrayView4<'a, F>,
    out: ArrayView4<'a, F>,
    dout: ArrayView4<'a, F>,
    lse: ArrayView3<F>,
    params: &ForwardParams,
    cp: &ContextParallel,
) -> Result<Grads<F>> {
    let setup = Setup::new(&q, &k, &v, &[q.dim().1], params, cp)?;
    backward(&setup, [q, k, v, out, dout], lse)
}

/// [`cp_backward`] of a packed varlen batch (layouts of
/// [`cp_forward_varlen`]: `out`, `dout` `(total, nheads, d)`, `lse`
/// `(nheads, total)`).
#[allow(clippy::too_many_arguments)]
pub fn cp_backward_varlen<'a, F: Real + Send + Sync>(
    q: ArrayView3<'a, F>,
    k: ArrayView3<'a, F>,
    v: ArrayView3<'a, F>,
    out: ArrayView3<'a, F>,
    dout: ArrayView3<'a, F>,
    lse: ndarray::ArrayView2<F>,
    cu_seqlens: &[i32],
    params: &ForwardParams,
    cp: &ContextParallel,
) -> Result<VarlenGrads<F>> {
    let docs = docs_of_cu_seqlens(cu_seqlens, q.dim().0)?;
    let [q, k, v, out, dout] = [q, k, v, out, dout].map(|x| x.insert_axis(Axis(0)));
    let setup = Setup::new(&q, &k, &v, &docs, params, cp)?;
    let g = backward(&setup, [q, k, v, out, dout], lse.insert_axis(Axis(0)))?;
    let [dq, dk, dv] = [g.dq, g.dk, g.dv].map(|x| x.index_axis_move(Axis(0), 0));
    Ok(VarlenGrads { dq, dk, dv })
}

fn backward<F: Real + Send + Sync>(setup: &Setup, [q, k, v, out, dout]: [ArrayView4<F>; 5], lse: ArrayView3<F>) -> Result<Grads<F>> {
    let (batch, seqlen, nheads, _) = q.dim();
    let rule = "out and dout are (batch, seqlen, nheads, headdim) like q";
    for (argument, x) in [("out", &out), ("dout", &dout)] {
        for (a, axis) in ["batch", "seqlen", "nheads", "headdim"].into_iter().enumerate() {
            same(argument, axis, x.shape()[a], q.shape()[a], rule)?;
        }
    }
    if lse.dim() != (batch, nheads, seqlen) {
        return Err(FlashAttnError::InvalidArgument { argument: "lse", value: format!("shape {:?}", lse.dim()), reason: "must be (batch, nheads, seqlen_q)" });
    }
    let parts = run_ranks(setup.cp.ranks, |rank: Rank<F>| {
        let r = rank.comm.rank;
        let local = [&q, &k, &v, &out, &dout].map(|x| setup.shard4(x, r));
        let lse = setup.plan.shard(lse.view(), Axis(2), r);
        match setup.cp.strategy {
            Strategy::Ring => ring_backward_rank(setup, &rank, local, lse),
            Strategy::Ulysses => ulysses_backward_rank(setup, &rank.comm, local, lse),
        }
    })?;
    let unshard = |i: usize| -> Result<Array4<F>> {
        let views: Vec<_> = parts.iter().map(|p: &[Array4<F>; 3]| p[i].view()).collect();
        setup.plan.unshard(&views, Axis(1))
    };
    Ok(Grads { dq: unshard(0)?, dk: unshard(1)?, dv: unshard(2)? })
}

/// FlashAttention-2's backward of one block from the global `O` and `LSE`.
fn block_grads<F: Real>(setup: &Setup, mask: Mask, [q, k, v, o, dout]: [ArrayView4<F>; 5], lse: ArrayView3<F>) -> Result<Grads<F>> {
    let (br, bc) = DEFAULT_BLOCK;
    fa2_backward(q, k, v, o, dout, lse, &setup.block_params(mask == Mask::Causal), None, br, bc)
}

fn ring_backward_rank<F: Real>(setup: &Setup, rank: &Rank<F>, [q, k, v, o, dout]: [Array4<F>; 5], lse: Array3<F>) -> RankResult<[Array4<F>; 3]> {
    let (comm, comm_grad) = (&rank.comm, &rank.comm_grad);
    let ranks = setup.cp.ranks;
    let mut dq = Array4::from_elem(q.dim(), F::ZERO);
    // The held shard and the gradients of its keys, which travel with it.
    let (mut k, mut v) = (k, v);
    let (mut dk, mut dv) = (Array4::from_elem(k.dim(), F::ZERO), Array4::from_elem(v.dim(), F::ZERO));
    for step in 0..ranks {
        let last = step + 1 == ranks;
        if !last {
            comm.send(comm.next(), vec![to_dyn4(k.clone()), to_dyn4(v.clone())])?;
        }
        if let Some(block) = ring_block(setup.cp.sharding, setup.causal, ranks, comm.rank, step) {
            for (qr, kr) in block_rows(setup, &block) {
                let qs = s![.., qr.clone(), .., ..];
                let ks = s![.., kr.clone(), .., ..];
                let g = block_grads(setup, block.mask, [q.slice(qs), k.slice(ks), v.slice(ks), o.slice(qs), dout.slice(qs)], lse.slice(s![.., .., qr.clone()]))?;
                add_into(dq.slice_mut(qs), g.dq.view());
                add_into(dk.slice_mut(ks), g.dk.view());
                add_into(dv.slice_mut(ks), g.dv.view());
            }
        }
        // dK, dV one hop along the second ring, every step: after `ranks`
        // hops each arrives at its shard's owner.
        comm_grad.send(comm_grad.next(), vec![to_dyn4(dk), to_dyn4(dv)])?;
        let mut msg = comm_grad.recv(comm_grad.prev())?.into_iter();
        (dk, dv) = (next_of::<_, Ix4>(&mut msg)?, next_of::<_, Ix4>(&mut msg)?);
        if !last {
            let mut msg = comm.recv(comm.prev())?.into_iter();
            (k, v) = (next_of::<_, Ix4>(&mut msg)?, next_of::<_, Ix4>(&mut msg)?);
        }
    }
    Ok([dq, dk, dv])
}

fn ulysses_backward_rank<F: Real>(setup: &Setup, comm: &Comm<F>, local: [Array4<F>; 5], lse: Array3<F>) -> RankResult<[Array4<F>; 3]> {
    let mut xs: Vec<ArrayD<F>> = local.into_iter().map(to_dyn4).collect();
    xs.push(lse.into_dyn());
    let mut full = heads_to_sequence(setup, comm, &xs, &[2, 2, 2, 2, 2, 1], &[1, 1, 1, 1, 1, 2])?.into_iter();
    let [q, k, v, o, dout] = [(); 5].map(|()| next_of::<_, Ix4>(&mut full));
    let (q, k, v, o, dout, lse) = (q?, k?, v?, o?, dout?, next_of::<_, Ix3>(&mut full)?);
    let mut dq = Array4::from_elem(q.dim(), F::ZERO);
    let (mut dk, mut dv) = (Array4::from_elem(k.dim(), F::ZERO), Array4::from_elem(v.dim(), F::ZERO));
    let mask = if setup.causal { Mask::Causal } else { Mask::Full };
    for (off, len) in setup.global_docs().into_iter().filter(|&(_, len)| len > 0) {
        let rows = s![.., off..off + len, .., ..];
        let g = block_grads(setup, mask, [q.slice(rows), k.slice(rows), v.slice(rows), o.slice(rows), dout.slice(rows)], lse.slice(s![.., .., off..off + len]))?;
        dq.slice_mut(rows).assign(&g.dq);
        dk.slice_mut(rows).assign(&g.dk);
        dv.slice_mut(rows).assign(&g.dv);
    }
    let mut back = sequence_to_heads(setup, comm, &[dq.into_dyn(), dk.into_dyn(), dv.into_dyn()], &[2, 2, 2], &[1, 1, 1])?.into_iter();
    Ok([next_of::<_, Ix4>(&mut back)?, next_of::<_, Ix4>(&mut back)?, next_of::<_, Ix4>(&mut back)?])
}
