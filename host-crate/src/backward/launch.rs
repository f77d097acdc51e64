//! Plan + buffers → the launches of a backward call (the only `unsafe`).

use std::sync::Arc;

use cudarc::driver::{CudaStream, DevicePtr, DevicePtrMut, PushKernelArg};
use flash_attn_common::{AttnParams, BwdParams};

use super::validate::{check_stats_len, ranges_overlap};
use super::{BackwardParams, BackwardPlan, BackwardScratch};
use crate::tensor::{AttnElem, Extras, StatsRef, Tensor, TensorLayout, TensorMut};
use crate::validate::Problem;
use crate::device::FlashAttention;
use crate::error::{FlashAttnError, Result};
use crate::params::LoopOrder;
use crate::tc::KernelArg;
use crate::varlen::check_alibi;
use crate::varlen_api::VarlenLaunch;

/// The buffers of one backward call.
pub(crate) struct Buffers<'a, Q, K, V, O, DO, GQ, GK, GV> {
    pub q: Tensor<'a, Q>,
    pub k: Tensor<'a, K>,
    pub v: Tensor<'a, V>,
    pub out: Tensor<'a, O>,
    pub dout: Tensor<'a, DO>,
    pub stats: StatsRef<'a>,
    pub dq: TensorMut<'a, GQ>,
    pub dk: TensorMut<'a, GK>,
    pub dv: TensorMut<'a, GV>,
    pub scratch: Option<&'a mut BackwardScratch>,
    /// The device prefix sums of a varlen call.
    pub varlen: Option<&'a VarlenLaunch<'a>>,
}

