//! The partial merge on the GPU: `ring_merge_{f16,bf16}` (kernel-crate's
//! `ring.rs`), launched on the caller's stream. Needs no NCCL: the ring
//! (`super::nccl`, feature `nccl`) calls it after each step's local
//! attention, and its backward to sum each step's gradient partials in f32.

use std::sync::Arc;

use cudarc::driver::{CudaStream, DevicePtr, DevicePtrMut, LaunchConfig, PushKernelArg};
use flash_attn_common::ring::{RING_MERGE_WARPS, RingMergeParams, merge_mode};

use crate::tensor::AttnElem;
use crate::device::FlashAttention;
use crate::dispatch::Launch;
use crate::types::DType;
use crate::error::{FlashAttnError, Result};
use crate::tc::KernelArg;

/// The merge kernels (checked present in every PTX build).
pub const RING_KERNELS: &[&str] = &["ring_merge_f16", "ring_merge_bf16"];

/// The shape of a rank's accumulator: `O` f32 `(batch, seqlen, nheads,
/// headdim)`, `LSE` f32 `(batch, nheads, seqlen)`, both contiguous.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AccShape {
    /// Sequences.
    pub batch: usize,
    /// Rows (tokens) of the rank's shard.
    pub seqlen: usize,
    /// Query heads.
    pub nheads: usize,
    /// Head dim.
    pub headdim: usize,
}

impl AccShape {
    /// Elements of `O`: `batch·seqlen·nheads·headdim`.
    pub fn o_len(&self) -> usize {
        self.batch * self.seqlen * self.nheads * self.headdim
    }
    /// Elements of `LSE`: `batch·nheads·seqlen`.
    pub fn lse_len(&self) -> usize {
        self.batch * self.nheads * self.seqlen
    }
}

/// The partial's rows `row0..row0 + rows` inside the accumulator's sequence.
fn check_rows(shape: AccShape, row0: usize, rows: usize) -> Result<()> {
    if row0 + rows > shape.seqlen {
        return Err(FlashAttnError::InvalidArgument {
            argument: "rows",
            value: format!("{row0}..{}", row0 + rows),
            reason: "the partial's rows must lie inside the accumulator's sequence",
        });
    }
    Ok(())
}

fn too_short(argument: &'static str, len: usize, required: usize) -> Result<()> {
    if len < required { Err(FlashAttnError::StatsTooShort { argument, len, required }) } else { Ok(()) }
}

impl FlashAttention {
    fn ring_merge_launch<T: AttnElem>(&self, stream: &Arc<CudaStream>, p: RingMergeParams) -> Result<()> {
        let name = match T::DTYPE {
            DType::BF16 => "ring_merge_bf16",
            DType::F16 => "ring_merge_f16",
            _ => return Err(FlashAttnError::Unsupported { argument: "o", dtype: "f32", what: "the ring merge (f16 and bf16 only)" }),
        };
        if !p.headdim.is_multiple_of(4) {
            return Err(FlashAttnError::InvalidArgument {
                argument: "headdim",
                value: p.headdim.to_string(),
                reason: "the ring merge moves 4 columns per lane: headdim must be a multiple of 4",
            });
        }
        let rows = p.batch as u64 * p.nheads as u64 * p.rows as u64;
        let (f, _) = self.prepare(&Launch { kernel: name, grid: 1, threads: 32 * RING_MERGE_WARPS, smem_bytes: 0 })?;
        let cfg = LaunchConfig {
            grid_dim: (rows.div_ceil(RING_MERGE_WARPS as u64).clamp(1, 1 << 20) as u32, 1, 1),
            block_dim: (32 * RING_MERGE_WARPS, 1, 1),
            shared_mem_bytes: 0,
        };
        let arg = KernelArg(p);
        // SAFETY: `ring_merge_*(p: RingMergeParams)`: the callers checked
        // every buffer's length against the layouts of `RingMergeParams`
        // (accumulator `shape`, partial `rows` rows at `row0`, `row0 + rows ≤
        // seqlen`; the LSE buffers only in the INIT and MERGE modes, the only
        // ones that read them) and hold their device pointers' guards for
        // this launch; headdim a multiple of 4; 32·RING_MERGE_WARPS threads.
        unsafe { stream.launch_builder(f).arg(&arg).launch(cfg) }?;
        Ok(())
    }

