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
    Ptx {
        /// The PTX build (`"sm_80"`, `"sm_90"`, `"sm_90a"`).
        build: &'static str,
        /// Why.
        reason: String,
    },

    /// No CUDA driver or no GPU: the device API cannot run (the ndarray API
    /// falls back to the CPU instead).
    #[error("no usable CUDA GPU: {reason}")]
    NoGpu {
        /// Why.
        reason: String,
    },

    /// The GPU lacks what a feature needs (e.g. FP8 conversions).
    #[error("device `{name}` (compute capability {major}.{minor}) does not support {what}")]
    DeviceLacks {
        /// The device's name.
        name: String,
        /// Compute capability, major.
        major: i32,
        /// Compute capability, minor.
        minor: i32,
        /// The feature and what it needs.
        what: &'static str,
    },

    /// The GPU is older than the oldest embedded PTX build (sm_80).
    #[error("unsupported device `{name}`: compute capability {major}.{minor}; flash-attn needs sm_80 (Ampere) or newer")]
    UnsupportedDevice {
        /// The device's name.
        name: String,
        /// Compute capability, major.
        major: i32,
        /// Compute capability, minor.
        minor: i32,
    },

    /// A tensor has a zero-sized axis.
    #[error("`{argument}`: the {axis} axis is zero-sized (shape {shape:?})")]
    ZeroSizedDim {
        /// The argument's name, as in the call's signature.
        argument: &'static str,
        /// The axis (`batch`, `seqlen`, `nheads`, `headdim`; a paged pool's
        /// `num_blocks`, `page_size`, `nheads_k`, `headdim`).
        axis: &'static str,
        /// The tensor's shape (axes as above).
        shape: [usize; 4],
    },

    /// Head dim outside the supported range.
    #[error("`{argument}`: headdim {headdim} is out of range (supported: 1..=256)")]
    HeadDimOutOfRange {
        /// The argument's name, as in the call's signature.
        argument: &'static str,
        /// The head dim.
        headdim: usize,
    },

    /// Two tensors disagree on an axis.
    #[error("`{argument}`: {axis} is {actual}, but must equal {expected} ({rule})")]
    ShapeMismatch {
        /// The argument's name, as in the call's signature.
        argument: &'static str,
        /// The axis (`batch`, `seqlen`, `nheads`, `headdim`, or a product of them).
        axis: &'static str,
        /// What the argument has.
        actual: usize,
        /// What it must have.
        expected: usize,
        /// The rule it breaks.
        rule: &'static str,
    },

    /// An axis is larger than the kernels index (32-bit sequence, batch and head counts).
    #[error("`{argument}`: {axis} = {value} exceeds the supported maximum {max}")]
    DimTooLarge {
        /// The argument's name, as in the call's signature.
        argument: &'static str,
        /// The axis (`batch`, `seqlen`, `nheads`, `headdim`, or a product of them).
        axis: &'static str,
        /// The offending value.
        value: usize,
        /// The largest value supported.
        max: usize,
    },

    /// The largest offset the shape and strides address does not fit in `usize`.
    #[error("`{argument}`: shape {shape:?} with strides {strides:?} (+ contiguous headdim) overflows the address space")]
    StrideOverflow {
        /// The argument's name, as in the call's signature.
        argument: &'static str,
        /// The tensor's shape.
        shape: [usize; 4],
        /// Element strides of the batch, seqlen and head axes.
        strides: [usize; 3],
    },

    /// A buffer is shorter than its shape and strides need.
    #[error("`{argument}`: buffer holds {len} elements, but shape {shape:?} with strides {strides:?} needs {required}")]
    BufferTooShort {
        /// The argument's name, as in the call's signature.
        argument: &'static str,
        /// Elements the buffer holds.
        len: usize,
        /// Elements the call needs.
        required: usize,
        /// The tensor's shape `(batch, seqlen, nheads, headdim)`.
        shape: [usize; 4],
        /// Element strides of the batch, seqlen and head axes.
        strides: [usize; 3],
    },

    /// A row-statistics buffer (`lse`, `l`, `m`) is shorter than `batch·nheads·seqlen_q`.
    #[error("`{argument}`: buffer holds {len} f32, but (batch, nheads, seqlen_q) needs {required}")]
    StatsTooShort {
        /// The argument's name, as in the call's signature.
        argument: &'static str,
        /// Elements the buffer holds.
        len: usize,
        /// Elements the call needs.
        required: usize,
    },

    /// An output whose strides make distinct elements share memory.
    #[error(
        "`{argument}`: strides {strides:?} make distinct elements of shape {shape:?} overlap \
         (each stride must exceed the span of the faster-varying axes)"
    )]
    OverlappingOutput {
        /// The argument's name, as in the call's signature.
        argument: &'static str,
        /// The tensor's shape `(batch, seqlen, nheads, headdim)`.
        shape: [usize; 4],
        /// Element strides of the batch, seqlen and head axes.
        strides: [usize; 3],
    },

    /// An argument's value is outside what it may be (window, softcap,
    /// ALiBi slopes, varlen prefix sums, GQA head counts, ...).
    #[error("{}: {reason}", argument_value(argument, value))]
    InvalidArgument {
        /// The argument's name, as in the call's signature.
        argument: &'static str,
        /// The offending value (where it names the argument itself, e.g. `cu_seqlens_q[3] = 7`, the message shows it once).
        value: String,
        /// Why.
        reason: &'static str,
    },

    /// `softmax_scale` is NaN or infinite.
    #[error("`softmax_scale` = {value} is not a finite number")]
    InvalidSoftmaxScale {
        /// The offending value.
        value: f32,
    },

    /// `block = Some((br, bc))` with a zero or over-large size.
    #[error("`block`: (br, bc) = ({br}, {bc}) is invalid: {reason}")]
    InvalidBlock {
        /// Query rows per block.
        br: usize,
        /// Keys per block.
        bc: usize,
        /// Why.
        reason: &'static str,
    },

    /// `block = Some((br, bc))` whose tiles do not fit the device's shared memory.
    #[error(
        "`block`: (br, bc) = ({br}, {bc}) with headdim {headdim} needs {smem_bytes} bytes of shared memory \
         for {loop_order:?}, but the device allows {max_smem_bytes} per block"
    )]
    BlockTooLarge {
        /// Query rows per block.
        br: usize,
        /// Keys per block.
        bc: usize,
        /// The head dim.
        headdim: usize,
        /// The loop order asked for.
        loop_order: LoopOrder,
        /// Shared memory the tiles need.
        smem_bytes: usize,
        /// The device's per-block limit.
        max_smem_bytes: usize,
    },

    /// The row statistics given to `forward_into` do not match the loop order.
    #[error("`stats`: {loop_order:?} writes {expected}, but {given} was given")]
    StatsMismatch {
        /// The loop order asked for.
        loop_order: LoopOrder,
        /// The statistics that loop order writes.
        expected: &'static str,
        /// What was given.
        given: &'static str,
    },

    /// The element type (or combination) has no kernel yet.
    #[error("`{argument}`: {dtype} is not supported by {what}")]
    Unsupported {
        /// The argument's name, as in the call's signature.
        argument: &'static str,
        /// The element type.
        dtype: &'static str,
        /// The path or feature that lacks it.
        what: &'static str,
    },

    /// The tensor-core path copies 16-byte chunks: pointers must be 16-byte
    /// aligned and the batch, seqlen and head strides multiples of 8 elements.
    #[error("`{argument}`: the f16/bf16 tensor-core kernels need {requirement} (got {})", misaligned_value(requirement, *value))]
    Misaligned {
        /// The argument's name, as in the call's signature.
        argument: &'static str,
        /// What the kernels need.
        requirement: &'static str,
        /// The offending address (shown in hex) or stride (in elements).
        value: u64,
    },

    /// A buffer or stream belongs to another CUDA context than the `FlashAttention`.
    #[error("`{argument}` belongs to CUDA context of device {found}, but this FlashAttention runs on device {expected}")]
    ContextMismatch {
        /// The argument's name, as in the call's signature.
        argument: &'static str,
        /// The ordinal of the argument's device.
        found: usize,
        /// The ordinal of this `FlashAttention`'s device.
        expected: usize,
    },

    /// The standard-attention scratch matrix `batch·nheads·seqlen_q·seqlen_k` does not fit in `usize`.
    #[error("the S/P scratch matrix of standard attention ({what}) is too large")]
    ScratchTooLarge {
        /// The sizes that overflow.
        what: String,
    },

    /// The CPU fallback (the reference implementation) refused its arguments.
    #[error("CPU reference: {0}")]
    Reference(#[from] RefError),

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

/// Why a reference computation refused its arguments.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum RefError {
    /// An axis of `arg` is 0.
    #[error("`{arg}` has a zero-sized axis: shape (batch, seqlen, nheads, headdim) = {shape:?}")]
    ZeroDim {
        /// The argument's name.
        arg: &'static str,
        /// The tensor's shape `(batch, seqlen, nheads, headdim)`.
        shape: [usize; 4],
    },
    /// `arg` does not agree with `other` on the axes named in `axes`.
    #[error(
        "`{arg}` has shape {shape:?} but must match `{other}` (shape {other_shape:?}) in {axes}; \
         layout is (batch, seqlen, nheads, headdim)"
    )]
    ShapeMismatch {
        /// The argument's name.
        arg: &'static str,
        /// The argument's shape.
        shape: [usize; 4],
        /// The argument it must match.
        other: &'static str,
        /// That argument's shape.
        other_shape: [usize; 4],
        /// The axes that must agree.
        axes: &'static str,
    },
    /// A block size (`br`, `bc`) is 0.
    #[error("block size `{arg}` must be positive, got {value}")]
    ZeroBlock {
        /// The argument's name.
        arg: &'static str,
        /// The value given.
        value: usize,
    },
    /// A sequence length does not fit the `u32` of [`AttnParams`](flash_attn_common::AttnParams).
    #[error("`{arg}` seqlen {value} exceeds u32::MAX")]
    TooLong {
        /// The argument's name.
        arg: &'static str,
        /// The sequence length.
        value: usize,
    },
    /// `softmax_scale` is NaN or infinite.
    #[error("`softmax_scale` must be finite, got {value}")]
    BadScale {
        /// The value given.
        value: f64,
    },
    /// FP8 scales neither one value nor one per (batch, head), or not
    /// finite and positive ([`crate::reference::fp8`]).
    #[error("fp8 `scales`: {reason}")]
    BadFp8Scales {
        /// Why.
        reason: String,
    },
}

