//! Validation: shapes, strides, buffer lengths and options of a call
//! become a checked [`Problem`] (typed errors name the argument and the
//! value). Pure: no GPU needed, so every error path is unit-tested.
//!
//! * this module: the dense checks ([`validate`]) and the tensor-core
//!   alignment rule;
//! * [`options`]: `ForwardParams::resolve` (window, softcap, scale);
//! * [`varlen`]: the device varlen description (prefix-sum lengths, maxima).
//!
//! The rules on host values shared with the CPU reference (prefix sums,
//! GQA head counts, ALiBi lengths) are in `crate::varlen`.

pub(crate) mod options;
pub(crate) mod varlen;

use flash_attn_common::AttnParams;

use crate::error::{FlashAttnError, Result};
use crate::params::{ForwardParams, Resolved};
use crate::tensor::TensorLayout;
use crate::types::Dims;
use crate::varlen::check_gqa;

pub use varlen::validate_varlen;

/// A validated problem: sizes and the effective options.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Problem {
    /// For varlen: `batch` = sequences, `seqlen_q/k` = the maxima.
    pub dims: Dims,
    /// The effective `softmax_scale` (natural units).
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

/// The axes of a `(batch, seqlen, nheads, headdim)` tensor.
pub(crate) const AXES: [&str; 4] = ["batch", "seqlen", "nheads", "headdim"];
/// The axes of a paged cache's pool (`k_pages`, `v_pages`).
pub(crate) const PAGE_AXES: [&str; 4] = ["num_blocks", "page_size", "nheads_k", "headdim"];

/// The names of `argument`'s axes, for messages.
fn axes_of(argument: &str) -> [&'static str; 4] {
    if argument.ends_with("_pages") { PAGE_AXES } else { AXES }
}

/// Largest batch, nheads and seqlen the kernels index (u32 fields of `AttnParams`).
pub const MAX_DIM: usize = i32::MAX as usize;
/// Largest supported head dim.
pub const MAX_HEADDIM: usize = 256;

/// One tensor argument: no zero-sized axis, head dim and sizes within the
/// kernels' range, its buffer long enough for shape and strides.
pub(crate) fn check_layout(argument: &'static str, l: &TensorLayout, buffer_len: usize) -> Result<()> {
    check_layout_axes(argument, axes_of(argument), l, buffer_len)
}

/// [`check_layout`] with the axes named `axes` in its messages.
pub(crate) fn check_layout_axes(argument: &'static str, axes: [&'static str; 4], l: &TensorLayout, buffer_len: usize) -> Result<()> {
    for (a, &n) in l.shape.iter().enumerate() {
        if n == 0 {
            return Err(FlashAttnError::ZeroSizedDim { argument, axis: axes[a], shape: l.shape });
        }
    }
    if l.headdim() > MAX_HEADDIM {
        return Err(FlashAttnError::HeadDimOutOfRange { argument, headdim: l.headdim() });
    }
    for (&value, axis) in l.shape[..3].iter().zip(axes) {
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
    fn messages_say_each_thing_once() {
        // A value that names its argument is printed alone, not after "`nheads_k` =".
        let e = run([2, 5, 3, 8], [2, 7, 4, 8], [2, 7, 4, 8], [2, 5, 3, 8]).unwrap_err();
        let m = e.to_string();
        assert!(m.starts_with("nheads_k = 4, nheads = 3: "), "{m}");
        assert_eq!(m.matches("nheads_k").count(), 2, "{m}"); // the value and the rule's formula
        // Otherwise the argument is named once, then its value.
        let e = FlashAttnError::InvalidArgument { argument: "num_splits", value: "0".into(), reason: "must be in 1..=128" };
        assert_eq!(e.to_string(), "`num_splits` = 0: must be in 1..=128");
        // A value that is a phrase of its own follows a colon: no chain of "=".
        let e = FlashAttnError::InvalidArgument { argument: "k_cache", value: "batch_c = 1, batch = 2".into(), reason: "needs a cache row per sequence" };
        assert_eq!(e.to_string(), "`k_cache`: batch_c = 1, batch = 2: needs a cache row per sequence");
        let e = FlashAttnError::InvalidArgument { argument: "window_left", value: "Some(8)".into(), reason: "r" };
        assert_eq!(e.to_string(), "`window_left` = Some(8): r");
        // A misaligned address in hex, a misaligned stride in decimal.
        let p = AttnParams { q_ptr: 0x7f00_0000_0102, k_ptr: 0x10, v_ptr: 0x10, o_ptr: 0x10, batch: 1, seqlen_q: 1, seqlen_k: 1, nheads: 1, ..Default::default() };
        let m = check_tc_alignment(&p).unwrap_err().to_string();
        assert!(m.ends_with("(got 0x7f0000000102)"), "{m}");
        let p = AttnParams { q_ptr: 0x10, q_stride: [64, 12, 8], batch: 1, seqlen_q: 2, seqlen_k: 1, nheads: 1, k_ptr: 0x10, v_ptr: 0x10, o_ptr: 0x10, ..Default::default() };
        let m = check_tc_alignment(&p).unwrap_err().to_string();
        assert!(m.ends_with("(got 12)"), "{m}");
        // A paged pool's axes by their own names.
        let e = check_layout("k_pages", &TensorLayout::contiguous([4, 0, 2, 8]), 0).unwrap_err();
        assert!(matches!(e, FlashAttnError::ZeroSizedDim { argument: "k_pages", axis: "page_size", .. }), "{e}");
        assert_eq!(e.to_string(), "`k_pages`: the page_size axis is zero-sized (shape [4, 0, 2, 8])");
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

