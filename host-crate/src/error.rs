//! The one error type of the library.
//!
//! Every invalid argument is reported with the argument's name (as in
//! `flash_attn_func(q, k, v, softmax_scale, causal)`) and the offending
//! value; driver failures are wrapped unchanged.

use crate::params::LoopOrder;
use cudarc::driver::DriverError;

/// Errors of the flash-attn API.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FlashAttnError {
    /// A CUDA driver call failed (including out-of-memory and launch errors).
    #[error("CUDA driver error: {0}")]
    Driver(#[from] DriverError),

    /// The embedded PTX build cannot be indexed, or lacks a kernel of the
    /// host's tables (a build mismatch, never the caller's input).
    #[error("embedded PTX build {build}: {reason}")]
    Ptx { build: &'static str, reason: String },

    /// No CUDA driver or no GPU: the device API cannot run (the ndarray API
    /// falls back to the CPU instead).
    #[error("no usable CUDA GPU: {reason}")]
    NoGpu { reason: String },

    /// The GPU lacks what a feature needs (e.g. FP8 conversions).
    #[error("device `{name}` (compute capability {major}.{minor}) does not support {what}")]
    DeviceLacks { name: String, major: i32, minor: i32, what: &'static str },

    /// The GPU is older than the oldest embedded PTX build (sm_80).
    #[error("unsupported device `{name}`: compute capability {major}.{minor}; flash-attn needs sm_80 (Ampere) or newer")]
    UnsupportedDevice { name: String, major: i32, minor: i32 },

    /// A tensor has a zero-sized axis.
    #[error("`{argument}`: the {axis} axis is zero-sized (shape {shape:?}, layout (batch, seqlen, nheads, headdim))")]
    ZeroSizedDim { argument: &'static str, axis: &'static str, shape: [usize; 4] },

    /// Head dim outside the supported range.
    #[error("`{argument}`: headdim {headdim} is out of range (supported: 1..=256)")]
    HeadDimOutOfRange { argument: &'static str, headdim: usize },

    /// Two tensors disagree on an axis.
    #[error("`{argument}`: {axis} is {actual}, but must equal {expected} ({rule})")]
    ShapeMismatch { argument: &'static str, axis: &'static str, actual: usize, expected: usize, rule: &'static str },

    /// An axis is larger than the kernels index (32-bit sequence, batch and head counts).
    #[error("`{argument}`: {axis} = {value} exceeds the supported maximum {max}")]
    DimTooLarge { argument: &'static str, axis: &'static str, value: usize, max: usize },

    /// The largest offset the shape and strides address does not fit in `usize`.
    #[error("`{argument}`: shape {shape:?} with strides {strides:?} (+ contiguous headdim) overflows the address space")]
    StrideOverflow { argument: &'static str, shape: [usize; 4], strides: [usize; 3] },

    /// A buffer is shorter than its shape and strides need.
    #[error("`{argument}`: buffer holds {len} elements, but shape {shape:?} with strides {strides:?} needs {required}")]
    BufferTooShort { argument: &'static str, len: usize, required: usize, shape: [usize; 4], strides: [usize; 3] },

    /// A row-statistics buffer (`lse`, `l`, `m`) is shorter than `batch·nheads·seqlen_q`.
    #[error("`{argument}`: buffer holds {len} f32, but (batch, nheads, seqlen_q) needs {required}")]
    StatsTooShort { argument: &'static str, len: usize, required: usize },

    /// An output whose strides make distinct elements share memory.
    #[error(
        "`{argument}`: strides {strides:?} make distinct elements of shape {shape:?} overlap \
         (each stride must exceed the span of the faster-varying axes)"
    )]
    OverlappingOutput { argument: &'static str, shape: [usize; 4], strides: [usize; 3] },

    /// An argument's value is outside what it may be (window, softcap,
    /// ALiBi slopes, varlen prefix sums, GQA head counts, ...).
    #[error("`{argument}` = {value}: {reason}")]
    InvalidArgument { argument: &'static str, value: String, reason: &'static str },

    /// `softmax_scale` is NaN or infinite.
    #[error("`softmax_scale` = {value} is not a finite number")]
    InvalidSoftmaxScale { value: f32 },

    /// `block = Some((br, bc))` with a zero or over-large size.
    #[error("`block`: (br, bc) = ({br}, {bc}) is invalid: {reason}")]
    InvalidBlock { br: usize, bc: usize, reason: &'static str },

    /// `block = Some((br, bc))` whose tiles do not fit the device's shared memory.
    #[error(
        "`block`: (br, bc) = ({br}, {bc}) with headdim {headdim} needs {smem_bytes} bytes of shared memory \
         for {loop_order:?}, but the device allows {max_smem_bytes} per block"
    )]
    BlockTooLarge { br: usize, bc: usize, headdim: usize, loop_order: LoopOrder, smem_bytes: usize, max_smem_bytes: usize },

    /// The row statistics given to `forward_into` do not match the loop order.
    #[error("`stats`: {loop_order:?} writes {expected}, but {given} was given")]
    StatsMismatch { loop_order: LoopOrder, expected: &'static str, given: &'static str },

    /// The element type (or combination) has no kernel yet.
    #[error("`{argument}`: {dtype} is not supported by {what}")]
    Unsupported { argument: &'static str, dtype: &'static str, what: &'static str },

    /// The tensor-core path copies 16-byte chunks: pointers must be 16-byte
    /// aligned and the batch, seqlen and head strides multiples of 8 elements.
    #[error("`{argument}`: the f16/bf16 tensor-core kernels need {requirement} (got {value})")]
    Misaligned { argument: &'static str, requirement: &'static str, value: u64 },

    /// A buffer or stream belongs to another CUDA context than the `FlashAttention`.
    #[error("`{argument}` belongs to CUDA context of device {found}, but this FlashAttention runs on device {expected}")]
    ContextMismatch { argument: &'static str, found: usize, expected: usize },

    /// The standard-attention scratch matrix `batch·nheads·seqlen_q·seqlen_k` does not fit in `usize`.
    #[error("the S/P scratch matrix of standard attention ({what}) is too large")]
    ScratchTooLarge { what: String },

    /// The CPU fallback (the reference implementation) refused its arguments.
    #[error("CPU reference: {0}")]
    Reference(#[from] crate::reference::RefError),

    /// An NCCL call of the context-parallel ring failed (feature `nccl`).
    #[cfg(feature = "nccl")]
    #[error("NCCL: {0:?}")]
    Nccl(cudarc::nccl::result::NcclError),

    /// Building an `ndarray` result failed (not expected: shapes are validated first).
    #[error("ndarray: {0}")]
    Ndarray(#[from] ndarray::ShapeError),
}

#[cfg(feature = "nccl")]
impl From<cudarc::nccl::result::NcclError> for FlashAttnError {
    fn from(e: cudarc::nccl::result::NcclError) -> Self {
        FlashAttnError::Nccl(e)
    }
}

/// `Result` with [`FlashAttnError`].
pub type Result<T, E = FlashAttnError> = std::result::Result<T, E>;
