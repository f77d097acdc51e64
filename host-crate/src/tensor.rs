//! The tensors, options and outputs of the device API: what a caller hands
//! [`FlashAttention`](crate::FlashAttention)'s calls and gets back. Types
//! only; the checks are in `validate`, the launches in `api` and the
//! other front ends.

use cudarc::driver::{CudaSlice, CudaViewMut, DevicePtr, DevicePtrMut, DeviceRepr, ValidAsZeroBits};

use crate::params::AlibiShape;
use crate::types::DType;

/// Shape and element strides of one `(batch, seqlen, nheads, headdim)`
/// tensor; the head dimension is contiguous (stride 1).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TensorLayout {
    /// `[batch, seqlen, nheads, headdim]`.
    pub shape: [usize; 4],
    /// Element strides of `[batch, seqlen, nheads]`.
    pub strides: [usize; 3],
}

impl TensorLayout {
    /// A layout of `shape` `(batch, seqlen, nheads, headdim)` with element
    /// strides `strides` of the batch, seqlen and head axes.
    pub fn new(shape: [usize; 4], strides: [usize; 3]) -> Self {
        Self { shape, strides }
    }

    /// The densely packed row-major layout (strides saturate on overflow,
    /// which validation then reports).
    pub fn contiguous(shape: [usize; 4]) -> Self {
        let [_, n, h, d] = shape;
        let sh = d;
        let sn = h.saturating_mul(d);
        let sb = n.saturating_mul(sn);
        Self { shape, strides: [sb, sn, sh] }
    }

    /// Sequences (axis 0).
    pub fn batch(&self) -> usize {
        self.shape[0]
    }
    /// Tokens per sequence (axis 1).
    pub fn seqlen(&self) -> usize {
        self.shape[1]
    }
    /// Heads (axis 2).
    pub fn nheads(&self) -> usize {
        self.shape[2]
    }
    /// Head dim (axis 3, contiguous).
    pub fn headdim(&self) -> usize {
        self.shape[3]
    }

    /// Number of elements, or `None` on overflow.
    pub fn num_elements(&self) -> Option<usize> {
        self.shape.iter().try_fold(1usize, |a, &x| a.checked_mul(x))
    }

    /// One past the largest element offset the layout addresses, or `None`
    /// on overflow. 0 for an empty shape.
    pub fn required_len(&self) -> Option<usize> {
        if self.shape.contains(&0) {
            return Some(0);
        }
        let mut last = self.shape[3] - 1;
        for a in 0..3 {
            last = last.checked_add((self.shape[a] - 1).checked_mul(self.strides[a])?)?;
        }
        last.checked_add(1)
    }

    /// Whether two distinct elements can share an offset: false when, with
    /// the axes sorted by stride, every stride exceeds the span of the
    /// faster-varying axes (headdim first, stride 1). Conservative.
    pub fn may_overlap(&self) -> bool {
        let mut axes: Vec<(usize, usize)> = (0..3).map(|a| (self.strides[a], self.shape[a])).filter(|&(_, n)| n > 1).collect();
        axes.sort_unstable();
        let mut span = self.shape[3].saturating_sub(1);
        for (stride, n) in axes {
            if stride <= span {
                return true;
            }
            span = match (n - 1).checked_mul(stride).and_then(|x| x.checked_add(span)) {
                Some(s) => s,
                None => return true,
            };
        }
        false
    }
}

/// A device buffer (any cudarc `CudaSlice`/`CudaView`, or a
/// `dyn DevicePtr<T>`) and its layout.
#[derive(Debug)]
pub struct Tensor<'a, S: ?Sized> {
    /// The device buffer.
    pub data: &'a S,
    /// Its shape and strides.
    pub layout: TensorLayout,
}

impl<S: ?Sized> Clone for Tensor<'_, S> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<S: ?Sized> Copy for Tensor<'_, S> {}

impl<'a, S: ?Sized> Tensor<'a, S> {
    /// `data` viewed as `layout`.
    pub fn new(data: &'a S, layout: TensorLayout) -> Self {
        Self { data, layout }
    }
}

/// Any buffer's tensor as one of `dyn DevicePtr<T>`, the form the cache
/// structs' optional fields take ([`KvCache::k_new`](crate::KvCache::k_new)):
/// `Tensor::new(&k_new, layout).into()`.
impl<'a, T, S: DevicePtr<T>> From<Tensor<'a, S>> for Tensor<'a, dyn DevicePtr<T> + 'a> {
    fn from(t: Tensor<'a, S>) -> Self {
        Tensor { data: t.data, layout: t.layout }
    }
}

