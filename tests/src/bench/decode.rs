//! What the decode benchmarks (`fa-bench-decode`, the `decode-tune`
//! example) share: the cell of the decode grid and its inputs on the GPU —
//! K/V caches filled with random values (contiguous, or paged with the pages
//! in a random order), one query token per sequence, full `cache_seqlens`,
//! and split scratch sized for 128 splits (with the fused combine's counters) — and one decode call over them.

use cudarc::driver::CudaSlice;
use flash_attn::{
    BlockTable, DecodeOptions, Extras, ForwardParams, KvCache, SplitScratch, Tensor, TensorLayout, TensorMut,
};

use super::Res;
use crate::{Gpu, Rng};

/// Query heads and head dim of every cell (Llama-3-8B's).
pub const H: usize = 32;
pub const D: usize = 128;
/// Splits the scratch of a cell holds.
pub const MAX_SPLITS: usize = 128;

/// One cell of the decode grid (bf16, `H` query heads, head dim `D`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cell {
    pub batch: usize,
    pub cache: usize,
    pub hk: usize,
    /// Page size; `None`: contiguous.
    pub page: Option<usize>,
}

impl Cell {
    /// K and V bytes read once.
    pub fn bytes(&self) -> f64 {
        (2 * self.batch * self.cache * self.hk * D * 2) as f64
    }
    pub fn layout(&self) -> String {
        self.page
            .map_or("contiguous".to_string(), |p| format!("paged {p}"))
    }
    /// The contiguous cell of the same shape (PyTorch's).
    pub fn contiguous(&self) -> Cell {
        Cell {
            page: None,
            ..*self
        }
    }
}

/// Where a paged cell's pages lie in the pool: a random permutation of the
/// whole pool (the benchmark's default: FlashAttention-2's tests draw block
/// tables so, the worst case for the DRAM), or shuffled only within groups
/// of `n` consecutive pages (`Grouped(1)`: in order) — a diagnostic of
/// how much of the paged cost is placement (perf notes, decode steps 37, 39).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum PageOrder {
    #[default]
    Random,
    Grouped(usize),
    /// A random permutation, then each run of `n` logical pages sorted by
    /// address: what a kernel reading each split's `n` pages in address
    /// order would stream (decode step 42).
    Sorted(usize),
    /// A random permutation, then in each sequence's row of pages, split
    /// into `splits` equal shares: the first `first` pages of each share
    /// left random, the others given the row's remaining pages in address
    /// order, share after share — what a kernel handing each split an
    /// address range of the row's pages (after `first` pages read in
    /// logical order) would stream (decode step 42).
    Ranged { splits: usize, first: usize },
    /// A random permutation, then each row as the library's
    /// [`flash_attn::order_block_table`] leaves it for the benchmark's call
    /// (one query token, no append, no mask: every full page by address) —
    /// what a caller that orders its tables gets.
    Ordered,
    /// The sequences' pages drawn at random from a pool `factor` times
    /// larger than they need (an allocator's pool after churn: a sequence's
    /// pages scattered among others'), rows `ordered` by the library or not.
    Scattered { factor: usize, ordered: bool },
}

