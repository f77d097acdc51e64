//! The arguments of the decode calls: the caches (contiguous or paged,
//! appended to or read in place), the split-KV scratch, the options, and
//! the caller's or the library's outputs. Types only; the checks are in
//! `validate`.

use cudarc::driver::{CudaSlice, DevicePtr, DevicePtrMut};

use crate::tensor::{Tensor, TensorLayout, TensorMut};

/// A paged cache's block table: i32 `(batch, max_blocks_per_seq)`; key `t`
/// of sequence `b` is row `t % page_size` of page `block_table[b][t / page_size]`.
#[derive(Clone, Copy)]
pub struct BlockTable<'a> {
    pub table: &'a dyn DevicePtr<i32>,
    pub max_blocks_per_seq: usize,
}

impl<'a> BlockTable<'a> {
    /// `table` (i32, `batch · max_blocks_per_seq`, row major) read as
    /// `(batch, max_blocks_per_seq)`.
    pub fn new<B: DevicePtr<i32>>(table: &'a B, max_blocks_per_seq: usize) -> Self {
        Self { table, max_blocks_per_seq }
    }
}

/// The KV cache of a decode call. `layout` describes k_cache and v_cache
/// alike: `(batch_c, seqlen_cache, nheads_k, d)` or, with a block table,
/// `(num_pages, page_size, nheads_k, d)`.
pub struct KvCache<'a, T> {
    pub k_cache: &'a mut dyn DevicePtrMut<T>,
    pub v_cache: &'a mut dyn DevicePtrMut<T>,
    pub layout: TensorLayout,
    pub cache_seqlens: &'a dyn DevicePtr<i32>,
    pub cache_batch_idx: Option<&'a dyn DevicePtr<i32>>,
    pub block_table: Option<BlockTable<'a>>,
    /// New keys and values `(batch, s_new, nheads_k, d)` to append first.
    pub k_new: Option<Tensor<'a, dyn DevicePtr<T> + 'a>>,
    pub v_new: Option<Tensor<'a, dyn DevicePtr<T> + 'a>>,
}

impl<'a, T> KvCache<'a, T> {
    /// A contiguous cache `k_cache`, `v_cache` of `layout` with
    /// `cache_seqlens` (i32 `(batch)`) keys cached per sequence: no batch
    /// index, no block table, nothing appended. The `with_` methods add
    /// them:
    ///
    /// ```no_run
    /// # use flash_attn::{BlockTable, KvCache, Tensor, TensorLayout};
    /// # fn f(stream: &std::sync::Arc<cudarc::driver::CudaStream>) -> Result<(), flash_attn::FlashAttnError> {
    /// # let (pool, new) = (TensorLayout::contiguous([64, 16, 2, 64]), TensorLayout::contiguous([2, 1, 2, 64]));
    /// # let (mut k_pages, mut v_pages) = (stream.alloc_zeros::<half::f16>(131072)?, stream.alloc_zeros::<half::f16>(131072)?);
    /// # let (k_new, v_new) = (stream.alloc_zeros::<half::f16>(256)?, stream.alloc_zeros::<half::f16>(256)?);
    /// # let (cache_seqlens, table) = (stream.clone_htod(&[100i32, 200])?, stream.alloc_zeros::<i32>(64)?);
    /// let cache = KvCache::new(&mut k_pages, &mut v_pages, pool, &cache_seqlens)
    ///     .with_block_table(BlockTable::new(&table, 32))
    ///     .with_new(Tensor::new(&k_new, new), Tensor::new(&v_new, new));
    /// # Ok(()) }
    /// ```
    pub fn new<K, V, S>(k_cache: &'a mut K, v_cache: &'a mut V, layout: TensorLayout, cache_seqlens: &'a S) -> Self
    where
        K: DevicePtrMut<T>,
        V: DevicePtrMut<T>,
        S: DevicePtr<i32>,
    {
        Self { k_cache, v_cache, layout, cache_seqlens, cache_batch_idx: None, block_table: None, k_new: None, v_new: None }
    }
}

/// The `with_` methods of the decode caches, whose fields share their names:
/// a block table, a batch index and, for the caches a call appends to
/// (`appends`), the new rows (and [`DecodeCache`] from them).
macro_rules! cache_builders {
    ($cache:ident) => {
        impl<'a, T> $cache<'a, T> {
            /// The cache paged through `block_table` (`layout` then
            /// `(num_pages, page_size, nheads_k, d)`).
            pub fn with_block_table(self, block_table: BlockTable<'a>) -> Self {
                Self { block_table: Some(block_table), ..self }
            }

            /// Sequence `b` in cache row `cache_batch_idx[b]` (i32 `(batch)`).
            pub fn with_cache_batch_idx<I: DevicePtr<i32>>(self, cache_batch_idx: &'a I) -> Self {
                Self { cache_batch_idx: Some(cache_batch_idx), ..self }
            }
        }
    };
    ($cache:ident, appends) => {
        cache_builders!($cache);

        impl<'a, T> $cache<'a, T> {
            /// New keys and values `(batch, s_new, nheads_k, d)` in the
            /// call's element type, appended by the call before it attends.
            pub fn with_new<KN: DevicePtr<T>, VN: DevicePtr<T>>(self, k_new: Tensor<'a, KN>, v_new: Tensor<'a, VN>) -> Self {
                Self { k_new: Some(k_new.into()), v_new: Some(v_new.into()), ..self }
            }
        }

        impl<T> sealed::Sealed for $cache<'_, T> {}
        impl<T> DecodeCache for $cache<'_, T> {
            fn seqlen_new(&self) -> usize {
                self.k_new.as_ref().map_or(0, |k| k.layout.seqlen())
            }
        }
    };
}
pub(super) use cache_builders;

