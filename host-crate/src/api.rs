//! The device-level API: attention over cudarc buffers, on the caller's
//! stream, with no host synchronization (every call only enqueues work).
//!
//! ```no_run
//! use std::sync::Arc;
//! use cudarc::driver::CudaContext;
//! use flash_attn::{FlashAttention, ForwardParams, LoopOrder, RowStats, Tensor, TensorLayout};
//!
//! # fn main() -> Result<(), flash_attn::FlashAttnError> {
//! let ctx = CudaContext::new(0)?;
//! let stream = ctx.default_stream();
//! let fa = FlashAttention::new(&ctx)?;
//! let shape = [2, 1024, 12, 64]; // (batch, seqlen, nheads, headdim)
//! let n = shape.iter().product::<usize>();
//! let q = stream.clone_htod(&vec![0.5f32; n])?;
//! let k = stream.clone_htod(&vec![0.25f32; n])?;
//! let v = stream.clone_htod(&vec![1.0f32; n])?;
//! let layout = TensorLayout::contiguous(shape);
//! let params = ForwardParams { causal: true, ..Default::default() };
//! let out = fa.forward(&stream, Tensor::new(&q, layout), Tensor::new(&k, layout), Tensor::new(&v, layout), &params)?;
//! let o: Vec<f32> = stream.clone_dtoh(&out.o)?; // synchronizes here, not before
//! if let RowStats::LogSumExp(lse) = &out.stats { let _lse = stream.clone_dtoh(lse)?; }
//! # Ok(()) }
//! ```

use std::sync::Arc;

use cudarc::driver::{
    CudaSlice, CudaStream, CudaViewMut, DevicePtr, DevicePtrMut, DeviceRepr, DeviceSlice, PushKernelArg, ValidAsZeroBits,
};
use flash_attn_common::AttnParams;

use crate::device::FlashAttention;
use crate::dispatch::{self, DType, Dims, DispatchKey, Features, Plan};
use crate::varlen::{check_alibi, check_gqa};
use crate::varlen_api::VarlenLaunch;
use crate::error::{FlashAttnError, Result};

pub use crate::params::{AlibiShape, ForwardParams, LoopOrder, Resolved};
pub use crate::varlen_api::{Varlen, VarlenOutput};

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

    pub fn batch(&self) -> usize {
        self.shape[0]
    }
    pub fn seqlen(&self) -> usize {
        self.shape[1]
    }
    pub fn nheads(&self) -> usize {
        self.shape[2]
    }
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
    pub data: &'a S,
    pub layout: TensorLayout,
}

impl<'a, S: ?Sized> Tensor<'a, S> {
    pub fn new(data: &'a S, layout: TensorLayout) -> Self {
        Self { data, layout }
    }
}

/// A mutable device buffer (`CudaSlice`/`CudaViewMut`) and its layout.
#[derive(Debug)]
pub struct TensorMut<'a, S> {
    pub data: &'a mut S,
    pub layout: TensorLayout,
}

impl<'a, S> TensorMut<'a, S> {
    pub fn new(data: &'a mut S, layout: TensorLayout) -> Self {
        Self { data, layout }
    }
}

/// Row statistics handed back by [`FlashAttention::forward`], each f32
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
    Fa1 { l: CudaSlice<f32>, m: CudaSlice<f32> },
}

/// Caller-owned row-statistics buffers for [`FlashAttention::forward_into`]
/// (views of at least `batch·nheads·seqlen_q` f32). FA1 initializes `l` and
/// `m` itself (Algorithm 1, line 2).
#[derive(Debug)]
pub enum StatsMut<'a> {
    /// For `LoopOrder::Fa2` and `LoopOrder::Standard`.
    LogSumExp(CudaViewMut<'a, f32>),
    /// For `LoopOrder::Fa1`.
    Fa1 { l: CudaViewMut<'a, f32>, m: CudaViewMut<'a, f32> },
}

