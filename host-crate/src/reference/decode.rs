//! Decode in the CPU reference (`../shared/INFERENCE.md`, issue 9):
//!
//! * split-KV (flash-decoding): [`split_kv_partials`] runs FA2's loop over
//!   each split of the key range alone, leaving a normalized partial `O_i`
//!   and its `LSE_i` (an empty or fully masked split: `O_i = 0`,
//!   `LSE_i = -inf`), and [`combine_partials`] merges them;
//!   [`split_kv_forward`] is the two together;
//! * the KV cache: [`kvcache_attention`] appends new k/v in place at rows
//!   `cache_seqlens[b]..` of cache row `cache_batch_idx[b]` (or `b`) and
//!   attends to `cache_seqlens[b] + s_new` keys;
//! * paged KV: token `t` of sequence `b` lives in block
//!   `block_table[b][t / page_size]`, row `t % page_size`
//!   ([`paged_kvcache_attention`], [`attention_varlen_paged`],
//!   [`paged_to_contiguous`]). Any page size ≥ 1.
//!
//! Semantics are FlashAttention-2's `flash_attn_with_kvcache`: causal and
//! window aligned bottom-right over the attended keys; the window normalized
//! with the cache capacity (`seqlen_cache`, or `max_blocks_per_seq ·
//! page_size` when paged), as `mha_fwd_kvcache` does; ALiBi `(batch, nheads)`
//! indexed by the query's batch entry. Every check runs before the first
//! write: a call that fails leaves the cache untouched. Appends happen
//! before any attention (a sequence reading slots another one appends to
//! sees the new rows); two appends to the same slot are an error (on a GPU
//! they would race).
//!
//! The KV-cache and paged calls compute each sequence as `params.loop_order`
//! says: `Standard` materializes `S` (the definition), `Fa2`/`Fa1` (the
//! default) run FA2's blocked loop with `params.block` (default
//! [`DEFAULT_BLOCK`]), whose memory stays `O(Br·Bc)`: the CPU fallback's
//! choice. Both agree to rounding (the tests hold them to 1e-12 in f64).

use std::collections::HashMap;

use flash_attn_common::Real;
use ndarray::{
    Array1, Array2, Array3, Array4, Array5, ArrayView2, ArrayView3, ArrayView4, ArrayViewMut4, Axis, CowArray, s,
};

use super::AttnOutput;
use super::features::DEFAULT_BLOCK;
use super::features::{
    HostAlibi, Opts, Path, check_block, check_dense, check_dims, dim4, run_dense, run_seq, same,
};
use super::varlen::{VarlenOutput, check_dims3, check_query_side, run_varlen};
use crate::error::{FlashAttnError, Result};
use crate::params::ForwardParams;
use crate::varlen::{check_gqa, check_varlen_keys};

fn invalid(argument: &'static str, value: String, reason: &'static str) -> FlashAttnError {
    FlashAttnError::InvalidArgument { argument, value, reason }
}

// ---------------------------------------------------------------------------
// Split-KV and the combine.
// ---------------------------------------------------------------------------

/// Merges the normalized partials of `splits` key ranges, row by row
/// (INFERENCE.md, seed 003): `M = max_i LSE_i` (0 if every `LSE_i` is
/// `-inf`), `LSE = ln Σ_i exp(LSE_i − M) + M`, `O = Σ_i exp(LSE_i − LSE)·O_i`;
/// a row whose every partial is `-inf` gets `O = 0`, `LSE = -inf`.
///
/// `lse` is `(splits, rows)`, `o` `(splits, rows, d)`; returns `O` `(rows,
/// d)` and `LSE` `(rows)`.
///
/// # Panics
/// If `o`'s first two axes differ from `lse`'s.
pub fn combine_partials<F: Real>(lse: ArrayView2<F>, o: ArrayView3<F>) -> (Array2<F>, Array1<F>) {
    let (splits, rows) = lse.dim();
    let (o_splits, o_rows, d) = o.dim();
    assert!(
        (o_splits, o_rows) == (splits, rows),
        "combine_partials: o is {:?} but lse is {:?} (must be (splits, rows, d) and (splits, rows))",
        o.dim(),
        lse.dim()
    );
    let mut out = Array2::from_elem((rows, d), F::ZERO);
    let mut out_lse = Array1::from_elem(rows, F::NEG_INFINITY);
    for r in 0..rows {
        let col = lse.column(r);
        let mut m = F::NEG_INFINITY;
        for &x in col {
            m = m.max_nan(x);
        }
        // Never -inf − -inf: an all-empty row uses M = 0, and its Σ is 0.
        let m = if m == F::NEG_INFINITY { F::ZERO } else { m };
        let mut sum = F::ZERO;
        for &x in col {
            sum = sum + (x - m).exp();
        }
        let total = sum.ln() + m;
        out_lse[r] = total;
        if total == F::NEG_INFINITY {
            continue; // O = 0
        }
        let mut row = out.row_mut(r);
        for (i, &x) in col.iter().enumerate() {
            let w = (x - total).exp();
            for (acc, &y) in row.iter_mut().zip(o.slice(s![i, r, ..])) {
                *acc = *acc + w * y;
            }
        }
    }
    (out, out_lse)
}

