//! candle-flash-attn's variable-length functions: sequences packed along
//! the first axis, `q` `(total_q, num_heads_q, head_size)`, `k`, `v`
//! `(total_kv, num_heads_kv, head_size)`, and cumulative lengths
//! `seqlens_q`, `seqlens_k` (u32, `batch + 1` entries, starting at 0).
//!
//! Their arguments are checked here (same messages as the fixed-length
//! functions); running them needs the core library's varlen API
//! (`forward_varlen`, cumulative lengths on the device), and the paged one
//! its KV-cache API: until they land, each call is a candle error saying so.

use candle_core::{CpuStorage, CustomOp3, DType, Layout, Result, Shape, Tensor};

use crate::check::{self, Missing, err};

struct FlashAttnVarLen {
    softmax_scale: f32,
    seqlens_q: Tensor,
    seqlens_k: Tensor,
    alibi_slopes: Option<Tensor>,
    window_size_left: Option<usize>,
    window_size_right: Option<usize>,
    softcap: Option<f32>,
}

/// A packed `(total, nheads, headdim)` layout, head dim contiguous.
fn layout3(argument: &str, l: &Layout) -> Result<[usize; 3]> {
    let dims = l.shape().dims();
    let &[t, h, d] = dims else {
        return Err(err(format_args!(
            "`{argument}` must have rank 3 (total_tokens, nheads, headdim) for varlen, got rank {} (shape {dims:?})",
            dims.len()
        )));
    };
    if l.stride()[2] != 1 {
        return Err(err(format_args!(
            "`{argument}`: the last (headdim) dimension must be contiguous (stride 1), got strides {:?}",
            l.stride()
        )));
    }
    Ok([t, h, d])
}

fn check_seqlens(argument: &str, t: &Tensor) -> Result<usize> {
    if t.dtype() != DType::U32 {
        return Err(err(format_args!("dtype mismatch: `{argument}` is {:?}, expected U32", t.dtype())));
    }
    match t.dims() {
        &[n] if n >= 2 => Ok(n - 1),
        dims => Err(err(format_args!(
            "`{argument}` must be the cumulative lengths, rank 1 with batch + 1 ≥ 2 entries, got shape {dims:?}"
        ))),
    }
}

impl FlashAttnVarLen {
    fn check(&self, q_l: &Layout, k_l: &Layout, v_l: &Layout) -> Result<()> {
        let [_, h, d] = layout3("q", q_l)?;
        let k = layout3("k", k_l)?;
        let v = layout3("v", v_l)?;
        if v != k {
            return Err(err(format_args!("shape mismatch: `v` is {v:?} but `k` is {k:?}: they must be equal")));
        }
        if k[2] != d {
            return Err(err(format_args!("shape mismatch: `k` has headdim {} but `q` has {d}", k[2])));
        }
        let bq = check_seqlens("seqlens_q", &self.seqlens_q)?;
        let bk = check_seqlens("seqlens_k", &self.seqlens_k)?;
        if bq != bk {
            return Err(err(format_args!("`seqlens_k` holds {bk} sequences but `seqlens_q` {bq}")));
        }
        if k[1] == 0 || h % k[1] != 0 {
            return Err(err(format_args!("`k`: number of k/v heads {} must divide the number of heads in `q` {h}", k[1])));
        }
        // The options, with the rules of the fixed-length call.
        let opts = check::Options {
            softmax_scale: self.softmax_scale,
            window_size_left: self.window_size_left,
            window_size_right: self.window_size_right,
            softcap: self.softcap,
            alibi: false,
        };
        check::forward_params(&opts, d, usize::MAX)?;
        if self.alibi_slopes.is_some() {
            return Err(Missing::Alibi.error("alibi_slopes"));
        }
        Ok(())
    }
}

impl CustomOp3 for FlashAttnVarLen {
    fn name(&self) -> &'static str {
        "flash-attn-varlen"
    }

    fn cpu_fwd(
        &self,
        _: &CpuStorage,
        q_l: &Layout,
        _: &CpuStorage,
        k_l: &Layout,
        _: &CpuStorage,
        v_l: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        self.check(q_l, k_l, v_l)?;
        Err(Missing::Varlen.error("seqlens_q/seqlens_k"))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        _: &candle_core::CudaStorage,
        q_l: &Layout,
        _: &candle_core::CudaStorage,
        k_l: &Layout,
        _: &candle_core::CudaStorage,
        v_l: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        self.check(q_l, k_l, v_l)?;
        Err(Missing::Varlen.error("seqlens_q/seqlens_k"))
    }
}