/// Output of [`FlashAttention::forward`].
#[derive(Debug)]
pub struct ForwardOutput<T> {
    /// `(batch, seqlen_q, nheads, headdim)`, contiguous ([`ForwardOutput::o_layout`]).
    pub o: CudaSlice<T>,
    pub o_layout: TensorLayout,
    pub stats: RowStats,
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
    const DTYPE: DType;
    fn to_f32(self) -> f32;
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

/// `1 / sqrt(headdim)`, the default `softmax_scale`.
pub fn default_softmax_scale(headdim: usize) -> f32 {
    (1.0 / (headdim as f64).sqrt()) as f32
}

/// A validated problem: sizes and the effective options.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Problem {
    /// For varlen: `batch` = sequences, `seqlen_q/k` = the maxima.
    pub dims: Dims,
    pub softmax_scale: f32,
    /// Window and softcap after FlashAttention-2's normalization.
    pub opts: Resolved,
}

impl Problem {
    /// The kernel parameter block of this problem over q, k, v, o at
    /// `ptrs` with element strides `strides` (same order), causal or not,
    /// and ALiBi slopes `(pointer, batch stride)`; the row statistics,
    /// scratch, varlen and block-size fields at their defaults, for the
    /// caller to set. One place for the forward and backward launches.
    pub(crate) fn attn_params(&self, ptrs: [u64; 4], strides: [[usize; 3]; 4], causal: bool, alibi: Option<(u64, usize)>) -> AttnParams {
        let dims = &self.dims;
        let u = |x: usize| x as u64;
        AttnParams {
            q_ptr: ptrs[0],
            k_ptr: ptrs[1],
            v_ptr: ptrs[2],
            o_ptr: ptrs[3],
            q_stride: strides[0].map(u),
            k_stride: strides[1].map(u),
            v_stride: strides[2].map(u),
            o_stride: strides[3].map(u),
            // Validated: each ≤ MAX_DIM = 2³¹ − 1 (MAX_HEADDIM for headdim).
            batch: dims.batch as u32,
            nheads: dims.nheads as u32,
            nheads_k: dims.nheads_k as u32,
            seqlen_q: dims.seqlen_q as u32,
            seqlen_k: dims.seqlen_k as u32,
            headdim: dims.headdim as u32,
            causal: causal as u32,
            alibi_ptr: alibi.map_or(0, |(ptr, _)| ptr),
            alibi_batch_stride: alibi.map_or(0, |(_, s)| s as u32),
            ..self.opts.kernel_params()
        }
    }

