//! Attention against a KV cache with in-place append: FlashAttention-2's
//! `flash_attn_with_kvcache` on candle tensors (`../shared/INFERENCE.md`).
//!
//! ```text
//! k_cache, v_cache   (batch_c, seqlen_cache, nheads_k, d)       contiguous cache
//!                    (num_blocks, page_block_size, nheads_k, d) paged (block_table)
//! cache_seqlens      U32/I32 (batch): keys already cached per sequence
//! k_new, v_new       (batch, seqlen_new, nheads_k, d): written in place at rows
//!                    cache_seqlens[b]..+seqlen_new, then attended to
//! q                  (batch, seqlen_q, nheads, d); sequence b sees cache_seqlens[b] + seqlen_new keys
//! ```
//!
//! candle's in-place ops hand out one writable storage each, and a call
//! writes two (k_cache, v_cache): the op on `k_cache` runs the op on
//! `v_cache` inside it, and that inner op, holding both for writing, makes
//! one call of the core (`FlashAttention::forward_kvcache` on the GPU: it
//! validates everything, device pointers and alignment included, before it
//! enqueues the appends and the attention; the reference's
//! `kvcache_attention`/`paged_kvcache_attention` on the CPU: every check,
//! the cache lengths and table entries included, before the first write).
//! A call that fails leaves both caches as they were.

use std::cell::RefCell;

use candle_core::op::BackpropOp;
use candle_core::{CpuStorage, InplaceOp1, Layout, Result, Storage, Tensor};
use flash_attn::{ForwardParams, TensorLayout};

use crate::check::{self, err, layout4, layout4_of};
use crate::kvcache_fp8::KvScales;
use crate::cpu;
use crate::storage::Held;

/// FlashAttention-2's `flash_attn_with_kvcache` options, as
/// [`crate::FlashAttn`]'s fields plus the split-KV count.
#[derive(Clone, Debug)]
pub struct FlashAttnKvCache {
    pub softmax_scale: f32,
    /// f32 `(num_heads_q)` or `(batch, num_heads_q)`.
    pub alibi_slopes: Option<Tensor>,
    /// Window (bottom-right aligned, normalized with the cache capacity);
    /// `(None, Some(0))` is causal.
    pub window_size_left: Option<usize>,
    pub window_size_right: Option<usize>,
    /// `cap · tanh(score / cap)`; `None` or 0: off.
    pub softcap: Option<f32>,
    /// Split-KV parts on the GPU: `None` FlashAttention-2's heuristic,
    /// `Some(1)` no split, at most 128. The CPU path does not split.
    pub num_splits: Option<usize>,
}

/// The cache-side arguments of a [`FlashAttnKvCache`] call (see the module
/// docs). `cache_batch_idx` (U32/I32 `(batch)`): the cache row of each
/// sequence, contiguous caches only; `block_table` (U32/I32 `(batch,
/// max_blocks_per_seq)`, contiguous) makes the caches paged.
#[derive(Clone, Copy, Debug)]
pub struct KvCacheArgs<'a> {
    pub k_new: Option<&'a Tensor>,
    pub v_new: Option<&'a Tensor>,
    pub cache_seqlens: &'a Tensor,
    pub cache_batch_idx: Option<&'a Tensor>,
    pub block_table: Option<&'a Tensor>,
}

impl<'a> KvCacheArgs<'a> {
    /// `k_new` and `v_new`, held for reading, if both are given (the check
    /// makes one without the other an error).
    pub(crate) fn held_new(&self) -> Option<[Held<'a>; 2]> {
        Some([Held::new("k_new", self.k_new?), Held::new("v_new", self.v_new?)])
    }
}

/// A validated KV-cache call (host-side checks; the core and the reference
/// check the rest before anything is written).
#[derive(Clone, Copy, Debug)]
pub(crate) struct KvChecked {
    pub q: TensorLayout,
    pub k_cache: TensorLayout,
    pub v_cache: TensorLayout,
    /// Layouts of k_new and v_new.
    pub new: Option<(TensorLayout, TensorLayout)>,
    pub params: ForwardParams,
    pub batch: usize,
    /// Paged: the block table's `max_blocks_per_seq`.
    pub max_blocks: Option<usize>,
}