/// The partials of split-KV, in the layout of FlashAttention-2's scratch
/// buffers (f32 there, `F` here).
#[derive(Clone, Debug, PartialEq)]
pub struct SplitPartials<F> {
    /// `(splits, batch, nheads, seqlen_q, headdim)`: `O_i`, normalized over
    /// split `i`'s keys (0 where the split has no visible key).
    pub o: Array5<F>,
    /// `(splits, batch, nheads, seqlen_q)`: `LSE_i` (`-inf` where the split
    /// has no visible key).
    pub lse: Array4<F>,
}

/// `split_bounds` = `[0 = b_0 ≤ b_1 ≤ … ≤ b_n = seqlen_k]`, `n ≥ 1`.
fn check_split_bounds(split_bounds: &[usize], seqlen_k: usize) -> Result<()> {
    let reason = "split boundaries must be non-decreasing key indices from 0 to seqlen_k (n + 1 entries for n splits)";
    let (Some(&first), Some(&last)) = (split_bounds.first(), split_bounds.last()) else {
        return Err(invalid("split_bounds", "[]".into(), reason));
    };
    if split_bounds.len() < 2 || first != 0 || last != seqlen_k || split_bounds.windows(2).any(|w| w[1] < w[0]) {
        return Err(invalid("split_bounds", format!("{split_bounds:?} with seqlen_k = {seqlen_k}"), reason));
    }
    Ok(())
}

/// Split-KV partials: split `i` covers keys `split_bounds[i]..split_bounds[i+1]`
/// (any boundaries, empty splits included) and runs FA2's blocked loop over
/// them alone (blocks `params.block`, default [`DEFAULT_BLOCK`], whatever
/// `params.loop_order`), with
/// every option of [`super::attention`] (window normalized with `seqlen_k`).
pub fn split_kv_partials<F: Real>(
    q: ArrayView4<F>,
    k: ArrayView4<F>,
    v: ArrayView4<F>,
    params: &ForwardParams,
    alibi: Option<HostAlibi<'_>>,
    split_bounds: &[usize],
) -> Result<SplitPartials<F>> {
    let opts = check_dense(&q, &k, &v, params, alibi.as_ref())?;
    let (br, bc) = params.block.unwrap_or(DEFAULT_BLOCK);
    check_block(br, bc)?;
    check_split_bounds(split_bounds, k.dim().1)?;
    let (batch, sq, nheads, d) = q.dim();
    let splits = split_bounds.len() - 1;
    let mut o = Array5::from_elem((splits, batch, nheads, sq, d), F::ZERO);
    let mut lse = Array4::from_elem((splits, batch, nheads, sq), F::NEG_INFINITY);
    for (i, w) in split_bounds.windows(2).enumerate() {
        let part = run_dense(q, k, v, alibi, &opts, Path::Online { br, bc, keys: (w[0], w[1]) });
        // (batch, sq, h, d) -> (batch, h, sq, d)
        o.index_axis_mut(Axis(0), i).assign(&part.o.view().permuted_axes([0, 2, 1, 3]));
        lse.index_axis_mut(Axis(0), i).assign(&part.lse);
    }
    Ok(SplitPartials { o, lse })
}

/// [`split_kv_partials`] then [`combine_partials`] per (batch, head): the
/// result of [`super::attention`] up to rounding, for any split boundaries.
pub fn split_kv_forward<F: Real>(
    q: ArrayView4<F>,
    k: ArrayView4<F>,
    v: ArrayView4<F>,
    params: &ForwardParams,
    alibi: Option<HostAlibi<'_>>,
    split_bounds: &[usize],
) -> Result<AttnOutput<F>> {
    let parts = split_kv_partials(q, k, v, params, alibi, split_bounds)?;
    let (batch, sq, nheads, d) = q.dim();
    let mut o = Array4::from_elem((batch, sq, nheads, d), F::ZERO);
    let mut lse = Array3::from_elem((batch, nheads, sq), F::NEG_INFINITY);
    for b in 0..batch {
        for h in 0..nheads {
            let (ob, lb) = combine_partials(parts.lse.slice(s![.., b, h, ..]), parts.o.slice(s![.., b, h, .., ..]));
            o.slice_mut(s![b, .., h, ..]).assign(&ob);
            lse.slice_mut(s![b, h, ..]).assign(&lb);
        }
    }
    Ok(AttnOutput { o, lse })
}