impl PageOrder {
    /// `random`, `inorder`, `group:N`, `sorted:N` or `ranged:S:F`.
    pub fn parse(s: &str) -> Result<Self, String> {
        let n = |p: &str| match s.strip_prefix(p).map(str::parse::<usize>) {
            Some(Ok(n)) if n > 0 => Some(n),
            _ => None,
        };
        match s {
            "random" => Ok(PageOrder::Random),
            "inorder" => Ok(PageOrder::Grouped(1)),
            "ordered" => Ok(PageOrder::Ordered),
            _ if s.starts_with("scattered") => match (n("scattered:"), n("scattered-ordered:")) {
                (Some(factor), _) => Ok(PageOrder::Scattered { factor, ordered: false }),
                (_, Some(factor)) => Ok(PageOrder::Scattered { factor, ordered: true }),
                _ => Err(format!("{s}: want scattered:K or scattered-ordered:K (K > 0)")),
            },
            _ if s.starts_with("ranged:") => match s["ranged:".len()..].split_once(':').map(|(a, b)| (a.parse::<usize>(), b.parse::<usize>())) {
                Some((Ok(splits), Ok(first))) if splits > 0 => Ok(PageOrder::Ranged { splits, first }),
                _ => Err(format!("{s}: want ranged:SPLITS:FIRST (SPLITS > 0)")),
            },
            _ => match (n("group:"), n("sorted:")) {
                (Some(g), _) => Ok(PageOrder::Grouped(g)),
                (_, Some(r)) => Ok(PageOrder::Sorted(r)),
                _ => Err(format!("{s}: want random, inorder, ordered, group:N, sorted:N (N > 0), ranged:SPLITS:FIRST or scattered[-ordered]:K")),
            },
        }
    }

    /// The name [`PageOrder::parse`] takes back.
    pub fn name(self) -> String {
        match self {
            PageOrder::Random => "random".into(),
            PageOrder::Grouped(1) => "inorder".into(),
            PageOrder::Grouped(n) => format!("group:{n}"),
            PageOrder::Sorted(n) => format!("sorted:{n}"),
            PageOrder::Ranged { splits, first } => format!("ranged:{splits}:{first}"),
            PageOrder::Ordered => "ordered".into(),
            PageOrder::Scattered { factor, ordered: false } => format!("scattered:{factor}"),
            PageOrder::Scattered { factor, ordered: true } => format!("scattered-ordered:{factor}"),
        }
    }

    /// For a report's method line.
    pub fn describe(self) -> String {
        match self {
            PageOrder::Random => "pages placed by a random permutation of the pool (as FlashAttention-2's tests draw block tables)".into(),
            PageOrder::Grouped(1) => "pages in order (as FlashInfer's decode benchmark hands them out)".into(),
            PageOrder::Grouped(n) => format!("pages shuffled within groups of {n}"),
            PageOrder::Sorted(n) => format!("a random permutation of the pool, each run of {n} logical pages sorted by address"),
            PageOrder::Ranged { splits, first } => format!("a random permutation of the pool, each sequence's {splits} split shares given address ranges after their first {first} pages"),
            PageOrder::Ordered => "pages placed by a random permutation of the pool, each block-table row then ordered by `flash_attn::order_block_table`".into(),
            PageOrder::Scattered { factor, ordered } => format!(
                "pages drawn at random from a pool {factor}× as large as the sequences need{}",
                if ordered { ", each block-table row then ordered by `flash_attn::order_block_table`" } else { "" }
            ),
        }
    }

    /// How many times the pages the sequences need the pool holds.
    pub fn pool_factor(self) -> usize {
        match self {
            PageOrder::Scattered { factor, .. } => factor,
            _ => 1,
        }
    }

    /// Whether the rows go through [`flash_attn::order_block_table`].
    pub fn ordered_by_library(self) -> bool {
        matches!(self, PageOrder::Ordered | PageOrder::Scattered { ordered: true, .. })
    }

