//! The forward's plan and launch: a validated [`Problem`] → the kernel
//! family, tiles and grid ([`FlashAttention::plan`]: the Hopper rule, then
//! the dispatch table) → the launches, the one place that fills
//! [`AttnParams`] for the dense and varlen forward. The front doors
//! (`api`, `varlen_api`) validate and call [`FlashAttention::launch_problem`].

use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream, DevicePtr, DevicePtrMut, PushKernelArg};
use flash_attn_common::AttnParams;

use crate::device::FlashAttention;
use crate::dispatch::{self, DispatchKey, Plan};
use crate::error::{FlashAttnError, Result};
use crate::params::{ForwardParams, LoopOrder};
use crate::tensor::{AttnElem, Extras, StatsOut, Tensor, TensorMut};
use crate::types::Features;
use crate::validate::{Problem, check_stats, check_tc_alignment};
use crate::varlen::check_alibi;
use crate::varlen_api::VarlenLaunch;

impl FlashAttention {
    /// Checks streams, stats and extras of a validated problem, then
    /// dispatches and launches (the one place that fills [`AttnParams`]).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn launch_problem<T, Q, K, V, O>(
        &self,
        stream: &Arc<CudaStream>,
        problem: &Problem,
        q: Tensor<'_, Q>,
        k: Tensor<'_, K>,
        v: Tensor<'_, V>,
        o: TensorMut<'_, O>,
        stats: StatsOut<'_>,
        params: &ForwardParams,
        ext: &Extras<'_>,
        varlen: Option<&VarlenLaunch<'_>>,
    ) -> Result<()>
    where
        T: AttnElem,
        Q: DevicePtr<T>,
        K: DevicePtr<T>,
        V: DevicePtr<T>,
        O: DevicePtrMut<T>,
    {
        self.check_stream("stream", stream)?;
        for (name, s) in [("q", q.data.stream()), ("k", k.data.stream()), ("v", v.data.stream()), ("o", o.data.stream())] {
            self.check_stream(name, s)?;
        }
        let dims = problem.dims;
        if let Some(a) = &ext.alibi_slopes {
            check_alibi(a.shape, a.slopes.len(), dims.batch, dims.nheads)?;
            self.check_stream("alibi_slopes", a.slopes.stream())?;
        }
        let plan = self.plan::<T>(problem, params, ext.alibi_slopes.is_some(), varlen.is_some())?;
        // Row statistics: (batch, nheads, seqlen_q), or (nheads, total_q) for varlen.
        let n = varlen.map_or(problem.stats_len(), |vl| dims.nheads * vl.total_q);
        let mut stats = stats;
        match (&mut stats, params.loop_order) {
            (StatsOut::LogSumExp(lse), LoopOrder::Fa2 | LoopOrder::Standard) => {
                check_stats("lse", lse.len(), n)?;
                self.check_stream("lse", lse.stream())?;
            }
            (StatsOut::Fa1 { l, m }, LoopOrder::Fa1) => {
                check_stats("l", l.len(), n)?;
                check_stats("m", m.len(), n)?;
                self.check_stream("l", l.stream())?;
                self.check_stream("m", m.stream())?;
            }
            (given, loop_order) => {
                let expected = StatsOut::name_of(loop_order == LoopOrder::Fa1);
                return Err(FlashAttnError::StatsMismatch { loop_order, expected, given: given.name() });
            }
        }

        // Device pointers; the guards record the reads/writes on `stream`
        // when they drop, after the launches below.
        let (q_ptr, _q_guard) = q.data.device_ptr(stream);
        let (k_ptr, _k_guard) = k.data.device_ptr(stream);
        let (v_ptr, _v_guard) = v.data.device_ptr(stream);
        let (o_ptr, _o_guard) = o.data.device_ptr_mut(stream);
        let alibi = ext.alibi_slopes.map(|a| (a.slopes.device_ptr(stream), a.shape.batch_stride(dims.nheads)));
        let mut p = problem.attn_params(
            [q_ptr, k_ptr, v_ptr, o_ptr],
            [q.layout.strides, k.layout.strides, v.layout.strides, o.layout.strides],
            params.causal,
            alibi.as_ref().map(|((ptr, _), s)| (*ptr, *s)),
        );
        if let Some(vl) = varlen {
            vl.fill(&mut p);
        }

        match (plan, stats) {
            (Plan::Fa2 { main, br, bc }, StatsOut::LogSumExp(lse)) => {
                let (lse_ptr, _lse_guard) = lse.device_ptr_mut(stream);
                p.lse_ptr = lse_ptr;
                p.br = br as u32;
                p.bc = bc as u32;
                let (f, cfg) = self.prepare(&main)?;
                let arg = crate::tc::KernelArg(p);
                // SAFETY: `fa2_forward_f32(p: AttnParams)` takes exactly this one
                // parameter block by value. `validate` checked q, k, v and o
                // against their shapes and strides (o non-overlapping; varlen:
                // cu_seqlens lengths, contents clamped in the kernel) and the
                // guards above keep the buffers alive and ordered on `stream`;
                // lse holds ≥ n f32; ALiBi slopes checked against their shape;
                // `cfg` has F32_THREADS threads and Fa2Smem::new(br, bc, d)
                // bytes of dynamic shared memory, within the limit set at load.
                unsafe { stream.launch_builder(f).arg(&arg).launch(cfg) }?;
            }
            (Plan::Fa1 { init, main, br, bc }, StatsOut::Fa1 { l, m }) => {
                let (l_ptr, _l_guard) = l.device_ptr_mut(stream);
                let (m_ptr, _m_guard) = m.device_ptr_mut(stream);
                p.lse_ptr = l_ptr;
                p.m_ptr = m_ptr;
                p.br = br as u32;
                p.bc = bc as u32;
                let arg = crate::tc::KernelArg(p);
                let (f, cfg) = self.prepare(&init)?;
                // SAFETY: `fa1_init_f32(p: AttnParams)` takes this one block by
                // value and writes O (validated shape/strides, non-overlapping)
                // and l, m (≥ batch·nheads·seqlen_q f32 each); grid-stride, no
                // shared memory.
                unsafe { stream.launch_builder(f).arg(&arg).launch(cfg) }?;
                let (f, cfg) = self.prepare(&main)?;
                // SAFETY: `fa1_forward_f32(p: AttnParams)`: same buffers, now
                // initialized by the launch above (same stream, in order);
                // q, k, v validated; F32_THREADS threads and
                // Fa1Smem::new(br, bc, d) bytes of dynamic shared memory.
                unsafe { stream.launch_builder(f).arg(&arg).launch(cfg) }?;
            }
            (Plan::Standard { scores, softmax, pv, scratch_len }, StatsOut::LogSumExp(lse)) => {
                let (lse_ptr, _lse_guard) = lse.device_ptr_mut(stream);
                // SAFETY: uninitialized f32 scratch; `standard_scores_f32` writes
                // every element before `standard_softmax_f32` reads any.
                let mut scratch: CudaSlice<f32> = unsafe { stream.alloc(scratch_len) }?;
                let (scratch_ptr, _scratch_guard) = scratch.device_ptr_mut(stream);
                p.lse_ptr = lse_ptr;
                p.scratch_ptr = scratch_ptr;
                let arg = crate::tc::KernelArg(p);
                let (f, cfg) = self.prepare(&scores)?;
                // SAFETY: `standard_scores_f32(p: AttnParams)` reads q, k
                // (validated) and writes the batch·nheads·seqlen_q·seqlen_k
                // scratch; F32_THREADS threads, StdSmem bytes of shared memory.
                unsafe { stream.launch_builder(f).arg(&arg).launch(cfg) }?;
                let (f, cfg) = self.prepare(&softmax)?;
                // SAFETY: `standard_softmax_f32(p: AttnParams)` rewrites the
                // scratch in place and writes lse (≥ batch·nheads·seqlen_q f32).
                unsafe { stream.launch_builder(f).arg(&arg).launch(cfg) }?;
                let (f, cfg) = self.prepare(&pv)?;
                // SAFETY: `standard_pv_f32(p: AttnParams)` reads the scratch and
                // v (validated), writes o (validated, non-overlapping);
                // F32_THREADS threads, StdSmem bytes of shared memory.
                unsafe { stream.launch_builder(f).arg(&arg).launch(cfg) }?;
            }
            (Plan::TcFa2 { kernel, main }, StatsOut::LogSumExp(lse)) => {
                check_tc_alignment(&p)?;
                let (lse_ptr, _lse_guard) = lse.device_ptr_mut(stream);
                p.lse_ptr = lse_ptr;
                p.br = kernel.br() as u32;
                p.bc = kernel.bc as u32;
                let (f, cfg) = self.prepare(&main)?;
                let arg = crate::tc::KernelArg(p);
                // SAFETY: `flash_fwd_tc_fa2*(p: AttnParams)` takes this one
                // block by value; q, k, v, o validated against their shapes and
                // strides (o non-overlapping) and checked 16-byte aligned with
                // strides multiple of 8 elements; headdim ≤ kernel.d, a multiple
                // of 8 (the plan matched it; the kernel zero-pads the rest);
                // lse ≥ n f32; varlen and ALiBi as for the f32 kernel above;
                // `cfg` has the kernel's threads, grid and dynamic shared memory.
                unsafe { stream.launch_builder(f).arg(&arg).launch(cfg) }?;
            }
            (Plan::Hopper { kernel, main }, StatsOut::LogSumExp(lse)) => {
                check_tc_alignment(&p)?;
                let (lse_ptr, _lse_guard) = lse.device_ptr_mut(stream);
                p.lse_ptr = lse_ptr;
                p.br = kernel.br() as u32;
                p.bc = kernel.bc as u32;
                // SAFETY: q, k, v, o validated against their shapes and
                // strides (o non-overlapping), 16-byte aligned with strides
                // multiple of 8 elements (checked above); headdim a multiple
                // of 8 ≤ kernel.d (the plan's `hopper_head_dim`; the copies
                // zero-fill the rest); lse ≥ batch·nheads·seqlen_q f32;
                // `main` is the plan's launch for `kernel`.
                unsafe { crate::hopper::launch(self, stream, kernel, &main, &p) }?;
            }
            (Plan::TcFa1 { kernel, init, main, accum_len }, StatsOut::Fa1 { l, m }) => {
                check_tc_alignment(&p)?;
                let (l_ptr, _l_guard) = l.device_ptr_mut(stream);
                let (m_ptr, _m_guard) = m.device_ptr_mut(stream);
                // SAFETY: uninitialized f32 accumulator; `fa1_init_f32` below
                // writes every element before the main kernel reads any.
                let mut accum: CudaSlice<f32> = unsafe { stream.alloc(accum_len) }?;
                let (accum_ptr, _accum_guard) = accum.device_ptr_mut(stream);
                p.lse_ptr = l_ptr;
                p.m_ptr = m_ptr;
                p.br = kernel.br() as u32;
                p.bc = kernel.bc as u32;
                // The accumulator rows are the kernel's compiled head dim wide.
                let (nq, nh, kd) = (dims.seqlen_q as u64, dims.nheads as u64, kernel.d as u64);
                let init_p = AttnParams { o_ptr: accum_ptr, o_stride: [nq * nh * kd, nh * kd, kd], headdim: kernel.d as u32, ..p };
                let (f, cfg) = self.prepare(&init)?;
                let arg = crate::tc::KernelArg(init_p);
                // SAFETY: `fa1_init_f32(p: AttnParams)` writes the f32
                // accumulator (accum_len = batch·seqlen_q·nheads·kernel.d,
                // contiguous strides given) and l, m (≥ batch·nheads·seqlen_q).
                unsafe { stream.launch_builder(f).arg(&arg).launch(cfg) }?;
                p.o_accum_ptr = accum_ptr;
                let (f, cfg) = self.prepare(&main)?;
                let arg = crate::tc::KernelArg(p);
                // SAFETY: `flash_fwd_tc_fa1_*(p: AttnParams)`: q, k, v, o as for
                // FA2 above (validated, aligned); o_accum, l, m initialized by
                // the launch above (same stream, in order); the kernel's
                // threads, batch·nheads blocks and dynamic shared memory.
                unsafe { stream.launch_builder(f).arg(&arg).launch(cfg) }?;
            }
            // `plan` follows `params.loop_order`, and the stats were matched
            // against it above.
            (plan, stats) => {
                let expected = StatsOut::name_of(matches!(plan, Plan::Fa1 { .. } | Plan::TcFa1 { .. }));
                return Err(FlashAttnError::StatsMismatch { loop_order: params.loop_order, expected, given: stats.name() });
            }
        }
        Ok(())
    }

    /// The dispatch decision for a validated problem on this device
    /// (`alibi`: slopes given; `varlen`: a packed batch).
    pub fn plan<T: AttnElem>(&self, problem: &Problem, params: &ForwardParams, alibi: bool, varlen: bool) -> Result<Plan> {
        let key = DispatchKey {
            dtype: T::DTYPE,
            headdim: problem.dims.headdim,
            causal: params.causal,
            loop_order: params.loop_order,
            arch: self.compute_capability(),
            features: Features { varlen, mods: alibi || problem.opts.softcap > 0.0, decode: false },
        };
        // The sm_90a kernels take MHA/GQA, dense or varlen, causal, windowed
        // or no mask (softcap, ALiBi and decode stay on the mma.sync kernels;
        // `hopper::plan` says no to them).
        let o = &problem.opts;
        let plain_mask = o.window_left < 0 && (o.window_right < 0 || (params.causal && o.window_right == 0));
        let smem = self.limits().max_smem_per_block;
        if let Some(plan) = crate::hopper::plan(self.has_hopper_kernels(), &key, !plain_mask, &problem.dims, params.block, smem)? {
            return Ok(plan);
        }
        dispatch::plan(&key, &problem.dims, params.block, &self.limits())
    }
}