// ---------------------------------------------------------------------------
// Where a sequence's tokens live: a contiguous cache row or pages.
// ---------------------------------------------------------------------------

/// Token placement of a cache: `(outer index, row)` of token `t` of sequence
/// `b` in a `(outer, rows, nheads_k, d)` store.
enum Placement<'t> {
    /// Sequence `b` owns cache row `rows[b]`.
    Contiguous { rows: Vec<usize> },
    /// Paged: block `table[b][t / page_size]`, row `t % page_size`.
    Paged { table: ArrayView2<'t, i32>, page_size: usize, num_blocks: usize },
}

impl Placement<'_> {
    fn slot(&self, b: usize, t: usize) -> Result<(usize, usize)> {
        match self {
            Placement::Contiguous { rows } => Ok((rows[b], t)),
            Placement::Paged { table, page_size, num_blocks } => {
                let i = t / page_size;
                let e = table[[b, i]];
                if e < 0 || e as usize >= *num_blocks {
                    return Err(invalid(
                        "block_table",
                        format!("block_table[{b}][{i}] = {e}, num_blocks = {num_blocks} (token {t} of sequence {b})"),
                        "an entry a sequence uses must be a block of the cache (0..num_blocks)",
                    ));
                }
                Ok((e as usize, t % page_size))
            }
        }
    }

    /// Slots of tokens `0..len` of sequence `b`.
    fn slots(&self, b: usize, len: usize) -> Result<Vec<(usize, usize)>> {
        (0..len).map(|t| self.slot(b, t)).collect()
    }
}

/// Copies the tokens at `slots` of a `(outer, rows, hk, d)` store into a
/// `(len, hk, d)` array.
fn gather_slots<F: Real>(store: ArrayView4<F>, slots: &[(usize, usize)]) -> Array3<F> {
    let (_, _, hk, d) = store.dim();
    let mut out = Array3::from_elem((slots.len(), hk, d), F::ZERO);
    for (t, &(blk, row)) in slots.iter().enumerate() {
        out.index_axis_mut(Axis(0), t).assign(&store.slice(s![blk, row, .., ..]));
    }
    out
}

/// A paged KV cache, read-only: `k_pages`/`v_pages` `(num_blocks,
/// page_size, nheads_k, headdim)`, `block_table` `(batch,
/// max_blocks_per_seq)` i32.
#[derive(Clone, Copy, Debug)]
pub struct PagedKv<'a, F> {
    /// Key pages `(num_blocks, page_size, nheads_k, headdim)`.
    pub k_pages: ArrayView4<'a, F>,
    /// Value pages, shaped like `k_pages`.
    pub v_pages: ArrayView4<'a, F>,
    /// `(batch, max_blocks_per_seq)`: sequence `b`'s `i`-th page.
    pub block_table: ArrayView2<'a, i32>,
}

/// A paged KV cache that new keys and values are appended to
/// ([`paged_kvcache_attention`]).
#[derive(Debug)]
pub struct PagedKvMut<'a, F> {
    /// Key pages `(num_blocks, page_size, nheads_k, headdim)`.
    pub k_pages: ArrayViewMut4<'a, F>,
    /// Value pages, shaped like `k_pages`.
    pub v_pages: ArrayViewMut4<'a, F>,
    /// `(batch, max_blocks_per_seq)`: sequence `b`'s `i`-th page.
    pub block_table: ArrayView2<'a, i32>,
}

impl<F> PagedKvMut<'_, F> {
    /// The same cache, read-only.
    pub fn view(&self) -> PagedKv<'_, F> {
        PagedKv { k_pages: self.k_pages.view(), v_pages: self.v_pages.view(), block_table: self.block_table.view() }
    }
}

