//! Address-ordered block tables: [`order_block_table`] (the rule is in
//! its docs) and its GPU form.

use std::sync::Arc;

use cudarc::driver::{CudaStream, DevicePtr, DevicePtrMut, PushKernelArg};
use flash_attn_common::mask::{UNBOUNDED, normalize_window};
use flash_attn_common::page_order::{PageOrderParams, free_keys};

use crate::decode::DecodeCache;
use crate::device::FlashAttention;
use crate::dispatch::Launch;
use crate::error::{FlashAttnError, Result};
use crate::params::ForwardParams;
use crate::reference::decode::{check_lengths, paged_capacity};
use crate::tensor::{Extras, TensorLayout, Varlen};

/// The call an ordered table is made for: its options and shape, taken
/// from the arguments the call itself takes ([`KvCacheCall::new`],
/// [`KvCacheCall::varlen_paged`]), so that a table is never ordered for
/// another call than the one that reads it.
#[derive(Clone, Copy, Debug)]
pub struct KvCacheCall {
    /// The options of the call.
    params: ForwardParams,
    /// Whether the call passes ALiBi slopes (position-dependent: no order).
    alibi: bool,
    /// Query rows per sequence (≥ 1).
    seqlen_q: usize,
    /// Keys appended by the call (`k_new`/`v_new` rows; 0 without).
    s_new: usize,
}

impl KvCacheCall {
    /// The KV-cache call with these arguments:
    /// [`FlashAttention::forward_kvcache`]`(stream, q, cache, params, ext,
    /// opts)` is `KvCacheCall::new(&q.layout, &cache, params, ext)` (and
    /// likewise `_into`, `_ref`, `_fp8`): `q`'s query rows per sequence,
    /// the keys the cache appends (or counts as appended,
    /// [`KvCacheRef::seqlen_new`](crate::KvCacheRef::seqlen_new)), whether
    /// `ext` has ALiBi slopes.
    pub fn new<C: DecodeCache + ?Sized>(q: &TensorLayout, cache: &C, params: &ForwardParams, ext: &Extras<'_>) -> Self {
        Self::from_shape(params, ext.alibi_slopes.is_some(), q.seqlen(), cache.seqlen_new())
    }

    /// The varlen prefill over a paged cache with these arguments:
    /// [`FlashAttention::forward_varlen_paged`]`(stream, q, cache, varlen,
    /// params, ext, opts)` is `KvCacheCall::varlen_paged(&varlen, params,
    /// ext)`: `varlen.max_seqlen_q` query rows (the longest chunk), no key
    /// appended.
    pub fn varlen_paged(varlen: &Varlen<'_>, params: &ForwardParams, ext: &Extras<'_>) -> Self {
        Self::from_shape(params, ext.alibi_slopes.is_some(), varlen.max_seqlen_q, 0)
    }

    /// A call described by its shape, for callers that hold no call's
    /// arguments (host tables for the ndarray front end, adapters that take
    /// the step's shape): options `params`, ALiBi slopes or not, `seqlen_q`
    /// query rows and `s_new` keys appended per sequence.
    pub fn from_shape(params: &ForwardParams, alibi: bool, seqlen_q: usize, s_new: usize) -> Self {
        Self { params: *params, alibi, seqlen_q, s_new }
    }
}

/// The kernel of [`FlashAttention::order_block_table`].
pub const PAGE_ORDER_KERNELS: &[&str] = &["order_block_table"];
/// Largest `max_blocks_per_seq` the device sort takes (its row sorted in
/// 128 KB of shared memory: 524 288 keys per sequence in 16-token pages).
pub const MAX_DEVICE_ORDER_BLOCKS: usize = 1 << 15;
/// Most threads of the device sort's block (one block per row).
const MAX_ORDER_THREADS: usize = 1024;

/// Which keys of one sequence may be read in any order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct FreeKeys {
    seqlen_q: usize,
    s_new: usize,
    /// The right window bound after FlashAttention-2's normalization
    /// ([`UNBOUNDED`]: none).
    right: i32,
}

