//! The KV-cache calls: `flash_attn_varlen_paged_windowed` (varlen prefill
//! over a paged cache) and `flash_attn_with_kvcache` / `FlashAttnKvCache`
//! (append in place, then attend), on the CPU against candle's attention
//! over the gathered / concatenated keys and against flash-attn's CPU
//! reference called directly; on the GPU (`FA_REQUIRE_GPU=1`, feature
//! `cuda`) against the CPU path on the same inputs, caches compared
//! exactly. Bad input: candle errors naming the argument, caches untouched.

mod common;

use candle_core::{DType, Device, IndexOp, Result, Tensor};
use common::*;
use flash_attn::ForwardParams;
use flash_attn::reference::{self, PagedKv};
use flash_attn_candle::{self as fa, FlashAttnKvCache, KvCacheArgs};
use ndarray::{Array2, Array3, Array4};

/// A 64-bit LCG: block tables in a random order, reproducibly.
struct Lcg(u64);

impl Lcg {
    fn below(&mut self, n: usize) -> usize {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        ((self.0 >> 33) % n as u64) as usize
    }

    fn shuffle<T>(&mut self, v: &mut [T]) {
        for i in (1..v.len()).rev() {
            v.swap(i, self.below(i + 1));
        }
    }
}

/// A block table `(batch, max_blocks)` row-major: sequence `b`'s
/// `ceil(lens[b] / page)` blocks are distinct pages in a shuffled order,
/// one spare column, the unused entries valid but random; 3 spare pages.
struct Pages {
    page: usize,
    table: Vec<u32>,
    max_blocks: usize,
    num_blocks: usize,
}

fn random_pages(rng: &mut Lcg, lens: &[usize], page: usize) -> Pages {
    let need: Vec<usize> = lens.iter().map(|l| l.div_ceil(page)).collect();
    let max_blocks = need.iter().max().unwrap() + 1;
    let num_blocks = need.iter().sum::<usize>() + 3;
    let mut ids: Vec<u32> = (0..num_blocks as u32).collect();
    rng.shuffle(&mut ids);
    let mut table = vec![0u32; lens.len() * max_blocks];
    let mut next = 0;
    for (b, &n) in need.iter().enumerate() {
        for i in 0..max_blocks {
            table[b * max_blocks + i] = if i < n {
                next += 1;
                ids[next - 1]
            } else {
                rng.below(num_blocks) as u32
            };
        }
    }
    Pages { page, table, max_blocks, num_blocks }
}

impl Pages {
    fn tensor(&self, dev: &Device) -> Result<Tensor> {
        Tensor::from_slice(&self.table, (self.table.len() / self.max_blocks, self.max_blocks), dev)
    }

    /// `(outer, row)` of key `t` of sequence `b`.
    fn slot(&self, b: usize, t: usize) -> (usize, usize) {
        (self.table[b * self.max_blocks + t / self.page] as usize, t % self.page)
    }
}

/// Keys `0..len` of sequence `b` of a `(outer, rows, hk, d)` store.
fn gather(store: &Tensor, slot: impl Fn(usize) -> (usize, usize), len: usize) -> Result<Tensor> {
    let (n0, n1, hk, d) = store.dims4()?;
    let flat = store.reshape((n0 * n1, hk, d))?;
    let idx: Vec<u32> = (0..len).map(slot).map(|(o, r)| (o * n1 + r) as u32).collect();
    flat.index_select(&Tensor::new(idx.as_slice(), store.device())?, 0)
}

/// `max |a − b|` where equal values (−inf LSEs of rows without keys) count 0.
fn max_diff_inf(a: &Tensor, b: &Tensor) -> Result<f32> {
    let (a, b) = (a.flatten_all()?.to_vec1::<f32>()?, b.flatten_all()?.to_vec1::<f32>()?);
    Ok(a.iter().zip(&b).map(|(x, y)| if x == y { 0.0 } else { (x - y).abs() }).fold(0.0, f32::max))
}

fn cu(lens: &[usize]) -> Vec<u32> {
    std::iter::once(0).chain(lens.iter().scan(0u32, |a, &x| {
        *a += x as u32;
        Some(*a)
    })).collect()
}

fn nd3(t: &Tensor) -> Result<Array3<f64>> {
    let (a, b, c) = t.dims3()?;
    Ok(Array3::from_shape_vec((a, b, c), t.to_dtype(DType::F64)?.flatten_all()?.to_vec1::<f64>()?).unwrap())
}

fn nd4(t: &Tensor) -> Result<Array4<f64>> {
    let (a, b, c, d) = t.dims4()?;
    Ok(Array4::from_shape_vec((a, b, c, d), t.to_dtype(DType::F64)?.flatten_all()?.to_vec1::<f64>()?).unwrap())
}

fn max_diff_nd<D: ndarray::Dimension>(a: &ndarray::Array<f64, D>, t: &Tensor) -> Result<f64> {
    let b = t.to_dtype(DType::F64)?.flatten_all()?.to_vec1::<f64>()?;
    Ok(a.iter().zip(&b).map(|(x, y)| if x == y { 0.0 } else { (x - y).abs() }).fold(0.0, f64::max))
}

/// Our options as the core's parameters (for the reference called directly).
fn params(scale: f32, window: (Option<usize>, Option<usize>), softcap: Option<f32>) -> ForwardParams {
    let causal = window == (None, Some(0));
    let (window_left, window_right) = if causal { (None, None) } else { window };
    ForwardParams { softmax_scale: Some(scale), causal, window_left, window_right, softcap, ..Default::default() }
}

type Window = (Option<usize>, Option<usize>);

const WINDOWS: [(Window, Option<f32>); 3] =
    [((None, Some(0)), None), ((Some(6), Some(0)), None), ((None, None), Some(4.0))];