/// Shapes of a paged cache; returns its placement and capacity per sequence
/// (`max_blocks_per_seq · page_size`).
fn check_pages<'t>(ks: [usize; 4], vs: [usize; 4], block_table: ArrayView2<'t, i32>, batch: usize) -> Result<(Placement<'t>, usize)> {
    let [num_blocks, page_size, _, _] = ks;
    if page_size == 0 {
        return Err(invalid("k_pages", format!("shape {ks:?}"), "page_size (axis 1 of the pages) must be ≥ 1"));
    }
    check_dims("k_pages", ks, &[2, 3])?;
    let rule = "v_pages must have the shape of k_pages (num_blocks, page_size, nheads_k, headdim)";
    for (a, axis) in ["num_blocks", "page_size", "nheads_k", "headdim"].into_iter().enumerate() {
        same("v_pages", axis, vs[a], ks[a], rule)?;
    }
    let (rows, max_blocks) = block_table.dim();
    same("block_table", "batch", rows, batch, "block_table is (batch, max_blocks_per_seq)")?;
    let capacity = paged_capacity(max_blocks, page_size)?;
    Ok((Placement::Paged { table: block_table, page_size, num_blocks }, capacity))
}

/// Keys per sequence of a paged cache, `max_blocks_per_seq · page_size`,
/// within the kernels' 32-bit lengths.
pub(crate) fn paged_capacity(max_blocks_per_seq: usize, page_size: usize) -> Result<usize> {
    let capacity = max_blocks_per_seq.saturating_mul(page_size);
    if u32::try_from(capacity).is_err() {
        let (argument, axis, max) = ("block_table", "max_blocks_per_seq · page_size", u32::MAX as usize);
        return Err(FlashAttnError::DimTooLarge { argument, axis, value: capacity, max });
    }
    Ok(capacity)
}

/// `lens[b]` (i32, named `argument`) as lengths `0..=capacity`.
pub(crate) fn check_lengths(argument: &'static str, lens: &[i32], batch: usize, capacity: usize) -> Result<Vec<usize>> {
    if lens.len() != batch {
        return Err(invalid(argument, format!("{} entries, batch = {batch}", lens.len()), "must hold one entry per sequence (batch)"));
    }
    lens.iter()
        .enumerate()
        .map(|(b, &n)| {
            if n < 0 || n as usize > capacity {
                Err(invalid(
                    argument,
                    format!("{argument}[{b}] = {n}, cache capacity = {capacity}"),
                    "a sequence length must be within 0..=the cache's capacity per sequence (seqlen_cache, or max_blocks_per_seq · page_size)",
                ))
            } else {
                Ok(n as usize)
            }
        })
        .collect()
}

/// The contiguous copy of a paged cache: `(batch, max_blocks_per_seq ·
/// page_size, nheads_k, headdim)` k and v, whose row `t < seqlens[b]` of
/// sequence `b` is token `t` of its pages; rows past `seqlens[b]` are 0
/// (table entries past a sequence's length are never read).
pub fn paged_to_contiguous<F: Real>(pages: &PagedKv<'_, F>, seqlens: &[i32]) -> Result<(Array4<F>, Array4<F>)> {
    let batch = pages.block_table.dim().0;
    let (place, capacity) = check_pages(dim4(&pages.k_pages), dim4(&pages.v_pages), pages.block_table, batch)?;
    let lens = check_lengths("seqlens", seqlens, batch, capacity)?;
    let (_, _, hk, d) = pages.k_pages.dim();
    let mut k = Array4::from_elem((batch, capacity, hk, d), F::ZERO);
    let mut v = k.clone();
    for (b, &n) in lens.iter().enumerate() {
        let slots = place.slots(b, n)?;
        k.slice_mut(s![b, ..n, .., ..]).assign(&gather_slots(pages.k_pages, &slots));
        v.slice_mut(s![b, ..n, .., ..]).assign(&gather_slots(pages.v_pages, &slots));
    }
    Ok((k, v))
}

// ---------------------------------------------------------------------------
// The KV-cache call, contiguous or paged.
// ---------------------------------------------------------------------------

/// New keys and values to append, `(batch, s_new, nheads_k, d)` each.
type NewKv<'a, 'b, F> = (Option<ArrayView4<'a, F>>, Option<ArrayView4<'b, F>>);

