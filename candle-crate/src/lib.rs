//! # flash-attn-candle
//!
//! FlashAttention for [candle](https://github.com/huggingface/candle)
//! tensors on flash-attn's pure-Rust kernels (compiled by rustc's nvptx
//! backend; no nvcc, no C++), with the function names and signatures of
//! `candle-flash-attn` 0.11.1, so that a `[patch.crates-io]` line runs
//! candle-transformers' models on it unchanged (see the `candle-flash-attn`
//! package beside this crate).
//!
//! ```no_run
//! # fn main() -> candle_core::Result<()> {
//! use candle_core::{Device, DType, Tensor};
//! let dev = Device::Cpu; // or Device::new_cuda(0)? with the `cuda` feature
//! let q = Tensor::randn(0f32, 1., (1, 128, 8, 64), &dev)?; // (batch, seqlen, nheads, headdim)
//! let (k, v) = (q.clone(), q.clone());
//! let o = flash_attn_candle::flash_attn(&q, &k, &v, 0.125, true)?;
//! let (o2, lse) = flash_attn_candle::flash_attn_with_lse(&q, &k, &v, 0.125, true)?; // lse: (1, 8, 128) f32
//! # let _ = (o, o2, lse, DType::F32); Ok(()) }
//! ```
//!
//! * [`FlashAttn`] is a candle `CustomOp3`. On CUDA (feature `cuda`) it runs
//!   on candle's stream over candle's buffers as they are (offsets, strides),
//!   output allocated on that stream: f32, f16, bf16. On the CPU it runs
//!   flash-attn's CPU reference: f32, f64, f16, bf16 (candle-flash-attn has
//!   no CPU path). Layout `(batch, seqlen, nheads, headdim)`, any batch,
//!   sequence and head strides, head dim contiguous.
//! * Training: `loss.backward()` through every function here but the
//!   paged and KV-cache ones runs the core's backward pass (`CustomOp3::bwd`:
//!   the kernels on CUDA, the CPU reference on the CPU), from the forward's
//!   logsumexp kept with the op.
//! * Bad input is a candle error naming the argument (rank, dtype, strides,
//!   device, shapes, head dim); nothing panics.
//! * GQA/MQA (k/v with fewer heads), sliding windows, softcap, ALiBi and
//!   varlen run on both paths (the core's `forward_ext`/`forward_varlen`
//!   and `fa2_forward_ext`/`attention_varlen`).
//! * A paged KV cache in varlen prefill ([`flash_attn_varlen_paged_windowed`]:
//!   the core's `forward_varlen_paged`, `attention_varlen_paged` on the
//!   CPU) and decode against a KV cache with new keys appended in place
//!   ([`flash_attn_with_kvcache`], [`FlashAttnKvCache`]: the core's
//!   `forward_kvcache`, contiguous or paged, split-KV; the reference's
//!   `kvcache_attention`/`paged_kvcache_attention` on the CPU).
//! * FP8 (e4m3) on candle's `DType::F8E4M3`: [`flash_attn_fp8`] (and
//!   `_windowed`, `_varlen`, [`FlashAttnFp8`]) with FlashAttention-3's
//!   descale tensors ([`Fp8Descales`]), O in bf16 or f16 (the core's
//!   `forward_fp8_into` on sm_90a; the FP8 reference on the CPU), and decode
//!   over an e4m3 KV cache with `k_scale`/`v_scale`, new rows quantized in
//!   place ([`flash_attn_with_kvcache_fp8`], [`FlashAttnKvCache::forward_fp8`]:
//!   the core's `forward_kvcache_fp8`). Forward only.
//! * [`FlashAttnKvCache::order_block_table`] sorts a block-table tensor's
//!   position-free full pages by address in place (the core's
//!   `order_block_table` on the CPU, its device sort on candle's stream),
//!   so that paged calls stream their pages in address order.

mod backward;
mod check;
mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;
#[cfg(feature = "cuda")]
mod cuda_fp8;
mod fp8;
mod fp8_varlen;
mod kvcache;
mod kvcache_fp8;
mod op;
mod page_order;
mod storage;
mod varlen;

pub use fp8::{FlashAttnFp8, Fp8Descales, flash_attn_fp8, flash_attn_fp8_windowed};
pub use fp8_varlen::{flash_attn_fp8_varlen, flash_attn_fp8_varlen_windowed};
pub use kvcache::{FlashAttnKvCache, KvCacheArgs, flash_attn_with_kvcache};
pub use kvcache_fp8::flash_attn_with_kvcache_fp8;
pub use op::FlashAttn;
pub use varlen::*;

use candle_core::{Result, Tensor};

use crate::check::err;

/// q, k (and v) on one device, named in the error otherwise.
fn check_devices(tensors: &[(&str, &Tensor)]) -> Result<()> {
    let (first, t0) = tensors[0];
    for &(name, t) in &tensors[1..] {
        if !t.device().same_device(t0.device()) {
            return Err(err(format_args!(
                "device mismatch: `{name}` is on {:?} but `{first}` is on {:?}",
                t.device().location(),
                t0.device().location()
            )));
        }
    }
    Ok(())
}