    /// The pool's page order: `perm[i]` is the page holding logical page `i`
    /// (`per` pages per sequence, rows one after another) of `n` pages, in a
    /// pool of `n ·` [`PageOrder::pool_factor`] pages. (Before
    /// [`flash_attn::order_block_table`] for the orders that use it.)
    pub fn permutation(self, n: usize, per: usize, rng: &mut Rng) -> Vec<i32> {
        let mut perm: Vec<i32> = (0..(n * self.pool_factor()) as i32).collect();
        let group = match self {
            PageOrder::Grouped(g) => g,
            _ => perm.len().max(1),
        };
        for chunk in perm.chunks_mut(group) {
            for i in (1..chunk.len()).rev() {
                chunk.swap(i, rng.below(i + 1));
            }
        }
        if let PageOrder::Sorted(r) = self {
            for run in perm.chunks_mut(r) {
                run.sort_unstable();
            }
        }
        if let PageOrder::Ranged { splits, first } = self {
            let share = per.div_ceil(splits).max(1);
            for row in perm.chunks_mut(per.max(1)) {
                let later: Vec<usize> = (0..row.len()).filter(|i| i % share >= first).collect();
                let mut pages: Vec<i32> = later.iter().map(|&i| row[i]).collect();
                pages.sort_unstable();
                for (&i, p) in later.iter().zip(pages) {
                    row[i] = p;
                }
            }
        }
        perm.truncate(n);
        perm
    }
}

/// The benchmark's call as its tables are ordered for it (`p` the call's
/// options): one query token, no append — every full page by address.
fn ordered_call(p: &ForwardParams) -> flash_attn::KvCacheCall {
    flash_attn::KvCacheCall::from_shape(p, false, 1, 0)
}

/// The device inputs of one cell.
pub struct DecodeInputs {
    pub cell: Cell,
    kc: CudaSlice<half::bf16>,
    vc: CudaSlice<half::bf16>,
    q: CudaSlice<half::bf16>,
    seqlens: CudaSlice<i32>,
    table: CudaSlice<i32>,
    o_acc: CudaSlice<f32>,
    l_acc: CudaSlice<f32>,
    /// Tile counters of the fused combine (zeroed once; every launch puts
    /// its counts back to 0).
    counters: CudaSlice<u32>,
    /// O and the LSE of [`DecodeInputs::run_into`] (the other calls get
    /// the library's).
    o: CudaSlice<half::bf16>,
    lse: CudaSlice<f32>,
    layout: TensorLayout,
    per: usize,
    /// Hand the fused combine its counters (default); `false`: the scratch
    /// has none and the combine runs as a second launch.
    pub fused: bool,
    /// [`DecodeOptions::deterministic`] (default `false`: the library's
    /// default schedule).
    pub deterministic: bool,
}

impl DecodeInputs {
    /// Allocates and fills the cell's caches (random values repeated from a
    /// 4 Mi-element pattern), its query and its block table.
    pub fn new(g: &Gpu, c: Cell, rng: &mut Rng) -> Res<Self> {
        Self::with_page_order(g, c, rng, PageOrder::Random)
    }

    /// [`DecodeInputs::new`] with the pages of a paged cell placed as
    /// `order` says.
    pub fn with_page_order(g: &Gpu, c: Cell, rng: &mut Rng, order: PageOrder) -> Res<Self> {
        let s = &g.stream;
        let (n_rows, rows_per) = match c.page {
            None => (c.batch, c.cache),
            Some(p) => (c.batch * c.cache / p, p),
        };
        let pool_rows = n_rows * c.page.map_or(1, |_| order.pool_factor());
        let elems = pool_rows * rows_per * c.hk * D;
        let pattern: Vec<half::bf16> = (0..elems.min(1 << 22))
            .map(|_| half::bf16::from_f32(rng.nonzero(1.0)))
            .collect();
        let pattern = s.clone_htod(&pattern)?;
        // SAFETY: both filled right below, before any read.
        let (mut kc, mut vc) =
            unsafe { (s.alloc::<half::bf16>(elems)?, s.alloc::<half::bf16>(elems)?) };
        for buf in [&mut kc, &mut vc] {
            let (len, n) = (buf.len(), pattern.len());
            let mut off = 0;
            while off < len {
                let k = n.min(len - off);
                s.memcpy_dtod(&pattern.slice(0..k), &mut buf.slice_mut(off..off + k))?;
                off += k;
            }
        }
        drop(pattern);
        let q = s.clone_htod(
            &(0..c.batch * H * D)
                .map(|_| half::bf16::from_f32(rng.nonzero(1.0)))
                .collect::<Vec<_>>(),
        )?;
        let lens = vec![c.cache as i32; c.batch];
        let seqlens = s.clone_htod(&lens)?;
        let per = c.cache.div_ceil(rows_per);
        let mut table = order.permutation(n_rows, per, rng);
        if c.page.is_some() && order.ordered_by_library() {
            flash_attn::order_block_table(&mut table, per, rows_per, &lens, &ordered_call(&ForwardParams::default()))?;
        }
        let table = s.clone_htod(&table)?;
        Ok(DecodeInputs {
            cell: c,
            kc,
            vc,
            q,
            seqlens,
            table,
            o_acc: s.alloc_zeros(MAX_SPLITS * c.batch * H * D)?,
            l_acc: s.alloc_zeros(MAX_SPLITS * c.batch * H)?,
            counters: s.alloc_zeros(c.batch * H)?,
            o: s.alloc_zeros(c.batch * H * D + 8)?, // + 8: plan_only's misaligned view
            lse: s.alloc_zeros(c.batch * H)?,
            layout: TensorLayout::contiguous([pool_rows, rows_per, c.hk, D]),
            per,
            fused: true,
            deterministic: false,
        })
    }