/// Paged varlen prefill on the CPU: random block tables, page sizes 1, 3,
/// 7, 16; each sequence equals candle's attention over the keys gathered
/// from its pages, and the whole call equals `reference::attention_varlen_paged`.
#[test]
fn paged_varlen_matches_candle_and_reference() -> Result<()> {
    let dev = Device::Cpu;
    let mut rng = Lcg(7);
    let (h, hk, d) = (4, 2, 32);
    let (lq, lk) = ([4usize, 1, 9], [12usize, 30, 9]);
    let (cq, ck) = (cu(&lq), cu(&lk));
    let (cq_t, ck_t) = (Tensor::new(cq.as_slice(), &dev)?, Tensor::new(ck.as_slice(), &dev)?);
    let scale = 0.17f32;
    for page in [1usize, 3, 7, 16] {
        let p = random_pages(&mut rng, &lk, page);
        let q = Tensor::randn(0f32, 1., (cq[3] as usize, h, d), &dev)?;
        let kp = randn((p.num_blocks, page, hk, d), &dev)?;
        let vp = randn((p.num_blocks, page, hk, d), &dev)?;
        let bt = p.tensor(&dev)?;
        for (window, softcap) in WINDOWS {
            let what = format!("page {page} window {window:?} softcap {softcap:?}");
            let o = fa::flash_attn_varlen_paged_windowed(&q, &kp, &vp, &cq_t, &ck_t, &bt, None, 9, 30, scale, window.0, window.1, page, softcap)?;
            assert_eq!(o.dims(), q.dims());
            for b in 0..3 {
                let qi = q.narrow(0, cq[b] as usize, lq[b])?.unsqueeze(0)?;
                let ki = gather(&kp, |t| p.slot(b, t), lk[b])?.unsqueeze(0)?;
                let vi = gather(&vp, |t| p.slot(b, t), lk[b])?.unsqueeze(0)?;
                let want = candle_attention_ext(&qi, &ki, &vi, scale as f64, window, softcap.map(f64::from), None)?.squeeze(0)?;
                let e = max_diff(&o.narrow(0, cq[b] as usize, lq[b])?, &want)?;
                assert!(e <= 2e-5, "{what}, sequence {b}: {e} from candle's attention over the gathered keys");
            }
            let table = Array2::from_shape_vec((3, p.max_blocks), p.table.iter().map(|&x| x as i32).collect()).unwrap();
            let (k4, v4) = (nd4(&kp)?, nd4(&vp)?);
            let pages = PagedKv { k_pages: k4.view(), v_pages: v4.view(), block_table: table.view() };
            let cqi: Vec<i32> = cq.iter().map(|&x| x as i32).collect();
            let cki: Vec<i32> = ck.iter().map(|&x| x as i32).collect();
            let want = reference::attention_varlen_paged(nd3(&q)?.view(), &pages, &cqi, &cki, None, 9, 30, &params(scale, window, softcap), None).unwrap();
            let e = max_diff_nd(&want.o, &o)?;
            assert!(e <= 1e-5, "{what}: {e} from the f64 reference");
        }
    }
    Ok(())
}

/// A KV-cache call's inputs (f32, on the CPU): `batch` sequences with
/// `lens[b]` cached keys, `s_new` new ones, `sq` queries; contiguous caches
/// `(batch_c, cap, hk, d)` (rows through `batch_idx` if given) or pages.
struct KvCase {
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    new: Option<(Tensor, Tensor)>,
    lens: Vec<u32>,
    batch_idx: Option<Vec<u32>>,
    pages: Option<Pages>,
}

#[derive(Clone, Copy)]
struct Geom {
    heads: (usize, usize),
    d: usize,
    sq: usize,
    s_new: usize,
    cap: usize,
}

fn kv_case(rng: &mut Lcg, g: Geom, lens: &[usize], page: Option<usize>, batch_idx: Option<&[u32]>) -> Result<KvCase> {
    let dev = Device::Cpu;
    let batch = lens.len();
    let (h, hk) = g.heads;
    let pages = page.map(|p| {
        let total: Vec<usize> = lens.iter().map(|l| l + g.s_new).collect();
        random_pages(rng, &total, p)
    });
    let shape = match &pages {
        Some(p) => (p.num_blocks, p.page, hk, g.d),
        None => (batch_idx.map_or(batch, |i| *i.iter().max().unwrap() as usize + 1), g.cap, hk, g.d),
    };
    let new = if g.s_new > 0 { Some((randn((batch, g.s_new, hk, g.d), &dev)?, randn((batch, g.s_new, hk, g.d), &dev)?)) } else { None };
    Ok(KvCase {
        q: randn((batch, g.sq, h, g.d), &dev)?,
        k_cache: randn(shape, &dev)?,
        v_cache: randn(shape, &dev)?,
        new,
        lens: lens.iter().map(|&l| l as u32).collect(),
        batch_idx: batch_idx.map(<[u32]>::to_vec),
        pages,
    })
}

impl KvCase {
    fn slot(&self, b: usize, t: usize) -> (usize, usize) {
        match (&self.pages, &self.batch_idx) {
            (Some(p), _) => p.slot(b, t),
            (None, Some(i)) => (i[b] as usize, t),
            (None, None) => (b, t),
        }
    }

    /// Runs `op` on `dev` in `dt` over fresh copies of the caches; returns
    /// O, LSE and the caches after the call (all on the CPU, f32).
    fn run(&self, op: &FlashAttnKvCache, dev: &Device, dt: DType) -> Result<[Tensor; 4]> {
        let put = |t: &Tensor| -> Result<Tensor> { t.to_dtype(dt)?.to_device(dev)?.copy() };
        let (q, kc, vc) = (put(&self.q)?, put(&self.k_cache)?, put(&self.v_cache)?);
        let new = self.new.as_ref().map(|(k, v)| Ok::<_, candle_core::Error>((put(k)?, put(v)?))).transpose()?;
        let lens = Tensor::new(self.lens.as_slice(), dev)?;
        let idx = self.batch_idx.as_ref().map(|i| Tensor::new(i.as_slice(), dev)).transpose()?;
        let bt = self.pages.as_ref().map(|p| p.tensor(dev)).transpose()?;
        let args = KvCacheArgs {
            k_new: new.as_ref().map(|n| &n.0),
            v_new: new.as_ref().map(|n| &n.1),
            cache_seqlens: &lens,
            cache_batch_idx: idx.as_ref(),
            block_table: bt.as_ref(),
        };
        let (o, lse) = op.forward(&q, &kc, &vc, args)?;
        let cpu = |t: &Tensor| t.to_device(&Device::Cpu)?.to_dtype(DType::F32);
        Ok([cpu(&o)?, cpu(&lse)?, cpu(&kc)?, cpu(&vc)?])
    }