impl FlashAttnKvCache {
    fn options(&self) -> check::Options {
        check::Options {
            softmax_scale: self.softmax_scale,
            window_size_left: self.window_size_left,
            window_size_right: self.window_size_right,
            softcap: self.softcap,
        }
    }

    /// Shapes, dtypes, index tensors, options: everything the host sees
    /// (`fp8`: e4m3 caches, f16/bf16 q, head dims multiples of 16).
    fn check(&self, q: &Tensor, k_cache: &Tensor, v_cache: &Tensor, a: &KvCacheArgs<'_>, fp8: bool) -> Result<KvChecked> {
        let ql = layout4("q", q.layout())?;
        let axes = if a.block_table.is_some() {
            "(num_blocks, page_block_size, nheads_k, headdim) for a paged cache"
        } else {
            "(batch_c, seqlen_cache, nheads_k, headdim)"
        };
        let kc = layout4_of("k_cache", k_cache.layout(), axes)?;
        let vc = layout4_of("v_cache", v_cache.layout(), axes)?;
        if fp8 {
            crate::kvcache_fp8::check_dtypes(q.dtype(), k_cache.dtype(), v_cache.dtype())?;
            crate::fp8::check_headdim("k_cache", kc.headdim())?;
        } else {
            check::check_dtypes(q.dtype(), k_cache.dtype(), v_cache.dtype(), cpu::DTYPES, "CPU or GPU")
                .map_err(|e| rename(e, &[("`k`", "`k_cache`"), ("`v`", "`v_cache`")]))?;
        }
        if vc.shape != kc.shape {
            return Err(err(format_args!("shape mismatch: `v_cache` is {:?} but `k_cache` is {:?}: they must be equal", vc.shape, kc.shape)));
        }
        let [batch, _, h, d] = ql.shape;
        let [_, rows, hk, dk] = kc.shape;
        if dk != d {
            return Err(err(format_args!("shape mismatch: `k_cache` has headdim {dk} but `q` has {d}")));
        }
        if hk == 0 || h % hk != 0 {
            return Err(err(format_args!("`k_cache`: number of k/v heads {hk} must divide the number of heads in `q` {h}")));
        }
        let new = match (a.k_new, a.v_new) {
            (None, None) => None,
            (Some(kn), Some(vn)) => {
                let axes = "(batch, seqlen_new, nheads_k, headdim)";
                let (lk, lv) = (layout4_of("k_new", kn.layout(), axes)?, layout4_of("v_new", vn.layout(), axes)?);
                for (argument, t) in [("k_new", kn), ("v_new", vn)] {
                    if t.dtype() != q.dtype() {
                        return Err(err(format_args!("dtype mismatch: `{argument}` is {:?} but `q` is {:?}", t.dtype(), q.dtype())));
                    }
                }
                let [nb, _, nh, nd] = lk.shape;
                if (nb, nh, nd) != (batch, hk, d) || lv.shape != lk.shape {
                    return Err(err(format_args!(
                        "shape mismatch: `k_new` is {:?}, `v_new` {:?}: both must be (batch {batch}, seqlen_new, nheads_k {hk}, headdim {d})",
                        lk.shape, lv.shape
                    )));
                }
                Some((lk, lv))
            }
            (Some(_), None) => return Err(err("`v_new` is None but `k_new` is given: new keys and values come together")),
            (None, Some(_)) => return Err(err("`k_new` is None but `v_new` is given: new keys and values come together")),
        };
        let per_seq = |argument: &str, t: &Tensor| -> Result<()> {
            match check::index_tensor(argument, t, "(batch)", 1)? {
                &[n] if n == batch => Ok(()),
                dims => Err(err(format_args!("shape mismatch: `{argument}` is {dims:?}, expected ({batch}) (q's batch)"))),
            }
        };
        per_seq("cache_seqlens", a.cache_seqlens)?;
        if let Some(t) = a.cache_batch_idx {
            if a.block_table.is_some() {
                return Err(err("`cache_batch_idx` applies to contiguous caches; a paged cache has `block_table` instead"));
            }
            per_seq("cache_batch_idx", t)?;
        }
        let max_blocks = match a.block_table {
            None => None,
            Some(t) => match check::index_tensor("block_table", t, "(batch, max_blocks_per_seq)", 2)? {
                &[b, m] if b == batch && m >= 1 => Some(m),
                dims => {
                    return Err(err(format_args!(
                        "shape mismatch: `block_table` is {dims:?}, expected ({batch}, max_blocks_per_seq ≥ 1)"
                    )));
                }
            },
        };
        // Keys a sequence can hold: the window's normalization (FA2's rule).
        let capacity = max_blocks.map_or(rows, |m| m.saturating_mul(rows));
        let mut params = check::forward_params(&self.options(), d, capacity.max(1))?;
        if ql.shape[1] == 1 && params.causal {
            // One query row sits at the last key (bottom-right): the causal
            // mask hides nothing. Without it the core packs a GQA group's
            // query heads into one tile and reads each KV head once (with
            // it, once per query head: 2.1x the time at 32k keys, 32/8 heads).
            params.causal = false;
        }
        Ok(KvChecked { q: ql, k_cache: kc, v_cache: vc, new, params, batch, max_blocks })
    }