impl FreeKeys {
    /// The rule for `call` over a cache of `capacity` keys per sequence
    /// (the window normalization's `seqlen_k`, as the paged calls use).
    fn new(call: &KvCacheCall, capacity: usize) -> Result<Self> {
        let p = &call.params;
        if call.seqlen_q == 0 {
            return Err(invalid("seqlen_q", "0".into(), "a call has at least one query row"));
        }
        if call.alibi {
            return Err(invalid(
                "alibi_slopes",
                "given".into(),
                "ALiBi's bias depends on each key's position: its pages cannot be reordered",
            ));
        }
        let (left, right) = normalize_window(p.causal, p.window_left, p.window_right, capacity);
        if left != UNBOUNDED {
            return Err(invalid(
                "window_left",
                format!("{:?}", p.window_left),
                "a left window bound masks keys by position: its pages cannot be reordered",
            ));
        }
        let too_large = |argument, value: usize| FlashAttnError::DimTooLarge { argument, axis: "length", value, max: u32::MAX as usize };
        let seqlen_q = u32::try_from(call.seqlen_q).map_err(|_| too_large("seqlen_q", call.seqlen_q))? as usize;
        let s_new = u32::try_from(call.s_new).map_err(|_| too_large("s_new", call.s_new))? as usize;
        Ok(FreeKeys { seqlen_q, s_new, right })
    }

    /// The leading keys of a sequence with `cached` keys that every query
    /// row sees with no position-dependent term (the kernel's rule).
    fn count(&self, cached: usize) -> usize {
        free_keys(cached as u64, self.seqlen_q as u64, self.s_new as u64, self.right) as usize
    }
}

/// Sorts, in each row of a block table `(batch, max_blocks_per_seq)` (row
/// major, `batch = cache_seqlens.len()`), the slots of the full pages whose
/// keys are position-free for `call` (below) by page index; every other
/// slot is left as it was. Returns the number of slots ordered.
///
/// ```
/// use flash_attn::{ForwardParams, KvCacheCall, order_block_table};
///
/// // Two sequences, pages of 16 tokens, up to 4 pages each.
/// let mut table = vec![7, 2, 9, 0, /* */ 5, 1, 3, 8];
/// let cache_seqlens = [60, 40]; // 3 full pages + a partial one; 2 full + 1 partial
/// let params = ForwardParams { causal: true, ..Default::default() };
/// // One decode step: one query token, one key appended (described by
/// // hand: for a device call, `KvCacheCall::new` takes it from the call's
/// // arguments, see `FlashAttention::order_block_table`).
/// let call = KvCacheCall::from_shape(&params, false, 1, 1);
/// let ordered = order_block_table(&mut table, 4, 16, &cache_seqlens, &call)?;
/// // The full pages in address order; partial pages and unused slots stay put.
/// assert_eq!(table, [2, 7, 9, 0, /* */ 1, 5, 3, 8]);
/// assert_eq!(ordered, 5);
/// # Ok::<(), flash_attn::FlashAttnError>(())
/// ```
///
/// # Which pages move
/// Address-ordered block tables: a paged cache read in the order its pages
/// lie in memory.
///
/// Attention sums over keys. Where no mask and no bias depends on a key's
/// position, the order in which a block table lists a sequence's pages does
/// not change the result (up to the rounding of the sums). The DRAM cares:
/// 16-token pages placed by a random permutation of the pool stream 2–4%
/// slower than the same pages read in address order (docs/perf-notes.md,
/// decode steps 37–42: DRAM locality between 256 KB and 2 MB, not the
/// kernel). [`order_block_table`] sorts each row's *position-free* pages by
/// page index — by address — and leaves every other slot where it is.
///
/// Position-free, for one sequence of a call with `seqlen_q` query rows,
/// `cache_seqlens[b]` cached keys and `s_new` keys appended
/// (`seqlen_k = cache_seqlens[b] + s_new`, queries aligned bottom-right):
/// a full page all of whose keys are cached (`< cache_seqlens[b]`, so no
/// append writes into it) and seen by every query row, with no ALiBi bias
/// and no left window bound (those depend on the key's position). Causal
/// or a right window bound `r` let row 0 see keys up to
/// `seqlen_k − seqlen_q + r`; plain decode (one query token, or
/// `s_new ≥ seqlen_q − 1` with causal) sees all of them. The partial last
/// page and every slot past the ordered ones stay put, so appends and later
/// pages land where they did.
///
/// Varlen prefill over a paged cache (prefix caching,
/// `forward_varlen_paged`) is such a call with `s_new = 0`, each sequence's
/// key count as its cached length and the longest query chunk as
/// `seqlen_q` (more rows than a sequence has only order fewer pages).
///
/// An ordered table stays valid for later calls of the same kind as long as
/// sequences only grow (decode): its ordered pages stay full and cached.
/// Order again after anything that shortens a sequence below them
/// (speculative decoding's rollback) or before a call with a sliding
/// window, ALiBi or a causal query block that does not see them all.
///
/// The result is a block table over the same pages that a call of the same
/// kind computes the same attention with (to rounding) and streams in
/// address order. Entries are not checked against the pool (the kernels
/// clamp them); the multiset of each row is unchanged.
///
/// Errors: `page_size` or `max_blocks_per_seq` 0, a table of another length,
/// a capacity over `u32`, `cache_seqlens` entries negative or past
/// `max_blocks_per_seq · page_size`, or a call whose keys are not
/// position-free (`seqlen_q` 0, ALiBi, a left window bound).
pub fn order_block_table(
    table: &mut [i32],
    max_blocks_per_seq: usize,
    page_size: usize,
    cache_seqlens: &[i32],
    call: &KvCacheCall,
) -> Result<usize> {
    let capacity = check_table(table.len(), max_blocks_per_seq, page_size, cache_seqlens.len())?;
    let cached = check_lengths("cache_seqlens", cache_seqlens, cache_seqlens.len(), capacity)?;
    let free = FreeKeys::new(call, capacity)?;
    let mut ordered = 0;
    for (row, cached) in table.chunks_exact_mut(max_blocks_per_seq).zip(cached) {
        let n = free.count(cached) / page_size;
        row[..n].sort_unstable();
        ordered += n;
    }
    Ok(ordered)
}

