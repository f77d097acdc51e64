//! Placeholder of the tensor-core backward's interface (branch `tc` writes
//! the real module with these two signatures): no kernel here, so f16/bf16
//! backward calls get a typed `Unsupported` error.

use std::sync::Arc;

use cudarc::driver::CudaStream;
use flash_attn_common::BwdParams;

use crate::device::FlashAttention;
use crate::dispatch::DType;
use crate::error::{FlashAttnError, Result};

/// Whether a tensor-core backward kernel runs this dtype and head dim on a
/// device of compute capability `cc` (none in this build).
pub(crate) fn tc_backward_supported(_dtype: DType, _headdim: usize, _cc: (i32, i32)) -> bool {
    false
}

/// Launches the tensor-core backward main kernel (none in this build).
///
/// # Safety
/// `p` from the validated backward launch (see the real module's contract).
pub(crate) unsafe fn launch_tc_backward(_fa: &FlashAttention, _stream: &Arc<CudaStream>, _p: &BwdParams, dtype: DType) -> Result<()> {
    Err(FlashAttnError::Unsupported { argument: "q", dtype: dtype.name(), what: "the backward pass (no tensor-core backward kernel in this build)" })
}