    /// Elements of each row-statistics buffer: `batch·nheads·seqlen_q`.
    pub fn stats_len(&self) -> usize {
        // Cannot overflow: q's layout (which has these axes) was validated.
        self.dims.batch * self.dims.nheads * self.dims.seqlen_q
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
    pub slopes: &'a dyn DevicePtr<f32>,
    pub shape: AlibiShape,
}

impl<'a> AlibiSlopes<'a> {
    pub fn new(slopes: &'a dyn DevicePtr<f32>, shape: AlibiShape) -> Self {
        Self { slopes, shape }
    }
}

const AXES: [&str; 4] = ["batch", "seqlen", "nheads", "headdim"];
/// Largest batch, nheads and seqlen the kernels index (u32 fields of `AttnParams`).
pub const MAX_DIM: usize = i32::MAX as usize;
/// Largest supported head dim.
pub const MAX_HEADDIM: usize = 256;

pub(crate) fn check_layout(argument: &'static str, l: &TensorLayout, buffer_len: usize) -> Result<()> {
    for (a, &n) in l.shape.iter().enumerate() {
        if n == 0 {
            return Err(FlashAttnError::ZeroSizedDim { argument, axis: AXES[a], shape: l.shape });
        }
    }
    if l.headdim() > MAX_HEADDIM {
        return Err(FlashAttnError::HeadDimOutOfRange { argument, headdim: l.headdim() });
    }
    for (&value, axis) in l.shape[..3].iter().zip(AXES) {
        if value > MAX_DIM {
            return Err(FlashAttnError::DimTooLarge { argument, axis, value, max: MAX_DIM });
        }
    }
    let required = l.required_len().ok_or(FlashAttnError::StrideOverflow { argument, shape: l.shape, strides: l.strides })?;
    if buffer_len < required {
        return Err(FlashAttnError::BufferTooShort { argument, len: buffer_len, required, shape: l.shape, strides: l.strides });
    }
    Ok(())
}

fn expect_eq(argument: &'static str, axis: &'static str, actual: usize, expected: usize, rule: &'static str) -> Result<()> {
    if actual == expected { Ok(()) } else { Err(FlashAttnError::ShapeMismatch { argument, axis, actual, expected, rule }) }
}

/// A caller's output `o`: the shape of q (`shape`), inside its buffer of
/// `len` elements, no two elements at one address.
pub(crate) fn check_output(l: &TensorLayout, len: usize, shape: [usize; 4]) -> Result<()> {
    for (a, (&got, &want)) in l.shape.iter().zip(shape.iter()).enumerate() {
        expect_eq("o", AXES[a], got, want, "o has the shape of q")?;
    }
    check_layout("o", l, len)?;
    if l.may_overlap() {
        return Err(FlashAttnError::OverlappingOutput { argument: "o", shape: l.shape, strides: l.strides });
    }
    Ok(())
}

/// Validates the layouts and buffer lengths of q, k, v and o and the
/// parameters; pure (no GPU needed), so every error path is unit-tested.
pub fn validate(
    q: (&TensorLayout, usize),
    k: (&TensorLayout, usize),
    v: (&TensorLayout, usize),
    o: (&TensorLayout, usize),
    params: &ForwardParams,
) -> Result<Problem> {
    check_layout("q", q.0, q.1)?;
    check_layout("k", k.0, k.1)?;
    check_layout("v", v.0, v.1)?;
    let (ql, kl, vl) = (q.0, k.0, v.0);
    expect_eq("k", "batch", kl.batch(), ql.batch(), "same as q")?;
    check_gqa(ql.nheads(), kl.nheads())?;
    expect_eq("k", "headdim", kl.headdim(), ql.headdim(), "same as q")?;
    expect_eq("v", "batch", vl.batch(), ql.batch(), "same as q")?;
    expect_eq("v", "seqlen", vl.seqlen(), kl.seqlen(), "same as k")?;
    expect_eq("v", "nheads", vl.nheads(), kl.nheads(), "same as k")?;
    expect_eq("v", "headdim", vl.headdim(), ql.headdim(), "same as q")?;
    check_output(o.0, o.1, ql.shape)?;
    let d = ql.headdim();
    let opts = params.resolve(d, kl.seqlen())?;
    // batch·nheads·seqlen_q fits (q's element count does), as does the lse index.
    let dims = Dims {
        batch: ql.batch(),
        nheads: ql.nheads(),
        nheads_k: kl.nheads(),
        seqlen_q: ql.seqlen(),
        seqlen_k: kl.seqlen(),
        headdim: d,
    };
    Ok(Problem { dims, softmax_scale: opts.softmax_scale, opts })
}

/// The tensor-core kernels move 16-byte chunks (`cp.async`, 4-byte output
/// pairs): every pointer 16-byte aligned, every stride of an axis longer than
/// 1 a multiple of 8 elements.
pub(crate) fn check_tc_alignment(p: &AttnParams) -> Result<()> {
    let shape = [p.batch, p.seqlen_q, p.nheads];
    let kv_shape = [p.batch, p.seqlen_k, p.nheads];
    let tensors = [
        ("q", p.q_ptr, p.q_stride, shape),
        ("k", p.k_ptr, p.k_stride, kv_shape),
        ("v", p.v_ptr, p.v_stride, kv_shape),
        ("o", p.o_ptr, p.o_stride, shape),
    ];
    for (argument, ptr, strides, shape) in tensors {
        if ptr % 16 != 0 {
            return Err(FlashAttnError::Misaligned { argument, requirement: "a 16-byte aligned device address", value: ptr });
        }
        for (&stride, &n) in strides.iter().zip(shape.iter()) {
            if n > 1 && stride % 8 != 0 {
                return Err(FlashAttnError::Misaligned {
                    argument,
                    requirement: "batch, seqlen and head strides that are multiples of 8 elements",
                    value: stride,
                });
            }
        }
    }
    Ok(())
}

pub(crate) fn check_stats(argument: &'static str, len: usize, required: usize) -> Result<()> {
    if len < required { Err(FlashAttnError::StatsTooShort { argument, len, required }) } else { Ok(()) }
}

impl FlashAttention {
    pub(crate) fn check_stream(&self, argument: &'static str, stream: &CudaStream) -> Result<()> {
        let ctx = stream.context();
        if ctx.cu_ctx() != self.context().cu_ctx() {
            return Err(FlashAttnError::ContextMismatch { argument, found: ctx.ordinal(), expected: self.context().ordinal() });
        }
        Ok(())
    }