    /// Appends `k_new`/`v_new` (if given) into `k_cache`/`v_cache` in place
    /// and attends (see the module docs). Returns O `(batch, seq_len_q,
    /// num_heads_q, head_size)` and the logsumexp, f32 `(batch, num_heads_q,
    /// seq_len_q)`. Runs on the CPU (f32, f64, f16, bf16; the reference) and
    /// on CUDA (f16, bf16). Errors name the argument and leave the caches
    /// untouched. No backward op is recorded.
    pub fn forward(&self, q: &Tensor, k_cache: &Tensor, v_cache: &Tensor, a: KvCacheArgs<'_>) -> Result<(Tensor, Tensor)> {
        self.run(q, k_cache, v_cache, a, None)
    }

    /// [`Self::forward`], or with `scales` its FP8 form ([`Self::forward_fp8`]).
    pub(crate) fn run(&self, q: &Tensor, k_cache: &Tensor, v_cache: &Tensor, a: KvCacheArgs<'_>, scales: Option<KvScales<'_>>) -> Result<(Tensor, Tensor)> {
        let mut all = vec![("q", q), ("k_cache", k_cache), ("v_cache", v_cache), ("cache_seqlens", a.cache_seqlens)];
        if let Some(s) = &scales {
            all.extend([("k_scale", s.k_scale), ("v_scale", s.v_scale)]);
        }
        let optional = [
            ("k_new", a.k_new),
            ("v_new", a.v_new),
            ("cache_batch_idx", a.cache_batch_idx),
            ("block_table", a.block_table),
            ("alibi_slopes", self.alibi_slopes.as_ref()),
        ];
        all.extend(optional.iter().filter_map(|&(n, t)| t.map(|t| (n, t))));
        crate::check_devices(&all)?;
        let c = self.check(q, k_cache, v_cache, &a, scales.is_some())?;
        if let Some(s) = &scales {
            crate::kvcache_fp8::check_scales(s, c.k_cache.nheads())?;
        }
        let mut read = vec![("q", Some(q)), ("cache_seqlens", Some(a.cache_seqlens))];
        read.extend(optional);
        read.extend(scales.iter().flat_map(|s| [("k_scale", Some(s.k_scale)), ("v_scale", Some(s.v_scale))]));
        check::check_no_sharing(&[("k_cache", k_cache), ("v_cache", v_cache)], &read)?;
        let outer = OnKCache { op: self, c: &c, q, v_cache, a: &a, scales, out: RefCell::new(None) };
        k_cache.inplace_op1(&outer)?;
        let (o, lse) = outer.out.into_inner().ok_or_else(|| err("the KV-cache call returned no output"))?;
        let [b, s, h, d] = c.q.shape;
        let o = Tensor::from_storage(o, (b, s, h, d), BackpropOp::none(), false);
        let lse = Tensor::from_storage(lse, (b, h, s), BackpropOp::none(), false);
        Ok((o, lse))
    }
}