    /// The caches after appending, computed on the host from the slots.
    fn expected_caches(&self, dt: DType) -> Result<(Tensor, Tensor)> {
        let round = |t: &Tensor| t.to_dtype(dt)?.to_dtype(DType::F32);
        let mut out = vec![];
        for (i, cache) in [&self.k_cache, &self.v_cache].into_iter().enumerate() {
            let shape = cache.dims4()?;
            let mut data = round(cache)?.flatten_all()?.to_vec1::<f32>()?;
            if let Some(new) = &self.new {
                let new = round(if i == 0 { &new.0 } else { &new.1 })?;
                let (batch, s_new, hk, d) = new.dims4()?;
                let nv = new.flatten_all()?.to_vec1::<f32>()?;
                for b in 0..batch {
                    for t in 0..s_new {
                        let (o, r) = self.slot(b, self.lens[b] as usize + t);
                        let at = (o * shape.1 + r) * hk * d;
                        let from = (b * s_new + t) * hk * d;
                        data[at..at + hk * d].copy_from_slice(&nv[from..from + hk * d]);
                    }
                }
            }
            out.push(Tensor::from_vec(data, shape, &Device::Cpu)?);
        }
        Ok((out.remove(0), out.remove(0)))
    }

    /// Sequence `b`'s keys and values after the append: the cached rows
    /// then the new ones (the concatenation), f32 `(1, len, hk, d)`.
    fn concat(&self, b: usize, dt: DType) -> Result<(Tensor, Tensor)> {
        let (kc, vc) = self.expected_caches(dt)?;
        let n = self.lens[b] as usize + self.new.as_ref().map_or(0, |(k, _)| k.dim(1).unwrap());
        Ok((gather(&kc, |t| self.slot(b, t), n)?.unsqueeze(0)?, gather(&vc, |t| self.slot(b, t), n)?.unsqueeze(0)?))
    }
}

fn kv_op(window: (Option<usize>, Option<usize>), softcap: Option<f32>, alibi: Option<&Tensor>) -> FlashAttnKvCache {
    FlashAttnKvCache {
        softmax_scale: 0.15,
        alibi_slopes: alibi.cloned(),
        window_size_left: window.0,
        window_size_right: window.1,
        softcap,
        num_splits: None,
    }
}

/// KV cache on the CPU, contiguous (with and without `cache_batch_idx`) and
/// paged (page sizes 5, 16): the caches change exactly at the appended
/// rows; the output equals candle's attention over the concatenation
/// (cached + new keys) with window/softcap/ALiBi, the reference called
/// directly, and a second call that only attends over the appended cache.
#[test]
fn kvcache_appends_then_attends_on_the_cpu() -> Result<()> {
    let mut rng = Lcg(11);
    let slopes: Vec<f32> = (0..4).map(|i| 0.3 / (i + 1) as f32).collect();
    let slopes_t = Tensor::new(slopes.as_slice(), &Device::Cpu)?;
    let lens = [0usize, 17, 33];
    for (sq, s_new) in [(3, 3), (1, 1), (2, 0)] {
        let g = Geom { heads: (4, 2), d: 32, sq, s_new, cap: 40 };
        for (page, idx) in [(None, None), (None, Some(&[2u32, 0, 3][..])), (Some(5), None), (Some(16), None)] {
            let case = kv_case(&mut rng, g, &lens, page, idx)?;
            let (ek, ev) = case.expected_caches(DType::F32)?;
            for (window, softcap, alibi) in [
                ((None, Some(0)), None, None),
                ((Some(8), Some(0)), Some(3.0), Some(&slopes_t)),
                ((None, None), None, None),
            ] {
                let what = format!("sq {sq} s_new {s_new} page {page:?} idx {idx:?} window {window:?}");
                let op = kv_op(window, softcap, alibi);
                for dt in [DType::F32, DType::BF16] {
                    let [o, lse, kc, vc] = case.run(&op, &Device::Cpu, dt)?;
                    let (ekd, evd) = case.expected_caches(dt)?;
                    assert_eq!(max_diff(&kc, &ekd)?, 0.0, "{what} {dt:?}: k_cache after the append");
                    assert_eq!(max_diff(&vc, &evd)?, 0.0, "{what} {dt:?}: v_cache after the append");
                    assert_eq!(lse.dims(), &[3, 4, sq]);
                    for b in 0..3 {
                        let (k, v) = case.concat(b, dt)?;
                        if k.dim(1)? == 0 {
                            // No key at all: O = 0, LSE = −inf.
                            assert_eq!(o.i(b)?.abs()?.max_all()?.to_scalar::<f32>()?, 0.0, "{what}: empty sequence {b}");
                            assert_eq!(lse.i(b)?.max_all()?.to_scalar::<f32>()?, f32::NEG_INFINITY);
                            continue;
                        }
                        let qb = case.q.i(b..b + 1)?.to_dtype(dt)?;
                        let a = alibi.map(|_| slopes.as_slice());
                        let want = candle_attention_ext(&qb, &k, &v, 0.15, window, softcap.map(f64::from), a)?;
                        let e = max_diff(&o.i(b..b + 1)?, &want)?;
                        assert!(e <= tol(dt), "{what} {dt:?} sequence {b}: {e} from candle over the concatenation");
                    }
                    if dt == DType::F32 && page.is_none() {
                        // The reference itself (f64), appending into its own arrays.
                        let (mut k4, mut v4) = (nd4(&case.k_cache)?, nd4(&case.v_cache)?);
                        let new = case.new.as_ref().map(|(k, v)| Ok::<_, candle_core::Error>((nd4(k)?, nd4(v)?))).transpose()?;
                        let lens_i: Vec<i32> = case.lens.iter().map(|&x| x as i32).collect();
                        let idx_i: Option<Vec<i32>> = case.batch_idx.as_ref().map(|i| i.iter().map(|&x| x as i32).collect());
                        let host_alibi = alibi.map(|_| reference::HostAlibi { slopes: &slopes, shape: flash_attn::AlibiShape::PerHead });
                        let want = reference::kvcache_attention(
                            nd4(&case.q)?.view(),
                            &mut k4,
                            &mut v4,
                            &lens_i,
                            new.as_ref().map(|n| n.0.view()),
                            new.as_ref().map(|n| n.1.view()),
                            idx_i.as_deref(),
                            &params(0.15, window, softcap),
                            host_alibi,
                        )
                        .unwrap();
                        assert!(max_diff_nd(&want.o, &o)? <= 1e-5, "{what}: output vs the reference");
                        assert!(max_diff_nd(&want.lse, &lse)? <= 1e-4, "{what}: lse vs the reference");
                        assert_eq!(max_diff_nd(&k4, &ek)?, 0.0, "{what}: the reference's cache vs ours");
                        assert_eq!(max_diff_nd(&v4, &ev)?, 0.0);
                    }
                    if dt == DType::F32 {
                        // Append then attend == attend over the appended cache.
                        let after = KvCase {
                            q: case.q.clone(),
                            k_cache: kc.clone(),
                            v_cache: vc.clone(),
                            new: None,
                            lens: case.lens.iter().map(|&l| l + s_new as u32).collect(),
                            batch_idx: case.batch_idx.clone(),
                            pages: case.pages.as_ref().map(|p| Pages { table: p.table.clone(), ..*p }),
                        };
                        let [o2, lse2, kc2, _] = after.run(&op, &Device::Cpu, dt)?;
                        assert!(max_diff(&o2, &o)? <= 1e-6, "{what}: attend-only call differs");
                        assert!(max_diff_inf(&lse2, &lse)? <= 1e-5);
                        assert_eq!(max_diff(&kc2, &kc)?, 0.0, "{what}: a call without new keys wrote the cache");
                    }
                }
            }
        }
    }
    Ok(())
}

