//! Validation shared by the CPU and CUDA paths: candle layouts to our
//! [`TensorLayout`]s, candle-flash-attn's options to our [`ForwardParams`],
//! index tensors (prefix sums, cache lengths, block tables) and the
//! storage-sharing rule of the calls that write a KV cache in place.
//!
//! Every error is a candle error whose message names the argument, as
//! candle-flash-attn's do; nothing here panics.

use candle_core::{DType, Layout, Result};
use candle_core::Tensor;
use flash_attn::{AlibiShape, ForwardParams, TensorLayout};

/// Prefix of every message of this crate.
pub(crate) const NAME: &str = "flash-attn";

pub(crate) fn err(msg: impl std::fmt::Display) -> candle_core::Error {
    candle_core::Error::Msg(format!("{NAME}: {msg}")).bt()
}

/// A core-library error (already naming its argument) as a candle error.
pub(crate) fn core_err(e: flash_attn::FlashAttnError) -> candle_core::Error {
    err(e)
}

/// A `(batch, seqlen, nheads, headdim)` candle layout as our layout: rank 4,
/// last stride 1. The offset stays with the caller (it slices the buffer).
pub(crate) fn layout4(argument: &str, l: &Layout) -> Result<TensorLayout> {
    layout4_of(argument, l, "(batch, seqlen, nheads, headdim)")
}

/// [`layout4`] with the axes named as the call names them (e.g. a paged
/// cache's `(num_blocks, page_block_size, nheads_k, headdim)`).
pub(crate) fn layout4_of(argument: &str, l: &Layout, axes: &str) -> Result<TensorLayout> {
    let dims = l.shape().dims();
    let &[b, s, h, d] = dims else {
        return Err(err(format_args!("`{argument}` must have rank 4 {axes}, got rank {} (shape {dims:?})", dims.len())));
    };
    let st = l.stride();
    if st[3] != 1 {
        return Err(err(format_args!(
            "`{argument}`: the last (headdim) dimension must be contiguous (stride 1), got strides {st:?} for shape {dims:?}"
        )));
    }
    Ok(TensorLayout::new([b, s, h, d], [st[0], st[1], st[2]]))
}

/// The dtypes of q, k and v: one of f32, f16, bf16 (f64 too on the CPU), all equal.
pub(crate) fn check_dtypes(q: DType, k: DType, v: DType, allowed: &[DType], backend: &str) -> Result<()> {
    for (argument, dt) in [("k", k), ("v", v)] {
        if dt != q {
            return Err(err(format_args!(
                "dtype mismatch: `{argument}` is {dt:?} but `q` is {q:?} (q, k and v must share one dtype)"
            )));
        }
    }
    if !allowed.contains(&q) {
        return Err(err(format_args!("`q`: dtype {q:?} is not supported on the {backend} (supported: {allowed:?})")));
    }
    Ok(())
}

/// A validated call: the layouts of q, k and v and the parameters.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Checked {
    pub q: TensorLayout,
    pub k: TensorLayout,
    pub v: TensorLayout,
    pub params: ForwardParams,
}

impl Checked {
    /// `(batch, seqlen_q, nheads, headdim)`, the output's shape.
    pub fn out_shape(&self) -> (usize, usize, usize, usize) {
        let [b, s, h, d] = self.q.shape;
        (b, s, h, d)
    }

    /// `(batch, nheads, seqlen_q)`, the logsumexp's shape.
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    pub fn lse_shape(&self) -> (usize, usize, usize) {
        let [b, s, h, _] = self.q.shape;
        (b, h, s)
    }
}

/// The options of one [`crate::FlashAttn`] call, as candle-flash-attn has them.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Options {
    pub softmax_scale: f32,
    pub window_size_left: Option<usize>,
    pub window_size_right: Option<usize>,
    pub softcap: Option<f32>,
}

/// Layouts and options of q, k, v, checked in candle-flash-attn's order
/// (rank, last stride, shapes, head counts), then the options mapped to ours.
pub(crate) fn check(q_l: &Layout, k_l: &Layout, v_l: &Layout, o: &Options) -> Result<Checked> {
    let q = layout4("q", q_l)?;
    let k = layout4("k", k_l)?;
    let v = layout4("v", v_l)?;
    let [b, _, h, d] = q.shape;
    let [bk, sk, hk, dk] = k.shape;
    if (bk, dk) != (b, d) {
        return Err(err(format_args!(
            "shape mismatch: `k` is {:?} but `q` is {:?}: batch and headdim must match (layout (batch, seqlen, nheads, headdim))",
            k.shape, q.shape
        )));
    }
    if v.shape != k.shape {
        return Err(err(format_args!("shape mismatch: `v` is {:?} but `k` is {:?}: they must be equal", v.shape, k.shape)));
    }
    if hk == 0 || h % hk != 0 {
        return Err(err(format_args!("`k`: number of k/v heads {hk} must divide the number of heads in `q` {h}")));
    }
    let params = forward_params(o, d, sk)?;
    Ok(Checked { q, k, v, params })
}

/// candle-flash-attn's options as our [`ForwardParams`], with FA2's rules
/// (a window side `≥ seqlen_k` is unbounded; `(None, Some(0))` is causal;
/// softcap 0 is off), validated by the core's `resolve`.
pub(crate) fn forward_params(o: &Options, headdim: usize, seqlen_k: usize) -> Result<ForwardParams> {
    let mut p = ForwardParams {
        softmax_scale: Some(o.softmax_scale),
        window_left: o.window_size_left,
        window_right: o.window_size_right,
        softcap: o.softcap.filter(|&c| c != 0.0),
        ..Default::default()
    };
    let r = p.resolve(headdim, seqlen_k).map_err(core_err)?;
    if r.window_left < 0 && r.window_right == 0 {
        // Plain causal (bottom-right aligned): the causal kernels.
        (p.causal, p.window_left, p.window_right) = (true, None, None);
    } else if r.window_left < 0 && r.window_right < 0 {
        (p.window_left, p.window_right) = (None, None);
    }
    Ok(p)
}