/// Checks the k/v to append (both or neither, `(batch, s_new, nheads_k, d)`);
/// returns `s_new` (0 without).
fn check_new_kv((k_new, v_new): (Option<[usize; 4]>, Option<[usize; 4]>), (batch, nheads_k, d): (usize, usize, usize)) -> Result<usize> {
    match (k_new, v_new) {
        (None, None) => Ok(0),
        (Some(kns), Some(vns)) => {
            let rule = "k and v to append are (batch, s_new, nheads_k, headdim)";
            for (a, (axis, want)) in [("batch", batch), ("seqlen", kns[1]), ("nheads", nheads_k), ("headdim", d)].into_iter().enumerate() {
                same("k_new", axis, kns[a], want, rule)?;
                same("v_new", axis, vns[a], want, rule)?;
            }
            Ok(kns[1])
        }
        (Some(_), None) => Err(invalid("v_new", "None".into(), "new keys and values must be given together")),
        (None, Some(_)) => Err(invalid("k_new", "None".into(), "new keys and values must be given together")),
    }
}

/// The slots of the `cached[b] + s_new` tokens each sequence attends to
/// (every table entry checked), refusing two appends to one slot.
fn attended_slots(place: &Placement<'_>, cached: &[usize], s_new: usize) -> Result<Vec<Vec<(usize, usize)>>> {
    let slots: Vec<Vec<(usize, usize)>> =
        cached.iter().enumerate().map(|(b, &c)| place.slots(b, c + s_new)).collect::<Result<_>>()?;
    let mut writer: HashMap<(usize, usize), usize> = HashMap::new();
    for (b, (sl, &c)) in slots.iter().zip(cached).enumerate() {
        for &slot in &sl[c..] {
            if let Some(other) = writer.insert(slot, b) {
                return Err(invalid(
                    "cache_seqlens",
                    format!("sequences {other} and {b} both append to row {} of cache row / block {}", slot.1, slot.0),
                    "two sequences append to the same cache slot (shared cache_batch_idx or block_table entries)",
                ));
            }
        }
    }
    Ok(slots)
}

/// What the checks of a KV-cache call leave: the cached lengths, the
/// options and, per sequence, the slots of the keys it attends to.
struct KvChecked<F> {
    cached: Vec<usize>,
    opts: Opts<F>,
    path: Path,
    slots: Vec<Vec<(usize, usize)>>,
}

/// Every check of a KV-cache call over a `(outer, rows, hk, d)` store with
/// `place` (shapes, lengths, table entries, append slots), touching nothing.
#[allow(clippy::too_many_arguments)]
fn kvcache_checks<F: Real>(
    qs: [usize; 4],
    store: [usize; 4],
    place: &Placement<'_>,
    capacity: usize,
    cache_seqlens: &[i32],
    new: (Option<[usize; 4]>, Option<[usize; 4]>),
    params: &ForwardParams,
    alibi: Option<&HostAlibi<'_>>,
) -> Result<KvChecked<F>> {
    check_dims("q", qs, &[0, 2, 3])?;
    let [batch, _, nheads, d] = qs;
    let [_, _, nheads_k, dk] = store;
    same("k_cache", "headdim", dk, d, "k_cache is (batch_c, seqlen_cache, nheads_k, headdim), q (batch, seqlen_q, nheads, headdim)")?;
    check_gqa(nheads, nheads_k)?;
    if let Some(a) = alibi {
        a.check(batch, nheads)?;
    }
    let cached = check_lengths("cache_seqlens", cache_seqlens, batch, capacity)?;
    let s_new = check_new_kv(new, (batch, nheads_k, d))?;
    if let Some((b, &c)) = cached.iter().enumerate().find(|&(_, &c)| c + s_new > capacity) {
        return Err(invalid(
            "k_new",
            format!("sequence {b}: cache_seqlens[{b}] = {c} + {s_new} new rows > capacity {capacity}"),
            "appending would write past the cache's capacity per sequence",
        ));
    }
    let opts = Opts::resolve(params, d, capacity)?;
    let path = Path::of(params)?;
    let slots = attended_slots(place, &cached, s_new)?;
    Ok(KvChecked { cached, opts, path, slots })
}