/// The short form: `flash_attn_with_kvcache` with per-sequence lengths
/// equals the struct call; without lengths it attends over the whole
/// cache; with a block table and no lengths, over the whole capacity.
#[test]
fn kvcache_function_forms() -> Result<()> {
    let mut rng = Lcg(5);
    let g = Geom { heads: (4, 4), d: 16, sq: 1, s_new: 1, cap: 24 };
    let case = kv_case(&mut rng, g, &[3, 10], None, None)?;
    let (kc, vc) = (case.k_cache.copy()?, case.v_cache.copy()?);
    let (kn, vn) = case.new.as_ref().unwrap();
    let lens = Tensor::new(case.lens.as_slice(), &Device::Cpu)?;
    let o = fa::flash_attn_with_kvcache(&case.q, &kc, &vc, Some(kn), Some(vn), Some(&lens), None, 0.15, true)?;
    let [want, _, kc_want, _] = case.run(&kv_op((None, Some(0)), None, None), &Device::Cpu, DType::F32)?;
    assert_eq!(max_diff(&o, &want)?, 0.0);
    assert_eq!(max_diff(&kc, &kc_want)?, 0.0);
    // No lengths: the full cache, as flash_attn.
    let full = fa::flash_attn_with_kvcache(&case.q, &kc, &vc, None, None, None, None, 0.15, false)?;
    assert_eq!(max_diff(&full, &fa::flash_attn(&case.q, &kc, &vc, 0.15, false)?)?, 0.0);
    // Paged without lengths: every sequence fills its max_blocks · page keys.
    let p = random_pages(&mut rng, &[12, 12], 4);
    let kp = randn((p.num_blocks, 4, 4, 16), &Device::Cpu)?;
    let vp = randn((p.num_blocks, 4, 4, 16), &Device::Cpu)?;
    let bt = p.tensor(&Device::Cpu)?;
    let o = fa::flash_attn_with_kvcache(&case.q, &kp, &vp, None, None, None, Some(&bt), 0.15, false)?;
    for b in 0..2 {
        let k = gather(&kp, |t| p.slot(b, t), p.max_blocks * 4)?.unsqueeze(0)?;
        let v = gather(&vp, |t| p.slot(b, t), p.max_blocks * 4)?.unsqueeze(0)?;
        let want = candle_attention_ext(&case.q.i(b..b + 1)?, &k, &v, 0.15, (None, None), None, None)?;
        assert!(max_diff(&o.i(b..b + 1)?, &want)? <= 2e-5);
    }
    Ok(())
}

fn expect_err<T: std::fmt::Debug>(r: Result<T>, needles: &[&str]) {
    let e = r.expect_err("expected an error").to_string();
    for n in needles {
        assert!(e.contains(n), "error {e:?} should mention {n:?}");
    }
}

