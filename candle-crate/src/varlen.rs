//! candle-flash-attn's variable-length functions: sequences packed along
//! the first axis, `q` `(total_q, num_heads_q, head_size)`, `k`, `v`
//! `(total_kv, num_heads_kv, head_size)`, and cumulative lengths
//! `seqlens_q`, `seqlens_k` (u32, `batch + 1` entries, starting at 0).
//!
//! They run on the core's varlen API: `forward_varlen` on the GPU (the u32
//! prefix sums read in place as i32, on candle's stream), the reference's
//! `attention_varlen` on the CPU (prefix sums copied to the host there).
//! GQA, window, softcap and ALiBi (slopes `(nheads)` or `(batch, nheads)`)
//! as in the fixed-length functions. [`flash_attn_varlen_paged_windowed`]
//! reads k and v from a paged cache: the core's `forward_varlen_paged`
//! (split-KV included) on the GPU, `reference::attention_varlen_paged` on
//! the CPU.

use std::sync::Mutex;

use candle_core::{CpuStorage, CustomOp3, DType, Layout, Result, Shape, Storage, Tensor};
use flash_attn::TensorLayout;

use crate::check::{self, Checked, err};
use crate::cpu;

/// The paged form of a varlen call: k and v are pages `(num_blocks,
/// page_block_size, nheads_k, headdim)`, `block_table` `(batch, max_blocks)`.
struct Paged {
    block_table: Tensor,
    page_block_size: usize,
}

pub(crate) struct FlashAttnVarLen {
    opts: check::Options,
    max_seqlen_q: usize,
    max_seqlen_k: usize,
    seqlens_q: Tensor,
    seqlens_k: Tensor,
    alibi_slopes: Option<Tensor>,
    paged: Option<Paged>,
    /// The forward's logsumexp `(nheads, total_q)`, for the backward pass.
    lse: Mutex<Option<Tensor>>,
}

/// A checked varlen call's index tensors, as both backends take them: the
/// prefix sums, the batch they give, the maxima and, paged, the block table
/// and its `max_blocks` (then k and v are pages).
pub(crate) struct VarlenIdx<'a> {
    pub seqlens_q: &'a Tensor,
    pub seqlens_k: &'a Tensor,
    pub batch: usize,
    pub max_seqlen: (usize, usize),
    pub block_table: Option<(&'a Tensor, usize)>,
}

/// A packed `(total, nheads, headdim)` layout, head dim contiguous, as the
/// core's 4-axis layout with batch 1.
fn layout3(argument: &str, l: &Layout) -> Result<TensorLayout> {
    let dims = l.shape().dims();
    let &[t, h, d] = dims else {
        return Err(err(format_args!(
            "`{argument}` must have rank 3 (total_tokens, nheads, headdim) for varlen, got rank {} (shape {dims:?})",
            dims.len()
        )));
    };
    let st = l.stride();
    if st[2] != 1 {
        return Err(err(format_args!(
            "`{argument}`: the last (headdim) dimension must be contiguous (stride 1), got strides {st:?}"
        )));
    }
    Ok(TensorLayout::new([1, t, h, d], [0, st[0], st[1]]))
}

/// Cumulative lengths: U32 (or I32), rank 1, `batch + 1 ≥ 2` entries; the batch.
fn check_seqlens(argument: &str, t: &Tensor) -> Result<usize> {
    match check::index_tensor(argument, t, "(batch + 1): cumulative lengths", 1)? {
        &[n] if n >= 2 => Ok(n - 1),
        dims => Err(err(format_args!(
            "`{argument}` must be the cumulative lengths, rank 1 with batch + 1 ≥ 2 entries, got shape {dims:?}"
        ))),
    }
}

impl FlashAttnVarLen {
    /// A packed (not paged) call without ALiBi: what the FP8 varlen call
    /// checks its layouts and prefix sums with.
    pub(crate) fn packed(opts: check::Options, seqlens_q: &Tensor, seqlens_k: &Tensor, max_seqlen: (usize, usize)) -> Self {
        FlashAttnVarLen {
            paged: None,
            opts,
            max_seqlen_q: max_seqlen.0,
            max_seqlen_k: max_seqlen.1,
            seqlens_q: seqlens_q.clone(),
            seqlens_k: seqlens_k.clone(),
            alibi_slopes: None,
            lse: Mutex::new(None),
        }
    }

