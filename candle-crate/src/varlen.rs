//! candle-flash-attn's variable-length functions: sequences packed along
//! the first axis, `q` `(total_q, num_heads_q, head_size)`, `k`, `v`
//! `(total_kv, num_heads_kv, head_size)`, and cumulative lengths
//! `seqlens_q`, `seqlens_k` (u32, `batch + 1` entries, starting at 0).
//!
//! They run on the core's varlen API: `forward_varlen` on the GPU (the u32
//! prefix sums read in place as i32, on candle's stream), the reference's
//! `attention_varlen` on the CPU (prefix sums copied to the host there).
//! GQA, window, softcap and ALiBi (slopes `(nheads)` or `(batch, nheads)`)
//! as in the fixed-length functions; `flash_attn_varlen_paged_windowed`
//! needs the core's paged KV cache (`forward_kvcache`, not wired in yet)
//! and is an error until then.

use candle_core::backend::BackendStorage;
use candle_core::{CpuStorage, CustomOp3, DType, Layout, Result, Shape, Storage, Tensor};
use flash_attn::TensorLayout;

use crate::check::{self, Checked, Missing, err};
use crate::cpu;

struct FlashAttnVarLen {
    softmax_scale: f32,
    max_seqlen_q: usize,
    max_seqlen_k: usize,
    seqlens_q: Tensor,
    seqlens_k: Tensor,
    alibi_slopes: Option<Tensor>,
    window_size_left: Option<usize>,
    window_size_right: Option<usize>,
    softcap: Option<f32>,
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

/// Cumulative lengths: u32, rank 1, `batch + 1 ≥ 2` entries; the batch.
fn check_seqlens(argument: &str, t: &Tensor) -> Result<usize> {
    if t.dtype() != DType::U32 {
        return Err(err(format_args!("dtype mismatch: `{argument}` is {:?}, expected U32", t.dtype())));
    }
    if !t.is_contiguous() {
        return Err(err(format_args!("`{argument}` must be contiguous, got strides {:?}", t.stride())));
    }
    match t.dims() {
        &[n] if n >= 2 => Ok(n - 1),
        dims => Err(err(format_args!(
            "`{argument}` must be the cumulative lengths, rank 1 with batch + 1 ≥ 2 entries, got shape {dims:?}"
        ))),
    }
}

/// A u32 prefix-sum tensor on the CPU as the core's i32.
fn host_seqlens(argument: &str, t: &Tensor) -> Result<Vec<i32>> {
    let (st, l) = t.storage_and_layout();
    let Storage::Cpu(st) = &*st else {
        return Err(err(format_args!("device mismatch: `{argument}` is on {:?} but `q` on the CPU", t.device().location())));
    };
    let v = &st.as_slice::<u32>()?[l.start_offset()..][..t.elem_count()];
    v.iter()
        .map(|&x| i32::try_from(x).map_err(|_| err(format_args!("`{argument}`: {x} exceeds i32::MAX"))))
        .collect()
}

impl FlashAttnVarLen {
    fn check(&self, q_l: &Layout, k_l: &Layout, v_l: &Layout) -> Result<(Checked, usize)> {
        let q = layout3("q", q_l)?;
        let k = layout3("k", k_l)?;
        let v = layout3("v", v_l)?;
        let (h, d) = (q.nheads(), q.headdim());
        if v.shape != k.shape {
            return Err(err(format_args!("shape mismatch: `v` is {:?} but `k` is {:?}: they must be equal", &v.shape[1..], &k.shape[1..])));
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
        let opts = check::Options {
            softmax_scale: self.softmax_scale,
            window_size_left: self.window_size_left,
            window_size_right: self.window_size_right,
            softcap: self.softcap,
        };
        let params = check::forward_params(&opts, d, self.max_seqlen_k)?;
        Ok((Checked { q, k, v, params }, bq))
    }

    fn out_shape(c: &Checked) -> Shape {
        let [_, t, h, d] = c.q.shape;
        (t, h, d).into()
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
        check::check_dtypes(q.dtype(), k.dtype(), v.dtype(), cpu::DTYPES, "CPU")?;
        let (c, batch) = self.check(q_l, k_l, v_l)?;
        let args = cpu::VarlenArgs {
            cu_q: host_seqlens("seqlens_q", &self.seqlens_q)?,
            cu_k: host_seqlens("seqlens_k", &self.seqlens_k)?,
            max_q: self.max_seqlen_q,
            max_k: self.max_seqlen_k,
        };
        let alibi = match &self.alibi_slopes {
            None => None,
            Some(t) => {
                let (shape, offset) = check::alibi_shape(t, batch, c.q.nheads())?;
                let (st, _) = t.storage_and_layout();
                let Storage::Cpu(st) = &*st else {
                    return Err(err(format_args!("device mismatch: `alibi_slopes` is on {:?} but `q` on the CPU", t.device().location())));
                };
                Some((st.as_slice::<f32>()?[offset..][..t.elem_count()].to_vec(), shape))
            }
        };
        let alibi = alibi.as_ref().map(|(s, sh)| (s.as_slice(), *sh));
        let (o, _lse) = cpu::forward_varlen(&c, &args, alibi, q, q_l, k, k_l, v, v_l)?;
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
        check::check_dtypes(q.dtype(), k.dtype(), v.dtype(), crate::cuda::DTYPES, "GPU")?;
        let (c, batch) = self.check(q_l, k_l, v_l)?;
        let (sq, lq) = self.seqlens_q.storage_and_layout();
        let (sk, lk) = self.seqlens_k.storage_and_layout();
        let (Storage::Cuda(sq), Storage::Cuda(sk)) = (&*sq, &*sk) else {
            return Err(err("device mismatch: `seqlens_q` and `seqlens_k` must be on the GPU with `q`"));
        };
        let max = (self.max_seqlen_q, self.max_seqlen_k);
        let (o, _lse) = match &self.alibi_slopes {
            None => crate::cuda::forward_varlen(&c, (sq, lq, sk, lk), max, None, q, q_l, k, k_l, v, v_l)?,
            Some(t) => {
                let (shape, offset) = check::alibi_shape(t, batch, c.q.nheads())?;
                let (st, _) = t.storage_and_layout();
                let Storage::Cuda(st) = &*st else {
                    return Err(err(format_args!("device mismatch: `alibi_slopes` is on {:?} but `q` on the GPU", t.device().location())));
                };
                let slopes = st.as_cuda_slice::<f32>()?;
                let view = slopes.slice(offset.min(slopes.len())..);
                crate::cuda::forward_varlen(&c, (sq, lq, sk, lk), max, Some((&view, shape)), q, q_l, k, k_l, v, v_l)?
            }
        };
        Ok((o, Self::out_shape(&c)))
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
        softmax_scale,
        max_seqlen_q: max_seqlen.0,
        max_seqlen_k: max_seqlen.1,
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
    max_seqlen_q: usize,
    max_seqlen_k: usize,
    softmax_scale: f32,
    causal: bool,
) -> Result<Tensor> {
    apply_varlen(q, k, v, seqlens_q, seqlens_k, (max_seqlen_q, max_seqlen_k), softmax_scale, causal_window(causal), None, None)
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
    max_seqlen_q: usize,
    max_seqlen_k: usize,
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
    let _ = (seqlens_q, seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, window_size_left, window_size_right);
    let _ = (page_block_size, softcap);
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
    max_seqlen_q: usize,
    max_seqlen_k: usize,
    softmax_scale: f32,
    causal: bool,
) -> Result<Tensor> {
    apply_varlen(q, k, v, seqlens_q, seqlens_k, (max_seqlen_q, max_seqlen_k), softmax_scale, causal_window(causal), Some(alibi_slopes), None)
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
