//! The candle ops: [`FlashAttn`] (candle-flash-attn's struct, same public
//! fields) and the variant that also hands back the logsumexp.

use candle_core::op::BackpropOp;
use candle_core::{CpuStorage, CustomOp3, Layout, Result, Shape, Storage, Tensor};

use crate::check::{self, Checked, Options};
use crate::cpu;

/// FlashAttention-2 forward as a candle [`CustomOp3`] over `(q, k, v)`,
/// each `(batch, seqlen, nheads, headdim)` with any batch/seq/head strides
/// and a contiguous head dim; the output is contiguous with q's shape.
///
/// * CUDA (feature `cuda`): flash-attn's kernels on candle's own stream,
///   reading candle's buffers in place (offset and strides as they are) and
///   writing an output allocated on that stream; f32, f16, bf16.
/// * CPU: flash-attn's CPU reference (f32 and f64 natively, f16 and bf16
///   through f32); candle-flash-attn has no CPU path.
///
/// The fields are candle-flash-attn 0.11.1's.
pub struct FlashAttn {
    pub softmax_scale: f32,
    pub alibi_slopes: Option<Tensor>,
    pub window_size_left: Option<usize>,
    pub window_size_right: Option<usize>,
    pub softcap: Option<f32>,
}

impl FlashAttn {
    pub(crate) fn options(&self) -> Options {
        Options {
            softmax_scale: self.softmax_scale,
            window_size_left: self.window_size_left,
            window_size_right: self.window_size_right,
            softcap: self.softcap,
        }
    }

    pub(crate) fn check(&self, q_l: &Layout, k_l: &Layout, v_l: &Layout) -> Result<Checked> {
        check::check(q_l, k_l, v_l, &self.options())
    }

    /// Runs on whichever backend the storages live on; the logsumexp
    /// `(batch, nheads, seqlen_q)` f32 comes back beside the output.
    #[allow(clippy::too_many_arguments)]
    fn fwd(
        &self,
        q: &Storage,
        q_l: &Layout,
        k: &Storage,
        k_l: &Layout,
        v: &Storage,
        v_l: &Layout,
    ) -> Result<(Storage, Shape, Storage)> {
        match (q, k, v) {
            (Storage::Cpu(q), Storage::Cpu(k), Storage::Cpu(v)) => {
                let (o, lse, shape) = self.run_cpu(q, q_l, k, k_l, v, v_l)?;
                Ok((Storage::Cpu(o), shape, Storage::Cpu(lse)))
            }
            #[cfg(feature = "cuda")]
            (Storage::Cuda(q), Storage::Cuda(k), Storage::Cuda(v)) => {
                let (o, lse, shape) = self.run_cuda(q, q_l, k, k_l, v, v_l)?;
                Ok((Storage::Cuda(o), shape, Storage::Cuda(lse)))
            }
            (q, k, v) => Err(check::err(format_args!(
                "device mismatch or unsupported device: `q` on {:?}, `k` on {:?}, `v` on {:?} \
                 (this build runs on {})",
                q.device().location(),
                k.device().location(),
                v.device().location(),
                if cfg!(feature = "cuda") { "the CPU and CUDA" } else { "the CPU only: enable the `cuda` feature for CUDA" },
            ))),
        }
    }
}

impl FlashAttn {
    /// The CPU path: output, logsumexp, output shape.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn run_cpu(
        &self,
        q: &CpuStorage,
        q_l: &Layout,
        k: &CpuStorage,
        k_l: &Layout,
        v: &CpuStorage,
        v_l: &Layout,
    ) -> Result<(CpuStorage, CpuStorage, Shape)> {
        cpu::check_dtypes(q, k, v)?;
        let c = self.check(q_l, k_l, v_l)?;
        let (o, lse) = cpu::forward(&c, self.alibi_slopes.as_ref(), q, q_l, k, k_l, v, v_l)?;
        Ok((o, lse, c.out_shape().into()))
    }

    /// The CUDA path: output, logsumexp, output shape.
    #[cfg(feature = "cuda")]
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn run_cuda(
        &self,
        q: &candle_core::CudaStorage,
        q_l: &Layout,
        k: &candle_core::CudaStorage,
        k_l: &Layout,
        v: &candle_core::CudaStorage,
        v_l: &Layout,
    ) -> Result<(candle_core::CudaStorage, candle_core::CudaStorage, Shape)> {
        crate::cuda::check_dtypes(q, k, v)?;
        let c = self.check(q_l, k_l, v_l)?;
        let (o, lse) = crate::cuda::forward(&c, self.alibi_slopes.as_ref(), q, q_l, k, k_l, v, v_l)?;
        Ok((o, lse, c.out_shape().into()))
    }
}

impl CustomOp3 for FlashAttn {
    fn name(&self) -> &'static str {
        "flash-attn"
    }

    fn cpu_fwd(
        &self,
        q: &CpuStorage,
        q_l: &Layout,
        k: &CpuStorage,
        k_l: &Layout,
        v: &CpuStorage,
        v_l: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let (o, _lse, shape) = self.run_cpu(q, q_l, k, k_l, v, v_l)?;
        Ok((o, shape))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        q: &candle_core::CudaStorage,
        q_l: &Layout,
        k: &candle_core::CudaStorage,
        k_l: &Layout,
        v: &candle_core::CudaStorage,
        v_l: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        let (o, _lse, shape) = self.run_cuda(q, q_l, k, k_l, v, v_l)?;
        Ok((o, shape))
    }

    /// dq, dk, dv (`crate::backward`); the logsumexp is recomputed (the
    /// public functions apply a recording op that keeps it instead).
    fn bwd(&self, q: &Tensor, k: &Tensor, v: &Tensor, out: &Tensor, dout: &Tensor) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let (_, lse) = self.forward_with_lse(q, k, v)?;
        self.backward(q, k, v, out, dout, &lse)
    }
}

impl FlashAttn {
    /// The gradients of this op's call on q, k, v given its output, the
    /// output's gradient and its logsumexp `(batch, nheads, seqlen_q)`.
    pub(crate) fn backward(&self, q: &Tensor, k: &Tensor, v: &Tensor, out: &Tensor, dout: &Tensor, lse: &Tensor) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let c = self.check(q.layout(), k.layout(), v.layout())?;
        crate::backward::grads(&c, None, self.alibi_slopes.as_ref(), [q, k, v, out, dout, lse])
    }
}

/// Runs `op` on q, k, v and returns the output and the logsumexp. candle's
/// `CustomOp3` returns one tensor, so the storages are read here and the
/// two results wrapped as tensors (no backward: the op has none anyway).
pub(crate) fn forward_with_lse(op: &FlashAttn, q: &Tensor, k: &Tensor, v: &Tensor) -> Result<(Tensor, Tensor)> {
    let (qs, q_l) = q.storage_and_layout();
    let (ks, k_l) = k.storage_and_layout();
    let (vs, v_l) = v.storage_and_layout();
    let (o, shape, lse) = op.fwd(&qs, q_l, &ks, k_l, &vs, v_l)?;
    let (b, s, h, _) = shape.dims4()?;
    let o = Tensor::from_storage(o, shape, BackpropOp::none(), false);
    let lse = Tensor::from_storage(lse, (b, h, s), BackpropOp::none(), false);
    Ok((o, lse))
}
