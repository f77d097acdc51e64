//! Decode in the CPU reference (issue 9, `../shared/INFERENCE.md`):
//!
//! * split-KV: partials + combine = one pass, for any number of splits and
//!   any boundaries, splits with no key included (O and LSE, 1e-12); the
//!   combine's rules on its own;
//! * KV cache: appending new k/v then attending = attending over the
//!   concatenation (dense `attention` of the sequence alone), with and
//!   without `cache_batch_idx`; the updated cache is exactly the old one
//!   with the new rows in place, nothing else touched;
//! * paged KV: = the contiguous cache for random block tables (garbage in the
//!   unused entries) and page sizes 1, 2, 3, 4, 5, 7, 8, 16, 32; the pages
//!   after an append; varlen prefill over pages (shared prefix pages
//!   included) = varlen over the packed keys;
//! * address-ordered block tables (`order_block_table`): each row's free full
//!   pages sorted, the logical table's attention and appends where no mask or
//!   bias depends on positions, a typed error where one does;
//! * every bad input a typed error naming the argument, the cache untouched.
//!
//! f64, 256 cases per property.

mod cpu_support;
#[path = "cpu_support/infer.rs"]
mod infer;

use cpu_support::Rng;
use flash_attn::reference::{
    AttnOutput, PagedKv, PagedKvMut, attention, attention_varlen, attention_varlen_paged, combine_partials,
    kvcache_attention, paged_kvcache_attention, paged_to_contiguous, split_kv_forward, split_kv_partials,
};
use flash_attn::common::mask::{UNBOUNDED, normalize_window};
use flash_attn::{FlashAttnError, ForwardParams, KvCacheCall, order_block_table};
use infer::{Dense, Feat, assert_invalid, check_close, check_out, dense, expected_alone, feat, host_alibi, prefix_sums, seq_slopes, slopes};
use ndarray::{Array2, Array3, Array4, Axis, array, concatenate, s};
use proptest::prelude::*;

const TOL: f64 = 1e-12;

// ---------------------------------------------------------------------------
// Split-KV.
// ---------------------------------------------------------------------------

#[derive(Clone, Debug)]
struct SplitCase {
    x: Dense,
    /// Boundaries: 0, sorted draws in 0..=sk (repeats = empty splits), sk.
    bounds: Vec<usize>,
    block: (usize, usize),
}