/// Bad input: typed errors naming the argument; a failed call leaves both
/// caches untouched (device-side values included: lengths past the
/// capacity, table entries out of range, two appends to one slot).
#[test]
fn kvcache_errors_name_the_argument_and_leave_the_cache() -> Result<()> {
    let dev = Device::Cpu;
    let mut rng = Lcg(3);
    let g = Geom { heads: (4, 2), d: 16, sq: 1, s_new: 2, cap: 8 };
    let case = kv_case(&mut rng, g, &[2, 5], None, None)?;
    let (kc, vc) = (case.k_cache.copy()?, case.v_cache.copy()?);
    let (kn, vn) = case.new.clone().unwrap();
    let op = kv_op((None, Some(0)), None, None);
    let lens = |v: &[u32]| Tensor::new(v, &dev).unwrap();
    let ok = lens(&[2, 5]);
    fn with<'a>(kn: &'a Tensor, vn: &'a Tensor, l: &'a Tensor) -> KvCacheArgs<'a> {
        KvCacheArgs { k_new: Some(kn), v_new: Some(vn), cache_seqlens: l, cache_batch_idx: None, block_table: None }
    }
    let unchanged = |what: &str| {
        assert_eq!(max_diff(&kc, &case.k_cache).unwrap(), 0.0, "{what}: k_cache was written");
        assert_eq!(max_diff(&vc, &case.v_cache).unwrap(), 0.0, "{what}: v_cache was written");
    };
    // Device-side values, checked before any write.
    expect_err(op.forward(&case.q, &kc, &vc, with(&kn, &vn, &lens(&[2, 7]))), &["k_new", "capacity"]);
    unchanged("append past the capacity");
    expect_err(op.forward(&case.q, &kc, &vc, with(&kn, &vn, &lens(&[9, 0]))), &["cache_seqlens"]);
    unchanged("cache_seqlens past the capacity");
    let same_row = Tensor::new(&[1u32, 1], &dev)?;
    expect_err(op.forward(&case.q, &kc, &vc, KvCacheArgs { cache_batch_idx: Some(&same_row), ..with(&kn, &vn, &lens(&[2, 2])) }), &["cache_seqlens", "same cache slot"]);
    unchanged("two appends to one slot");
    let bad_row = Tensor::new(&[0u32, 5], &dev)?;
    expect_err(op.forward(&case.q, &kc, &vc, KvCacheArgs { cache_batch_idx: Some(&bad_row), ..with(&kn, &vn, &ok) }), &["cache_batch_idx"]);
    unchanged("cache_batch_idx out of range");
    // Host-side checks.
    expect_err(op.forward(&case.q, &kc, &vc, KvCacheArgs { v_new: None, ..with(&kn, &vn, &ok) }), &["`v_new`"]);
    let kn3 = kn.narrow(1, 0, 1)?;
    expect_err(op.forward(&case.q, &kc, &vc, KvCacheArgs { k_new: Some(&kn3), ..with(&kn, &vn, &ok) }), &["`k_new`", "shape mismatch"]);
    expect_err(op.forward(&case.q, &kc, &vc, with(&kn, &vn, &ok.to_dtype(DType::F32)?)), &["`cache_seqlens`", "U32 or I32"]);
    expect_err(op.forward(&case.q, &kc, &vc, with(&kn, &vn, &lens(&[2, 5, 1]))), &["`cache_seqlens`", "(2)"]);
    expect_err(op.forward(&case.q, &kc, &kc, with(&kn, &vn, &ok)), &["`v_cache` shares storage with `k_cache`"]);
    expect_err(op.forward(&case.q, &kc, &vc, KvCacheArgs { k_new: Some(&kc), ..with(&kn, &vn, &ok) }), &["k_new"]);
    expect_err(op.forward(&case.q, &kc, &vc.to_dtype(DType::F64)?, with(&kn, &vn, &ok)), &["dtype mismatch", "`v_cache`"]);
    expect_err(op.forward(&case.q, &kc, &vc.narrow(1, 0, 4)?, with(&kn, &vn, &ok)), &["`v_cache`", "shape mismatch"]);
    expect_err(fa::flash_attn_with_kvcache(&case.q, &kc, &vc, Some(&kn), Some(&vn), None, None, 0.1, true), &["`cache_seqlens`"]);
    unchanged("host-side errors");
    // Paged: table entries out of range, cache_batch_idx beside a table.
    let p = random_pages(&mut rng, &[4, 7], 3);
    let kp = randn((p.num_blocks, 3, 2, 16), &dev)?;
    let vp = kp.copy()?;
    let mut table = p.table.clone();
    table[p.max_blocks + 1] = 999;
    let bad = Tensor::from_slice(&table, (2, p.max_blocks), &dev)?;
    let (kp0, vp0) = (kp.copy()?, vp.copy()?);
    expect_err(op.forward(&case.q, &kp, &vp, KvCacheArgs { block_table: Some(&bad), ..with(&kn, &vn, &ok) }), &["block_table", "999"]);
    assert_eq!(max_diff(&kp, &kp0)?, 0.0);
    assert_eq!(max_diff(&vp, &vp0)?, 0.0);
    let bt = p.tensor(&dev)?;
    expect_err(
        op.forward(&case.q, &kp, &vp, KvCacheArgs { block_table: Some(&bt), cache_batch_idx: Some(&bad_row), ..with(&kn, &vn, &ok) }),
        &["`cache_batch_idx`", "block_table"],
    );
    let bt3 = Tensor::from_slice(&p.table[..p.max_blocks], (1, p.max_blocks), &dev)?;
    expect_err(op.forward(&case.q, &kp, &vp, KvCacheArgs { block_table: Some(&bt3), ..with(&kn, &vn, &ok) }), &["`block_table`", "shape mismatch"]);
    Ok(())
}