/// A core error message with the core's argument names as this call's.
fn rename(e: candle_core::Error, names: &[(&str, &str)]) -> candle_core::Error {
    let mut msg = e.to_string();
    for (from, to) in names {
        msg = msg.replace(from, to);
    }
    candle_core::Error::Msg(msg)
}

/// The in-place op on `k_cache`; it runs [`OnVCache`] on `v_cache`.
struct OnKCache<'a> {
    op: &'a FlashAttnKvCache,
    c: &'a KvChecked,
    q: &'a Tensor,
    v_cache: &'a Tensor,
    a: &'a KvCacheArgs<'a>,
    /// An FP8 cache's scales (`None`: a 16-bit cache).
    scales: Option<KvScales<'a>>,
    /// O and the logsumexp, set by the inner op.
    out: RefCell<Option<(Storage, Storage)>>,
}

/// `k_cache`'s storage, writable, handed to the op on `v_cache`.
enum KStore<'s> {
    Cpu(&'s mut CpuStorage, &'s Layout),
    #[cfg(feature = "cuda")]
    Cuda(&'s mut candle_core::CudaStorage, &'s Layout),
}

/// The in-place op on `v_cache`, holding `k_cache` for writing too: the
/// one core call.
struct OnVCache<'a, 's> {
    outer: &'a OnKCache<'a>,
    k: RefCell<Option<KStore<'s>>>,
}

impl InplaceOp1 for OnKCache<'_> {
    fn name(&self) -> &'static str {
        "flash-attn-kvcache"
    }

    fn cpu_fwd(&self, k: &mut CpuStorage, k_l: &Layout) -> Result<()> {
        let inner = OnVCache { outer: self, k: RefCell::new(Some(KStore::Cpu(k, k_l))) };
        self.v_cache.inplace_op1(&inner)
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(&self, k: &mut candle_core::CudaStorage, k_l: &Layout) -> Result<()> {
        let inner = OnVCache { outer: self, k: RefCell::new(Some(KStore::Cuda(k, k_l))) };
        self.v_cache.inplace_op1(&inner)
    }
}

impl OnVCache<'_, '_> {
    fn k_store(&self) -> Option<KStore<'_>> {
        // Reborrow for the call's duration.
        self.k.borrow_mut().take().map(|k| match k {
            KStore::Cpu(s, l) => KStore::Cpu(s, l),
            #[cfg(feature = "cuda")]
            KStore::Cuda(s, l) => KStore::Cuda(s, l),
        })
    }
}

impl InplaceOp1 for OnVCache<'_, '_> {
    fn name(&self) -> &'static str {
        "flash-attn-kvcache"
    }

    fn cpu_fwd(&self, v: &mut CpuStorage, v_l: &Layout) -> Result<()> {
        let Some(KStore::Cpu(k, k_l)) = self.k_store() else {
            return Err(err("device mismatch: `k_cache` and `v_cache` must be on one device"));
        };
        let OnKCache { op, c, q, a, scales, .. } = self.outer;
        let (o, lse) = match scales {
            Some(s) => crate::kvcache_fp8::cpu(c, a, s, op.alibi_slopes.as_ref(), q, (k, k_l), (v, v_l))?,
            None => cpu::kvcache(c, a, op.alibi_slopes.as_ref(), q, (k, k_l), (v, v_l))?,
        };
        *self.outer.out.borrow_mut() = Some((Storage::Cpu(o), Storage::Cpu(lse)));
        Ok(())
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(&self, v: &mut candle_core::CudaStorage, v_l: &Layout) -> Result<()> {
        let Some(KStore::Cuda(k, k_l)) = self.k_store() else {
            return Err(err("device mismatch: `k_cache` and `v_cache` must be on one device"));
        };
        let OnKCache { op, c, q, a, scales, .. } = self.outer;
        let (o, lse) = match scales {
            Some(s) => crate::cuda_fp8::kvcache(c, a, s, op.num_splits, op.alibi_slopes.as_ref(), q, (k, k_l), (v, v_l))?,
            None => crate::cuda::kvcache(c, a, op.num_splits, op.alibi_slopes.as_ref(), q, (k, k_l), (v, v_l))?,
        };
        *self.outer.out.borrow_mut() = Some((Storage::Cuda(o), Storage::Cuda(lse)));
        Ok(())
    }
}