    /// Attention forward into freshly allocated outputs (allocated on
    /// `stream`, stream-ordered): O `(batch, seqlen_q, nheads, headdim)`
    /// contiguous and the row statistics of the loop order (FA1: `l`, `m`
    /// initialized to 0 / −inf and updated by Algorithm 1; FA2, Standard:
    /// the logsumexp). Only enqueues work on `stream`.
    ///
    /// Errors: every invalid shape, stride, buffer length or parameter (see
    /// [`FlashAttnError`]). f16/bf16 run on the tensor cores (FA2, FA1; head
    /// dims 32, 64, 96, 128, 256; 16-byte aligned, strides multiple of 8);
    /// anything else 16-bit is a typed [`FlashAttnError::Unsupported`].
    pub fn forward<T, Q, K, V>(
        &self,
        stream: &Arc<CudaStream>,
        q: Tensor<'_, Q>,
        k: Tensor<'_, K>,
        v: Tensor<'_, V>,
        params: &ForwardParams,
    ) -> Result<ForwardOutput<T>>
    where
        T: AttnElem,
        Q: DevicePtr<T>,
        K: DevicePtr<T>,
        V: DevicePtr<T>,
    {
        self.forward_ext(stream, q, k, v, params, &Extras::default())
    }

    /// Attention forward into caller-owned buffers: `o` (any non-overlapping
    /// strides) and the row statistics of the loop order. Only enqueues work
    /// on `stream` (FA1: an init kernel, then the main kernel; Standard: a
    /// stream-ordered scratch allocation and three kernels; on a device
    /// without memory pools cudarc frees that scratch synchronously).
    #[allow(clippy::too_many_arguments)]
    pub fn forward_into<T, Q, K, V, O>(
        &self,
        stream: &Arc<CudaStream>,
        q: Tensor<'_, Q>,
        k: Tensor<'_, K>,
        v: Tensor<'_, V>,
        o: TensorMut<'_, O>,
        stats: StatsMut<'_>,
        params: &ForwardParams,
    ) -> Result<()>
    where
        T: AttnElem,
        Q: DevicePtr<T>,
        K: DevicePtr<T>,
        V: DevicePtr<T>,
        O: DevicePtrMut<T>,
    {
        self.forward_into_ext(stream, q, k, v, o, stats, params, &Extras::default())
    }

    /// [`FlashAttention::forward`] with the device-side extras (ALiBi slopes).
    pub fn forward_ext<T, Q, K, V>(
        &self,
        stream: &Arc<CudaStream>,
        q: Tensor<'_, Q>,
        k: Tensor<'_, K>,
        v: Tensor<'_, V>,
        params: &ForwardParams,
        ext: &Extras<'_>,
    ) -> Result<ForwardOutput<T>>
    where
        T: AttnElem,
        Q: DevicePtr<T>,
        K: DevicePtr<T>,
        V: DevicePtr<T>,
    {
        let o_layout = TensorLayout::contiguous(q.layout.shape);
        let o_len = o_layout.required_len().unwrap_or(usize::MAX);
        let problem = validate(
            (&q.layout, q.data.len()),
            (&k.layout, k.data.len()),
            (&v.layout, v.data.len()),
            (&o_layout, o_len),
            params,
        )?;
        self.check_stream("stream", stream)?;
        self.plan::<T>(&problem, params, ext.alibi_slopes.is_some(), false)?;
        let mut o = stream.alloc_zeros::<T>(o_len)?;
        let n = problem.stats_len();
        let stats = if params.loop_order == LoopOrder::Fa1 {
            let (mut l, mut m) = (stream.alloc_zeros::<f32>(n)?, stream.alloc_zeros::<f32>(n)?);
            let stats = StatsMut::Fa1 { l: l.as_view_mut(), m: m.as_view_mut() };
            self.forward_into_ext(stream, q, k, v, TensorMut::new(&mut o, o_layout), stats, params, ext)?;
            RowStats::Fa1 { l, m }
        } else {
            let mut lse = stream.alloc_zeros::<f32>(n)?;
            let stats = StatsMut::LogSumExp(lse.as_view_mut());
            self.forward_into_ext(stream, q, k, v, TensorMut::new(&mut o, o_layout), stats, params, ext)?;
            RowStats::LogSumExp(lse)
        };
        Ok(ForwardOutput { o, o_layout, stats })
    }