/// A mutable device buffer (`CudaSlice`/`CudaViewMut`) and its layout.
#[derive(Debug)]
pub struct TensorMut<'a, S> {
    /// The device buffer, written.
    pub data: &'a mut S,
    /// Its shape and strides.
    pub layout: TensorLayout,
}

impl<'a, S> TensorMut<'a, S> {
    /// `data` viewed as `layout`, to be written.
    pub fn new(data: &'a mut S, layout: TensorLayout) -> Self {
        Self { data, layout }
    }
}

/// Row statistics handed back by [`FlashAttention::forward`](crate::FlashAttention::forward), each f32
/// `(batch, nheads, seqlen_q)` contiguous.
#[derive(Debug)]
pub enum RowStats {
    /// FA2 and Standard: the natural-log logsumexp of each row of
    /// `softmax_scale·QKᵀ` (−inf for a row that sees no key).
    LogSumExp(CudaSlice<f32>),
    /// FA1: the final `l` and `m` of Algorithm 1, in the base-2 units of
    /// [`crate::RowState`]: `m` is the row maximum of
    /// `softmax_scale·log2(e)·QKᵀ` (−inf for a row that sees no key), `l`
    /// the sum of `2^(s − m)`; `RowState { m, l }.lse()` is the logsumexp.
    Fa1 {
        /// Row sums `(batch, nheads, seqlen_q)`.
        l: CudaSlice<f32>,
        /// Row maxima (base 2) `(batch, nheads, seqlen_q)`.
        m: CudaSlice<f32>,
    },
}

/// The row statistics a backward call reads
/// ([`FlashAttention::backward`](crate::FlashAttention::backward)): the
/// forward's [`RowStats`] (`&out.stats`), or a logsumexp alone in any f32
/// buffer (`&out.lse` of an [`AttnOutput`], a caller's `softmax_lse`); both
/// convert with `into`.
#[derive(Clone, Copy)]
pub enum StatsRef<'a> {
    /// The logsumexp of the FA2 and Standard forwards.
    LogSumExp(&'a dyn DevicePtr<f32>),
    /// FA1's `l` and `m` ([`RowStats::Fa1`]).
    Fa1 {
        /// Row sums.
        l: &'a dyn DevicePtr<f32>,
        /// Row maxima (base 2).
        m: &'a dyn DevicePtr<f32>,
    },
}

impl std::fmt::Debug for StatsRef<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StatsRef::LogSumExp(lse) => f.debug_struct("LogSumExp").field("len", &lse.len()).finish(),
            StatsRef::Fa1 { l, m } => f.debug_struct("Fa1").field("l_len", &l.len()).field("m_len", &m.len()).finish(),
        }
    }
}

impl<'a> From<&'a RowStats> for StatsRef<'a> {
    fn from(stats: &'a RowStats) -> Self {
        match stats {
            RowStats::LogSumExp(lse) => StatsRef::LogSumExp(lse),
            RowStats::Fa1 { l, m } => StatsRef::Fa1 { l, m },
        }
    }
}

impl<'a, S: DevicePtr<f32>> From<&'a S> for StatsRef<'a> {
    fn from(lse: &'a S) -> Self {
        StatsRef::LogSumExp(lse)
    }
}

/// Caller-owned row-statistics buffers for [`FlashAttention::forward_into`](crate::FlashAttention::forward_into)
/// (views of at least `batch·nheads·seqlen_q` f32). FA1 initializes `l` and
/// `m` itself (Algorithm 1, line 2).
#[derive(Debug)]
pub enum StatsMut<'a> {
    /// For `LoopOrder::Fa2` and `LoopOrder::Standard`.
    LogSumExp(CudaViewMut<'a, f32>),
    /// For `LoopOrder::Fa1`.
    Fa1 {
        /// Row sums.
        l: CudaViewMut<'a, f32>,
        /// Row maxima (base 2).
        m: CudaViewMut<'a, f32>,
    },
}

/// The row-statistics buffers a launch writes: the logsumexp (FA2 and
/// Standard; the varlen front door's `lse`) or FA1's `l, m` (the dense
/// front door's [`StatsMut`]).
pub(crate) enum StatsOut<'a> {
    LogSumExp(&'a mut dyn DevicePtrMut<f32>),
    Fa1 { l: &'a mut dyn DevicePtrMut<f32>, m: &'a mut dyn DevicePtrMut<f32> },
}

