//! The backward pass of the candle ops (`CustomOp3::bwd` of [`FlashAttn`]
//! and of the varlen op), so that `loss.backward()` through `flash_attn` /
//! `flash_attn_varlen` trains: dq, dk, dv from q, k, v, the forward's
//! output and logsumexp, and the output's gradient.
//!
//! * CUDA: the core's `backward` / `backward_varlen` on candle's stream over
//!   candle's buffers (q, k, v at their strides; out, dout contiguous);
//!   f32 on the f32 kernels, f16/bf16 on the tensor-core backward.
//! * CPU: the core's reference (`reference::fa2_backward`,
//!   `varlen_attention_backward`), f64 in f64, everything else in f32.
//!
//! The logsumexp: the ops the public functions apply record it at the
//! forward ([`Recording`]); a bare [`FlashAttn`] applied by the caller
//! recomputes it (one more forward).

use std::sync::Mutex;

use candle_core::op::BackpropOp;
use candle_core::{CpuStorage, CustomOp3, Device, Layout, Result, Shape, Storage, Tensor};

use crate::check::{Checked, err};
use crate::op::FlashAttn;
use crate::varlen::VarlenIdx;

/// The six tensors of a backward call: q, k, v, out, dout, lse.
pub(crate) type Six<'a> = [&'a Tensor; 6];

/// dq, dk, dv of a checked call (`idx`: varlen) on q's device.
pub(crate) fn grads(c: &Checked, idx: Option<&VarlenIdx<'_>>, alibi: Option<&Tensor>, t: Six<'_>) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
    let [q, k, v, out, dout, lse] = t;
    if dout.dtype() != q.dtype() || out.dtype() != q.dtype() {
        return Err(err(format_args!(
            "dtype mismatch: the output's gradient is {:?} and the output {:?}, but `q` is {:?}",
            dout.dtype(),
            out.dtype(),
            q.dtype()
        )));
    }
    if dout.dims() != q.dims() {
        return Err(err(format_args!("shape mismatch: the output's gradient is {:?}, `q` {:?}", dout.dims(), q.dims())));
    }
    let (out, dout, lse) = (out.contiguous()?, dout.contiguous()?, lse.contiguous()?);
    let six = [q, k, v, &out, &dout, &lse];
    let [dq, dk, dv] = match q.device() {
        Device::Cpu => crate::cpu::backward(c, idx, alibi, six)?,
        #[cfg(feature = "cuda")]
        Device::Cuda(_) => crate::cuda::backward(c, idx, alibi, six)?,
        #[allow(unreachable_patterns)]
        d => return Err(err(format_args!("the backward pass runs on the CPU and CUDA, not on {:?}", d.location()))),
    };
    Ok((Some(dq), Some(dk), Some(dv)))
}

/// A gradient's storage as a tensor of `shape` (no op recorded).
pub(crate) fn tensor(s: Storage, shape: impl Into<Shape>) -> Tensor {
    Tensor::from_storage(s, shape, BackpropOp::none(), false)
}

/// [`FlashAttn`] with its forward's logsumexp kept for the backward pass
/// (what [`crate::flash_attn`] and its siblings apply).
pub(crate) struct Recording {
    pub op: FlashAttn,
    lse: Mutex<Option<Tensor>>,
}

impl Recording {
    pub fn new(op: FlashAttn) -> Self {
        Self { op, lse: Mutex::new(None) }
    }

    fn keep(&self, lse: Storage, shape: (usize, usize, usize)) {
        *self.lse.lock().unwrap_or_else(|e| e.into_inner()) = Some(tensor(lse, shape));
    }
}

impl CustomOp3 for Recording {
    fn name(&self) -> &'static str {
        "flash-attn"
    }

    fn cpu_fwd(&self, q: &CpuStorage, q_l: &Layout, k: &CpuStorage, k_l: &Layout, v: &CpuStorage, v_l: &Layout) -> Result<(CpuStorage, Shape)> {
        let (o, lse, shape) = self.op.run_cpu(q, q_l, k, k_l, v, v_l)?;
        let (b, s, h, _) = shape.dims4()?;
        self.keep(Storage::Cpu(lse), (b, h, s));
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
        let (o, lse, shape) = self.op.run_cuda(q, q_l, k, k_l, v, v_l)?;
        let (b, s, h, _) = shape.dims4()?;
        self.keep(Storage::Cuda(lse), (b, h, s));
        Ok((o, shape))
    }

    fn bwd(&self, q: &Tensor, k: &Tensor, v: &Tensor, out: &Tensor, dout: &Tensor) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let kept = self.lse.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let lse = match kept {
            Some(lse) => lse,
            None => self.op.forward_with_lse(q, k, v)?.1,
        };
        self.op.backward(q, k, v, out, dout, &lse)
    }
}