/// The checks of a block table's shape for `batch` sequences; returns the
/// capacity per sequence.
fn check_table(len: usize, max_blocks_per_seq: usize, page_size: usize, batch: usize) -> Result<usize> {
    if page_size == 0 {
        return Err(invalid("page_size", "0".into(), "a page holds at least one key"));
    }
    if max_blocks_per_seq == 0 {
        return Err(invalid("max_blocks_per_seq", "0".into(), "a block table row holds at least one slot"));
    }
    if batch.checked_mul(max_blocks_per_seq) != Some(len) {
        return Err(FlashAttnError::ShapeMismatch {
            argument: "block_table",
            axis: "length",
            actual: len,
            expected: batch.saturating_mul(max_blocks_per_seq),
            rule: "block_table is (batch, max_blocks_per_seq) with batch = cache_seqlens.len()",
        });
    }
    paged_capacity(max_blocks_per_seq, page_size)
}

/// The largest power of two ≤ `n` (0 for 0).
fn prev_power_of_two(n: usize) -> usize {
    if n == 0 { 0 } else { 1 << (usize::BITS - 1 - n.leading_zeros()) }
}

impl FlashAttention {
    /// [`order_block_table`] on the device, in place, stream-ordered: each
    /// row of `table` `(batch, max_blocks_per_seq)` with its position-free
    /// full pages for `call` sorted by page index, `batch =
    /// cache_seqlens.len()`. For tables that live on the GPU (a decode loop
    /// captured in a CUDA graph: the launch allocates and synchronizes
    /// nothing). `cache_seqlens` entries, which the host cannot see, are
    /// clamped to the capacity; only each row's own sorted slots are read
    /// and written. One launch of one thread block per row.
    ///
    /// Errors: those of [`order_block_table`] that the host can see, a
    /// `max_blocks_per_seq` above [`MAX_DEVICE_ORDER_BLOCKS`], buffers of
    /// another context than this `FlashAttention`'s.
    ///
    /// Ordered once before a decode loop, for the loop's call as
    /// [`KvCacheCall::new`] reads it from the call's own arguments (a
    /// function builds the step's cache, as an engine does each step):
    ///
    /// ```no_run
    /// # use std::sync::Arc;
    /// use cudarc::driver::{CudaSlice, CudaStream};
    /// use flash_attn::{BlockTable, DecodeOptions, Extras, FlashAttention, ForwardParams, KvCache, KvCacheCall, Tensor, TensorLayout};
    /// use half::f16;
    ///
    /// /// One step's cache: 64 pages of 16 keys, 32 pages per sequence, one new key each.
    /// fn step_cache<'a>(pages: [&'a mut CudaSlice<f16>; 2], table: &'a CudaSlice<i32>, lens: &'a CudaSlice<i32>, new: &'a [CudaSlice<f16>; 2]) -> KvCache<'a, f16> {
    ///     let (pool, new_l) = (TensorLayout::contiguous([64, 16, 2, 64]), TensorLayout::contiguous([2, 1, 2, 64]));
    ///     let [k, v] = pages;
    ///     KvCache::new(k, v, pool, lens).with_block_table(BlockTable::new(table, 32)).with_new(Tensor::new(&new[0], new_l), Tensor::new(&new[1], new_l))
    /// }
    ///
    /// # fn f(fa: &FlashAttention, stream: &Arc<CudaStream>) -> Result<(), flash_attn::FlashAttnError> {
    /// # let (mut k_pages, mut v_pages) = (stream.alloc_zeros::<f16>(131072)?, stream.alloc_zeros::<f16>(131072)?);
    /// # let (q, kv_new) = (stream.alloc_zeros::<f16>(1024)?, [stream.alloc_zeros::<f16>(256)?, stream.alloc_zeros::<f16>(256)?]);
    /// # let (lens, mut table) = (stream.clone_htod(&[100i32, 200])?, stream.alloc_zeros::<i32>(64)?);
    /// let step = TensorLayout::contiguous([2, 1, 8, 64]); // q: one token, 8 heads
    /// let (params, ext) = (ForwardParams { causal: true, ..Default::default() }, Extras::default());
    /// let call = KvCacheCall::new(&step, &step_cache([&mut k_pages, &mut v_pages], &table, &lens, &kv_new), &params, &ext);
    /// fa.order_block_table(stream, &mut table, 32, 16, &lens, &call)?;
    /// // … the decode loop, each step:
    /// let cache = step_cache([&mut k_pages, &mut v_pages], &table, &lens, &kv_new);
    /// let out = fa.forward_kvcache(stream, Tensor::new(&q, step), cache, &params, &ext, DecodeOptions::default())?;
    /// # Ok(()) }
    /// ```
    pub fn order_block_table(
        &self,
        stream: &Arc<CudaStream>,
        table: &mut dyn DevicePtrMut<i32>,
        max_blocks_per_seq: usize,
        page_size: usize,
        cache_seqlens: &dyn DevicePtr<i32>,
        call: &KvCacheCall,
    ) -> Result<()> {
        let batch = cache_seqlens.len();
        let capacity = check_table(table.len(), max_blocks_per_seq, page_size, batch)?;
        // The sort buffer: a power of two ≥ the row, within the device's
        // shared memory and MAX_DEVICE_ORDER_BLOCKS.
        let max = MAX_DEVICE_ORDER_BLOCKS.min(prev_power_of_two(self.limits().max_smem_per_block / 4));
        if max_blocks_per_seq > max {
            let (argument, axis) = ("block_table", "max_blocks_per_seq (the device sort's shared memory)");
            return Err(FlashAttnError::DimTooLarge { argument, axis, value: max_blocks_per_seq, max });
        }
        if u32::try_from(batch).is_err() {
            return Err(FlashAttnError::DimTooLarge { argument: "cache_seqlens", axis: "batch", value: batch, max: u32::MAX as usize });
        }
        let free = FreeKeys::new(call, capacity)?;
        for (name, s) in [("block_table", table.stream()), ("cache_seqlens", cache_seqlens.stream()), ("stream", stream)] {
            self.check_stream(name, s)?;
        }
        if batch == 0 {
            return Ok(());
        }
        let sort_len = max_blocks_per_seq.next_power_of_two();
        let (tp, _gt) = table.device_ptr_mut(stream);
        let (sp, _gs) = cache_seqlens.device_ptr(stream);
        let p = PageOrderParams {
            table_ptr: tp,
            cache_seqlens_ptr: sp,
            max_blocks_per_seq: max_blocks_per_seq as u32,
            page_size: page_size as u32,
            seqlen_q: free.seqlen_q as u32,
            s_new: free.s_new as u32,
            right: free.right,
            sort_len: sort_len as u32,
        };
        // A lane per two entries of the longest row, whole warps, at most 1024.
        let threads = (sort_len / 2).clamp(32, MAX_ORDER_THREADS) as u32;
        let launch = Launch { kernel: "order_block_table", grid: batch as u32, threads, smem_bytes: (sort_len * 4) as u32 };
        let (f, cfg) = self.prepare(&launch)?;
        let arg = crate::tc::KernelArg(p);
        // SAFETY: `order_block_table(p: PageOrderParams)`: the table holds
        // batch · max_blocks_per_seq i32 and cache_seqlens batch i32 (checked
        // above), page_size ≥ 1, sort_len a power of two ≥ max_blocks_per_seq
        // with sort_len · 4 bytes of shared memory (≤ 128 KB, within the
        // opt-in limit the module raised for every kernel).
        unsafe { stream.launch_builder(f).arg(&arg).launch(cfg) }?;
        Ok(())
    }
}