fn apply(q: &Tensor, k: &Tensor, v: &Tensor, op: FlashAttn) -> Result<Tensor> {
    check_devices(&[("q", q), ("k", k), ("v", v)])?;
    q.apply_op3(k, v, backward::Recording::new(op))
}

pub(crate) fn causal_window(causal: bool) -> (Option<usize>, Option<usize>) {
    (None, if causal { Some(0) } else { None })
}

/// Flash-attention v2: `softmax(Q @ Kᵀ · softmax_scale) @ V`.
///
/// * `q`: `(batch, seq_len_q, num_heads_q, head_size)`; `k`, `v`:
///   `(batch, seq_len_kv, num_heads_kv, head_size)`.
/// * `causal`: the causal mask, aligned to the bottom-right corner when
///   `seq_len_q != seq_len_kv` (a decode step sees the whole cache).
///
/// Returns `(batch, seq_len_q, num_heads_q, head_size)`, contiguous.
pub fn flash_attn(q: &Tensor, k: &Tensor, v: &Tensor, softmax_scale: f32, causal: bool) -> Result<Tensor> {
    let (window_size_left, window_size_right) = causal_window(causal);
    apply(q, k, v, FlashAttn { softmax_scale, alibi_slopes: None, window_size_left, window_size_right, softcap: None })
}

/// [`flash_attn`] with a sliding window: query `i` sees key `j` iff
/// `i + sk − sq − left ≤ j ≤ i + sk − sq + right` (`None`: unbounded);
/// `(None, Some(0))` is the causal mask.
pub fn flash_attn_windowed(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    softmax_scale: f32,
    window_size_left: Option<usize>,
    window_size_right: Option<usize>,
) -> Result<Tensor> {
    apply(q, k, v, FlashAttn { softmax_scale, alibi_slopes: None, window_size_left, window_size_right, softcap: None })
}

/// [`flash_attn`] with ALiBi: `alibi_slopes` f32 `(num_heads_q)`.
pub fn flash_attn_alibi(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    alibi_slopes: &Tensor,
    softmax_scale: f32,
    causal: bool,
) -> Result<Tensor> {
    let (window_size_left, window_size_right) = causal_window(causal);
    let op = FlashAttn { softmax_scale, alibi_slopes: Some(alibi_slopes.clone()), window_size_left, window_size_right, softcap: None };
    apply(q, k, v, op)
}

/// [`flash_attn_windowed`] with ALiBi.
pub fn flash_attn_alibi_windowed(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    alibi_slopes: &Tensor,
    softmax_scale: f32,
    window_size_left: Option<usize>,
    window_size_right: Option<usize>,
) -> Result<Tensor> {
    let op = FlashAttn { softmax_scale, alibi_slopes: Some(alibi_slopes.clone()), window_size_left, window_size_right, softcap: None };
    apply(q, k, v, op)
}

/// [`flash_attn_windowed`] with optional ALiBi and a Gemma-style softcap
/// (`cap · tanh(score / cap)`, 0 = off).
#[allow(clippy::too_many_arguments)]
pub fn flash_attn_alibi_windowed_softcap(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    alibi_slopes: Option<&Tensor>,
    softmax_scale: f32,
    window_size_left: Option<usize>,
    window_size_right: Option<usize>,
    softcap: f32,
) -> Result<Tensor> {
    let op = FlashAttn { softmax_scale, alibi_slopes: alibi_slopes.cloned(), window_size_left, window_size_right, softcap: Some(softcap) };
    apply(q, k, v, op)
}

impl FlashAttn {
    /// Runs the op and also returns the logsumexp of each row of
    /// `softmax_scale · QKᵀ`: f32 `(batch, num_heads_q, seq_len_q)`, natural
    /// log, −inf for a row that sees no key (what split-KV merging and
    /// backward passes need). No backward op is recorded (use [`flash_attn`]
    /// and its siblings to train).
    pub fn forward_with_lse(&self, q: &Tensor, k: &Tensor, v: &Tensor) -> Result<(Tensor, Tensor)> {
        check_devices(&[("q", q), ("k", k), ("v", v)])?;
        op::forward_with_lse(self, q, k, v)
    }
}

/// [`flash_attn`], also returning the logsumexp, f32
/// `(batch, num_heads_q, seq_len_q)` (see [`FlashAttn::forward_with_lse`]).
pub fn flash_attn_with_lse(q: &Tensor, k: &Tensor, v: &Tensor, softmax_scale: f32, causal: bool) -> Result<(Tensor, Tensor)> {
    let (window_size_left, window_size_right) = causal_window(causal);
    FlashAttn { softmax_scale, alibi_slopes: None, window_size_left, window_size_right, softcap: None }.forward_with_lse(q, k, v)
}
