//! Ulysses over NCCL (DeepSpeed-Ulysses): an all-to-all turns each rank's
//! sequence shard of every head into the whole sequence of its group of
//! `nheads / N` query heads and `nheads_k / N` KV heads; the attention runs
//! locally over the whole sequence (one FlashAttention call: any mask the
//! forward takes, nothing to merge); a second all-to-all returns `O` and
//! the LSE to the ranks that hold the tokens. The backward moves `Q, K, V,
//! O, dO` and the LSE the same way, runs one backward over the whole
//! sequence, and returns `dQ, dK, dV`. [`crate::context_parallel::cp_forward`]
//! with [`crate::context_parallel::Strategy::Ulysses`] simulates the same
//! exchange on the CPU.
//!
//! Shards are contiguous (rank `r` holds tokens `r·s..(r+1)·s` of every
//! sequence, `s = seqlen_local`): after the all-to-all a rank's tokens are
//! in sequence order, so the causal mask needs no balancing (every rank has
//! the whole sequence of the same number of heads: equal work).
//!
//! Layout moves: a head group of a shard is strided (`nheads·d` per token),
//! so it is packed into a contiguous block per destination with one 2-D
//! copy; each (destination, sequence) block then travels with one NCCL
//! send, straight into its place in the receiver's whole-sequence tensor
//! (`(batch, seqlen, heads / N, d)`, contiguous). Back, a whole-sequence
//! tensor's block of a rank's tokens is contiguous and is sent as it is;
//! the receiver unpacks the head groups with one 2-D copy per source. The
//! LSE `(batch, heads, tokens)` moves in one send per (sequence, head).
//! All of one all-to-all is one NCCL group; the compute stream waits for an
//! event recorded after it (see [`super`] on why cudarc's own are not enough).

use std::sync::Arc;

use cudarc::driver::sys::{CUDA_MEMCPY2D, CUmemorytype, cuMemcpy2DAsync_v2};
use cudarc::driver::{CudaSlice, CudaStream, DevicePtr, DevicePtrMut};
use cudarc::nccl::result::{group_end, group_start};
use cudarc::nccl::{Comm, NcclType};

use super::backward::grad_lens;
use super::{RingGradInputs, RingGrads, RingShape, Transfers, check_counts, check_shard_lens};
use crate::backward::{BackwardParams, BackwardScratch};
use crate::device::FlashAttention;
use crate::error::{FlashAttnError, Result};
use crate::params::ForwardParams;
use crate::tensor::{AttnElem, Extras, StatsMut, Tensor, TensorLayout, TensorMut};
use crate::varlen::check_gqa;

/// One rank of Ulysses: its GPU's kernels, its NCCL communicator (whose
/// stream carries the all-to-alls), its compute stream and buffers: the
/// packed head groups and the whole-sequence tensors of its heads: `3·q +
/// 4·kv` elements of `T` and two LSEs for the forward (`q`, `kv` a shard's
/// sizes), `5·q + 2·kv` more and the backward's scratch for the backward
/// (allocated by its first call).
pub struct UlyssesRank<T> {
    fa: Arc<FlashAttention>,
    comm: Comm,
    compute: Arc<CudaStream>,
    shape: RingShape,
    params: ForwardParams,
    /// Packed head groups `[dst][batch][token][head][d]` of q, k, v (and,
    /// back, of O or of dQ, dK, dV).
    pack: [CudaSlice<T>; 3],
    /// This rank's heads over the whole sequence: q, k, v, O.
    full: [CudaSlice<T>; 4],
    lse_full: CudaSlice<f32>,
    /// The LSE of this rank's tokens, every head `(batch, nheads, seqlen_local)`.
    lse: CudaSlice<f32>,
    bwd: Option<UlyssesBwd<T>>,
    transfers: Transfers,
}

/// The backward's extra buffers: packed O and dO, the whole sequence's dO,
/// dQ, dK, dV, the LSE as the backward's statistics, its scratch.
struct UlyssesBwd<T> {
    pack: [CudaSlice<T>; 2],
    full: [CudaSlice<T>; 4],
    lse: CudaSlice<f32>,
    scratch: BackwardScratch,
}