fn invalid(argument: &'static str, value: String, reason: &'static str) -> FlashAttnError {
    FlashAttnError::InvalidArgument { argument, value, reason }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(p: &ForwardParams, seqlen_q: usize, s_new: usize) -> KvCacheCall {
        KvCacheCall::from_shape(p, false, seqlen_q, s_new)
    }

    #[test]
    fn free_keys_follow_the_mask() {
        let plain = ForwardParams::default();
        let causal = ForwardParams { causal: true, ..Default::default() };
        let f = |p, sq, sn| FreeKeys::new(&call(p, sq, sn), 1000).unwrap();
        // Non-causal: every cached key.
        assert_eq!(f(&plain, 5, 0).count(37), 37);
        // Causal, one query: row 0 sees every key.
        assert_eq!(f(&causal, 1, 0).count(37), 37);
        // Causal, 4 rows, nothing appended: row 0 sees keys ≤ 37 − 4.
        assert_eq!(f(&causal, 4, 0).count(37), 34);
        // Causal, 4 rows over 4 appended keys: every cached key.
        assert_eq!(f(&causal, 4, 4).count(37), 37);
        assert_eq!(f(&causal, 4, 3).count(37), 37);
        assert_eq!(f(&causal, 4, 2).count(37), 36);
        // More rows than keys: none.
        assert_eq!(f(&causal, 50, 0).count(37), 0);
        // A right window of 2: two keys more.
        let right = ForwardParams { window_right: Some(2), ..Default::default() };
        assert_eq!(f(&right, 4, 0).count(37), 36);
        // A window side ≥ the capacity is unbounded (FA2's normalization).
        let wide = ForwardParams { window_left: Some(1000), ..Default::default() };
        assert_eq!(f(&wide, 1, 0).count(37), 37);
    }

    #[test]
    fn position_dependent_calls_are_refused() {
        let left = ForwardParams { causal: true, window_left: Some(8), ..Default::default() };
        let e = FreeKeys::new(&call(&left, 1, 0), 1000).unwrap_err();
        assert!(matches!(e, FlashAttnError::InvalidArgument { argument: "window_left", .. }), "{e}");
        let p = ForwardParams::default();
        let e = FreeKeys::new(&KvCacheCall { alibi: true, ..call(&p, 1, 0) }, 1000).unwrap_err();
        assert!(matches!(e, FlashAttnError::InvalidArgument { argument: "alibi_slopes", .. }), "{e}");
        let e = FreeKeys::new(&call(&p, 0, 0), 1000).unwrap_err();
        assert!(matches!(e, FlashAttnError::InvalidArgument { argument: "seqlen_q", .. }), "{e}");
    }

    #[test]
    fn orders_full_free_pages_only() {
        let p = ForwardParams::default();
        // Two rows of 5 slots, pages of 4 keys: 13 keys = 3 full pages + 1
        // partial; 8 keys = 2 full pages.
        let mut t = vec![9, 3, 7, 1, 0, /**/ 6, 2, 8, 5, 4];
        let n = order_block_table(&mut t, 5, 4, &[13, 8], &call(&p, 1, 0)).unwrap();
        assert_eq!(n, 5);
        assert_eq!(t, vec![3, 7, 9, 1, 0, /**/ 2, 6, 8, 5, 4]);
    }

    #[test]
    fn bad_tables_are_typed_errors() {
        let p = ForwardParams::default();
        let c = call(&p, 1, 0);
        let mut t = vec![0; 6];
        let arg = |r: Result<usize>| match r.unwrap_err() {
            FlashAttnError::InvalidArgument { argument, .. } | FlashAttnError::ShapeMismatch { argument, .. } => argument,
            e => panic!("{e}"),
        };
        assert_eq!(arg(order_block_table(&mut t, 3, 0, &[1, 1], &c)), "page_size");
        assert_eq!(arg(order_block_table(&mut t, 0, 4, &[1, 1], &c)), "max_blocks_per_seq");
        assert_eq!(arg(order_block_table(&mut t, 3, 4, &[1, 1, 1], &c)), "block_table");
        assert_eq!(arg(order_block_table(&mut t, 3, 4, &[1, 13], &c)), "cache_seqlens");
        assert_eq!(arg(order_block_table(&mut t, 3, 4, &[-1, 0], &c)), "cache_seqlens");
        assert!(matches!(
            order_block_table(&mut t, 3, usize::MAX / 2, &[1, 1], &c),
            Err(FlashAttnError::DimTooLarge { .. })
        ));
        assert_eq!(t, vec![0; 6]);
    }
}