    /// The layouts (k and v packed, or pages) and the index tensors.
    pub(crate) fn check(&self, q_l: &Layout, k_l: &Layout, v_l: &Layout) -> Result<(Checked, VarlenIdx<'_>)> {
        let q = layout3("q", q_l)?;
        let (k, v) = match &self.paged {
            None => (layout3("k", k_l)?, layout3("v", v_l)?),
            Some(_) => {
                let axes = "(num_blocks, page_block_size, nheads_k, headdim) for a paged cache";
                (check::layout4_of("k", k_l, axes)?, check::layout4_of("v", v_l, axes)?)
            }
        };
        let (h, d) = (q.nheads(), q.headdim());
        if v.shape != k.shape {
            let axes = if self.paged.is_some() { 0 } else { 1 };
            return Err(err(format_args!(
                "shape mismatch: `v` is {:?} but `k` is {:?}: they must be equal",
                &v.shape[axes..],
                &k.shape[axes..]
            )));
        }
        if k.headdim() != d {
            return Err(err(format_args!("shape mismatch: `k` has headdim {} but `q` has {d}", k.headdim())));
        }
        let bq = check_seqlens("seqlens_q", &self.seqlens_q)?;
        let bk = check_seqlens("seqlens_k", &self.seqlens_k)?;
        if bq != bk {
            return Err(err(format_args!("`seqlens_k` holds {bk} sequences but `seqlens_q` {bq}")));
        }
        if k.nheads() == 0 || h % k.nheads() != 0 {
            return Err(err(format_args!("`k`: number of k/v heads {} must divide the number of heads in `q` {h}", k.nheads())));
        }
        let params = check::forward_params(&self.opts, d, self.max_seqlen_k)?;
        let block_table = match &self.paged {
            None => None,
            Some(p) => Some((&p.block_table, check_pages(p, &k, bq)?)),
        };
        let idx = VarlenIdx {
            seqlens_q: &self.seqlens_q,
            seqlens_k: &self.seqlens_k,
            batch: bq,
            max_seqlen: (self.max_seqlen_q, self.max_seqlen_k),
            block_table,
        };
        Ok((Checked { q, k, v, params }, idx))
    }

    fn out_shape(c: &Checked) -> Shape {
        let [_, t, h, d] = c.q.shape;
        (t, h, d).into()
    }

    /// Keeps the forward's logsumexp `(nheads, total_q)` for [`Self::bwd`].
    fn keep(&self, c: &Checked, lse: Storage) {
        let [_, t, h, _] = c.q.shape;
        *self.lse.lock().unwrap_or_else(|e| e.into_inner()) = Some(crate::backward::tensor(lse, (h, t)));
    }
}

/// A paged call's `page_block_size` (the pages' axis 1) and block table
/// (`(batch, max_blocks ≥ 1)`); returns `max_blocks`.
fn check_pages(p: &Paged, pages: &TensorLayout, batch: usize) -> Result<usize> {
    let page = pages.shape[1];
    if p.page_block_size != page || page == 0 {
        return Err(err(format_args!(
            "`page_block_size` is {} but the pages `k` are {:?} (num_blocks, page_block_size, nheads_k, headdim): \
             it must equal their axis 1, ≥ 1",
            p.page_block_size, pages.shape
        )));
    }
    match check::index_tensor("block_table", &p.block_table, "(batch, max_blocks_per_seq)", 2)? {
        &[b, m] if b == batch && m >= 1 => Ok(m),
        dims => Err(err(format_args!(
            "shape mismatch: `block_table` is {dims:?}, expected ({batch}, max_blocks_per_seq ≥ 1) (batch from `seqlens_q`)"
        ))),
    }
}

impl CustomOp3 for FlashAttnVarLen {
    fn name(&self) -> &'static str {
        "flash-attn-varlen"
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
        cpu::check_dtypes(q, k, v)?;
        let (c, idx) = self.check(q_l, k_l, v_l)?;
        let (o, lse) = cpu::forward_varlen(&c, &idx, self.alibi_slopes.as_ref(), q, q_l, k, k_l, v, v_l)?;
        self.keep(&c, Storage::Cpu(lse));
        Ok((o, Self::out_shape(&c)))
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
        crate::cuda::check_dtypes(q, k, v)?;
        let (c, idx) = self.check(q_l, k_l, v_l)?;
        let (o, lse) = crate::cuda::forward_varlen(&c, &idx, self.alibi_slopes.as_ref(), q, q_l, k, k_l, v, v_l)?;
        self.keep(&c, Storage::Cuda(lse));
        Ok((o, Self::out_shape(&c)))
    }

    /// dq, dk, dv through the core's varlen backward (`crate::backward`);
    /// not for paged k/v (their gradient would scatter into pages).
    fn bwd(&self, q: &Tensor, k: &Tensor, v: &Tensor, out: &Tensor, dout: &Tensor) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        if self.paged.is_some() {
            return Err(err("the backward pass of a paged varlen call is not supported (use packed k and v to train)"));
        }
        let lse = self.lse.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let lse = lse.ok_or_else(|| err("flash-attn-varlen: no logsumexp recorded by the forward pass"))?;
        let (c, idx) = self.check(q.layout(), k.layout(), v.layout())?;
        crate::backward::grads(&c, Some(&idx), self.alibi_slopes.as_ref(), [q, k, v, out, dout, &lse])
    }
}