/// A strided block copy on `stream`: `height` rows of `width` elements from
/// `src` (rows `src_pitch` elements apart) to `dst` (`dst_pitch` apart).
fn copy_2d<T: AttnElem>(
    stream: &Arc<CudaStream>,
    (src, src_off, src_pitch): (&CudaSlice<T>, usize, usize),
    (dst, dst_off, dst_pitch): (&mut CudaSlice<T>, usize, usize),
    width: usize,
    height: usize,
) -> Result<()> {
    if height == 0 || width == 0 {
        return Ok(());
    }
    let last = |off: usize, pitch: usize| off + (height - 1) * pitch + width;
    if last(src_off, src_pitch) > src.len() || last(dst_off, dst_pitch) > dst.len() || width > src_pitch || width > dst_pitch {
        return Err(FlashAttnError::InvalidArgument {
            argument: "copy_2d",
            value: format!("{height} rows of {width} at {src_off}/{src_pitch} → {dst_off}/{dst_pitch}"),
            reason: "a head-group copy out of its buffers (internal layout error)",
        });
    }
    let sz = std::mem::size_of::<T>();
    let (s, _gs) = src.device_ptr(stream);
    let (d, _gd) = dst.device_ptr_mut(stream);
    let copy = CUDA_MEMCPY2D {
        srcXInBytes: 0,
        srcY: 0,
        srcMemoryType: CUmemorytype::CU_MEMORYTYPE_DEVICE,
        srcHost: std::ptr::null(),
        srcDevice: s + (src_off * sz) as u64,
        srcArray: std::ptr::null_mut(),
        srcPitch: src_pitch * sz,
        dstXInBytes: 0,
        dstY: 0,
        dstMemoryType: CUmemorytype::CU_MEMORYTYPE_DEVICE,
        dstHost: std::ptr::null_mut(),
        dstDevice: d + (dst_off * sz) as u64,
        dstArray: std::ptr::null_mut(),
        dstPitch: dst_pitch * sz,
        WidthInBytes: width * sz,
        Height: height,
    };
    // SAFETY: both ranges checked inside their allocations above; the
    // pointers' guards live until after the copy is enqueued on `stream`.
    unsafe { cuMemcpy2DAsync_v2(&copy, stream.cu_stream()) }.result()?;
    Ok(())
}

/// Packs `x` (a shard `(batch, seqlen_local, per·N heads, d)`) into `pack`
/// as `[dst][batch][token][per heads][d]`: one 2-D copy per destination.
fn pack_heads<T: AttnElem>(stream: &Arc<CudaStream>, shape: RingShape, n: usize, x: &CudaSlice<T>, pack: &mut CudaSlice<T>, per: usize) -> Result<()> {
    let (row, w, rows) = (per * n * shape.headdim, per * shape.headdim, shape.batch * shape.seqlen_local);
    (0..n).try_for_each(|dst| copy_2d(stream, (x, dst * w, row), (pack, dst * rows * w, w), w, rows))
}

/// The inverse of [`pack_heads`]: `pack` `[src][batch][token][per][d]` into the shard `x`.
fn unpack_heads<T: AttnElem>(stream: &Arc<CudaStream>, shape: RingShape, n: usize, pack: &CudaSlice<T>, x: &mut CudaSlice<T>, per: usize) -> Result<()> {
    let (row, w, rows) = (per * n * shape.headdim, per * shape.headdim, shape.batch * shape.seqlen_local);
    (0..n).try_for_each(|src| copy_2d(stream, (pack, src * rows * w, w), (x, src * w, row), w, rows))
}