impl FlashAttention {
    /// Checks streams, statistics, scratch and buffer overlaps, fills
    /// [`BwdParams`] and launches preprocess, main kernel and dQ cast.
    pub(crate) fn launch_backward<T, Q, K, V, O, DO, GQ, GK, GV>(
        &self,
        stream: &Arc<CudaStream>,
        problem: &Problem,
        plan: &BackwardPlan,
        bufs: Buffers<'_, Q, K, V, O, DO, GQ, GK, GV>,
        params: &BackwardParams,
        ext: &Extras<'_>,
    ) -> Result<()>
    where
        T: AttnElem,
        Q: DevicePtr<T>,
        K: DevicePtr<T>,
        V: DevicePtr<T>,
        O: DevicePtr<T>,
        DO: DevicePtr<T>,
        GQ: DevicePtrMut<T>,
        GK: DevicePtrMut<T>,
        GV: DevicePtrMut<T>,
    {
        let Buffers { q, k, v, out, dout, stats, dq, dk, dv, scratch, varlen } = bufs;
        self.check_stream("stream", stream)?;
        for (name, s) in [("q", q.data.stream()), ("k", k.data.stream()), ("v", v.data.stream()), ("out", out.data.stream()), ("dout", dout.data.stream())] {
            self.check_stream(name, s)?;
        }
        for (name, s) in [("dq", dq.data.stream()), ("dk", dk.data.stream()), ("dv", dv.data.stream())] {
            self.check_stream(name, s)?;
        }
        let dims = problem.dims;
        if let Some(a) = &ext.alibi_slopes {
            check_alibi(a.shape, a.slopes.len(), dims.batch, dims.nheads)?;
            self.check_stream("alibi_slopes", a.slopes.stream())?;
            // The head dims only the Hopper kernel runs (136..=256) take no
            // ALiBi: refused before anything is launched.
            if plan.main.is_none() && !super::tc::tc_backward_supported(T::DTYPE, dims.headdim, self.compute_capability()) {
                return Err(FlashAttnError::Unsupported {
                    argument: "alibi_slopes",
                    dtype: T::DTYPE.name(),
                    what: "ALiBi in the backward pass above head dim 128 (the tensor-core backward stops at 128, the Hopper backward has no ALiBi)",
                });
            }
        }
        // Row statistics: (batch, nheads, seqlen_q), or (nheads, total_q) for varlen.
        let n = varlen.map_or(problem.stats_len(), |vl| dims.nheads * vl.total_q);
        let fa1 = params.forward.loop_order == LoopOrder::Fa1;
        let (stat_a, stat_b): (&dyn DevicePtr<f32>, Option<&dyn DevicePtr<f32>>) = match (stats, fa1) {
            (StatsRef::LogSumExp(lse), false) => {
                check_stats_len("softmax_lse", lse.len(), n)?;
                (lse, None)
            }
            (StatsRef::Fa1 { l, m }, true) => {
                check_stats_len("l", l.len(), n)?;
                check_stats_len("m", m.len(), n)?;
                (l, Some(m))
            }
            _ => {
                let (expected, given) = if fa1 {
                    ("RowStats::Fa1 { l, m } (the FA1 forward's statistics)", "a logsumexp")
                } else {
                    ("a logsumexp (softmax_lse of the FA2 forward)", "RowStats::Fa1")
                };
                return Err(FlashAttnError::StatsMismatch { loop_order: params.forward.loop_order, expected, given });
            }
        };
        let mut own;
        let scratch = match scratch {
            Some(s) => {
                let need = plan.scratch;
                for (argument, len, required) in [
                    ("scratch.delta", s.delta.len(), need.delta),
                    ("scratch.dq_accum", s.dq_accum.len(), need.dq_accum),
                    ("scratch.semaphores", s.semaphores.len(), need.semaphores),
                ] {
                    if len < required {
                        return Err(FlashAttnError::StatsTooShort { argument, len, required });
                    }
                }
                s
            }
            None => {
                own = BackwardScratch::new(stream, plan.scratch)?;
                &mut own
            }
        };

        let (q_ptr, _q) = q.data.device_ptr(stream);
        let (k_ptr, _k) = k.data.device_ptr(stream);
        let (v_ptr, _v) = v.data.device_ptr(stream);
        let (o_ptr, _o) = out.data.device_ptr(stream);
        let (do_ptr, _do) = dout.data.device_ptr(stream);
        let (lse_ptr, _lse) = stat_a.device_ptr(stream);
        let m = stat_b.map(|m| m.device_ptr(stream));
        let (dq_ptr, _dq) = dq.data.device_ptr_mut(stream);
        let (dk_ptr, _dk) = dk.data.device_ptr_mut(stream);
        let (dv_ptr, _dv) = dv.data.device_ptr_mut(stream);
        let (delta_ptr, _delta) = scratch.delta.device_ptr_mut(stream);
        let (accum_ptr, _accum) = scratch.dq_accum.device_ptr_mut(stream);
        let (sem_ptr, _sem) = scratch.semaphores.device_ptr_mut(stream);
        // Gradients must not share memory with each other or with an input.
        let sz = std::mem::size_of::<T>() as u64;
        let span = |ptr: u64, l: &TensorLayout| (ptr, l.required_len().unwrap_or(0) as u64 * sz);
        let grads = [("dq", span(dq_ptr, &dq.layout)), ("dk", span(dk_ptr, &dk.layout)), ("dv", span(dv_ptr, &dv.layout))];
        let inputs = [span(q_ptr, &q.layout), span(k_ptr, &k.layout), span(v_ptr, &v.layout), span(o_ptr, &out.layout), span(do_ptr, &dout.layout)];
        for (gi, (name, (a, an))) in grads.iter().enumerate() {
            let others = grads.iter().enumerate().filter(|(i, _)| *i != gi).map(|(_, (_, r))| *r).chain(inputs);
            for (b, bn) in others {
                if ranges_overlap(*a, *an, b, bn) {
                    return Err(FlashAttnError::InvalidArgument {
                        argument: name,
                        value: format!("device range {a:#x}+{an}"),
                        reason: "a gradient buffer may not share memory with another gradient or an input",
                    });
                }
            }
        }
        let alibi = ext.alibi_slopes.map(|a| (a.slopes.device_ptr(stream), a.shape.batch_stride(dims.nheads)));
        let u = |x: usize| x as u64;
        let mut fwd = AttnParams {
            lse_ptr,
            m_ptr: m.as_ref().map_or(0, |(p, _)| *p),
            ..problem.attn_params(
                [q_ptr, k_ptr, v_ptr, o_ptr],
                [q.layout.strides, k.layout.strides, v.layout.strides, out.layout.strides],
                params.forward.causal,
                alibi.as_ref().map(|((ptr, _), s)| (*ptr, *s)),
            )
        };
        let mut strides = [dout.layout.strides, dq.layout.strides, dk.layout.strides, dv.layout.strides].map(|s| s.map(u));
        if let Some(vl) = varlen {
            // Packed tensors: rows are indexed through cu_seqlens, never by batch.
            vl.fill(&mut fwd);
            for s in &mut strides {
                s[0] = 0;
            }
        }
        let [do_stride, dq_stride, dk_stride, dv_stride] = strides;
        let p = BwdParams {
            fwd,
            do_ptr,
            do_stride,
            dq_ptr,
            dq_stride,
            dk_ptr,
            dk_stride,
            dv_ptr,
            dv_stride,
            delta_ptr,
            dq_accum_ptr: accum_ptr,
            dq_semaphore_ptr: if params.deterministic { sem_ptr } else { 0 },
            deterministic: params.deterministic as u32,
            br: plan.br as u32,
            bc: plan.bc as u32,
            _pad: 0,
        };
        let arg = KernelArg(p);
        let (f, cfg) = self.prepare(&plan.preprocess)?;
        // SAFETY: `bwd_preprocess_*(p: BwdParams)` takes this one block by
        // value; out and dout validated against q's shape at their strides
        // (T elements); delta ≥ batch·nheads·seqlen_q f32, dq_accum ≥ that ×
        // headdim, semaphores ≥ semaphore_count (checked above or allocated
        // from the plan); F32_THREADS threads, no shared memory.
        unsafe { stream.launch_builder(f).arg(&arg).launch(cfg) }?;
        match &plan.main {
            Some(main) => {
                let (f, cfg) = self.prepare(main)?;
                // SAFETY: `bwd_fa2_f32` / `bwd_fa1_f32(p: BwdParams)`: q, k,
                // v, out, dout validated (f32); dk, dv of k's/v's shape,
                // non-overlapping and disjoint from every other buffer
                // (checked above); lse or l, m of exactly batch·nheads·
                // seqlen_q f32; delta, accumulator and semaphores prepared by
                // the launch above (same stream); ALiBi slopes checked;
                // F32_THREADS threads and BwdSmem::new(br, bc, d) bytes of
                // dynamic shared memory (≤ the limit set at load); in
                // deterministic mode the grid is at most the resident blocks.
                unsafe { stream.launch_builder(f).arg(&arg).launch(cfg) }?;
            }
            None => {
                // The Hopper kernel unless the call asks for what only the
                // tensor-core kernel does (a block size).
                let hopper = params.forward.block.is_none();
                // SAFETY: the same validated block; the kernels' contract
                // (delta computed, accumulator and semaphores zeroed) is met
                // by the preprocess launch above on the same stream; the
                // accumulator is a whole allocation (256-byte aligned).
                if !(hopper && unsafe { super::hopper::launch_hopper_backward(self, stream, &p, T::DTYPE) }?) {
                    unsafe { super::tc::launch_tc_backward(self, stream, &p, T::DTYPE) }?
                }
            }
        }
        let (f, cfg) = self.prepare(&plan.convert)?;
        // SAFETY: `bwd_dq_convert_*(p: BwdParams)`: reads the accumulator
        // (complete: the main kernel ran before on this stream) and writes
        // dq (validated, non-overlapping, disjoint from the other buffers).
        unsafe { stream.launch_builder(f).arg(&arg).launch(cfg) }?;
        Ok(())
    }
}