/// ALiBi slopes: f32, `(nheads)` or `(batch, nheads)`, contiguous; the
/// shape as the core names it and the layout's start offset.
pub(crate) fn alibi_shape(slopes: &Tensor, batch: usize, nheads: usize) -> Result<(AlibiShape, usize)> {
    if slopes.dtype() != DType::F32 {
        return Err(err(format_args!("dtype mismatch: `alibi_slopes` is {:?}, expected F32", slopes.dtype())));
    }
    let shape = match slopes.dims() {
        &[h] if h == nheads => AlibiShape::PerHead,
        &[b, h] if (b, h) == (batch, nheads) => AlibiShape::PerBatchHead,
        dims => {
            return Err(err(format_args!(
                "shape mismatch: `alibi_slopes` is {dims:?}, expected ({nheads}) or ({batch}, {nheads}) (nheads of q)"
            )));
        }
    };
    if !slopes.is_contiguous() {
        return Err(err(format_args!("`alibi_slopes` must be contiguous, got strides {:?}", slopes.stride())));
    }
    Ok((shape, slopes.layout().start_offset()))
}

/// An index tensor (prefix sums, cache lengths, block table, batch
/// indices): U32 or I32 (the kernels read i32; u32 values below 2³¹ are the
/// same bits), contiguous, of rank `dims.len()`; returns its dims. `dims`
/// names the axes for the message, e.g. `["batch + 1"]`.
pub(crate) fn index_tensor<'t>(argument: &str, t: &'t Tensor, axes: &str, rank: usize) -> Result<&'t [usize]> {
    if !matches!(t.dtype(), DType::U32 | DType::I32) {
        return Err(err(format_args!("dtype mismatch: `{argument}` is {:?}, expected U32 or I32", t.dtype())));
    }
    if t.rank() != rank {
        return Err(err(format_args!("`{argument}` must have rank {rank} {axes}, got shape {:?}", t.dims())));
    }
    if !t.is_contiguous() {
        return Err(err(format_args!("`{argument}` must be contiguous, got strides {:?}", t.stride())));
    }
    Ok(t.dims())
}

/// The address of a tensor's storage (equal for tensors sharing one
/// allocation: views, narrows, reshapes of one tensor).
fn storage_addr(t: &Tensor) -> usize {
    let (s, _) = t.storage_and_layout();
    std::ptr::from_ref(&*s).addr()
}

/// The calls that write a cache in place hold its storage for writing
/// while they read the others: a tensor sharing storage with a written
/// one (e.g. `k_cache` and `v_cache` as views of one KV tensor) is an
/// error naming both, never a deadlock or a read of half-written data.
pub(crate) fn check_no_sharing(written: &[(&str, &Tensor)], read: &[(&str, Option<&Tensor>)]) -> Result<()> {
    for (i, &(w, wt)) in written.iter().enumerate() {
        let wa = storage_addr(wt);
        let others = written[i + 1..].iter().map(|&(n, t)| (n, Some(t))).chain(read.iter().copied());
        for (name, t) in others {
            if let Some(t) = t
                && storage_addr(t) == wa
            {
                return Err(err(format_args!(
                    "`{name}` shares storage with `{w}`, which this call writes in place: pass separate tensors \
                     (e.g. `.copy()` of one of them)"
                )));
            }
        }
    }
    Ok(())
}

/// Elements of a buffer from a layout's start offset on.
pub(crate) fn len_from(buffer_len: usize, l: &Layout) -> usize {
    buffer_len.saturating_sub(l.start_offset())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(wl: Option<usize>, wr: Option<usize>) -> Options {
        Options { softmax_scale: 0.125, window_size_left: wl, window_size_right: wr, softcap: None }
    }

    #[test]
    fn windows_map_to_causal_or_none_as_fa2_does() {
        let p = forward_params(&opts(None, Some(0)), 64, 100).unwrap();
        assert!(p.causal && p.window_left.is_none() && p.window_right.is_none());
        // A left side ≥ seqlen_k is unbounded: still causal.
        assert!(forward_params(&opts(Some(100), Some(0)), 64, 100).unwrap().causal);
        let p = forward_params(&opts(None, None), 64, 100).unwrap();
        assert!(!p.causal);
        assert!(!forward_params(&opts(Some(500), Some(100)), 64, 100).unwrap().causal);
        let p = forward_params(&opts(Some(10), Some(0)), 64, 100).unwrap();
        assert_eq!((p.causal, p.window_left, p.window_right), (false, Some(10), Some(0)));
    }

    #[test]
    fn rank_and_stride_errors_name_the_argument() {
        let l3 = Layout::contiguous((2, 3, 4));
        let e = layout4("k", &l3).unwrap_err().to_string();
        assert!(e.contains("`k` must have rank 4"), "{e}");
        let t = Layout::contiguous((1, 2, 3, 4)).transpose(2, 3).unwrap();
        let e = layout4("v", &t).unwrap_err().to_string();
        assert!(e.contains("`v`: the last (headdim) dimension must be contiguous"), "{e}");
    }
}