    /// One decode call on `g.stream` (the outputs dropped, stream-ordered):
    /// `splits` and `kernel` as [`DecodeOptions`].
    pub fn run(&mut self, g: &Gpu, splits: Option<usize>, kernel: Option<&'static str>) -> Res<()> {
        self.call(g, splits, kernel, None, false).map(drop)
    }

    /// One decode step with one new token's keys and values per sequence
    /// (`forward_kvcache` with `k_new`/`v_new`: the append, then the
    /// attention; the query buffer reinterpreted as `(batch, 1, kv_heads,
    /// d)` for both). The cells' caches are full, so the append writes
    /// nothing and the attention reads the same keys: a step's launches at
    /// the cost of a real one.
    pub fn run_with_new(&mut self, g: &Gpu) -> Res<()> {
        self.call(g, None, None, None, true).map(drop)
    }

    /// One decode call recording the flash-decoding kernel's per-block
    /// timeline into `words` (see [`DecodeOptions::timeline`]).
    pub fn run_timeline(&mut self, g: &Gpu, splits: Option<usize>, kernel: Option<&'static str>, words: &mut CudaSlice<u64>) -> Res<()> {
        self.call(g, splits, kernel, Some(words), false).map(drop)
    }

    /// One decode call, its output O `(batch, 1, H, D)` copied to the host.
    pub fn output(&mut self, g: &Gpu, splits: Option<usize>, kernel: Option<&'static str>) -> Res<Vec<f32>> {
        let o = self.call(g, splits, kernel, None, false)?;
        Ok(g.stream.clone_dtoh(&o)?.iter().map(|x| x.to_f32()).collect())
    }

    /// Appends one token's keys per sequence to the K cache at row
    /// `cache_seqlens[b]` (`append_kv`, stream-ordered): the append launch a
    /// decode step with new keys runs twice. The cells' caches are full, so
    /// the kernel reads its lengths and writes nothing (`new` is the query
    /// buffer, reinterpreted as `(batch, 1, kv_heads, d)`).
    pub fn append(&mut self, g: &Gpu) -> Res<()> {
        let c = self.cell;
        g.fa.append_kv::<half::bf16>(
            &g.stream,
            &mut self.kc,
            self.layout,
            Tensor::new(&self.q, TensorLayout::contiguous([c.batch, 1, c.hk, D])),
            &self.seqlens,
            None,
            c.page.map(|_| BlockTable::new(&self.table, self.per)),
        )?;
        Ok(())
    }