/// FlashAttention-2's `flash_attn_with_kvcache`: `k_new`/`v_new` `(batch,
/// seqlen_new, num_heads_kv, head_size)` appended in place into `k_cache`,
/// `v_cache` at rows `cache_seqlens[b]..`, then `q` `(batch, seq_len_q,
/// num_heads_q, head_size)` attends to `cache_seqlens[b] + seqlen_new`
/// keys; `causal` bottom-right aligned (a decode step sees every key).
///
/// * `cache_seqlens`: U32/I32 `(batch)` on q's device. `None`: every
///   sequence fills the whole cache (a cache grown by concatenation, as
///   candle-transformers' models keep it); then `k_new`/`v_new` must be
///   `None`, and with a `block_table` the capacity `max_blocks_per_seq ·
///   page_block_size` counts as filled.
/// * `block_table`: U32/I32 `(batch, max_blocks_per_seq)`; the caches are
///   then pages `(num_blocks, page_block_size, num_heads_kv, head_size)`.
///
/// More options (window, softcap, ALiBi, `cache_batch_idx`, split count)
/// and the logsumexp: [`FlashAttnKvCache::forward`].
#[allow(clippy::too_many_arguments)]
pub fn flash_attn_with_kvcache(
    q: &Tensor,
    k_cache: &Tensor,
    v_cache: &Tensor,
    k_new: Option<&Tensor>,
    v_new: Option<&Tensor>,
    cache_seqlens: Option<&Tensor>,
    block_table: Option<&Tensor>,
    softmax_scale: f32,
    causal: bool,
) -> Result<Tensor> {
    let (window_size_left, window_size_right) = crate::causal_window(causal);
    let op = FlashAttnKvCache { softmax_scale, alibi_slopes: None, window_size_left, window_size_right, softcap: None, num_splits: None };
    let full;
    let cache_seqlens = match (cache_seqlens, block_table) {
        (Some(l), _) => l,
        (None, _) if k_new.is_some() || v_new.is_some() => {
            return Err(err("`cache_seqlens` is None but `k_new`/`v_new` are given: appending needs each sequence's cached length"));
        }
        (None, None) => {
            crate::check_devices(&[("q", q), ("k_cache", k_cache), ("v_cache", v_cache)])?;
            return crate::flash_attn(q, k_cache, v_cache, softmax_scale, causal);
        }
        (None, Some(bt)) => {
            let (batch, max_blocks) = check::index_tensor("block_table", bt, "(batch, max_blocks_per_seq)", 2)?
                .try_into()
                .map(|[b, m]: [usize; 2]| (b, m))
                .map_err(|_| err("`block_table` must have rank 2"))?;
            let page = k_cache.dims().get(1).copied().unwrap_or(0);
            let capacity = u32::try_from(max_blocks * page).map_err(|_| err("`block_table`: capacity exceeds u32"))?;
            full = Tensor::full(capacity, batch, bt.device())?;
            &full
        }
    };
    let args = KvCacheArgs { k_new, v_new, cache_seqlens, cache_batch_idx: None, block_table };
    Ok(op.forward(q, k_cache, v_cache, args)?.0)
}