#[allow(clippy::too_many_arguments)]
fn apply_varlen(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    seqlens_q: &Tensor,
    seqlens_k: &Tensor,
    max_seqlen: (usize, usize),
    softmax_scale: f32,
    window: (Option<usize>, Option<usize>),
    alibi_slopes: Option<&Tensor>,
    softcap: Option<f32>,
) -> Result<Tensor> {
    crate::check_devices(&[("q", q), ("k", k), ("v", v), ("seqlens_q", seqlens_q), ("seqlens_k", seqlens_k)])?;
    let op = FlashAttnVarLen {
        paged: None,
        opts: check::Options { softmax_scale, window_size_left: window.0, window_size_right: window.1, softcap },
        max_seqlen_q: max_seqlen.0,
        max_seqlen_k: max_seqlen.1,
        seqlens_q: seqlens_q.clone(),
        seqlens_k: seqlens_k.clone(),
        alibi_slopes: alibi_slopes.cloned(),
        lse: Mutex::new(None),
    };
    q.apply_op3(k, v, op)
}

/// Variable-length [`crate::flash_attn`] (see the module docs).
#[allow(clippy::too_many_arguments)]
pub fn flash_attn_varlen(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    seqlens_q: &Tensor,
    seqlens_k: &Tensor,
    max_seqlen_q: usize,
    max_seqlen_k: usize,
    softmax_scale: f32,
    causal: bool,
) -> Result<Tensor> {
    apply_varlen(q, k, v, seqlens_q, seqlens_k, (max_seqlen_q, max_seqlen_k), softmax_scale, crate::causal_window(causal), None, None)
}

/// Variable-length [`crate::flash_attn_windowed`].
#[allow(clippy::too_many_arguments)]
pub fn flash_attn_varlen_windowed(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    seqlens_q: &Tensor,
    seqlens_k: &Tensor,
    max_seqlen_q: usize,
    max_seqlen_k: usize,
    softmax_scale: f32,
    window_size_left: Option<usize>,
    window_size_right: Option<usize>,
) -> Result<Tensor> {
    apply_varlen(q, k, v, seqlens_q, seqlens_k, (max_seqlen_q, max_seqlen_k), softmax_scale, (window_size_left, window_size_right), None, None)
}

/// Variable-length attention over a paged KV cache (prefix caching, chunked
/// prefill), candle-flash-attn 0.11.1's signature and meaning:
///
/// * `q` `(total_q, num_heads_q, head_size)` packed with `seqlens_q` (as in
///   [`flash_attn_varlen`]);
/// * `k`, `v`: the pages `(num_blocks, page_block_size, num_heads_kv,
///   head_size)`; sequence `b`'s key `t` is row `t % page_block_size` of
///   page `block_table[b][t / page_block_size]`;
/// * `seqlens_k`: cumulative key lengths, `batch + 1` entries: sequence `b`
///   attends to its first `seqlens_k[b+1] − seqlens_k[b]` keys (the keys
///   live in the pages, the sums give lengths only);
/// * `block_table` U32 or I32 `(batch, max_blocks_per_seq)`, contiguous;
/// * `page_block_size`: the pages' axis 1. Any size ≥ 1 (candle-flash-attn
///   needs a multiple of 32);
/// * window (bottom-right per sequence, normalized with `max_seqlen_k`),
///   causal = `(None, Some(0))`, `softcap` (`None`/0 off) as elsewhere.
///
/// `mm_prefix_ranges` (I32 `(batch, max_ranges, 2)`: key ranges `[start,
/// end)` inside which a query sees every key, bypassing the causal/window
/// mask, for multimodal prompts) has no counterpart in our kernels: with a
/// causal or window mask it is an error naming it; without a mask it
/// changes nothing (as in candle-flash-attn) and is only checked.
#[allow(clippy::too_many_arguments)]
pub fn flash_attn_varlen_paged_windowed(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    seqlens_q: &Tensor,
    seqlens_k: &Tensor,
    block_table: &Tensor,
    mm_prefix_ranges: Option<&Tensor>,
    max_seqlen_q: usize,
    max_seqlen_k: usize,
    softmax_scale: f32,
    window_size_left: Option<usize>,
    window_size_right: Option<usize>,
    page_block_size: usize,
    softcap: Option<f32>,
) -> Result<Tensor> {
    let mut tensors = vec![("q", q), ("k", k), ("v", v), ("seqlens_q", seqlens_q), ("seqlens_k", seqlens_k), ("block_table", block_table)];
    if let Some(r) = mm_prefix_ranges {
        tensors.push(("mm_prefix_ranges", r));
    }
    crate::check_devices(&tensors)?;
    if let Some(ranges) = mm_prefix_ranges {
        check_mm_prefix_ranges(ranges, seqlens_q, max_seqlen_k, (window_size_left, window_size_right))?;
    }
    let op = FlashAttnVarLen {
        opts: check::Options { softmax_scale, window_size_left, window_size_right, softcap },
        max_seqlen_q,
        max_seqlen_k,
        seqlens_q: seqlens_q.clone(),
        seqlens_k: seqlens_k.clone(),
        alibi_slopes: None,
        paged: Some(Paged { block_table: block_table.clone(), page_block_size }),
        lse: Mutex::new(None),
    };
    q.apply_op3(k, v, op)
}