/// Heads to sequence (inside the caller's group): each destination's
/// packed block of every sequence to it; from each source, its tokens
/// of this rank's heads into their place in `full` (`(batch, seqlen,
/// per, d)`).
fn send_to_sequence<T: NcclType>(comm: &Comm, shape: RingShape, pack: &CudaSlice<T>, full: &mut CudaSlice<T>, per: usize) -> Result<()> {
    let n = comm.world_size();
    let (b, s, d) = (shape.batch, shape.seqlen_local, shape.headdim);
    let blk = s * per * d;
    for peer in 0..n {
        for bi in 0..b {
            comm.send(&pack.slice((peer * b + bi) * blk..(peer * b + bi + 1) * blk), peer as i32)?;
            let at = (bi * n * s + peer * s) * per * d;
            comm.recv(&mut full.slice_mut(at..at + blk), peer as i32)?;
        }
    }
    Ok(())
}

/// Sequence to heads (inside the caller's group): each peer's tokens of
/// `full` to it; from each source, this rank's tokens of its heads into
/// `pack` (`[src][batch][token][per][d]`).
fn send_to_heads<T: NcclType>(comm: &Comm, shape: RingShape, full: &CudaSlice<T>, pack: &mut CudaSlice<T>, per: usize) -> Result<()> {
    let n = comm.world_size();
    let (b, s, d) = (shape.batch, shape.seqlen_local, shape.headdim);
    let blk = s * per * d;
    for peer in 0..n {
        for bi in 0..b {
            let at = (bi * n * s + peer * s) * per * d;
            comm.send(&full.slice(at..at + blk), peer as i32)?;
            comm.recv(&mut pack.slice_mut((peer * b + bi) * blk..(peer * b + bi + 1) * blk), peer as i32)?;
        }
    }
    Ok(())
}

/// The LSE rows one (peer, sequence, head of the peer's group) exchange
/// moves: `(offset in the local (batch, nheads, seqlen_local), offset in the
/// full (batch, nheads / N, seqlen))`, each `seqlen_local` long.
fn lse_rows(shape: RingShape, n: usize) -> impl Iterator<Item = (i32, usize, usize)> {
    let (b, s, h) = (shape.batch, shape.seqlen_local, shape.nheads);
    let per = h / n;
    (0..n).flat_map(move |peer| {
        (0..b).flat_map(move |bi| (0..per).map(move |hh| (peer as i32, (bi * h + peer * per + hh) * s, (bi * per + hh) * n * s + peer * s)))
    })
}

/// The LSE of the rank's tokens (`local`) to the ranks holding their heads;
/// this rank's heads' rows of every peer's tokens into `full` (inside the
/// caller's group).
fn lse_to_full(comm: &Comm, shape: RingShape, local: &CudaSlice<f32>, full: &mut CudaSlice<f32>) -> Result<()> {
    let s = shape.seqlen_local;
    for (peer, l, f) in lse_rows(shape, comm.world_size()) {
        comm.send(&local.slice(l..l + s), peer)?;
        comm.recv(&mut full.slice_mut(f..f + s), peer)?;
    }
    Ok(())
}

/// The inverse of [`lse_to_full`]: each peer's tokens of `full` back, every
/// head of this rank's tokens into `local`.
fn lse_to_local(comm: &Comm, shape: RingShape, full: &CudaSlice<f32>, local: &mut CudaSlice<f32>) -> Result<()> {
    let s = shape.seqlen_local;
    for (peer, l, f) in lse_rows(shape, comm.world_size()) {
        comm.send(&full.slice(f..f + s), peer)?;
        comm.recv(&mut local.slice_mut(l..l + s), peer)?;
    }
    Ok(())
}