cache_builders!(KvCache, appends);

/// The KV caches of the decode calls ([`KvCache`], [`KvCacheRef`],
/// [`KvCacheFp8`](super::KvCacheFp8)), as
/// [`KvCacheCall::new`](crate::KvCacheCall::new) reads them. Sealed.
pub trait DecodeCache: sealed::Sealed {
    /// Keys per sequence that the call attends to past `cache_seqlens[b]`:
    /// the rows of `k_new` (0 without), or [`KvCacheRef::seqlen_new`].
    fn seqlen_new(&self) -> usize;
}

pub(super) mod sealed {
    pub trait Sealed {}
}

impl<T> sealed::Sealed for KvCacheRef<'_, T> {}
impl<T> DecodeCache for KvCacheRef<'_, T> {
    fn seqlen_new(&self) -> usize {
        self.seqlen_new
    }
}

cache_builders!(KvCacheRef);

/// Caller-owned split-KV scratch (fixed size: usable under CUDA-graph
/// capture): `o_accum` ≥ `max_splits · batch · nheads · seqlen_q · d` f32,
/// `lse_accum` ≥ `max_splits · batch · nheads · seqlen_q` f32.
///
/// `counters` (optional): u32 tile counters for the fused combine of the
/// flash-decoding kernels (the last split of each tile merges the partials:
/// no combine launch), at least `batch · nheads · ⌈seqlen_q / 16⌉` of them
/// (one per tile of 16 query rows of a (sequence, head); varlen: the
/// longest sequence's `seqlen_q`), **zeroed once** by the caller before the first call and
/// put back to 0 by every launch (keep them to one stream at a time).
/// Without them the combine runs as a second launch. Calls without a
/// caller scratch use the library's own per-stream counters.
pub struct SplitScratch<'a> {
    pub o_accum: &'a mut dyn DevicePtrMut<f32>,
    pub lse_accum: &'a mut dyn DevicePtrMut<f32>,
    pub max_splits: usize,
    pub counters: Option<&'a mut dyn DevicePtrMut<u32>>,
}