impl StatsOut<'_> {
    /// The variant's name as the caller wrote it, for error messages.
    pub(crate) fn name(&self) -> &'static str {
        Self::name_of(matches!(self, StatsOut::Fa1 { .. }))
    }

    /// The name of the variant a launch needs: FA1's `l, m` (`fa1`) or
    /// the logsumexp.
    pub(crate) fn name_of(fa1: bool) -> &'static str {
        if fa1 { "StatsMut::Fa1 { l, m }" } else { "StatsMut::LogSumExp" }
    }
}

impl<'a> From<&'a mut StatsMut<'_>> for StatsOut<'a> {
    fn from(stats: &'a mut StatsMut<'_>) -> Self {
        match stats {
            StatsMut::LogSumExp(lse) => StatsOut::LogSumExp(lse),
            StatsMut::Fa1 { l, m } => StatsOut::Fa1 { l, m },
        }
    }
}

impl RowStats {
    /// The logsumexp of the FA2 and Standard loop orders; `None` for FA1's
    /// `l, m`.
    pub fn lse(&self) -> Option<&CudaSlice<f32>> {
        match self {
            RowStats::LogSumExp(lse) => Some(lse),
            RowStats::Fa1 { .. } => None,
        }
    }
}

/// Output of the dense forward ([`FlashAttention::forward`](crate::FlashAttention::forward)
/// and [`forward_ext`](crate::FlashAttention::forward_ext)), whose loop
/// order decides its row statistics: [`AttnOutput`]'s `o` and `o_layout`,
/// and the statistics as [`RowStats`] ([`ForwardOutput::lse`] for the
/// logsumexp of FA2 and Standard).
#[derive(Debug)]
pub struct ForwardOutput<T> {
    /// `(batch, seqlen_q, nheads, headdim)`, contiguous ([`ForwardOutput::o_layout`]).
    pub o: CudaSlice<T>,
    /// `o`'s layout (contiguous).
    pub o_layout: TensorLayout,
    /// The row statistics of the loop order.
    pub stats: RowStats,
}

impl<T> ForwardOutput<T> {
    /// The logsumexp `(batch, nheads, seqlen_q)` of the FA2 and Standard
    /// loop orders; `None` for FA1 (its `l, m` are in [`ForwardOutput::stats`]).
    pub fn lse(&self) -> Option<&CudaSlice<f32>> {
        self.stats.lse()
    }
}

/// Output of every call that computes the logsumexp whatever its options:
/// the KV-cache calls ([`FlashAttention::forward_kvcache`](crate::FlashAttention::forward_kvcache),
/// `_ref`, `_fp8`), varlen ([`FlashAttention::forward_varlen`](crate::FlashAttention::forward_varlen),
/// [`forward_varlen_paged`](crate::FlashAttention::forward_varlen_paged))
/// and FP8 attention ([`FlashAttention::forward_fp8`](crate::FlashAttention::forward_fp8)).
/// `o` and `o_layout` as in [`ForwardOutput`]; the logsumexp is a field.
#[derive(Debug)]
pub struct AttnOutput<T> {
    /// O, contiguous: `(batch, seqlen_q, nheads, headdim)`, or packed
    /// `(total_q, nheads, headdim)` for the varlen calls (`o_layout` with
    /// batch 1, [`TensorLayout::varlen`]).
    pub o: CudaSlice<T>,
    /// `o`'s layout (contiguous).
    pub o_layout: TensorLayout,
    /// The natural-log logsumexp of each row of `softmax_scale·QKᵀ` (−inf
    /// for a row that sees no key), f32 contiguous: `(batch, nheads,
    /// seqlen_q)`, or `(nheads, total_q)` for the varlen calls.
    pub lse: CudaSlice<f32>,
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for f32 {}
    impl Sealed for half::f16 {}
    impl Sealed for half::bf16 {}
}

/// Element types of q, k, v and o: `f32`, `half::f16`, `half::bf16`
/// (sealed). f32 runs the readable f32 kernels; f16 and bf16 the
/// tensor-core kernels (f32 accumulation).
pub trait AttnElem:
    sealed::Sealed + DeviceRepr + ValidAsZeroBits + Copy + Default + Send + Sync + std::fmt::Debug + 'static
{
    /// The element type's tag.
    const DTYPE: DType;
    /// Widens to f32.
    fn to_f32(self) -> f32;
    /// Rounds from f32 (to nearest even).
    fn from_f32(x: f32) -> Self;
}

