//! The vocabulary of a problem that every layer speaks: its element type
//! ([`DType`]), its sizes ([`Dims`]) and the features that need their own
//! kernel variants ([`Features`]). Types only, importing nothing of the
//! crate, so the kernel tables, validation, dispatch and the front ends all
//! sit above it.

/// Element type of q, k, v and o.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DType {
    /// `f32`: the f32 kernels (FA1, FA2, standard attention).
    F32,
    /// `half::f16`: the tensor-core kernels.
    F16,
    /// `half::bf16`: the tensor-core kernels.
    BF16,
}

impl DType {
    /// The lower-case name (`"f32"`, `"f16"`, `"bf16"`) that error messages
    /// and kernel names use.
    pub const fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
        }
    }
}

/// Sizes of one problem (validated: every one ≥ 1, fits the kernels' u32 fields).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Dims {
    /// Sequences (for varlen: sequences of the packed batch).
    pub batch: usize,
    /// Query heads.
    pub nheads: usize,
    /// Heads of k and v (GQA/MQA; `nheads` for MHA).
    pub nheads_k: usize,
    /// Queries per sequence (for varlen: the longest).
    pub seqlen_q: usize,
    /// Keys per sequence (for varlen: the longest).
    pub seqlen_k: usize,
    /// Head dim of q, k and v.
    pub headdim: usize,
}

/// The features of a call that need their own kernel variants (GQA,
/// windows and head-dim padding are run-time parameters of every kernel).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Features {
    /// A packed (varlen) batch.
    pub varlen: bool,
    /// Softcap or ALiBi: per-score work in the softmax.
    pub mods: bool,
    /// KV cache (contiguous or paged) or split-KV: the `fa2d` kernels.
    pub decode: bool,
}