/// A KV cache read in place, nothing appended by the call: the attention
/// half of [`FlashAttention::forward_kvcache`](crate::FlashAttention::forward_kvcache), for callers that append
/// with [`FlashAttention::append_kv`](crate::FlashAttention::append_kv) themselves (one cache tensor at a
/// time, e.g. frameworks whose tensors mutate one at a time). Layout and
/// meaning as [`KvCache`].
pub struct KvCacheRef<'a, T> {
    pub k_cache: &'a dyn DevicePtr<T>,
    pub v_cache: &'a dyn DevicePtr<T>,
    pub layout: TensorLayout,
    pub cache_seqlens: &'a dyn DevicePtr<i32>,
    pub cache_batch_idx: Option<&'a dyn DevicePtr<i32>>,
    pub block_table: Option<BlockTable<'a>>,
    /// Keys already appended after `cache_seqlens[b]` that this call
    /// attends to: sequence `b` sees `cache_seqlens[b] + seqlen_new` keys.
    pub seqlen_new: usize,
}

impl<'a, T> KvCacheRef<'a, T> {
    /// A contiguous cache read in place, as [`KvCache::new`]: no batch
    /// index, no block table, no keys appended before the call; the
    /// `with_` methods add them.
    pub fn new<K, V, S>(k_cache: &'a K, v_cache: &'a V, layout: TensorLayout, cache_seqlens: &'a S) -> Self
    where
        K: DevicePtr<T>,
        V: DevicePtr<T>,
        S: DevicePtr<i32>,
    {
        Self { k_cache, v_cache, layout, cache_seqlens, cache_batch_idx: None, block_table: None, seqlen_new: 0 }
    }

    /// `seqlen_new` keys appended after `cache_seqlens[b]` before the call
    /// ([`FlashAttention::append_kv`](crate::FlashAttention::append_kv)), attended to by it.
    pub fn with_seqlen_new(self, seqlen_new: usize) -> Self {
        Self { seqlen_new, ..self }
    }
}

/// A paged cache read by a varlen prefill ([`FlashAttention::forward_varlen_paged`](crate::FlashAttention::forward_varlen_paged)):
/// `k_pages`/`v_pages` `(num_pages, page_size, nheads_k, d)` (`layout`),
/// key `t` of sequence `b` at row `t % page_size` of page
/// `block_table[b][t / page_size]`.
pub struct PagedCache<'a, T> {
    pub k_pages: &'a dyn DevicePtr<T>,
    pub v_pages: &'a dyn DevicePtr<T>,
    pub layout: TensorLayout,
    pub block_table: BlockTable<'a>,
}

impl<'a, T> PagedCache<'a, T> {
    /// Pages `k_pages`, `v_pages` of `layout` `(num_pages, page_size,
    /// nheads_k, d)` through `block_table`.
    pub fn new<K: DevicePtr<T>, V: DevicePtr<T>>(k_pages: &'a K, v_pages: &'a V, layout: TensorLayout, block_table: BlockTable<'a>) -> Self {
        Self { k_pages, v_pages, layout, block_table }
    }
}

impl<T> Clone for PagedCache<'_, T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for PagedCache<'_, T> {}