    /// The cell's block table through the device's
    /// `FlashAttention::order_block_table` (in place, stream-ordered; one
    /// query token, no append): what ordering the table costs a decode step
    /// whose tables live on the GPU. A contiguous cell has no table: an error.
    pub fn order_table(&mut self, g: &Gpu) -> Res<()> {
        let c = self.cell;
        let page = c.page.ok_or("order_table: a contiguous cell has no block table")?;
        g.fa.order_block_table(&g.stream, &mut self.table, self.per, page, &self.seqlens, &ordered_call(&ForwardParams::default()))?;
        Ok(())
    }

    /// One decode call into this cell's own O and LSE buffers
    /// (`forward_kvcache_into`, the library's kernel and split count; with
    /// the scratch's counters nothing is allocated: a CUDA graph can
    /// capture it).
    pub fn run_into(&mut self, g: &Gpu) -> Res<()> {
        Ok(self.call_into(g, 0)?)
    }

    /// [`DecodeInputs::run_into`] with O 8 bytes off its alignment: the
    /// call validates and plans, then fails its alignment check before any
    /// launch (the host's cost of a call without the driver's). Errors
    /// unless it fails so.
    pub fn plan_only(&mut self, g: &Gpu) -> Res<()> {
        match self.call_into(g, 4) {
            Err(flash_attn::FlashAttnError::Misaligned { argument: "o", .. }) => Ok(()),
            other => Err(format!("plan_only: expected a misaligned O, got {other:?}").into()),
        }
    }

    /// `forward_kvcache_into` with O starting `o_offset` elements into the
    /// cell's O buffer.
    fn call_into(&mut self, g: &Gpu, o_offset: usize) -> flash_attn::Result<()> {
        let c = self.cell;
        let deterministic = self.deterministic;
        let (cache, scratch, q, o, lse) = self.parts(false);
        let mut o = o.slice_mut(o_offset..);
        g.fa.forward_kvcache_into::<half::bf16, _, _>(
            &g.stream,
            q,
            cache,
            TensorMut::new(&mut o, TensorLayout::contiguous([c.batch, 1, H, D])),
            lse,
            &ForwardParams::default(),
            &Extras::default(),
            DecodeOptions { num_splits: None, scratch: Some(scratch), kernel: None, timeline: None, deterministic },
        )
    }

    /// A call's cache (with one new token per sequence: the query buffer
    /// reinterpreted as `(batch, 1, kv_heads, d)`), the split scratch, q,
    /// and the cell's own O and LSE.
    #[allow(clippy::type_complexity)]
    fn parts(&mut self, with_new: bool) -> (KvCache<'_, half::bf16>, SplitScratch<'_>, Tensor<'_, CudaSlice<half::bf16>>, &mut CudaSlice<half::bf16>, &mut CudaSlice<f32>) {
        let c = self.cell;
        let Self { kc, vc, q, seqlens, table, o_acc, l_acc, counters, o, lse, layout, per, fused, .. } = self;
        let new = || with_new.then(|| Tensor::new(&*q, TensorLayout::contiguous([c.batch, 1, c.hk, D])).into());
        let cache = KvCache {
            k_cache: kc,
            v_cache: vc,
            layout: *layout,
            cache_seqlens: &*seqlens,
            cache_batch_idx: None,
            block_table: c.page.map(|_| BlockTable::new(&*table, *per)),
            k_new: new(),
            v_new: new(),
        };
        let scratch = SplitScratch { o_accum: o_acc, lse_accum: l_acc, max_splits: MAX_SPLITS, counters: if *fused { Some(counters) } else { None } };
        (cache, scratch, Tensor::new(&*q, TensorLayout::contiguous([c.batch, 1, H, D])), o, lse)
    }

    fn call(&mut self, g: &Gpu, splits: Option<usize>, kernel: Option<&'static str>, timeline: Option<&mut CudaSlice<u64>>, with_new: bool) -> Res<CudaSlice<half::bf16>> {
        let deterministic = self.deterministic;
        let (cache, scratch, q, _, _) = self.parts(with_new);
        let out = g.fa.forward_kvcache::<half::bf16, _>(
            &g.stream,
            q,
            cache,
            &ForwardParams::default(),
            &Extras::default(),
            DecodeOptions { num_splits: splits, scratch: Some(scratch), kernel, timeline, deterministic },
        )?;
        Ok(out.o)
    }
}