    /// Merges a partial `(o_part, lse_part)` — attention of accumulator rows
    /// `row0..row0 + rows` over some key set, `o_part` `(batch, rows, nheads,
    /// headdim)` in `T`, `lse_part` `(batch, nheads, rows)` f32, both
    /// contiguous — into the f32 accumulator `(o_acc, lse_acc)` of `shape`,
    /// on `stream`. `init`: the accumulator's rows hold nothing yet (they
    /// are overwritten; no need to clear them).
    #[allow(clippy::too_many_arguments)]
    pub fn ring_merge<T: AttnElem>(
        &self,
        stream: &Arc<CudaStream>,
        shape: AccShape,
        (o_acc, lse_acc): (&mut impl DevicePtrMut<f32>, &mut impl DevicePtrMut<f32>),
        (o_part, lse_part): (&impl DevicePtr<T>, &impl DevicePtr<f32>),
        (row0, rows): (usize, usize),
        init: bool,
    ) -> Result<()> {
        self.check_stream("stream", stream)?;
        check_rows(shape, row0, rows)?;
        too_short("o_acc", o_acc.len(), shape.o_len())?;
        too_short("lse_acc", lse_acc.len(), shape.lse_len())?;
        too_short("o_part", o_part.len(), shape.batch * rows * shape.nheads * shape.headdim)?;
        too_short("lse_part", lse_part.len(), shape.batch * shape.nheads * rows)?;
        let (o_acc_ptr, _g1) = o_acc.device_ptr_mut(stream);
        let (lse_acc_ptr, _g2) = lse_acc.device_ptr_mut(stream);
        let (o_part_ptr, _g3) = o_part.device_ptr(stream);
        let (lse_part_ptr, _g4) = lse_part.device_ptr(stream);
        self.ring_merge_launch::<T>(
            stream,
            RingMergeParams {
                o_acc_ptr,
                lse_acc_ptr,
                o_part_ptr,
                lse_part_ptr,
                out_ptr: 0,
                batch: shape.batch as u32,
                nheads: shape.nheads as u32,
                headdim: shape.headdim as u32,
                seqlen_acc: shape.seqlen as u32,
                rows: rows as u32,
                row0: row0 as u32,
                mode: if init { merge_mode::INIT } else { merge_mode::MERGE },
                _pad: 0,
            },
        )
    }

    /// Sums a gradient partial `part` — rows `row0..row0 + rows` of an f32
    /// accumulator of `shape` (`(batch, seqlen, nheads, headdim)`, for dK and
    /// dV `nheads` = the KV heads), `part` `(batch, rows, nheads, headdim)`
    /// in `T`, contiguous — into `acc` in f32, on `stream`. `init`: the rows
    /// hold nothing yet (they are overwritten). The ring's backward adds
    /// each step's dQ, dK, dV this way; [`FlashAttention::ring_finalize`]
    /// rounds the sums.
    pub fn ring_grad_add<T: AttnElem>(
        &self,
        stream: &Arc<CudaStream>,
        shape: AccShape,
        acc: &mut impl DevicePtrMut<f32>,
        part: &impl DevicePtr<T>,
        (row0, rows): (usize, usize),
        init: bool,
    ) -> Result<()> {
        self.check_stream("stream", stream)?;
        check_rows(shape, row0, rows)?;
        too_short("acc", acc.len(), shape.o_len())?;
        too_short("part", part.len(), shape.batch * rows * shape.nheads * shape.headdim)?;
        let (o_acc_ptr, _g1) = acc.device_ptr_mut(stream);
        let (o_part_ptr, _g2) = part.device_ptr(stream);
        self.ring_merge_launch::<T>(
            stream,
            RingMergeParams {
                o_acc_ptr,
                o_part_ptr,
                batch: shape.batch as u32,
                nheads: shape.nheads as u32,
                headdim: shape.headdim as u32,
                seqlen_acc: shape.seqlen as u32,
                rows: rows as u32,
                row0: row0 as u32,
                mode: if init { merge_mode::COPY } else { merge_mode::ADD },
                ..Default::default()
            },
        )
    }

    /// Rounds the accumulator's `O` into `out` (`T`, `(batch, seqlen,
    /// nheads, headdim)` contiguous), on `stream`.
    pub fn ring_finalize<T: AttnElem>(
        &self,
        stream: &Arc<CudaStream>,
        shape: AccShape,
        o_acc: &impl DevicePtr<f32>,
        out: &mut impl DevicePtrMut<T>,
    ) -> Result<()> {
        self.check_stream("stream", stream)?;
        too_short("o_acc", o_acc.len(), shape.o_len())?;
        too_short("out", out.len(), shape.o_len())?;
        let (o_acc_ptr, _g1) = o_acc.device_ptr(stream);
        let (out_ptr, _g2) = out.device_ptr_mut(stream);
        // The kernel stores pairs of 16-bit elements as 32-bit words at even columns.
        if !out_ptr.is_multiple_of(4) {
            return Err(FlashAttnError::Misaligned { argument: "out", requirement: "a 4-byte aligned pointer", value: out_ptr });
        }
        self.ring_merge_launch::<T>(
            stream,
            RingMergeParams {
                o_acc_ptr,
                out_ptr,
                batch: shape.batch as u32,
                nheads: shape.nheads as u32,
                headdim: shape.headdim as u32,
                seqlen_acc: shape.seqlen as u32,
                rows: shape.seqlen as u32,
                mode: merge_mode::FINALIZE,
                ..Default::default()
            },
        )
    }
}