impl<T: AttnElem + NcclType> UlyssesRank<T> {
    /// Allocates the forward's buffers on `compute`. `params`: the local
    /// attention's (causal, scale, window, softcap: it runs over the whole
    /// sequence); `comm`'s stream and `compute` must belong to `fa`'s context.
    ///
    /// Errors: a zero-sized shape, `nheads` or `nheads_k` not divisible by
    /// the ranks (use the ring), `nheads % nheads_k != 0`, streams of
    /// another context, allocation.
    pub fn new(fa: Arc<FlashAttention>, comm: Comm, compute: Arc<CudaStream>, shape: RingShape, params: &ForwardParams) -> Result<Self> {
        fa.check_stream("compute", &compute)?;
        fa.check_stream("comm", &comm.stream())?;
        let dims = [shape.batch, shape.seqlen_local, shape.nheads, shape.headdim];
        if let Some(a) = dims.iter().position(|&x| x == 0) {
            return Err(FlashAttnError::ZeroSizedDim { argument: "shape", axis: ["batch", "seqlen", "nheads", "headdim"][a], shape: dims });
        }
        check_gqa(shape.nheads, shape.nheads_k)?;
        let n = comm.world_size();
        if !shape.nheads.is_multiple_of(n) || !shape.nheads_k.is_multiple_of(n) {
            return Err(FlashAttnError::InvalidArgument {
                argument: "shape",
                value: format!("{} query / {} KV heads over {n} ranks", shape.nheads, shape.nheads_k),
                reason: "Ulysses gives every rank nheads / ranks query heads and nheads_k / ranks KV heads: both must divide evenly (use the ring)",
            });
        }
        let (q, kv) = (shape.q_len(), shape.kv_len());
        let a = |len| compute.alloc_zeros::<T>(len);
        let lse_len = shape.batch * shape.nheads * shape.seqlen_local;
        Ok(Self {
            pack: [a(q)?, a(kv)?, a(kv)?],
            full: [a(q)?, a(kv)?, a(kv)?, a(q)?],
            lse_full: compute.alloc_zeros::<f32>(lse_len)?,
            lse: compute.alloc_zeros::<f32>(lse_len)?,
            fa,
            comm,
            compute,
            shape,
            params: *params,
            bwd: None,
            transfers: Transfers::default(),
        })
    }

    /// This rank's index in the communicator.
    pub fn rank(&self) -> usize {
        self.comm.rank()
    }

    /// The ranks of the communicator.
    pub fn ranks(&self) -> usize {
        self.comm.world_size()
    }

    /// The compute stream (where [`ulysses_forward`]'s results are ready).
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.compute
    }

    /// The logsumexp of the last [`ulysses_forward`] for this rank's
    /// tokens, f32 `(batch, nheads, seqlen_local)`.
    pub fn lse(&self) -> &CudaSlice<f32> {
        &self.lse
    }

    /// `(query heads, KV heads)` per rank.
    fn heads(&self) -> (usize, usize) {
        let n = self.ranks();
        (self.shape.nheads / n, self.shape.nheads_k / n)
    }

    /// Whole-sequence layouts of this rank's heads: `(q/O, k/v)`.
    fn full_layouts(&self) -> (TensorLayout, TensorLayout) {
        let (hq, hk) = self.heads();
        let s = self.shape;
        let len = s.seqlen_local * self.ranks();
        (TensorLayout::contiguous([s.batch, len, hq, s.headdim]), TensorLayout::contiguous([s.batch, len, hk, s.headdim]))
    }
}

/// Runs one all-to-all (a closure per rank, inside one NCCL group over all
/// `ranks`), then records its end on every comm stream.
fn all_to_all<T: AttnElem + NcclType>(ranks: &mut [UlyssesRank<T>], mut f: impl FnMut(&mut UlyssesRank<T>, usize) -> Result<()>) -> Result<()> {
    group_start()?;
    let sent: Result<()> = ranks.iter_mut().enumerate().try_for_each(|(i, r)| f(r, i));
    group_end()?;
    sent?;
    ranks.iter_mut().try_for_each(|r| r.transfers.record(&r.comm))
}