/// `flash_attn_varlen_paged_windowed`'s argument errors, `mm_prefix_ranges`
/// included: rejected under a mask, checked and without effect otherwise.
#[test]
fn paged_varlen_errors_and_mm_prefix_ranges() -> Result<()> {
    let dev = Device::Cpu;
    let mut rng = Lcg(9);
    let p = random_pages(&mut rng, &[8, 8], 4);
    let q = Tensor::randn(0f32, 1., (16, 4, 32), &dev)?;
    let kp = randn((p.num_blocks, 4, 2, 32), &dev)?;
    let bt = p.tensor(&dev)?;
    let cu = Tensor::new(&[0u32, 8, 16], &dev)?;
    let run = |k: &Tensor, bt: &Tensor, mm: Option<&Tensor>, w: (Option<usize>, Option<usize>), page: usize| {
        fa::flash_attn_varlen_paged_windowed(&q, k, k, &cu, &cu, bt, mm, 8, 8, 0.2, w.0, w.1, page, None)
    };
    let causal = (None, Some(0));
    expect_err(run(&kp, &bt, None, causal, 5), &["`page_block_size` is 5"]);
    expect_err(run(&kp.reshape((p.num_blocks * 4, 2, 32))?, &bt, None, causal, 4), &["`k` must have rank 4", "num_blocks"]);
    expect_err(run(&kp, &bt.narrow(0, 0, 1)?, None, causal, 4), &["`block_table`", "shape mismatch"]);
    expect_err(run(&kp, &bt.to_dtype(DType::F32)?, None, causal, 4), &["`block_table`", "U32 or I32"]);
    let mut table = p.table.clone();
    table[0] = 1000;
    let out_of_range = Tensor::from_slice(&table, (2, p.max_blocks), &dev)?;
    expect_err(run(&kp, &out_of_range, None, causal, 4), &["block_table", "1000"]);
    let ranges = Tensor::new(&[[[0i32, 4]], [[2, 6]]], &dev)?;
    expect_err(run(&kp, &bt, Some(&ranges), causal, 4), &["`mm_prefix_ranges`", "not supported"]);
    expect_err(run(&kp, &bt, Some(&ranges), (Some(3), None), 4), &["`mm_prefix_ranges`"]);
    // No mask: the ranges change nothing (candle-flash-attn's behaviour).
    let with = run(&kp, &bt, Some(&ranges), (None, None), 4)?;
    let without = run(&kp, &bt, None, (None, None), 4)?;
    assert_eq!(max_diff(&with, &without)?, 0.0);
    // A window side ≥ max_seqlen_k is no mask either.
    let wide = run(&kp, &bt, Some(&ranges), (Some(8), Some(100)), 4)?;
    assert_eq!(max_diff(&wide, &without)?, 0.0);
    expect_err(run(&kp, &bt, Some(&ranges.to_dtype(DType::U32)?), (None, None), 4), &["`mm_prefix_ranges`", "I32"]);
    expect_err(run(&kp, &bt, Some(&ranges.reshape((2, 2))?), (None, None), 4), &["`mm_prefix_ranges`", "max_ranges, 2"]);
    Ok(())
}

/// The GPU against the CPU path on the same inputs (f16, bf16): paged
/// varlen (page sizes 5 and 16, causal, window, softcap; a long-key case
/// that splits), and the KV cache contiguous / with `cache_batch_idx` /
/// paged, split counts forced and heuristic, GQA head packing, ALiBi:
/// outputs within the dtype's tolerance, caches after the append equal
/// exactly. f32 (no KV-cache kernel) is a typed error naming `q`.
#[test]
fn gpu_matches_cpu() -> Result<()> {
    let Some(gpu) = &requested_gpu() else { return Ok(()) };
    let cpu = Device::Cpu;
    let mut rng = Lcg(21);
    // Paged varlen prefill.
    for (lq, lk, page) in [([4usize, 1, 9], [12usize, 30, 9], 5usize), ([1, 2, 1], [700, 333, 1024], 16)] {
        let p = random_pages(&mut rng, &lk, page);
        let (cq, ck) = (cu(&lq), cu(&lk));
        let (max_q, max_k) = (*lq.iter().max().unwrap(), *lk.iter().max().unwrap());
        let q = Tensor::randn(0f32, 1., (cq[3] as usize, 8, 64), &cpu)?;
        let kp = randn((p.num_blocks, page, 2, 64), &cpu)?;
        let vp = randn((p.num_blocks, page, 2, 64), &cpu)?;
        for dt in [DType::F16, DType::BF16] {
            for (window, softcap) in WINDOWS {
                let on = |dev: &Device| -> Result<Tensor> {
                    let put = |t: &Tensor| t.to_dtype(dt)?.to_device(dev);
                    let (cq_t, ck_t) = (Tensor::new(cq.as_slice(), dev)?, Tensor::new(ck.as_slice(), dev)?);
                    let o = fa::flash_attn_varlen_paged_windowed(
                        &put(&q)?, &put(&kp)?, &put(&vp)?, &cq_t, &ck_t, &p.tensor(dev)?, None, max_q, max_k, 0.125, window.0, window.1, page, softcap,
                    )?;
                    o.to_device(&cpu)?.to_dtype(DType::F32)
                };
                let e = max_diff(&on(gpu)?, &on(&cpu)?)?;
                assert!(e <= tol(dt), "paged varlen {dt:?} page {page} lk {lk:?} window {window:?} softcap {softcap:?}: GPU vs CPU {e}");
            }
        }
    }
    // KV cache.
    let slopes_cpu = Tensor::new(&[0.3f32, 0.2, 0.1, 0.05, 0.3, 0.2, 0.1, 0.05], &cpu)?;
    type Case<'a> = (Geom, &'a [usize], Option<usize>, Option<&'a [u32]>);
    let cases: [Case<'_>; 5] = [
        (Geom { heads: (8, 2), d: 64, sq: 3, s_new: 3, cap: 64 }, &[0, 17, 33], None, None),
        (Geom { heads: (8, 2), d: 128, sq: 1, s_new: 1, cap: 64 }, &[5, 40, 63], None, Some(&[3, 0, 1])),
        (Geom { heads: (8, 2), d: 64, sq: 2, s_new: 2, cap: 0 }, &[0, 29, 50], Some(5), None),
        (Geom { heads: (8, 8), d: 128, sq: 1, s_new: 1, cap: 0 }, &[1500, 700, 2000], Some(16), None),
        (Geom { heads: (8, 2), d: 128, sq: 1, s_new: 1, cap: 2100 }, &[2000, 1, 1337], None, None),
    ];
    for (g, lens, page, idx) in cases {
        let case = kv_case(&mut rng, g, lens, page, idx)?;
        for dt in [DType::F16, DType::BF16] {
            for (n, (window, softcap, alibi)) in [
                ((None, Some(0)), None, None),
                ((None, None), Some(5.0), None),
                ((Some(40), Some(0)), None, Some(&slopes_cpu)),
            ]
            .into_iter()
            .enumerate()
            {
                for num_splits in [None, Some(1), Some(3)] {
                    let what = format!("kvcache lens {lens:?} page {page:?} idx {idx:?} {dt:?} option set {n} splits {num_splits:?}");
                    let op_on = |dev: &Device| -> Result<FlashAttnKvCache> {
                        let a = alibi.map(|a| a.to_device(dev)).transpose()?;
                        Ok(FlashAttnKvCache { num_splits, ..kv_op(window, softcap, a.as_ref()) })
                    };
                    let [og, lg, kg, vg] = case.run(&op_on(gpu)?, gpu, dt)?;
                    let [oc, lc, kc, vc] = case.run(&op_on(&cpu)?, &cpu, dt)?;
                    let e = max_diff(&og, &oc)?;
                    assert!(e <= tol(dt), "{what}: output GPU vs CPU {e}");
                    let e = max_diff_inf(&lg, &lc)?;
                    assert!(e <= 2e-2, "{what}: lse GPU vs CPU {e}");
                    assert_eq!(max_diff(&kg, &kc)?, 0.0, "{what}: k_cache after the append, GPU vs CPU");
                    assert_eq!(max_diff(&vg, &vc)?, 0.0, "{what}: v_cache after the append, GPU vs CPU");
                }
            }
        }
        expect_err(case.run(&kv_op((None, Some(0)), None, None), gpu, DType::F32), &["`q`", "f32"]);
    }
    Ok(())
}