#[cfg(test)]
mod tests {
    use super::PageOrder;
    use crate::Rng;

    #[test]
    fn page_orders_are_permutations_within_their_groups() {
        let mut rng = Rng::with_seed(3);
        for (order, n) in [(PageOrder::Random, 100), (PageOrder::Grouped(1), 37), (PageOrder::Grouped(8), 100), (PageOrder::Random, 0), (PageOrder::Sorted(16), 100), (PageOrder::Ranged { splits: 4, first: 3 }, 100)] {
            let perm = order.permutation(n, 50, &mut rng);
            let mut sorted = perm.clone();
            sorted.sort();
            assert_eq!(sorted, (0..n as i32).collect::<Vec<_>>(), "{order:?}");
            if let PageOrder::Grouped(g) = order {
                assert!(perm.iter().enumerate().all(|(i, &p)| p as usize / g == i / g), "{order:?}: {perm:?}");
            }
            if let PageOrder::Sorted(r) = order {
                assert!(perm.chunks(r).all(|run| run.windows(2).all(|w| w[0] < w[1])), "{order:?}: {perm:?}");
            }
            if let PageOrder::Ranged { splits, first } = order {
                // Rows of 50 in shares of 13: after the first 3 of each
                // share, increasing across the row.
                let share = 50usize.div_ceil(splits);
                for row in perm.chunks(50) {
                    let later: Vec<i32> = (0..row.len()).filter(|i| i % share >= first).map(|i| row[i]).collect();
                    assert!(later.windows(2).all(|w| w[0] < w[1]), "{order:?}: {row:?}");
                }
            }
        }
        assert_eq!(PageOrder::Grouped(1).permutation(5, 5, &mut rng), vec![0, 1, 2, 3, 4]);
        assert_eq!(PageOrder::parse("group:8"), Ok(PageOrder::Grouped(8)));
        assert_eq!(PageOrder::parse("inorder"), Ok(PageOrder::Grouped(1)));
        assert!(PageOrder::parse("group:0").is_err() && PageOrder::parse("sorted").is_err() && PageOrder::parse("sorted:0").is_err());
        assert_eq!(PageOrder::parse("sorted:128"), Ok(PageOrder::Sorted(128)));
        assert_eq!(PageOrder::parse("ranged:16:16"), Ok(PageOrder::Ranged { splits: 16, first: 16 }));
        assert!(PageOrder::parse("ranged:0:1").is_err() && PageOrder::parse("ranged:4").is_err());
        // A scattered pool: distinct pages of a pool 4× as large.
        let perm = PageOrder::Scattered { factor: 4, ordered: false }.permutation(100, 50, &mut rng);
        let mut seen = perm.clone();
        seen.sort();
        seen.dedup();
        assert!(perm.len() == 100 && seen.len() == 100 && perm.iter().all(|&p| (0..400).contains(&p)), "{perm:?}");
        assert!(perm.iter().any(|&p| p >= 100), "{perm:?}");
        assert!(PageOrder::parse("scattered:0").is_err() && PageOrder::parse("scattered").is_err());
        for o in [
            PageOrder::Random,
            PageOrder::Grouped(1),
            PageOrder::Grouped(8),
            PageOrder::Sorted(128),
            PageOrder::Ranged { splits: 16, first: 16 },
            PageOrder::Ordered,
            PageOrder::Scattered { factor: 4, ordered: false },
            PageOrder::Scattered { factor: 8, ordered: true },
        ] {
            assert_eq!(PageOrder::parse(&o.name()), Ok(o), "{o:?}");
            assert!(!o.describe().is_empty());
        }
    }
}