#[allow(clippy::too_many_arguments)]
fn apply_varlen(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    seqlens_q: &Tensor,
    seqlens_k: &Tensor,
    softmax_scale: f32,
    window: (Option<usize>, Option<usize>),
    alibi_slopes: Option<&Tensor>,
    softcap: Option<f32>,
) -> Result<Tensor> {
    crate::check_devices(&[("q", q), ("k", k), ("v", v), ("seqlens_q", seqlens_q), ("seqlens_k", seqlens_k)])?;
    let op = FlashAttnVarLen {
        softmax_scale,
        seqlens_q: seqlens_q.clone(),
        seqlens_k: seqlens_k.clone(),
        alibi_slopes: alibi_slopes.cloned(),
        window_size_left: window.0,
        window_size_right: window.1,
        softcap,
    };
    q.apply_op3(k, v, op)
}

fn causal_window(causal: bool) -> (Option<usize>, Option<usize>) {
    (None, if causal { Some(0) } else { None })
}

/// Variable-length [`crate::flash_attn`] (see the module docs).
#[allow(clippy::too_many_arguments)]
pub fn flash_attn_varlen(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    seqlens_q: &Tensor,
    seqlens_k: &Tensor,
    _max_seqlen_q: usize,
    _max_seqlen_k: usize,
    softmax_scale: f32,
    causal: bool,
) -> Result<Tensor> {
    apply_varlen(q, k, v, seqlens_q, seqlens_k, softmax_scale, causal_window(causal), None, None)
}

/// Variable-length [`crate::flash_attn_windowed`].
#[allow(clippy::too_many_arguments)]
pub fn flash_attn_varlen_windowed(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    seqlens_q: &Tensor,
    seqlens_k: &Tensor,
    _max_seqlen_q: usize,
    _max_seqlen_k: usize,
    softmax_scale: f32,
    window_size_left: Option<usize>,
    window_size_right: Option<usize>,
) -> Result<Tensor> {
    apply_varlen(q, k, v, seqlens_q, seqlens_k, softmax_scale, (window_size_left, window_size_right), None, None)
}

/// Variable-length attention over a paged KV cache: `k`, `v` `(num_blocks,
/// page_block_size, num_heads_kv, head_size)`, `block_table` u32 `(batch,
/// max_blocks_per_seq)`. `mm_prefix_ranges` (bidirectional prefix ranges
/// for multimodal prompts) is taken for signature compatibility.
#[allow(clippy::too_many_arguments)]
pub fn flash_attn_varlen_paged_windowed(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    seqlens_q: &Tensor,
    seqlens_k: &Tensor,
    block_table: &Tensor,
    mm_prefix_ranges: Option<&Tensor>,
    _max_seqlen_q: usize,
    _max_seqlen_k: usize,
    softmax_scale: f32,
    window_size_left: Option<usize>,
    window_size_right: Option<usize>,
    page_block_size: usize,
    softcap: Option<f32>,
) -> Result<Tensor> {
    let _ = mm_prefix_ranges;
    crate::check_devices(&[("q", q), ("k", k), ("v", v), ("block_table", block_table)])?;
    // k and v are paged (rank 4), not packed: the op's rank-3 check does
    // not apply; what is missing is the paged call itself.
    let _ = (seqlens_q, seqlens_k, softmax_scale, window_size_left, window_size_right, page_block_size, softcap);
    Err(Missing::Paged.error("block_table"))
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
    _max_seqlen_q: usize,
    _max_seqlen_k: usize,
    softmax_scale: f32,
    causal: bool,
) -> Result<Tensor> {
    apply_varlen(q, k, v, seqlens_q, seqlens_k, softmax_scale, causal_window(causal), Some(alibi_slopes), None)
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
    _max_seqlen_q: usize,
    _max_seqlen_k: usize,
    softmax_scale: f32,
    window_size_left: Option<usize>,
    window_size_right: Option<usize>,
) -> Result<Tensor> {
    let w = (window_size_left, window_size_right);
    apply_varlen(q, k, v, seqlens_q, seqlens_k, softmax_scale, w, Some(alibi_slopes), None)
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
    _max_seqlen_q: usize,
    _max_seqlen_k: usize,
    softmax_scale: f32,
    window_size_left: Option<usize>,
    window_size_right: Option<usize>,
    softcap: f32,
) -> Result<Tensor> {
    let w = (window_size_left, window_size_right);
    apply_varlen(q, k, v, seqlens_q, seqlens_k, softmax_scale, w, alibi_slopes, Some(softcap))
}