impl KvCase {
    /// The same call over another block table (the same pages).
    fn with_table(&self, table: Vec<u32>) -> KvCase {
        let p = self.pages.as_ref().expect("a paged case");
        KvCase {
            q: self.q.clone(),
            k_cache: self.k_cache.clone(),
            v_cache: self.v_cache.clone(),
            new: self.new.clone(),
            lens: self.lens.clone(),
            batch_idx: None,
            pages: Some(Pages { table, ..*p }),
        }
    }
}

/// The table `order_block_table` must give, computed here from the rule
/// (not the core's function): in each row, the full pages of keys that
/// every query row sees — `min(len, len + s_new + 1 − sq)` keys under the
/// causal mask, `len` without — sorted by page index; every other slot
/// as it was.
fn ordered_by_rule(p: &Pages, lens: &[u32], sq: usize, s_new: usize, causal: bool) -> Vec<u32> {
    let mut want = p.table.clone();
    for (b, &len) in lens.iter().enumerate() {
        let len = len as usize;
        let free = if causal { (len + s_new + 1).saturating_sub(sq).min(len) } else { len };
        let n = (free / p.page).min(p.max_blocks);
        want[b * p.max_blocks..b * p.max_blocks + n].sort_unstable();
    }
    want
}

/// A block table's entries as u32, whichever index dtype it has.
fn table_u32(t: &Tensor) -> Result<Vec<u32>> {
    Ok(match t.dtype() {
        DType::I32 => t.flatten_all()?.to_vec1::<i32>()?.into_iter().map(|x| x as u32).collect(),
        _ => t.flatten_all()?.to_vec1::<u32>()?,
    })
}

/// The table of `p` on `dev` as U32 or I32.
fn table_as(p: &Pages, dt: DType, dev: &Device) -> Result<Tensor> {
    let shape = (p.table.len() / p.max_blocks, p.max_blocks);
    match dt {
        DType::I32 => Tensor::from_vec(p.table.iter().map(|&x| x as i32).collect::<Vec<_>>(), shape, dev),
        _ => Tensor::from_slice(&p.table, shape, dev),
    }
}

/// `FlashAttnKvCache::order_block_table` on the CPU: U32 and I32 tables
/// equal the rule's (each row's full position-free pages sorted, the
/// partial page and later slots in place) for decode, speculative
/// (several causal query rows) and prefix-caching shapes and page sizes
/// 1–16; a call over the ordered table gives the logical table's O and
/// LSE (f32 rounding of the sums' order) and writes the caches exactly as
/// it does. Bad input: errors naming the argument, the table untouched.
#[test]
fn ordered_block_table_on_the_cpu() -> Result<()> {
    let cpu = Device::Cpu;
    let mut rng = Lcg(41);
    let mut reordered = 0;
    for (sq, s_new, causal) in [(1, 1, false), (1, 1, true), (3, 3, true), (4, 0, true), (2, 0, false)] {
        for page in [1, 4, 5, 16] {
            let g = Geom { heads: (4, 2), d: 16, sq, s_new, cap: 0 };
            let case = kv_case(&mut rng, g, &[0, 17, 33, 64], Some(page), None)?;
            let p = case.pages.as_ref().unwrap();
            let window = if causal { (None, Some(0)) } else { (None, None) };
            let op = kv_op(window, Some(3.0), None);
            let lens = Tensor::new(case.lens.as_slice(), &cpu)?;
            let want = ordered_by_rule(p, &case.lens, sq, s_new, causal);
            let what = format!("sq {sq} s_new {s_new} causal {causal} page {page}");
            for dt in [DType::U32, DType::I32] {
                let bt = table_as(p, dt, &cpu)?;
                op.order_block_table(&bt, &lens, page, sq, s_new)?;
                assert_eq!(table_u32(&bt)?, want, "{what} {dt:?}: the ordered table");
            }
            reordered += usize::from(want != p.table);
            let [o, lse, kc, vc] = case.run(&op, &cpu, DType::F32)?;
            let [o2, lse2, kc2, vc2] = case.with_table(want).run(&op, &cpu, DType::F32)?;
            assert!(max_diff(&o2, &o)? <= 1e-5, "{what}: O over the ordered table");
            assert!(max_diff_inf(&lse2, &lse)? <= 1e-5, "{what}: LSE over the ordered table");
            assert_eq!(max_diff(&kc2, &kc)?, 0.0, "{what}: k_cache after the append");
            assert_eq!(max_diff(&vc2, &vc)?, 0.0, "{what}: v_cache after the append");
        }
    }
    assert!(reordered >= 15, "only {reordered} of 20 cases had pages out of order: the test would not see a missing sort");

    // Bad input.
    let p = random_pages(&mut rng, &[40, 9], 4);
    let bt = p.tensor(&cpu)?;
    let lens = Tensor::new(&[40u32, 9], &cpu)?;
    let plain = kv_op((None, None), None, None);
    let slopes = Tensor::new(&[0.1f32, 0.2, 0.3, 0.4], &cpu)?;
    let untouched = |what: &str| assert_eq!(table_u32(&bt).unwrap(), p.table, "{what}: the table was written");
    expect_err(kv_op((None, None), None, Some(&slopes)).order_block_table(&bt, &lens, 4, 1, 1), &["alibi_slopes", "position"]);
    untouched("ALiBi");
    expect_err(kv_op((Some(8), Some(0)), None, None).order_block_table(&bt, &lens, 4, 1, 1), &["window_left"]);
    untouched("left window");
    expect_err(plain.order_block_table(&bt, &lens, 4, 0, 0), &["seqlen_q"]);
    expect_err(plain.order_block_table(&bt, &lens, 0, 1, 0), &["page_size"]);
    expect_err(plain.order_block_table(&bt, &Tensor::new(&[40u32, 9, 1], &cpu)?, 4, 1, 0), &["`cache_seqlens`", "(2)"]);
    let cap = (p.max_blocks * 4) as u32;
    expect_err(plain.order_block_table(&bt, &Tensor::new(&[cap + 1, 9], &cpu)?, 4, 1, 0), &["cache_seqlens"]);
    expect_err(plain.order_block_table(&bt.to_dtype(DType::F32)?, &lens, 4, 1, 0), &["`block_table`", "U32 or I32"]);
    expect_err(plain.order_block_table(&bt.flatten_all()?, &lens, 4, 1, 0), &["`block_table`", "rank 2"]);
    expect_err(plain.order_block_table(&bt.t()?, &lens, 4, 1, 0), &["`block_table`", "contiguous"]);
    let shared = bt.flatten_all()?.narrow(0, 0, 2)?;
    expect_err(plain.order_block_table(&bt, &shared, 4, 1, 0), &["`cache_seqlens` shares storage with `block_table`"]);
    untouched("bad input");
    Ok(())
}