/// "`argument` = value" for a plain value (`0`, `Some(8)`, `[0, 3]`); the
/// value alone where it names the argument itself (`cu_seqlens_q[0] = 3`,
/// `nheads_k = 4, nheads = 6`); "`argument`: value" where the value is a
/// phrase of its own (`batch_c = 1, batch = 2`, `length 5`), which
/// "`k_cache` = batch_c = 1" would chain into one equation: each thing said
/// once.
fn argument_value(argument: &str, value: &str) -> String {
    if value.starts_with(argument) {
        value.to_string()
    } else if is_plain(value) {
        format!("`{argument}` = {value}")
    } else {
        format!("`{argument}`: {value}")
    }
}

/// A value alone, not a phrase: no space outside brackets.
fn is_plain(value: &str) -> bool {
    let mut depth = 0i32;
    for c in value.chars() {
        match c {
            '(' | '[' | '{' => depth += 1,
            ')' | ']' | '}' => depth -= 1,
            ' ' if depth <= 0 => return false,
            _ => {}
        }
    }
    true
}

/// An address in hex, a stride in decimal.
fn misaligned_value(requirement: &str, value: u64) -> String {
    if requirement.contains("address") || requirement.contains("pointer") { format!("{value:#x}") } else { value.to_string() }
}

/// `Result` with [`FlashAttnError`].
pub type Result<T, E = FlashAttnError> = std::result::Result<T, E>;