/// `mm_prefix_ranges`: I32 `(batch, max_ranges, 2)`, last axis contiguous
/// (candle-flash-attn's rules); an error if a mask applies, since the
/// kernels cannot lift it inside the ranges.
fn check_mm_prefix_ranges(r: &Tensor, seqlens_q: &Tensor, max_seqlen_k: usize, window: (Option<usize>, Option<usize>)) -> Result<()> {
    // A side ≥ max_seqlen_k is unbounded (FlashAttention-2's rule).
    let bounded = |w: Option<usize>| w.is_some_and(|w| w < max_seqlen_k);
    if bounded(window.0) || bounded(window.1) {
        return Err(err(format_args!(
            "`mm_prefix_ranges`: bidirectional prefix ranges inside a causal or window mask \
             (window {window:?}, max_seqlen_k {max_seqlen_k}) are not supported by flash-attn-candle: \
             the kernels have no per-range exception to the mask; pass None (no silent fallback)"
        )));
    }
    if r.dtype() != DType::I32 {
        return Err(err(format_args!("dtype mismatch: `mm_prefix_ranges` is {:?}, expected I32", r.dtype())));
    }
    let batch = check_seqlens("seqlens_q", seqlens_q)?;
    match r.dims() {
        &[b, _, 2] if b == batch && r.stride()[2] == 1 => Ok(()),
        dims => Err(err(format_args!(
            "`mm_prefix_ranges` must be ({batch}, max_ranges, 2) with a contiguous last axis, got shape {dims:?}, strides {:?}",
            r.stride()
        ))),
    }
}

/// Variable-length [`crate::flash_attn_alibi`].
#[allow(clippy::too_many_arguments)]
pub fn flash_attn_varlen_alibi(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    alibi_slopes: &Tensor,
    seqlens_q: &Tensor,
    seqlens_k: &Tensor,
    max_seqlen_q: usize,
    max_seqlen_k: usize,
    softmax_scale: f32,
    causal: bool,
) -> Result<Tensor> {
    apply_varlen(q, k, v, seqlens_q, seqlens_k, (max_seqlen_q, max_seqlen_k), softmax_scale, crate::causal_window(causal), Some(alibi_slopes), None)
}

/// Variable-length [`crate::flash_attn_alibi_windowed`].
#[allow(clippy::too_many_arguments)]
pub fn flash_attn_varlen_alibi_windowed(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    alibi_slopes: &Tensor,
    seqlens_q: &Tensor,
    seqlens_k: &Tensor,
    max_seqlen_q: usize,
    max_seqlen_k: usize,
    softmax_scale: f32,
    window_size_left: Option<usize>,
    window_size_right: Option<usize>,
) -> Result<Tensor> {
    let w = (window_size_left, window_size_right);
    apply_varlen(q, k, v, seqlens_q, seqlens_k, (max_seqlen_q, max_seqlen_k), softmax_scale, w, Some(alibi_slopes), None)
}

/// Variable-length [`crate::flash_attn_alibi_windowed_softcap`].
#[allow(clippy::too_many_arguments)]
pub fn flash_attn_varlen_alibi_windowed_softcap(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    alibi_slopes: Option<&Tensor>,
    seqlens_q: &Tensor,
    seqlens_k: &Tensor,
    max_seqlen_q: usize,
    max_seqlen_k: usize,
    softmax_scale: f32,
    window_size_left: Option<usize>,
    window_size_right: Option<usize>,
    softcap: f32,
) -> Result<Tensor> {
    let w = (window_size_left, window_size_right);
    apply_varlen(q, k, v, seqlens_q, seqlens_k, (max_seqlen_q, max_seqlen_k), softmax_scale, w, alibi_slopes, Some(softcap))
}