impl AttnElem for f32 {
    const DTYPE: DType = DType::F32;
    fn to_f32(self) -> f32 {
        self
    }
    fn from_f32(x: f32) -> Self {
        x
    }
}

impl AttnElem for half::f16 {
    const DTYPE: DType = DType::F16;
    fn to_f32(self) -> f32 {
        half::f16::to_f32(self)
    }
    fn from_f32(x: f32) -> Self {
        half::f16::from_f32(x)
    }
}

impl AttnElem for half::bf16 {
    const DTYPE: DType = DType::BF16;
    fn to_f32(self) -> f32 {
        half::bf16::to_f32(self)
    }
    fn from_f32(x: f32) -> Self {
        half::bf16::from_f32(x)
    }
}

/// Optional device-side inputs of a call beyond q, k and v.
#[derive(Clone, Copy, Default)]
pub struct Extras<'a> {
    /// ALiBi slopes, f32 `(nheads)` or `(batch, nheads)` (FA2 paths).
    pub alibi_slopes: Option<AlibiSlopes<'a>>,
}

impl std::fmt::Debug for Extras<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Extras").field("alibi_slopes", &self.alibi_slopes.map(|a| (a.slopes.len(), a.shape))).finish()
    }
}

/// ALiBi slopes on the device: bias `−slope · |i + seqlen_k − seqlen_q − j|`
/// added after the softcap.
#[derive(Clone, Copy)]
pub struct AlibiSlopes<'a> {
    /// f32 slopes, `(nheads)` or `(batch, nheads)` row-major.
    pub slopes: &'a dyn DevicePtr<f32>,
    /// Which of the two shapes `slopes` has.
    pub shape: AlibiShape,
}

impl<'a> AlibiSlopes<'a> {
    /// Slopes `slopes` of shape `shape`.
    pub fn new(slopes: &'a dyn DevicePtr<f32>, shape: AlibiShape) -> Self {
        Self { slopes, shape }
    }
}

/// The varlen description of a call (device-side prefix sums).
#[derive(Clone, Copy)]
pub struct Varlen<'a> {
    /// i32 `(batch + 1)`, prefix sums of the query lengths from 0.
    pub cu_seqlens_q: &'a dyn DevicePtr<i32>,
    /// i32 `(batch + 1)`, prefix sums of the key lengths from 0.
    pub cu_seqlens_k: &'a dyn DevicePtr<i32>,
    /// At least every query (key) segment's length; sizes the grid.
    pub max_seqlen_q: usize,
    /// At least every key segment's length.
    pub max_seqlen_k: usize,
    /// Optional i32 `(batch)`: keys actually used per sequence (≤ its segment).
    pub seqused_k: Option<&'a dyn DevicePtr<i32>>,
}

impl Varlen<'_> {
    /// The element counts of `cu_seqlens_q`, `cu_seqlens_k` and `seqused_k`,
    /// as the validation's length checks take them.
    pub(crate) fn array_lens(&self) -> (usize, usize, Option<usize>) {
        (self.cu_seqlens_q.len(), self.cu_seqlens_k.len(), self.seqused_k.map(|s| s.len()))
    }
}

impl std::fmt::Debug for Varlen<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Varlen")
            .field("batch", &self.batch())
            .field("max_seqlen_q", &self.max_seqlen_q)
            .field("max_seqlen_k", &self.max_seqlen_k)
            .field("seqused_k", &self.seqused_k.is_some())
            .finish()
    }
}

impl Varlen<'_> {
    /// Number of sequences (`cu_seqlens_q.len() − 1`, 0 if empty).
    pub fn batch(&self) -> usize {
        self.cu_seqlens_q.len().saturating_sub(1)
    }
}

impl TensorLayout {
    /// A packed `(total, nheads, headdim)` varlen tensor, contiguous, as the
    /// 4-axis layout with batch 1 that the API takes.
    pub fn varlen(total: usize, nheads: usize, headdim: usize) -> Self {
        let c = Self::contiguous([1, total, nheads, headdim]);
        Self { strides: [0, c.strides[1], c.strides[2]], ..c }
    }
}