fn split_case() -> impl Strategy<Value = SplitCase> {
    let sq = prop_oneof![4 => Just(1usize), 1 => Just(0usize), 3 => 2usize..=20];
    let sk = prop_oneof![1 => Just(0usize), 6 => 1usize..=80];
    dense(1..=2, sq, sk, (1..=2, 1..=4, 1..=16)).prop_flat_map(|x| {
        let sk = x.sk;
        (prop::collection::vec(0..=sk, 0..=8), (1usize..=24, 1usize..=24)).prop_map(move |(mut cuts, block)| {
            cuts.sort_unstable();
            let bounds = std::iter::once(0).chain(cuts).chain(std::iter::once(sk)).collect();
            SplitCase { x: x.clone(), bounds, block }
        })
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn split_and_combine_equals_one_pass(c in split_case()) {
        let x = &c.x;
        let h = x.nheads();
        let (q, k, v, sl) = x.inputs();
        let p = ForwardParams { block: Some(c.block), ..x.f.params() };
        let al = || host_alibi(x.f.alibi, &sl);
        let want = attention(q.view(), k.view(), v.view(), &p, al()).unwrap();
        let got = split_kv_forward(q.view(), k.view(), v.view(), &p, al(), &c.bounds).unwrap();
        check_out("split-KV + combine vs one pass", &got, &want, TOL)?;

        let parts = split_kv_partials(q.view(), k.view(), v.view(), &p, al(), &c.bounds).unwrap();
        let splits = c.bounds.len() - 1;
        prop_assert_eq!(parts.o.dim(), (splits, x.batch, h, x.sq, x.d));
        prop_assert_eq!(parts.lse.dim(), (splits, x.batch, h, x.sq));
        for (i, w) in c.bounds.windows(2).enumerate() {
            let (o_i, lse_i) = (parts.o.index_axis(Axis(0), i), parts.lse.index_axis(Axis(0), i));
            // A split with no key at all: O = 0, LSE = -inf everywhere.
            if w[0] == w[1] {
                prop_assert!(lse_i.iter().all(|&x| x == f64::NEG_INFINITY));
            }
            // Wherever a split sees no key (empty, or masked by the window), O_i = 0.
            for b in 0..x.batch {
                for hh in 0..h {
                    for r in 0..x.sq {
                        if lse_i[[b, hh, r]] == f64::NEG_INFINITY {
                            prop_assert!(o_i.slice(s![b, hh, r, ..]).iter().all(|&x| x == 0.0));
                        }
                    }
                }
            }
        }
        // The combine does not depend on the order of the splits.
        for b in 0..x.batch {
            for hh in 0..h {
                let lse = parts.lse.slice(s![..;-1, b, hh, ..]);
                let o = parts.o.slice(s![..;-1, b, hh, .., ..]);
                let (ob, lb) = combine_partials(lse, o);
                check_close(
                    "combine of the reversed splits",
                    (ob.view(), lb.view()),
                    (want.o.slice(s![b, .., hh, ..]), want.lse.slice(s![b, hh, ..])),
                    TOL,
                )?;
            }
        }
    }
}

#[test]
fn combine_rules() {
    // Two splits with LSE ln 1 and ln 3: weights 1/4 and 3/4, LSE ln 4.
    let lse = array![[0.0f64, f64::NEG_INFINITY], [3.0f64.ln(), f64::NEG_INFINITY]];
    let o = Array3::from_shape_vec((2, 2, 2), vec![1.0, 2.0, 0.0, 0.0, 5.0, -2.0, 0.0, 0.0]).unwrap();
    let (out, l) = combine_partials(lse.view(), o.view());
    assert!((l[0] - 4.0f64.ln()).abs() < 1e-15);
    assert!((out[[0, 0]] - 4.0).abs() < 1e-15 && (out[[0, 1]] - -1.0).abs() < 1e-15, "{out}");
    // Every partial -inf: O = 0, LSE = -inf, never NaN.
    assert_eq!(l[1], f64::NEG_INFINITY);
    assert_eq!((out[[1, 0]], out[[1, 1]]), (0.0, 0.0));
    // One split: itself.
    let (out1, l1) = combine_partials(lse.slice(s![..1, ..]), o.slice(s![..1, .., ..]));
    assert_eq!(out1.row(0), o.slice(s![0, 0, ..]));
    assert_eq!(l1[0], 0.0);
    // Large LSEs do not overflow (M is subtracted first).
    let big = array![[1000.0f64], [1000.0]];
    let o = Array3::from_elem((2, 1, 1), 2.0);
    let (out, l) = combine_partials(big.view(), o.view());
    assert!((l[0] - (1000.0 + 2.0f64.ln())).abs() < 1e-12 && (out[[0, 0]] - 2.0).abs() < 1e-12);
    // f32 too.
    let (out, l) = combine_partials(big.mapv(|x| x as f32).view(), o.mapv(|x| x as f32).view());
    assert!((l[0] - (1000.0 + std::f32::consts::LN_2)).abs() < 1e-3 && (out[[0, 0]] - 2.0).abs() < 1e-3, "{l} {out}");
}

#[test]
#[should_panic(expected = "combine_partials")]
fn combine_checks_its_shapes() {
    let _ = combine_partials(Array2::<f64>::zeros((2, 3)).view(), Array3::<f64>::zeros((2, 4, 1)).view());
}

// ---------------------------------------------------------------------------
// KV cache (contiguous).
// ---------------------------------------------------------------------------

#[derive(Clone, Debug)]
struct CacheCase {
    batch: usize,
    /// Extra cache rows beyond batch (cache_batch_idx picks among them).
    extra_rows: usize,
    use_idx: bool,
    cap: usize,
    sq: usize,
    /// New rows per sequence (`None`: no k/v passed).
    s_new: Option<usize>,
    /// `cache_seqlens[b]` as a fraction of the room left.
    fill: Vec<f64>,
    nheads_k: usize,
    group: usize,
    d: usize,
    f: Feat,
    seed: u64,
}

fn cache_case() -> impl Strategy<Value = CacheCase> {
    (
        (1usize..=3, 0usize..=2, any::<bool>()),
        (1usize..=24, 1usize..=6, prop_oneof![Just(None), (0usize..=4).prop_map(Some)]),
        prop::collection::vec(0.0f64..=1.0, 3),
        (1usize..=2, 1usize..=3, 1usize..=16),
        any::<u64>(),
    )
        .prop_flat_map(|((batch, extra_rows, use_idx), (cap, sq, s_new), fill, (nheads_k, group, d), seed)| {
            let s_new = s_new.map(|n| n.min(cap));
            feat(cap + 3).prop_map(move |f| CacheCase {
                batch, extra_rows, use_idx, cap, sq, s_new, fill: fill.clone(), nheads_k, group, d, f, seed,
            })
        })
}

/// One KV-cache problem's data.
struct CacheData {
    q: Array4<f64>,
    k_cache: Array4<f64>,
    v_cache: Array4<f64>,
    k_new: Option<Array4<f64>>,
    v_new: Option<Array4<f64>>,
    seqlens: Vec<i32>,
    idx: Option<Vec<i32>>,
    slopes: Vec<f32>,
}

impl CacheCase {
    fn nheads(&self) -> usize {
        self.nheads_k * self.group
    }
    fn data(&self) -> CacheData {
        let mut rng = Rng::new(self.seed);
        let (b, hk, d) = (self.batch, self.nheads_k, self.d);
        let batch_c = b + self.extra_rows;
        let n = self.s_new.unwrap_or(0);
        let q = rng.tensor((b, self.sq, self.nheads(), d), 2.0);
        let k_cache = rng.tensor((batch_c, self.cap, hk, d), 2.0);
        let v_cache = rng.tensor((batch_c, self.cap, hk, d), 1.0);
        let k_new = self.s_new.map(|n| rng.tensor((b, n, hk, d), 2.0));
        let v_new = self.s_new.map(|n| rng.tensor((b, n, hk, d), 1.0));
        let seqlens = (0..b).map(|i| ((self.cap - n) as f64 * self.fill[i]).round() as i32).collect();
        // Appending needs distinct rows; reading alone may share them.
        let idx = self.use_idx.then(|| {
            if self.s_new.is_some() {
                let mut rows: Vec<i32> = (0..batch_c as i32).collect();
                for i in (1..rows.len()).rev() {
                    rows.swap(i, rng.below(i + 1));
                }
                rows[..b].to_vec()
            } else {
                (0..b).map(|_| rng.below(batch_c) as i32).collect()
            }
        });
        let slopes = slopes(&mut rng, self.f.alibi, b, self.nheads());
        CacheData { q, k_cache, v_cache, k_new, v_new, seqlens, idx, slopes }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn kvcache_append_then_attend_equals_attention_over_concatenation(c in cache_case()) {
        let x = c.data();
        let h = c.nheads();
        let (mut kc, mut vc) = (x.k_cache.clone(), x.v_cache.clone());
        let p = c.f.params();
        let out = kvcache_attention(
            x.q.view(), &mut kc, &mut vc, &x.seqlens, x.k_new.as_ref().map(|a| a.view()),
            x.v_new.as_ref().map(|a| a.view()), x.idx.as_deref(), &p, host_alibi(c.f.alibi, &x.slopes),
        ).unwrap();
        let n = c.s_new.unwrap_or(0);
        let (mut k_want, mut v_want) = (x.k_cache.clone(), x.v_cache.clone());
        for b in 0..c.batch {
            let row = x.idx.as_ref().map_or(b, |i| i[b] as usize);
            let cs = x.seqlens[b] as usize;
            // The keys: cache rows 0..cs, then the new ones.
            let cat = |cache: &Array4<f64>, new: &Option<Array4<f64>>| {
                let old = cache.slice(s![row, ..cs, .., ..]);
                let all = match new {
                    Some(nw) => concatenate(Axis(0), &[old, nw.slice(s![b, .., .., ..])]).unwrap(),
                    None => old.to_owned(),
                };
                all.insert_axis(Axis(0))
            };
            let (kb, vb) = (cat(&x.k_cache, &x.k_new), cat(&x.v_cache, &x.v_new));
            let qb = x.q.slice(s![b..b + 1, .., .., ..]);
            let want = expected_alone(&c.f, c.cap, qb, kb.view(), vb.view(), &seq_slopes(&c.f, &x.slopes, b, h));
            check_close(
                &format!("sequence {b}"),
                (out.o.slice(s![b..b + 1, .., .., ..]), out.lse.slice(s![b..b + 1, .., ..])),
                (want.o.view(), want.lse.view()),
                TOL,
            )?;
            if let (Some(kn), Some(vn)) = (&x.k_new, &x.v_new) {
                k_want.slice_mut(s![row, cs..cs + n, .., ..]).assign(&kn.slice(s![b, .., .., ..]));
                v_want.slice_mut(s![row, cs..cs + n, .., ..]).assign(&vn.slice(s![b, .., .., ..]));
            }
        }
        // The updated cache, exactly: new rows in place, nothing else touched.
        prop_assert_eq!(kc, k_want);
        prop_assert_eq!(vc, v_want);
    }
}

// ---------------------------------------------------------------------------
// Paged KV.
// ---------------------------------------------------------------------------

const PAGE_SIZES: [usize; 9] = [1, 2, 3, 4, 5, 7, 8, 16, 32];

#[derive(Clone, Debug)]
struct PagedCase {
    batch: usize,
    page: usize,
    max_blocks: usize,
    sq: usize,
    s_new: Option<usize>,
    fill: Vec<f64>,
    spare_blocks: usize,
    nheads_k: usize,
    group: usize,
    d: usize,
    f: Feat,
    seed: u64,
}

fn paged_case() -> impl Strategy<Value = PagedCase> {
    (
        (1usize..=3, prop::sample::select(PAGE_SIZES.to_vec()), 1usize..=5),
        (1usize..=5, prop_oneof![Just(None), (0usize..=5).prop_map(Some)]),
        prop::collection::vec(0.0f64..=1.0, 3),
        0usize..=3,
        (1usize..=2, 1usize..=3, 1usize..=8),
        any::<u64>(),
    )
        .prop_flat_map(|((batch, page, max_blocks0), (sq, s_new), fill, spare_blocks, (nheads_k, group, d), seed)| {
            // Keep the capacity moderate for the large pages.
            let max_blocks = max_blocks0.min(64usize.div_ceil(page)).max(1);
            let cap = max_blocks * page;
            let s_new = s_new.map(|n| n.min(cap));
            feat(cap + 3).prop_map(move |f| PagedCase {
                batch, page, max_blocks, sq, s_new, fill: fill.clone(), spare_blocks, nheads_k, group, d, f, seed,
            })
        })
}

/// One paged KV-cache problem's data: lengths before and after the append,
/// a random block table over a pool with spare pages, the pages, q, the new
/// rows, ALiBi slopes.
struct PagedData {
    seqlens: Vec<i32>,
    after: Vec<usize>,
    table: Array2<i32>,
    k_pages: Array4<f64>,
    v_pages: Array4<f64>,
    q: Array4<f64>,
    k_new: Option<Array4<f64>>,
    v_new: Option<Array4<f64>>,
    slopes: Vec<f32>,
}

impl PagedCase {
    fn data(&self, seed: u64) -> PagedData {
        let mut rng = Rng::new(seed);
        let (b, hk, d, h) = (self.batch, self.nheads_k, self.d, self.nheads_k * self.group);
        let cap = self.max_blocks * self.page;
        let n = self.s_new.unwrap_or(0);
        let seqlens: Vec<i32> = (0..b).map(|i| ((cap - n) as f64 * self.fill[i]).round() as i32).collect();
        let after: Vec<usize> = seqlens.iter().map(|&x| x as usize + n).collect();
        let (table, num_blocks) = block_table(&mut rng, &after, self.page, self.max_blocks, self.spare_blocks);
        let k_pages = rng.tensor((num_blocks, self.page, hk, d), 2.0);
        let v_pages = rng.tensor((num_blocks, self.page, hk, d), 1.0);
        let q = rng.tensor((b, self.sq, h, d), 2.0);
        let k_new = self.s_new.map(|n| rng.tensor((b, n, hk, d), 2.0));
        let v_new = self.s_new.map(|n| rng.tensor((b, n, hk, d), 1.0));
        let slopes = slopes(&mut rng, self.f.alibi, b, h);
        PagedData { seqlens, after, table, k_pages, v_pages, q, k_new, v_new, slopes }
    }
}

/// A random block table: each sequence gets distinct blocks for the tokens
/// it holds after the append (shuffled over the pool); entries past those
/// are garbage (-1, out of range, or someone else's block): never read.
fn block_table(rng: &mut Rng, lens: &[usize], page: usize, max_blocks: usize, spare: usize) -> (Array2<i32>, usize) {
    let need: Vec<usize> = lens.iter().map(|&n| n.div_ceil(page)).collect();
    let num_blocks = need.iter().sum::<usize>() + spare;
    let mut pool: Vec<i32> = (0..num_blocks as i32).collect();
    for i in (1..pool.len()).rev() {
        pool.swap(i, rng.below(i + 1));
    }
    let mut table = Array2::zeros((lens.len(), max_blocks));
    let mut next = 0;
    for (b, &nb) in need.iter().enumerate() {
        for i in 0..max_blocks {
            table[[b, i]] = if i < nb {
                next += 1;
                pool[next - 1]
            } else {
                match rng.below(3) {
                    0 => -1,
                    1 => (num_blocks + rng.below(5)) as i32,
                    _ => rng.below(num_blocks.max(1)) as i32,
                }
            };
        }
    }
    (table, num_blocks.max(1))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn paged_equals_contiguous(c in paged_case()) {
        let (b, hk, d) = (c.batch, c.nheads_k, c.d);
        let cap = c.max_blocks * c.page;
        let n = c.s_new.unwrap_or(0);
        let PagedData { seqlens, after, table, k_pages, v_pages, q, k_new, v_new, slopes: sl } = c.data(c.seed);
        let p = c.f.params();
        let al = || host_alibi(c.f.alibi, &sl);

        // paged_to_contiguous is the definition: token t of sequence b is row
        // t % P of block block_table[b][t / P]; rows past the length are 0.
        let view = PagedKv { k_pages: k_pages.view(), v_pages: v_pages.view(), block_table: table.view() };
        let (mut kc, mut vc) = paged_to_contiguous(&view, &seqlens).unwrap();
        prop_assert_eq!(kc.dim(), (b, cap, hk, d));
        for bb in 0..b {
            for t in 0..cap {
                let want = if t < seqlens[bb] as usize {
                    k_pages.slice(s![table[[bb, t / c.page]] as usize, t % c.page, .., ..]).to_owned()
                } else {
                    Array2::zeros((hk, d))
                };
                prop_assert_eq!(kc.slice(s![bb, t, .., ..]), want);
            }
        }

        let (kn, vn) = (k_new.as_ref().map(|a| a.view()), v_new.as_ref().map(|a| a.view()));
        let contiguous = kvcache_attention(q.view(), &mut kc, &mut vc, &seqlens, kn, vn, None, &p, al()).unwrap();
        let (mut kp, mut vp) = (k_pages.clone(), v_pages.clone());
        let pages = PagedKvMut { k_pages: kp.view_mut(), v_pages: vp.view_mut(), block_table: table.view() };
        let paged = paged_kvcache_attention(q.view(), pages, &seqlens, kn, vn, &p, al()).unwrap();
        check_out("paged vs contiguous", &paged, &contiguous, TOL)?;

        // The pages after the append hold what the contiguous cache holds ...
        let after_i32: Vec<i32> = after.iter().map(|&x| x as i32).collect();
        let updated = PagedKv { k_pages: kp.view(), v_pages: vp.view(), block_table: table.view() };
        let (k2, v2) = paged_to_contiguous(&updated, &after_i32).unwrap();
        prop_assert_eq!(k2, kc);
        prop_assert_eq!(v2, vc);
        // ... and only the appended slots changed.
        let (mut k_want, mut v_want) = (k_pages.clone(), v_pages.clone());
        if let (Some(kn), Some(vn)) = (&k_new, &v_new) {
            for bb in 0..b {
                for i in 0..n {
                    let t = seqlens[bb] as usize + i;
                    let blk = table[[bb, t / c.page]] as usize;
                    k_want.slice_mut(s![blk, t % c.page, .., ..]).assign(&kn.slice(s![bb, i, .., ..]));
                    v_want.slice_mut(s![blk, t % c.page, .., ..]).assign(&vn.slice(s![bb, i, .., ..]));
                }
            }
        }
        prop_assert_eq!(kp, k_want);
        prop_assert_eq!(vp, v_want);
    }

    /// An address-ordered block table (`order_block_table`) gives the
    /// logical table's attention and appends to the same slots; calls whose
    /// keys carry positions (a left window, ALiBi) are refused.
    #[test]
    fn ordered_table_equals_logical(c in paged_case()) {
        let cap = c.max_blocks * c.page;
        let n = c.s_new.unwrap_or(0);
        let PagedData { seqlens, table, k_pages, v_pages, q, k_new, v_new, slopes: sl, .. } = c.data(c.seed ^ 0x0DE5);
        let p = c.f.params();
        let call = KvCacheCall::from_shape(&p, c.f.alibi.is_some(), c.sq, n);
        let mut ordered = table.clone();
        let r = order_block_table(ordered.as_slice_mut().unwrap(), c.max_blocks, c.page, &seqlens, &call);
        let (left, _) = normalize_window(p.causal, p.window_left, p.window_right, cap);
        if c.f.alibi.is_some() || left != UNBOUNDED {
            prop_assert!(r.is_err(), "a position-dependent call was ordered");
            prop_assert_eq!(&ordered, &table);
            return Ok(());
        }
        // Each row: its full pages of keys that every query row sees (by
        // brute force over the mask) sorted, every other slot as it was.
        let (_, right) = normalize_window(p.causal, p.window_left, p.window_right, cap);
        let mut want_table = table.clone();
        let mut free_pages = 0;
        for (bb, &cached_b) in seqlens.iter().enumerate() {
            let (cached, seqlen_k) = (cached_b as i64, cached_b as i64 + n as i64);
            let seen_by_all = |j: i64| (0..c.sq as i64).all(|i| right == UNBOUNDED || j <= i + seqlen_k - c.sq as i64 + right as i64);
            let free = (0..cached).filter(|&j| seen_by_all(j)).count() / c.page;
            want_table.slice_mut(s![bb, ..free]).as_slice_mut().unwrap().sort_unstable();
            free_pages += free;
        }
        prop_assert_eq!(r.unwrap(), free_pages);
        prop_assert_eq!(&ordered, &want_table);
        let run = |t: &Array2<i32>| {
            let (mut kp, mut vp) = (k_pages.clone(), v_pages.clone());
            let pages = PagedKvMut { k_pages: kp.view_mut(), v_pages: vp.view_mut(), block_table: t.view() };
            let (kn, vn) = (k_new.as_ref().map(|a| a.view()), v_new.as_ref().map(|a| a.view()));
            let out = paged_kvcache_attention(q.view(), pages, &seqlens, kn, vn, &p, host_alibi(c.f.alibi, &sl)).unwrap();
            (out, kp, vp)
        };
        let (want, k_want, v_want) = run(&table);
        let (got, k_got, v_got) = run(&ordered);
        check_out("ordered vs logical table", &got, &want, TOL)?;
        prop_assert_eq!(k_got, k_want);
        prop_assert_eq!(v_got, v_want);
    }

    /// Varlen prefill over pages (prefix caching) = varlen over the packed
    /// keys; sequences may share their first pages (a common prefix).
    #[test]
    fn varlen_paged_equals_varlen(
        c in paged_case(),
        lens in prop::collection::vec((0usize..=12, 0.0f64..=1.0), 1..=4),
        share in any::<bool>(),
        use_seqused in any::<bool>(),
    ) {
        let mut rng = Rng::new(c.seed);
        let (hk, d, h, page) = (c.nheads_k, c.d, c.nheads_k * c.group, c.page);
        let batch = lens.len();
        let cap = c.max_blocks * page;
        let seg_k: Vec<usize> = lens.iter().map(|&(_, f)| (cap as f64 * f).round() as usize).collect();
        let (mut table, num_blocks) = block_table(&mut rng, &seg_k, page, c.max_blocks, c.spare_blocks);
        if share && batch > 1 && seg_k[0] >= page && seg_k[1] >= page {
            table[[1, 0]] = table[[0, 0]]; // sequence 1 reads sequence 0's first page
        }
        let k_pages = rng.tensor((num_blocks, page, hk, d), 2.0);
        let v_pages = rng.tensor((num_blocks, page, hk, d), 1.0);
        // The packed keys, gathered by hand.
        let pack = |pages: &Array4<f64>| {
            let rows: Vec<_> = (0..batch)
                .flat_map(|b| (0..seg_k[b]).map(move |t| (b, t)))
                .map(|(b, t)| pages.slice(s![table[[b, t / page]] as usize, t % page, .., ..]).insert_axis(Axis(0)).to_owned())
                .collect();
            let views: Vec<_> = rows.iter().map(|r| r.view()).collect();
            if views.is_empty() { Array3::zeros((0, hk, d)) } else { concatenate(Axis(0), &views).unwrap() }
        };
        let (k, v) = (pack(&k_pages), pack(&v_pages));
        let cu_q = prefix_sums(lens.iter().map(|&(n, _)| n));
        let cu_k = prefix_sums(seg_k.iter().copied());
        let used: Vec<i32> = seg_k.iter().map(|&n| rng.below(n + 1) as i32).collect();
        let seqused = use_seqused.then_some(used.as_slice());
        let max_q = lens.iter().map(|&(n, _)| n).max().unwrap();
        let max_k = if use_seqused { used.iter().copied().max().unwrap() as usize } else { seg_k.iter().copied().max().unwrap() };
        let q = Array3::from_shape_simple_fn((*cu_q.last().unwrap() as usize, h, d), || rng.sym(2.0));
        let sl = slopes(&mut rng, c.f.alibi, batch, h);
        let p = c.f.params();
        let al = || host_alibi(c.f.alibi, &sl);
        let want = attention_varlen(q.view(), k.view(), v.view(), &cu_q, &cu_k, seqused, max_q, max_k, &p, al()).unwrap();
        let pages = PagedKv { k_pages: k_pages.view(), v_pages: v_pages.view(), block_table: table.view() };
        let got = attention_varlen_paged(q.view(), &pages, &cu_q, &cu_k, seqused, max_q, max_k, &p, al()).unwrap();
        check_close("paged varlen vs varlen", (got.o.view(), got.lse.view()), (want.o.view(), want.lse.view()), TOL)?;
        // Prefix caching over an address-ordered table: each sequence's keys
        // as its cached length, no append, the longest query chunk as every
        // sequence's (fewer free keys: safe).
        let keys: Vec<i32> = if use_seqused { used.clone() } else { seg_k.iter().map(|&n| n as i32).collect() };
        let call = KvCacheCall::from_shape(&p, c.f.alibi.is_some(), max_q.max(1), 0);
        let mut ordered = table.clone();
        if order_block_table(ordered.as_slice_mut().unwrap(), c.max_blocks, page, &keys, &call).is_ok() {
            let pages = PagedKv { k_pages: k_pages.view(), v_pages: v_pages.view(), block_table: ordered.view() };
            let got = attention_varlen_paged(q.view(), &pages, &cu_q, &cu_k, seqused, max_q, max_k, &p, al()).unwrap();
            check_close("paged varlen over the ordered table vs varlen", (got.o.view(), got.lse.view()), (want.o.view(), want.lse.view()), TOL)?;
        }
    }
}

// ---------------------------------------------------------------------------
// Bad input.
// ---------------------------------------------------------------------------

#[test]
fn split_kv_bad_input() {
    let q = Array4::<f64>::zeros((1, 1, 2, 4));
    let k = Array4::<f64>::zeros((1, 5, 2, 4));
    let p = ForwardParams::default();
    let run = |b: &[usize], p: &ForwardParams| split_kv_forward(q.view(), k.view(), k.view(), p, None, b);
    assert_invalid(run(&[], &p), "split_bounds", &["[]"]);
    assert_invalid(run(&[0], &p), "split_bounds", &["[0]"]);
    assert_invalid(run(&[1, 5], &p), "split_bounds", &["[1, 5]", "seqlen_k = 5"]);
    assert_invalid(run(&[0, 4], &p), "split_bounds", &["[0, 4]"]);
    assert_invalid(run(&[0, 3, 2, 5], &p), "split_bounds", &["[0, 3, 2, 5]"]);
    assert!(run(&[0, 0, 5, 5], &p).is_ok());
    let e = run(&[0, 5], &ForwardParams { block: Some((0, 4)), ..p }).unwrap_err();
    assert!(matches!(e, FlashAttnError::InvalidBlock { .. }), "{e}");
    assert_invalid(run(&[0, 5], &ForwardParams { softcap: Some(f32::NAN), ..p }), "softcap", &["NaN"]);
}

/// Runs a KV-cache call that must fail, and checks the cache is unchanged.
fn kv_err(
    q: &Array4<f64>,
    cache: (&Array4<f64>, &Array4<f64>),
    seqlens: &[i32],
    new: (Option<&Array4<f64>>, Option<&Array4<f64>>),
    idx: Option<&[i32]>,
    p: &ForwardParams,
) -> flash_attn::Result<AttnOutput<f64>> {
    let (mut kc, mut vc) = (cache.0.clone(), cache.1.clone());
    let r = kvcache_attention(q.view(), &mut kc, &mut vc, seqlens, new.0.map(|a| a.view()), new.1.map(|a| a.view()), idx, p, None);
    assert!(r.is_err(), "expected an error");
    assert_eq!(&kc, cache.0, "the cache must be unchanged after an error");
    assert_eq!(&vc, cache.1, "the cache must be unchanged after an error");
    r
}

#[test]
fn kvcache_bad_input() {
    let mut rng = Rng::new(9);
    let q = rng.tensor((2, 1, 4, 8), 1.0);
    let kc = rng.tensor((3, 6, 2, 8), 1.0);
    let vc = rng.tensor((3, 6, 2, 8), 1.0);
    let kn = rng.tensor((2, 2, 2, 8), 1.0);
    let p = ForwardParams { causal: true, ..Default::default() };
    let c = (&kc, &vc);
    let none = (None, None);
    let new = (Some(&kn), Some(&kn));
    assert_invalid(kv_err(&q, c, &[1], none, None, &p), "cache_seqlens", &["1 entries", "batch = 2"]);
    assert_invalid(kv_err(&q, c, &[1, -1], none, None, &p), "cache_seqlens", &["cache_seqlens[1] = -1"]);
    assert_invalid(kv_err(&q, c, &[7, 0], none, None, &p), "cache_seqlens", &["cache_seqlens[0] = 7", "capacity = 6"]);
    assert_invalid(kv_err(&q, c, &[4, 5], new, None, &p), "k_new", &["sequence 1", "cache_seqlens[1] = 5 + 2 new rows > capacity 6"]);
    assert_invalid(kv_err(&q, c, &[1, 1], (Some(&kn), None), None, &p), "v_new", &["None"]);
    assert_invalid(kv_err(&q, c, &[1, 1], (None, Some(&kn)), None, &p), "k_new", &["None"]);
    assert_invalid(kv_err(&q, c, &[1, 1], none, Some(&[0]), &p), "cache_batch_idx", &["1 entries", "batch = 2"]);
    assert_invalid(kv_err(&q, c, &[1, 1], none, Some(&[0, 3]), &p), "cache_batch_idx", &["cache_batch_idx[1] = 3", "batch_c = 3"]);
    assert_invalid(kv_err(&q, c, &[1, 1], none, Some(&[-1, 0]), &p), "cache_batch_idx", &["cache_batch_idx[0] = -1"]);
    assert_invalid(kv_err(&q, c, &[1, 1], new, Some(&[2, 2]), &p), "cache_seqlens", &["sequences 0 and 1 both append"]);
    assert!(kvcache_attention(q.view(), &mut kc.clone(), &mut vc.clone(), &[1, 1], None, None, Some(&[2, 2]), &p, None).is_ok());
    let bad = ForwardParams { causal: true, window_right: Some(3), ..p };
    assert_invalid(kv_err(&q, c, &[1, 1], new, None, &bad), "window_right", &["Some(3)"]);
    // Shapes.
    let kn_h = rng.tensor((2, 2, 1, 8), 1.0);
    let e = kv_err(&q, c, &[1, 1], (Some(&kn_h), Some(&kn_h)), None, &p).unwrap_err();
    assert!(matches!(e, FlashAttnError::ShapeMismatch { argument: "k_new", axis: "nheads", actual: 1, expected: 2, .. }), "{e}");
    let kn_b = rng.tensor((1, 2, 2, 8), 1.0);
    let e = kv_err(&q, c, &[1, 1], (Some(&kn), Some(&kn_b)), None, &p).unwrap_err();
    assert!(matches!(e, FlashAttnError::ShapeMismatch { argument: "v_new", axis: "batch", actual: 1, expected: 2, .. }), "{e}");
    let vc_short = rng.tensor((3, 5, 2, 8), 1.0);
    let e = kv_err(&q, (&kc, &vc_short), &[1, 1], none, None, &p).unwrap_err();
    assert!(matches!(e, FlashAttnError::ShapeMismatch { argument: "v_cache", axis: "seqlen", .. }), "{e}");
    let small = rng.tensor((1, 6, 2, 8), 1.0);
    assert_invalid(kv_err(&q, (&small, &small), &[1, 1], none, None, &p), "k_cache", &["batch_c = 1", "batch = 2"]);
    let q3 = rng.tensor((2, 1, 3, 8), 1.0);
    assert_invalid(kv_err(&q3, c, &[1, 1], none, None, &p), "nheads_k", &["nheads_k = 2", "nheads = 3"]);
    let q_d = rng.tensor((2, 1, 4, 4), 1.0);
    let e = kv_err(&q_d, c, &[1, 1], none, None, &p).unwrap_err();
    assert!(matches!(e, FlashAttnError::ShapeMismatch { argument: "k_cache", axis: "headdim", .. }), "{e}");
}

#[test]
fn paged_bad_input() {
    let mut rng = Rng::new(11);
    let q = rng.tensor((2, 1, 2, 4), 1.0);
    let kp = rng.tensor((4, 3, 1, 4), 1.0);
    let kn = rng.tensor((2, 2, 1, 4), 1.0);
    let p = ForwardParams::default();
    let table = array![[0, 1], [2, -7]];
    // Runs a paged KV-cache call that must fail; the pages stay unchanged.
    let run = |kp0: &Array4<f64>, table: &Array2<i32>, seqlens: &[i32], new: Option<&Array4<f64>>| {
        let (mut k, mut v) = (kp0.clone(), kp0.clone());
        let pages = PagedKvMut { k_pages: k.view_mut(), v_pages: v.view_mut(), block_table: table.view() };
        let r = paged_kvcache_attention(q.view(), pages, seqlens, new.map(|a| a.view()), new.map(|a| a.view()), &p, None);
        assert!(r.is_err());
        assert_eq!((&k, &v), (kp0, kp0), "pages unchanged after an error");
        r
    };
    // Sequence 1 uses 3 tokens = block table[1][0] only: the -7 is never read.
    let (mut k, mut v) = (kp.clone(), kp.clone());
    let pages = PagedKvMut { k_pages: k.view_mut(), v_pages: v.view_mut(), block_table: table.view() };
    assert!(paged_kvcache_attention(q.view(), pages, &[4, 3], None, None, &p, None).is_ok());
    assert_invalid(run(&kp, &table, &[4, 4], None), "block_table", &["block_table[1][1] = -7", "num_blocks = 4"]);
    assert_invalid(run(&kp, &array![[0, 9], [2, 3]], &[4, 1], None), "block_table", &["block_table[0][1] = 9"]);
    assert_invalid(run(&kp, &table, &[7, 1], None), "cache_seqlens", &["cache_seqlens[0] = 7", "capacity = 6"]);
    assert_invalid(run(&kp, &table, &[5, 1], Some(&kn)), "k_new", &["cache_seqlens[0] = 5 + 2 new rows > capacity 6"]);
    assert_invalid(run(&kp, &array![[0, 1], [0, 3]], &[1, 1], Some(&kn)), "cache_seqlens", &["both append"]);
    let e = run(&kp, &array![[0, 1]], &[1, 1], None).unwrap_err();
    assert!(matches!(e, FlashAttnError::ShapeMismatch { argument: "block_table", axis: "batch", actual: 1, expected: 2, .. }), "{e}");
    let empty_pages = Array4::<f64>::zeros((4, 0, 1, 4));
    assert_invalid(run(&empty_pages, &table, &[0, 0], None), "k_pages", &["page_size"]);
    // paged_to_contiguous and the varlen prefill check the same.
    let view = PagedKv { k_pages: kp.view(), v_pages: kp.view(), block_table: table.view() };
    assert_invalid(paged_to_contiguous(&view, &[1, 4]), "block_table", &["block_table[1][1] = -7"]);
    assert_invalid(paged_to_contiguous(&view, &[1, 7]), "seqlens", &["seqlens[1] = 7"]);
    assert_invalid(paged_to_contiguous(&view, &[1]), "seqlens", &["1 entries"]);
    let vshort = Array4::<f64>::zeros((3, 3, 1, 4));
    let bad = PagedKv { k_pages: kp.view(), v_pages: vshort.view(), block_table: table.view() };
    let e = paged_to_contiguous(&bad, &[1, 1]).unwrap_err();
    assert!(matches!(e, FlashAttnError::ShapeMismatch { argument: "v_pages", axis: "num_blocks", .. }), "{e}");
    let qv = Array3::from_shape_simple_fn((2, 2, 4), || rng.sym(1.0));
    let r = attention_varlen_paged(qv.view(), &view, &[0, 1, 2], &[0, 3, 10], None, 1, 7, &p, None);
    assert_invalid(r, "cu_seqlens_k", &["cu_seqlens_k[1] = 7", "capacity = 6"]);
    let r = attention_varlen_paged(qv.view(), &view, &[0, 1, 2], &[0, 3, 7], None, 1, 4, &p, None);
    assert_invalid(r, "block_table", &["block_table[1][1] = -7"]);
    let r = attention_varlen_paged(qv.view(), &view, &[0, 1, 2], &[0, 3, 7], Some(&[3, 3]), 1, 3, &p, None);
    assert!(r.is_ok(), "seqused_k = 3 reads only block_table[1][0]");
    let r = attention_varlen_paged(qv.view(), &view, &[0, 2, 1], &[0, 3, 6], None, 2, 3, &p, None);
    assert_invalid(r, "cu_seqlens_q", &["cu_seqlens_q[2] = 1 < cu_seqlens_q[1] = 2"]);
}

/// The decode paths are generic: in f32 they match f64 on the same (rounded)
/// inputs to f32 accuracy, the cache appends are exact in both.
#[test]
fn decode_paths_in_f32() {
    let mut rng = Rng::new(21);
    let r32 = |a: Array4<f64>| a.mapv(|x| x as f32);
    let (q, kc, vc, kn) = (
        r32(rng.tensor((2, 3, 4, 16), 2.0)),
        r32(rng.tensor((2, 40, 2, 16), 2.0)),
        r32(rng.tensor((2, 40, 2, 16), 1.0)),
        r32(rng.tensor((2, 3, 2, 16), 2.0)),
    );
    let up = |a: &Array4<f32>| a.mapv(|x| x as f64);
    let p = ForwardParams { causal: true, window_left: Some(20), softcap: Some(30.0), ..Default::default() };
    let close = |what: &str, o32: &Array4<f32>, l32: &Array3<f32>, want: &AttnOutput<f64>| {
        let e = o32.iter().zip(&want.o).map(|(&a, &b)| (a as f64 - b).abs()).fold(0.0, f64::max);
        let el = l32.iter().zip(&want.lse).map(|(&a, &b)| (a as f64 - b).abs() / (1.0 + b.abs())).fold(0.0, f64::max);
        assert!(e < 5e-5 && el < 5e-5, "{what}: |ΔO| = {e:e}, |ΔLSE| = {el:e}");
    };
    // Split-KV.
    let (k0, v0) = (kc.slice(s![.., ..33, .., ..]), vc.slice(s![.., ..33, .., ..]));
    let want = attention(up(&q).view(), up(&k0.to_owned()).view(), up(&v0.to_owned()).view(), &p, None).unwrap();
    let got = split_kv_forward(q.view(), k0, v0, &p, None, &[0, 5, 5, 17, 33]).unwrap();
    close("split-KV f32", &got.o, &got.lse, &want);
    // KV cache with append, f32 and f64.
    let seqlens = [30, 7];
    let (mut k32, mut v32) = (kc.clone(), vc.clone());
    let got = kvcache_attention(q.view(), &mut k32, &mut v32, &seqlens, Some(kn.view()), Some(kn.view()), None, &p, None).unwrap();
    let (mut k64, mut v64) = (up(&kc), up(&vc));
    let (qd, knd) = (up(&q), up(&kn));
    let want = kvcache_attention(qd.view(), &mut k64, &mut v64, &seqlens, Some(knd.view()), Some(knd.view()), None, &p, None).unwrap();
    close("KV cache f32", &got.o, &got.lse, &want);
    assert_eq!(up(&k32), k64);
    // Paged, page size 4 (10 blocks per sequence, in reverse order).
    let k_pages = kc.clone().into_shape_with_order((20, 4, 2, 16)).unwrap();
    let table = Array2::from_shape_fn((2, 10), |(b, i)| (b * 10 + 9 - i) as i32);
    let view = PagedKv { k_pages: k_pages.view(), v_pages: k_pages.view(), block_table: table.view() };
    let (kcont, vcont) = paged_to_contiguous(&view, &[40, 40]).unwrap();
    let (mut kp, mut vp) = (k_pages.clone(), k_pages.clone());
    let pages = PagedKvMut { k_pages: kp.view_mut(), v_pages: vp.view_mut(), block_table: table.view() };
    let got = paged_kvcache_attention(q.view(), pages, &seqlens, Some(kn.view()), Some(kn.view()), &p, None).unwrap();
    let (mut kc2, mut vc2) = (up(&kcont), up(&vcont));
    let want = kvcache_attention(qd.view(), &mut kc2, &mut vc2, &seqlens, Some(knd.view()), Some(knd.view()), None, &p, None).unwrap();
    close("paged f32", &got.o, &got.lse, &want);
}

/// The flash-decoding split count on an H100 (132 SMs): one block per SM
/// for 8 warps × Bc 128 (d = 128), two for 4 warps × Bc 64. FlashAttention-2's
/// heuristic leaves SMs idle where these fill them (GQA 32/8 at batch 1:
/// 14 splits = 112 blocks; 16 = 128 blocks).
#[test]
fn decode_split_counts() {
    use flash_attn::advanced::decode::{decode_no_split_fill, decode_splits_heuristic, num_splits_heuristic as fa2};
    // An H100: half its SMs saturate the DRAM.
    let dec = |work, sms, per_sm, n, max, small, bal| decode_splits_heuristic(work, sms, per_sm, n, max, decode_no_split_fill(small, bal, n, true));
    // (work tiles, blocks per SM, key blocks, pages smaller than a key block,
    // splits balanced by tickets) → splits
    for (work, per_sm, n, small, bal, want) in [
        (8, 1, 256, false, true, 16),   // b1 GQA 32k, Bc 128
        (8, 1, 256, true, false, 16),   // the same over 16-token pages
        (8, 1, 1024, false, true, 16),  // b1 GQA 131k
        (32, 1, 256, false, true, 4),   // b1 MHA 32k
        (32, 1, 1024, false, false, 4), // b1 MHA 131k over 256-token pages
        (8, 2, 512, true, false, 32),   // b1 GQA 32k, Bc 64 (small pages; 33 would leave a split empty)
        (8, 2, 2048, true, false, 33),  // b1 GQA 131k, Bc 64
        (32, 2, 512, true, false, 8),   // b1 MHA 32k, Bc 64
        (64, 1, 32, false, true, 1),    // b8 GQA 4k: 64 tiles stream as fast unsplit
        (64, 1, 32, true, false, 2),    // b8 GQA 4k over 16-token pages: still split
        (64, 1, 256, false, true, 2),   // b8 GQA 32k contiguous: tickets balance the splits
        (64, 1, 1024, false, true, 2),  // b8 GQA 131k contiguous
        (64, 1, 256, false, false, 1),  // b8 GQA 32k over 256-token pages (static splits)
        (64, 1, 1024, false, false, 1), // b8 GQA 131k over 256-token pages
        (64, 1, 256, true, false, 2),   // b8 GQA 32k over 16-token pages
        (60, 1, 64, false, true, 1),    // 60 of 132 slots (≥ 45%), 8k keys
        (60, 1, 65, false, true, 2),    // one key block more: not short
        (56, 1, 64, false, false, 2),   // b7 GQA: 56 of 132 (< 45%)
        (256, 1, 256, true, false, 1),  // b8 MHA: the work fills the SMs
        (1, 1, 32, false, true, 32),    // one tile, 4k keys: a split per key block
        (8, 1, 4, false, true, 1),      // at most 4 key blocks: no split
    ] {
        assert_eq!(dec(work, 132, per_sm, n, 128, small, bal), want, "work {work}, {per_sm}/SM, {n} key blocks, small pages {small}, balanced {bal}");
    }
    // An H200 (36 GB/s per SM): 64 tiles of a short cache or over whole-block
    // pages still split (80%, the rule before decode step 30).
    for (n, small, bal) in [(32, false, false), (256, false, false), (32, false, true)] {
        assert_eq!(decode_splits_heuristic(64, 132, 1, n, 128, decode_no_split_fill(small, bal, n, false)), 2);
    }
    assert_eq!(decode_no_split_fill(false, false, 1024, false), 0.8);
    assert_eq!(decode_no_split_fill(false, false, 1024, true), flash_attn::advanced::decode::NO_SPLIT_FILL);
    assert_eq!(fa2(8, 132, 256, 128), 14);
    // max_splits bounds it; a scratch of one split turns it off.
    assert_eq!(dec(8, 132, 1, 256, 8, false, true), 8);
    assert_eq!(dec(8, 132, 1, 256, 1, false, true), 1);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]
    /// Within bounds, one wave, and no single-wave split count gives the
    /// busiest SM fewer key blocks.
    #[test]
    fn decode_split_count_is_the_least_load(
        work in 1usize..300, sms in 1usize..200, per_sm in 1usize..4, n in 1usize..5000, max in 1usize..=128, fill in 0.0f64..1.0,
    ) {
        let s = flash_attn::advanced::decode::decode_splits_heuristic(work, sms, per_sm, n, max, fill);
        prop_assert!(s >= 1 && s <= max.max(1) && s <= n.max(1));
        let slots = sms * per_sm;
        prop_assert!(s == 1 || work * s <= slots);
        // Every split has keys.
        prop_assert!(n.div_ceil(s) * (s - 1) < n);
        if s > 1 {
            let load = |s: usize| (work * s).div_ceil(sms) * n.div_ceil(s);
            for t in 1..=max.min(n) {
                if t == 1 || (work * t <= slots && n.div_ceil(n.div_ceil(t)) == t) {
                    prop_assert!(load(s) <= load(t), "s {s} load {} > t {t} load {}", load(s), load(t));
                }
            }
        }
    }
}