/// The KV-cache call over a `(outer, rows, hk, d)` store with `place`:
/// checks (all before the first write), appends, attends.
#[allow(clippy::too_many_arguments)]
fn kvcache_core<F: Real>(
    q: ArrayView4<F>,
    mut k_store: ArrayViewMut4<F>,
    mut v_store: ArrayViewMut4<F>,
    place: &Placement<'_>,
    capacity: usize,
    cache_seqlens: &[i32],
    (k_new, v_new): NewKv<'_, '_, F>,
    params: &ForwardParams,
    alibi: Option<HostAlibi<'_>>,
) -> Result<AttnOutput<F>> {
    let qs = dim4(&q);
    let new = (k_new.as_ref().map(dim4), v_new.as_ref().map(dim4));
    let KvChecked { cached, opts, path, slots, .. } =
        kvcache_checks(qs, dim4(&k_store.view()), place, capacity, cache_seqlens, new, params, alibi.as_ref())?;
    let (batch, _, nheads, d) = q.dim();
    // Append.
    if let (Some(kn), Some(vn)) = (k_new, v_new) {
        for (b, (sl, &c)) in slots.iter().zip(&cached).enumerate() {
            for (t, &(blk, row)) in sl[c..].iter().enumerate() {
                k_store.slice_mut(s![blk, row, .., ..]).assign(&kn.slice(s![b, t, .., ..]));
                v_store.slice_mut(s![blk, row, .., ..]).assign(&vn.slice(s![b, t, .., ..]));
            }
        }
    }
    // Attend to cache_seqlens[b] + s_new keys.
    let sq = qs[1];
    let mut o = Array4::from_elem((batch, sq, nheads, d), F::ZERO);
    let mut lse = Array3::from_elem((batch, nheads, sq), F::NEG_INFINITY);
    for (b, sl) in slots.iter().enumerate() {
        let (kb, vb) = (gather_slots(k_store.view(), sl), gather_slots(v_store.view(), sl));
        run_seq(
            (q.slice(s![b, .., .., ..]), kb.view(), vb.view()),
            alibi.map(|a| a.of_seq(b, nheads)),
            &opts,
            path,
            (o.slice_mut(s![b, .., .., ..]), lse.slice_mut(s![b, .., ..])),
        );
    }
    Ok(AttnOutput { o, lse })
}

/// Attention against a contiguous KV cache (`flash_attn_with_kvcache`).
///
/// q `(batch, seqlen_q, nheads, d)`; `k_cache`/`v_cache` `(batch_c,
/// seqlen_cache, nheads_k, d)`; `cache_seqlens[b]` (0 allowed) rows of cache
/// row `cache_batch_idx[b]` (default `b`, then `batch_c ≥ batch`) are valid.
/// If `k_new`/`v_new` `(batch, s_new, nheads_k, d)` are given they are
/// written at rows `cache_seqlens[b]..+s_new` first (rows outside are not
/// touched), then sequence `b` attends to `cache_seqlens[b] + s_new` keys,
/// causal/window bottom-right (see the module docs).
///
/// Errors: shapes, GQA, ALiBi, `cache_seqlens` of the wrong length, negative
/// or beyond `seqlen_cache`, appending past `seqlen_cache`, a
/// `cache_batch_idx` of the wrong length or out of `0..batch_c`, a repeated
/// `cache_batch_idx` entry when appending, the [`ForwardParams::resolve`]
/// errors. The caches are unchanged when an error is returned.
#[allow(clippy::too_many_arguments)]
pub fn kvcache_attention<F: Real>(
    q: ArrayView4<F>,
    k_cache: &mut Array4<F>,
    v_cache: &mut Array4<F>,
    cache_seqlens: &[i32],
    k_new: Option<ArrayView4<F>>,
    v_new: Option<ArrayView4<F>>,
    cache_batch_idx: Option<&[i32]>,
    params: &ForwardParams,
    alibi: Option<HostAlibi<'_>>,
) -> Result<AttnOutput<F>> {
    let ks = dim4(&k_cache.view());
    let place = contiguous_placement(ks, dim4(&v_cache.view()), q.dim().0, cache_batch_idx)?;
    kvcache_core(q, k_cache.view_mut(), v_cache.view_mut(), &place, ks[1], cache_seqlens, (k_new, v_new), params, alibi)
}

/// The placement of a contiguous cache `(batch_c, seqlen_cache, nheads_k,
/// d)`: sequence `b` in cache row `cache_batch_idx[b]` (default `b`).
fn contiguous_placement<'t>(ks: [usize; 4], vs: [usize; 4], batch: usize, cache_batch_idx: Option<&[i32]>) -> Result<Placement<'t>> {
    check_dims("k_cache", ks, &[0, 2, 3])?;
    let rule = "v_cache must have the shape of k_cache (batch_c, seqlen_cache, nheads_k, headdim)";
    for (a, axis) in ["batch", "seqlen", "nheads", "headdim"].into_iter().enumerate() {
        same("v_cache", axis, vs[a], ks[a], rule)?;
    }
    let batch_c = ks[0];
    let rows = match cache_batch_idx {
        None if batch_c < batch => {
            return Err(invalid(
                "k_cache",
                format!("batch_c = {batch_c}, batch = {batch}"),
                "without cache_batch_idx sequence b uses cache row b: the cache needs batch_c ≥ batch rows",
            ));
        }
        None => (0..batch).collect(),
        Some(idx) if idx.len() != batch => {
            return Err(invalid("cache_batch_idx", format!("{} entries, batch = {batch}", idx.len()), "must hold one entry per sequence (batch)"));
        }
        Some(idx) => idx
            .iter()
            .enumerate()
            .map(|(b, &i)| {
                if i < 0 || i as usize >= batch_c {
                    Err(invalid(
                        "cache_batch_idx",
                        format!("cache_batch_idx[{b}] = {i}, batch_c = {batch_c}"),
                        "must index a row of the cache (0..batch_c)",
                    ))
                } else {
                    Ok(i as usize)
                }
            })
            .collect::<Result<_>>()?,
    };
    Ok(Placement::Contiguous { rows })
}