/// Options of a decode call.
#[derive(Default)]
pub struct DecodeOptions<'a> {
    /// `None`: the heuristic; `Some(1)`: no split; at most [`MAX_SPLITS`](super::MAX_SPLITS)
    /// (and the scratch's `max_splits`).
    pub num_splits: Option<usize>,
    pub scratch: Option<SplitScratch<'a>>,
    /// Forces a kernel by name (benchmarks, tests): a flash-decoding kernel
    /// ([`DEC_KERNELS`](super::kernels::DEC_KERNELS): its `name` runs the entry
    /// taking the full `AttnParams`, its `compact` name the entry taking the
    /// 184-byte `DecodeParams`, an error for a call that block cannot carry)
    /// or the call's `fa2d` tile kernel. `None`: the flash-decoding kernel
    /// for calls with at most 16 rows per (sequence, head) — through its
    /// compact entry when the call fits one — else the `fa2d` kernel.
    pub kernel: Option<&'static str>,
    /// A per-block timeline of the flash-decoding kernel (profiling:
    /// `decode-tune --timeline`): [`timeline::WORDS`](super::timeline::WORDS) u64 per thread block,
    /// written by thread 0 of each (SM, split, both clocks at each point
    /// of [`timeline::POINTS`](super::timeline::POINTS)). Calls that run another
    /// kernel return [`FlashAttnError::Unsupported`](crate::FlashAttnError::Unsupported).
    pub timeline: Option<&'a mut CudaSlice<u64>>,
    /// Split-KV in the flash-decoding kernels: `true` gives each split a
    /// fixed share of a tile's key blocks (split `s` of `ns`: blocks `s, s +
    /// ns, …` over a contiguous cache, and over pages of at least a key
    /// block on devices that gain from it ([`INTERLEAVE_PAGED`](flash_attn_common::INTERLEAVE_PAGED)); else a
    /// contiguous run), so the same inputs give the same bits on every run
    /// on one device. `false` (default), with the fused
    /// combine: a tile's key blocks go to its splits one at a time (a ticket
    /// count per tile, [`AttnParams::split_tickets`](flash_attn_common::AttnParams::split_tickets)), so splits on SMs that
    /// stream faster take more blocks and the call waits less for its
    /// slowest SM; the partial sums then run in a different order on each
    /// run (the result agrees to rounding, not bitwise). Paged caches,
    /// calls with fewer than [`MIN_TICKET_BLOCKS_PER_SPLIT`](super::MIN_TICKET_BLOCKS_PER_SPLIT) key blocks per
    /// split, kernels built without the schedule ([`DecKernel::tickets`](super::DecKernel::tickets)),
    /// and devices with more than [`MAX_TICKET_BANDWIDTH_PER_SM`](super::MAX_TICKET_BANDWIDTH_PER_SM) of DRAM
    /// bandwidth per SM (the H200) keep the fixed shares.
    pub deterministic: bool,
}

/// New keys or values `(batch, s_new, nheads_k, d)` to append ([`KvCache::k_new`]).
pub(super) type NewRows<'a, T> = Tensor<'a, dyn DevicePtr<T> + 'a>;

/// A caller's output buffers of [`FlashAttention::forward_kvcache_into`](crate::FlashAttention::forward_kvcache_into).
pub(super) struct CallerOut<'a, T> {
    pub(super) o: &'a mut dyn DevicePtrMut<T>,
    pub(super) o_layout: TensorLayout,
    pub(super) lse: &'a mut dyn DevicePtrMut<f32>,
}

impl<'a, T> CallerOut<'a, T> {
    pub(super) fn new<O: DevicePtrMut<T>>(o: TensorMut<'a, O>, lse: &'a mut dyn DevicePtrMut<f32>) -> Self {
        Self { o: o.data, o_layout: o.layout, lse }
    }

    /// What the plan checks of these buffers.
    pub(super) fn spec(&self) -> OutSpec {
        OutSpec { o_layout: self.o_layout, o_len: self.o.len(), lse_len: self.lse.len() }
    }
}

/// O and the LSE allocated by the library for a call.
pub(super) type OwnOut<T> = (CudaSlice<T>, CudaSlice<f32>);

/// The library's O and LSE of a call that was given no buffers
/// ([`FlashAttention::attend_launch`](crate::FlashAttention::attend_launch) allocates them exactly then).
pub(super) fn allocated<T>(own: Option<OwnOut<T>>) -> OwnOut<T> {
    own.expect("the library's buffers when the caller gives none")
}

/// What [`FlashAttention::plan_attend`](crate::FlashAttention::plan_attend) checks of a caller's outputs:
/// O's layout and buffer length, the LSE buffer's length.
#[derive(Clone, Copy)]
pub(super) struct OutSpec {
    pub(super) o_layout: TensorLayout,
    pub(super) o_len: usize,
    pub(super) lse_len: usize,
}