/// The device sort through candle (`FA_REQUIRE_GPU=1`, feature `cuda`):
/// U32 and I32 tables on the GPU equal the rule's, rows of up to 4004
/// slots; cache lengths past the capacity (which the host cannot see) are
/// clamped to it; the ordered table's decode step on the GPU matches the
/// CPU path over the logical table; ALiBi is an error, the table untouched.
#[test]
fn gpu_ordered_block_table() -> Result<()> {
    let Some(gpu) = &requested_gpu() else { return Ok(()) };
    let cpu = Device::Cpu;
    let mut rng = Lcg(43);
    for (lens, page, sq, s_new, causal) in [
        (vec![0usize, 17, 333, 64], 16usize, 1usize, 1usize, false),
        (vec![4000, 1, 2500], 1, 3, 3, true),
        (vec![20000, 7], 16, 1, 0, true),
    ] {
        let g = Geom { heads: (8, 2), d: 128, sq, s_new, cap: 0 };
        let case = kv_case(&mut rng, g, &lens, Some(page), None)?;
        let p = case.pages.as_ref().unwrap();
        let window = if causal { (None, Some(0)) } else { (None, None) };
        let op = kv_op(window, None, None);
        let want = ordered_by_rule(p, &case.lens, sq, s_new, causal);
        let what = format!("lens {lens:?} page {page} sq {sq} s_new {s_new}");
        for dt in [DType::U32, DType::I32] {
            let bt = table_as(p, dt, gpu)?;
            op.order_block_table(&bt, &Tensor::new(case.lens.as_slice(), gpu)?, page, sq, s_new)?;
            assert_eq!(table_u32(&bt.to_device(&cpu)?)?, want, "{what} {dt:?}: the device-ordered table");
        }
        // Lengths past the capacity: clamped on the device (the CPU path errs).
        let cap = (p.max_blocks * page) as u32;
        let long: Vec<u32> = case.lens.iter().map(|_| cap + 7).collect();
        let bt = table_as(p, DType::I32, gpu)?;
        op.order_block_table(&bt, &Tensor::new(long.as_slice(), gpu)?, page, sq, s_new)?;
        let full: Vec<u32> = long.iter().map(|_| cap).collect();
        assert_eq!(table_u32(&bt.to_device(&cpu)?)?, ordered_by_rule(p, &full, sq, s_new, causal), "{what}: clamped lengths");
        for dt in [DType::F16, DType::BF16] {
            let [og, lg, kg, vg] = case.with_table(want.clone()).run(&op, gpu, dt)?;
            let [oc, lc, kc, vc] = case.run(&op, &cpu, dt)?;
            assert!(max_diff(&og, &oc)? <= tol(dt), "{what} {dt:?}: O over the ordered table, GPU vs CPU");
            assert!(max_diff_inf(&lg, &lc)? <= 2e-2, "{what} {dt:?}: LSE over the ordered table, GPU vs CPU");
            assert_eq!(max_diff(&kg, &kc)?, 0.0, "{what} {dt:?}: k_cache after the append");
            assert_eq!(max_diff(&vg, &vc)?, 0.0, "{what} {dt:?}: v_cache after the append");
        }
        let slopes = Tensor::new(&[0.1f32; 8], gpu)?;
        let bt = table_as(p, DType::U32, gpu)?;
        let r = kv_op(window, None, Some(&slopes)).order_block_table(&bt, &Tensor::new(case.lens.as_slice(), gpu)?, page, sq, s_new);
        expect_err(r, &["alibi_slopes"]);
        assert_eq!(table_u32(&bt.to_device(&cpu)?)?, p.table, "{what}: ALiBi wrote the table");
    }
    Ok(())
}