/// The cache of a KV-cache call, by shape, for [`check_kvcache_call`].
#[derive(Clone, Copy, Debug)]
pub enum CacheShape<'t> {
    /// `k_cache`/`v_cache` `(batch_c, seqlen_cache, nheads_k, d)`.
    Contiguous {
        /// `k_cache`'s shape.
        k: [usize; 4],
        /// `v_cache`'s shape.
        v: [usize; 4],
        /// Optional `(batch)`: the cache row of each sequence (default `b`).
        cache_batch_idx: Option<&'t [i32]>,
    },
    /// `k_pages`/`v_pages` `(num_blocks, page_size, nheads_k, d)`.
    Paged {
        /// `k_pages`' shape.
        k: [usize; 4],
        /// `v_pages`' shape.
        v: [usize; 4],
        /// `(batch, max_blocks_per_seq)`: sequence `b`'s `i`-th page.
        block_table: ArrayView2<'t, i32>,
    },
}

/// Every host-side check of [`kvcache_attention`] / [`paged_kvcache_attention`]
/// (shapes, `cache_seqlens`, `cache_batch_idx` and block-table entries,
/// appends within the capacity and to distinct slots, the options), without
/// computing anything: the same typed errors. `q` and the new k/v by shape.
pub fn check_kvcache_call(
    q: [usize; 4],
    cache: CacheShape<'_>,
    cache_seqlens: &[i32],
    new: (Option<[usize; 4]>, Option<[usize; 4]>),
    params: &ForwardParams,
    alibi: Option<&HostAlibi<'_>>,
) -> Result<()> {
    let (place, capacity, store) = match cache {
        CacheShape::Contiguous { k, v, cache_batch_idx } => (contiguous_placement(k, v, q[0], cache_batch_idx)?, k[1], k),
        CacheShape::Paged { k, v, block_table } => {
            let (place, capacity) = check_pages(k, v, block_table, q[0])?;
            (place, capacity, k)
        }
    };
    kvcache_checks::<f64>(q, store, &place, capacity, cache_seqlens, new, params, alibi).map(|_| ())
}

/// [`kvcache_attention`] over a paged cache: token `t` of sequence `b` is
/// row `t % page_size` of block `block_table[b][t / page_size]`; new k/v are
/// appended in place into the pages. The capacity per sequence is
/// `max_blocks_per_seq · page_size` (also the window normalization's
/// `seqlen_k`, as FA2); `cache_batch_idx` does not exist here (FA2 neither).
///
/// Errors: those of [`kvcache_attention`], a zero page size, a table entry
/// that a sequence uses (for its `cache_seqlens[b] + s_new` tokens) outside
/// `0..num_blocks`, two sequences appending to the same slot.
pub fn paged_kvcache_attention<F: Real>(
    q: ArrayView4<F>,
    pages: PagedKvMut<'_, F>,
    cache_seqlens: &[i32],
    k_new: Option<ArrayView4<F>>,
    v_new: Option<ArrayView4<F>>,
    params: &ForwardParams,
    alibi: Option<HostAlibi<'_>>,
) -> Result<AttnOutput<F>> {
    let PagedKvMut { k_pages, v_pages, block_table } = pages;
    let (place, capacity) = check_pages(dim4(&k_pages.view()), dim4(&v_pages.view()), block_table, q.dim().0)?;
    kvcache_core(q, k_pages, v_pages, &place, capacity, cache_seqlens, (k_new, v_new), params, alibi)
}