/// Ulysses' forward for every rank in `ranks` (all of them when one process
/// drives every GPU, or this process's one rank): `inputs[i] = [q, k, v]`
/// and `outs[i]` are rank `ranks[i]`'s contiguous shards on its GPU
/// (`RingShape` sizes; rank `r` holds tokens `r·seqlen_local..` of every
/// sequence). Enqueues the work; [`UlyssesRank::stream`] orders the results
/// (`outs[i]`, [`UlyssesRank::lse`]).
///
/// Errors: slices of the wrong length, mismatched counts, and every error
/// of the forward and NCCL.
pub fn ulysses_forward<T: AttnElem + NcclType>(ranks: &mut [UlyssesRank<T>], inputs: &[[&CudaSlice<T>; 3]], outs: &mut [&mut CudaSlice<T>]) -> Result<()> {
    check_counts(ranks.len(), inputs.len(), outs.len(), "outputs", "one [q, k, v] and one output per rank")?;
    for ((r, [q, k, v]), o) in ranks.iter_mut().zip(inputs).zip(outs.iter()) {
        check_shard_lens(&r.shape.lens_fwd([q.len(), k.len(), v.len(), o.len()]))?;
        let (hq, hk) = r.heads();
        let (stream, shape, n) = (r.compute.clone(), r.shape, r.ranks());
        let [pq, pk, pv] = &mut r.pack;
        pack_heads(&stream, shape, n, q, pq, hq)?;
        pack_heads(&stream, shape, n, k, pk, hk)?;
        pack_heads(&stream, shape, n, v, pv, hk)?;
    }
    all_to_all(ranks, |r, _| {
        let (hq, hk) = r.heads();
        let [fq, fk, fv, _] = &mut r.full;
        send_to_sequence(&r.comm, r.shape, &r.pack[0], fq, hq)?;
        send_to_sequence(&r.comm, r.shape, &r.pack[1], fk, hk)?;
        send_to_sequence(&r.comm, r.shape, &r.pack[2], fv, hk)
    })?;
    for r in ranks.iter_mut() {
        r.transfers.wait(&r.compute)?;
        let (lq, lk) = r.full_layouts();
        let [fq, fk, fv, fo] = &mut r.full;
        r.fa.forward_into(
            &r.compute,
            Tensor::new(&*fq, lq),
            Tensor::new(&*fk, lk),
            Tensor::new(&*fv, lk),
            TensorMut::new(fo, lq),
            StatsMut::LogSumExp(r.lse_full.as_view_mut()),
            &r.params,
        )?;
    }
    all_to_all(ranks, |r, _| {
        let (hq, _) = r.heads();
        send_to_heads(&r.comm, r.shape, &r.full[3], &mut r.pack[0], hq)?;
        lse_to_local(&r.comm, r.shape, &r.lse_full, &mut r.lse)
    })?;
    for (r, o) in ranks.iter_mut().zip(outs.iter_mut()) {
        r.transfers.wait(&r.compute)?;
        let (hq, _) = r.heads();
        unpack_heads(&r.compute, r.shape, r.ranks(), &r.pack[0], o, hq)?;
    }
    Ok(())
}