    /// [`FlashAttention::forward_into`] with the device-side extras (ALiBi slopes).
    #[allow(clippy::too_many_arguments)]
    pub fn forward_into_ext<T, Q, K, V, O>(
        &self,
        stream: &Arc<CudaStream>,
        q: Tensor<'_, Q>,
        k: Tensor<'_, K>,
        v: Tensor<'_, V>,
        o: TensorMut<'_, O>,
        stats: StatsMut<'_>,
        params: &ForwardParams,
        ext: &Extras<'_>,
    ) -> Result<()>
    where
        T: AttnElem,
        Q: DevicePtr<T>,
        K: DevicePtr<T>,
        V: DevicePtr<T>,
        O: DevicePtrMut<T>,
    {
        let problem = validate(
            (&q.layout, q.data.len()),
            (&k.layout, k.data.len()),
            (&v.layout, v.data.len()),
            (&o.layout, o.data.len()),
            params,
        )?;
        self.launch_problem(stream, &problem, q, k, v, o, stats, params, ext, None)
    }

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
        stats: StatsMut<'_>,
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
            (StatsMut::LogSumExp(lse), LoopOrder::Fa2 | LoopOrder::Standard) => {
                check_stats("lse", lse.len(), n)?;
                self.check_stream("lse", lse.stream())?;
            }
            (StatsMut::Fa1 { l, m }, LoopOrder::Fa1) => {
                check_stats("l", l.len(), n)?;
                check_stats("m", m.len(), n)?;
                self.check_stream("l", l.stream())?;
                self.check_stream("m", m.stream())?;
            }
            (given, loop_order) => {
                let expected = if loop_order == LoopOrder::Fa1 { "StatsMut::Fa1 { l, m }" } else { "StatsMut::LogSumExp" };
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
            (Plan::Fa2 { main, br, bc }, StatsMut::LogSumExp(mut lse)) => {
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
            (Plan::Fa1 { init, main, br, bc }, StatsMut::Fa1 { mut l, mut m }) => {
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
            (Plan::Standard { scores, softmax, pv, scratch_len }, StatsMut::LogSumExp(mut lse)) => {
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
            (Plan::TcFa2 { kernel, main }, StatsMut::LogSumExp(mut lse)) => {
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
            (Plan::Hopper { kernel, main }, StatsMut::LogSumExp(mut lse)) => {
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
            (Plan::TcFa1 { kernel, init, main, accum_len }, StatsMut::Fa1 { mut l, mut m }) => {
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
                let expected = if matches!(plan, Plan::Fa1 { .. } | Plan::TcFa1 { .. }) {
                    "StatsMut::Fa1 { l, m }"
                } else {
                    "StatsMut::LogSumExp"
                };
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

impl StatsMut<'_> {
    fn name(&self) -> &'static str {
        match self {
            StatsMut::LogSumExp(_) => "StatsMut::LogSumExp",
            StatsMut::Fa1 { .. } => "StatsMut::Fa1 { l, m }",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(shape: [usize; 4]) -> (TensorLayout, usize) {
        let l = TensorLayout::contiguous(shape);
        (l, l.required_len().unwrap())
    }

    fn run(q: [usize; 4], k: [usize; 4], v: [usize; 4], o: [usize; 4]) -> Result<Problem> {
        let (q, k, v, o) = (c(q), c(k), c(v), c(o));
        validate((&q.0, q.1), (&k.0, k.1), (&v.0, v.1), (&o.0, o.1), &ForwardParams::default())
    }

    #[test]
    fn accepts_cross_attention() {
        let p = run([2, 5, 3, 8], [2, 7, 3, 8], [2, 7, 3, 8], [2, 5, 3, 8]).unwrap();
        assert_eq!(p.dims, Dims { batch: 2, nheads: 3, nheads_k: 3, seqlen_q: 5, seqlen_k: 7, headdim: 8 });
        assert_eq!(p.softmax_scale, 1.0 / 8f32.sqrt());
    }

    #[test]
    fn names_the_argument_and_value() {
        let e = run([2, 5, 3, 8], [2, 7, 4, 8], [2, 7, 4, 8], [2, 5, 3, 8]).unwrap_err();
        assert!(matches!(&e, FlashAttnError::InvalidArgument { argument: "nheads_k", value, .. } if value.contains("nheads_k = 4")), "{e}");
        // GQA: 6 query heads over 2 KV heads is fine; v must have k's heads.
        run([2, 5, 6, 8], [2, 7, 2, 8], [2, 7, 2, 8], [2, 5, 6, 8]).unwrap();
        let e = run([2, 5, 6, 8], [2, 7, 2, 8], [2, 7, 3, 8], [2, 5, 6, 8]).unwrap_err();
        assert!(matches!(e, FlashAttnError::ShapeMismatch { argument: "v", axis: "nheads", actual: 3, expected: 2, .. }), "{e}");
        let e = run([2, 5, 3, 8], [2, 7, 3, 8], [2, 6, 3, 8], [2, 5, 3, 8]).unwrap_err();
        assert!(matches!(e, FlashAttnError::ShapeMismatch { argument: "v", axis: "seqlen", actual: 6, expected: 7, .. }));
        let e = run([2, 5, 3, 257], [2, 7, 3, 257], [2, 7, 3, 257], [2, 5, 3, 257]).unwrap_err();
        assert!(matches!(e, FlashAttnError::HeadDimOutOfRange { argument: "q", headdim: 257 }));
        let e = run([2, 0, 3, 8], [2, 7, 3, 8], [2, 7, 3, 8], [2, 0, 3, 8]).unwrap_err();
        assert!(matches!(e, FlashAttnError::ZeroSizedDim { argument: "q", axis: "seqlen", .. }));
        let e = run([2, 5, 3, 8], [2, 7, 3, 8], [2, 7, 3, 8], [2, 5, 3, 4]).unwrap_err();
        assert!(matches!(e, FlashAttnError::ShapeMismatch { argument: "o", axis: "headdim", actual: 4, expected: 8, .. }));
        assert!(e.to_string().contains("`o`"));
    }

    #[test]
    fn short_buffers_and_overflowing_strides() {
        let (l, n) = c([2, 5, 3, 8]);
        let p = ForwardParams::default();
        let e = validate((&l, n - 1), (&l, n), (&l, n), (&l, n), &p).unwrap_err();
        assert!(matches!(e, FlashAttnError::BufferTooShort { argument: "q", required: 240, len: 239, .. }));
        let big = TensorLayout::new([2, 5, 3, 8], [usize::MAX - 10, 24, 8]);
        let e = validate((&l, n), (&big, n), (&l, n), (&l, n), &p).unwrap_err();
        assert!(matches!(e, FlashAttnError::StrideOverflow { argument: "k", .. }));
        let huge = TensorLayout::contiguous([1, usize::MAX / 4, 4, 256]);
        let e = validate((&huge, usize::MAX), (&l, n), (&l, n), (&l, n), &p).unwrap_err();
        assert!(matches!(e, FlashAttnError::DimTooLarge { argument: "q", axis: "seqlen", .. }));
    }

    #[test]
    fn strided_inputs_and_overlapping_outputs() {
        // q as a slice of a packed qkv tensor: seqlen stride 3·h·d.
        let q = TensorLayout::new([2, 5, 3, 8], [5 * 72, 72, 8]);
        let n = q.required_len().unwrap();
        let (o, on) = c([2, 5, 3, 8]);
        let p = ForwardParams::default();
        validate((&q, n), (&q, n), (&q, n), (&o, on), &p).unwrap();
        // o with a zero seqlen stride: every row would be written by many blocks.
        let bad = TensorLayout::new([2, 5, 3, 8], [120, 0, 8]);
        let e = validate((&q, n), (&q, n), (&q, n), (&bad, on), &p).unwrap_err();
        assert!(matches!(e, FlashAttnError::OverlappingOutput { argument: "o", .. }));
        // heads interleaved with overlapping rows
        let bad = TensorLayout::new([2, 5, 3, 8], [120, 24, 4]);
        assert!(bad.may_overlap());
        // transposed but valid: (batch, nheads, seqlen, headdim) memory order
        let ok = TensorLayout::new([2, 5, 3, 8], [120, 8, 40]);
        assert!(!ok.may_overlap());
    }

    #[test]
    fn softmax_scale_must_be_finite() {
        let (l, n) = c([1, 1, 1, 1]);
        for bad in [f32::NAN, f32::INFINITY] {
            let p = ForwardParams { softmax_scale: Some(bad), ..Default::default() };
            let e = validate((&l, n), (&l, n), (&l, n), (&l, n), &p).unwrap_err();
            assert!(matches!(e, FlashAttnError::InvalidSoftmaxScale { .. }));
        }
    }
}