#[cfg(test)]
mod sort_tests {
    use flash_attn_common::page_order::{WARP_RUN, bitonic_pair, keeps_min};

    /// The device sort's schedule (kernel-crate/src/page_order.rs) run on
    /// the host lane by lane, shuffles as reads of the partner lane's
    /// registers: every shared-memory step's pairs cover each entry once,
    /// and the result is sorted.
    fn emulate(v: &[i32], warps: usize) -> Vec<i32> {
        let (n, n2) = (v.len(), v.len().next_power_of_two());
        let nt = warps * 32;
        let mut sm = vec![i32::MIN; n2]; // every entry must be written first
        let runs = n2.div_ceil(WARP_RUN);
        let top = n2.min(WARP_RUN);
        // One warp's run in registers: 32 lanes × 2.
        let steps = |x: &mut Vec<[i32; 2]>, base: usize, k: usize, j_top: usize| {
            let mut j = j_top;
            while j >= 2 {
                let y: Vec<[i32; 2]> = (0..32).map(|l| x[l ^ (j / 2)]).collect();
                for l in 0..32 {
                    let min = keeps_min(base + 2 * l, j, k);
                    for t in 0..2 {
                        x[l][t] = if min == (x[l][t] < y[l][t]) { x[l][t] } else { y[l][t] };
                    }
                }
                j /= 2;
            }
            for (l, xl) in x.iter_mut().enumerate() {
                let (lo, hi) = (xl[0].min(xl[1]), xl[0].max(xl[1]));
                *xl = if keeps_min(base + 2 * l, 1, k) { [lo, hi] } else { [hi, lo] };
            }
        };
        for w in 0..warps {
            for r in (w..runs).step_by(warps) {
                let ld = |e: usize| if e < n { v[e] } else { i32::MAX };
                let mut x: Vec<[i32; 2]> = (0..32).map(|l| [ld(r * WARP_RUN + 2 * l), ld(r * WARP_RUN + 2 * l + 1)]).collect();
                let mut k = 2;
                while k <= top {
                    steps(&mut x, r * WARP_RUN, k, k / 2);
                    k *= 2;
                }
                for (l, xl) in x.iter().enumerate() {
                    let e0 = r * WARP_RUN + 2 * l;
                    if e0 < n2 {
                        (sm[e0], sm[e0 + 1]) = (xl[0], xl[1]);
                    }
                }
            }
        }
        assert!(sm.iter().all(|&e| e != i32::MIN), "n2 {n2}: every entry stored by the first phase");
        let mut k = 2 * WARP_RUN;
        while k <= n2 {
            let mut j = k / 2;
            while j >= WARP_RUN {
                let mut seen = vec![0u8; n2];
                for tid in 0..nt {
                    for q in (tid..n2 / 2).step_by(nt) {
                        let (i, l) = bitonic_pair(q, j.trailing_zeros());
                        assert_eq!(l, i + j);
                        seen[i] += 1;
                        seen[l] += 1;
                        if (sm[i] > sm[l]) == (i & k == 0) {
                            sm.swap(i, l);
                        }
                    }
                }
                assert!(seen.iter().all(|&c| c == 1), "n2 {n2}, k {k}, j {j}: every entry in one pair");
                j /= 2;
            }
            for r in 0..runs {
                let base = r * WARP_RUN;
                let mut x: Vec<[i32; 2]> = (0..32).map(|l| [sm[base + 2 * l], sm[base + 2 * l + 1]]).collect();
                steps(&mut x, base, k, WARP_RUN / 2);
                for (l, xl) in x.iter().enumerate() {
                    (sm[base + 2 * l], sm[base + 2 * l + 1]) = (xl[0], xl[1]);
                }
            }
            k *= 2;
        }
        sm.truncate(n);
        sm
    }

    #[test]
    fn the_device_sort_schedule_sorts() {
        let mut x = 0x9E37_79B9u32;
        for n in (2..140).chain([255, 256, 257, 1000, 2048, 3000, 4096]) {
            for warps in [1, 4, 32] {
                let v: Vec<i32> = (0..n)
                    .map(|_| {
                        x ^= x << 13;
                        x ^= x >> 17;
                        x ^= x << 5;
                        (x % 5000) as i32 - 100
                    })
                    .collect();
                let mut want = v.clone();
                want.sort_unstable();
                assert_eq!(emulate(&v, warps), want, "n {n}, warps {warps}");
            }
        }
    }
}