/// Varlen prefill over a paged cache (prefix caching, `flash_attn_varlen_func`
/// with a `block_table`): q `(total_q, nheads, d)` and `cu_seqlens_q` as in
/// [`super::attention_varlen`]; sequence `b` attends to the first
/// `seqused_k[b]` (default `cu_seqlens_k[b+1] − cu_seqlens_k[b]`) tokens of its
/// pages (`cu_seqlens_k` gives lengths only: the keys are in the pages). The
/// window is normalized with `max_seqlen_k`.
///
/// Errors: those of [`super::attention_varlen`] (but for `cu_seqlens_k`'s
/// bound on buffer rows, which pages do not have), a zero page size, a
/// sequence longer than `max_blocks_per_seq · page_size`, a used table
/// entry outside `0..num_blocks`.
#[allow(clippy::too_many_arguments)]
pub fn attention_varlen_paged<F: Real>(
    q: ArrayView3<F>,
    pages: &PagedKv<'_, F>,
    cu_seqlens_q: &[i32],
    cu_seqlens_k: &[i32],
    seqused_k: Option<&[i32]>,
    max_seqlen_q: usize,
    max_seqlen_k: usize,
    params: &ForwardParams,
    alibi: Option<HostAlibi<'_>>,
) -> Result<VarlenOutput<F>> {
    let qd = q.dim();
    let (spans, place, lens, opts, path) = varlen_paged_checks::<F>(
        [qd.0, qd.1, qd.2],
        (dim4(&pages.k_pages), dim4(&pages.v_pages), pages.block_table),
        (cu_seqlens_q, cu_seqlens_k, seqused_k),
        (max_seqlen_q, max_seqlen_k),
        params,
        alibi.as_ref(),
    )?;
    let kvs: Vec<(Array3<F>, Array3<F>)> = lens
        .iter()
        .enumerate()
        .map(|(b, &n)| {
            let sl = place.slots(b, n)?;
            Ok((gather_slots(pages.k_pages, &sl), gather_slots(pages.v_pages, &sl)))
        })
        .collect::<Result<_>>()?;
    Ok(run_varlen(q, &spans, alibi, &opts, path, |b, _| (CowArray::from(kvs[b].0.view()), CowArray::from(kvs[b].1.view()))))
}

type VarlenPagedChecked<'t, F> = (Vec<crate::varlen::SeqSpan>, Placement<'t>, Vec<usize>, Opts<F>, Path);

/// Every check of [`attention_varlen_paged`], touching nothing.
fn varlen_paged_checks<'t, F: Real>(
    q: [usize; 3],
    (ks, vs, block_table): ([usize; 4], [usize; 4], ArrayView2<'t, i32>),
    (cu_seqlens_q, cu_seqlens_k, seqused_k): (&[i32], &[i32], Option<&[i32]>),
    (max_seqlen_q, max_seqlen_k): (usize, usize),
    params: &ForwardParams,
    alibi: Option<&HostAlibi<'_>>,
) -> Result<VarlenPagedChecked<'t, F>> {
    let qd = (q[0], q[1], q[2]);
    check_dims3("q", qd)?;
    let spans = check_varlen_keys(cu_seqlens_q, cu_seqlens_k, seqused_k, qd.0, None, max_seqlen_q, max_seqlen_k)?;
    let (place, capacity) = check_pages(ks, vs, block_table, spans.len())?;
    let [_, _, nheads_k, dk] = ks;
    check_query_side(qd, nheads_k, dk, spans.len(), alibi)?;
    let used: Vec<i32> = spans.iter().map(|sp| sp.seqlen_k as i32).collect();
    let lens = check_lengths(if seqused_k.is_some() { "seqused_k" } else { "cu_seqlens_k" }, &used, spans.len(), capacity)?;
    let opts = Opts::resolve(params, qd.2, max_seqlen_k)?;
    let path = Path::of(params)?;
    for (b, &n) in lens.iter().enumerate() {
        place.slots(b, n)?;
    }
    Ok((spans, place, lens, opts, path))
}

/// Every host-side check of [`attention_varlen_paged`] (q `(total_q,
/// nheads, d)` and the pages by shape), without computing: the same typed
/// errors.
pub fn check_varlen_paged_call(
    q: [usize; 3],
    pages: ([usize; 4], [usize; 4], ArrayView2<'_, i32>),
    cu_seqlens: (&[i32], &[i32], Option<&[i32]>),
    max_seqlen: (usize, usize),
    params: &ForwardParams,
    alibi: Option<&HostAlibi<'_>>,
) -> Result<()> {
    varlen_paged_checks::<f64>(q, pages, cu_seqlens, max_seqlen, params, alibi).map(|_| ())
}