/// Ulysses' backward for every rank in `ranks`: the inputs and gradients of
/// [`super::ring_backward`] (contiguous shards; `lse` the forward's, as
/// [`UlyssesRank::lse`] gave it). `deterministic`: the local backward's
/// deterministic mode (the all-to-alls move bits unchanged).
///
/// Errors: slices of the wrong length, mismatched counts, and every error
/// of the backward and NCCL.
pub fn ulysses_backward<T: AttnElem + NcclType>(
    ranks: &mut [UlyssesRank<T>],
    inputs: &[RingGradInputs<'_, T>],
    grads: &mut [RingGrads<'_, T>],
    deterministic: bool,
) -> Result<()> {
    check_counts(ranks.len(), inputs.len(), grads.len(), "gradient sets", "one RingGradInputs and one RingGrads per rank")?;
    let bp = |r: &UlyssesRank<T>| BackwardParams { forward: r.params, deterministic };
    for ((r, x), g) in ranks.iter_mut().zip(inputs).zip(grads.iter()) {
        check_shard_lens(&grad_lens(r.shape, x, g))?;
        let s = r.shape;
        let lse = s.batch * s.nheads * s.seqlen_local;
        if r.bwd.is_none() {
            let (lq, lk) = r.full_layouts();
            let sizes = r.fa.backward_scratch_sizes::<T>(&lq, &lk, &bp(r))?;
            let c = &r.compute;
            let (q, kv) = (s.q_len(), s.kv_len());
            r.bwd = Some(UlyssesBwd {
                pack: [c.alloc_zeros(q)?, c.alloc_zeros(q)?],
                full: [c.alloc_zeros(q)?, c.alloc_zeros(q)?, c.alloc_zeros(kv)?, c.alloc_zeros(kv)?],
                lse: c.alloc_zeros(lse)?,
                scratch: BackwardScratch::new(c, sizes)?,
            });
        }
        let (hq, hk) = r.heads();
        let (stream, shape, n) = (r.compute.clone(), r.shape, r.ranks());
        let [pq, pk, pv] = &mut r.pack;
        pack_heads(&stream, shape, n, x.q, pq, hq)?;
        pack_heads(&stream, shape, n, x.k, pk, hk)?;
        pack_heads(&stream, shape, n, x.v, pv, hk)?;
        let [po, pdo] = &mut r.bwd.as_mut().expect("allocated above").pack;
        pack_heads(&stream, shape, n, x.out, po, hq)?;
        pack_heads(&stream, shape, n, x.dout, pdo, hq)?;
    }
    all_to_all(ranks, |r, i| {
        let (hq, hk) = r.heads();
        let (comm, shape) = (&r.comm, r.shape);
        let [fq, fk, fv, fo] = &mut r.full;
        send_to_sequence(comm, shape, &r.pack[0], fq, hq)?;
        send_to_sequence(comm, shape, &r.pack[1], fk, hk)?;
        send_to_sequence(comm, shape, &r.pack[2], fv, hk)?;
        let b = r.bwd.as_mut().expect("allocated above");
        send_to_sequence(comm, shape, &b.pack[0], fo, hq)?;
        let [fdo, ..] = &mut b.full;
        send_to_sequence(comm, shape, &b.pack[1], fdo, hq)?;
        // The forward's LSE to this rank's heads: into the backward's statistics.
        lse_to_full(comm, shape, inputs[i].lse, &mut b.lse)
    })?;
    for r in ranks.iter_mut() {
        r.transfers.wait(&r.compute)?;
        let (lq, lk) = r.full_layouts();
        let params = bp(r);
        let [fq, fk, fv, fo] = &r.full;
        let b = r.bwd.as_mut().expect("allocated above");
        let [fdo, fdq, fdk, fdv] = &mut b.full;
        r.fa.backward_into(
            &r.compute,
            Tensor::new(fq, lq),
            Tensor::new(fk, lk),
            Tensor::new(fv, lk),
            Tensor::new(fo, lq),
            Tensor::new(&*fdo, lq),
            &b.lse,
            TensorMut::new(fdq, lq),
            TensorMut::new(fdk, lk),
            TensorMut::new(fdv, lk),
            Some(&mut b.scratch),
            &params,
            &Extras::default(),
        )?;
    }
    all_to_all(ranks, |r, _| {
        let (hq, hk) = r.heads();
        let (comm, shape) = (&r.comm, r.shape);
        let b = r.bwd.as_ref().expect("allocated above");
        let [pq, pk, pv] = &mut r.pack;
        send_to_heads(comm, shape, &b.full[1], pq, hq)?;
        send_to_heads(comm, shape, &b.full[2], pk, hk)?;
        send_to_heads(comm, shape, &b.full[3], pv, hk)
    })?;
    for (r, g) in ranks.iter_mut().zip(grads.iter_mut()) {
        r.transfers.wait(&r.compute)?;
        let (hq, hk) = r.heads();
        let (stream, shape, n) = (&r.compute, r.shape, r.ranks());
        unpack_heads(stream, shape, n, &r.pack[0], g.dq, hq)?;
        unpack_heads(stream, shape, n, &r.pack[1], g.dk, hk)?;
        unpack_heads(stream, shape, n, &r.pack[2], g.dv, hk)?;
    }
    Ok(())
}
