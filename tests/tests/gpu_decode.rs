//! End-to-end: decode against a KV cache (contiguous and paged), with new
//! keys appended in place, split-KV and its combine, GQA head packing —
//! FlashAttention-2's kvcache/splitkv matrix (INFERENCE.md): each sequence
//! checked against the f64 reference over its cached keys followed by the
//! new ones ([`flash_attn_tests::features`]), error ≤ 3 × the naive
//! same-dtype error (+1e-5), the logsumexp within 1e-4·max(1, |ref|), the
//! updated cache compared exactly.

use cudarc::driver::CudaSlice;
use flash_attn::{
    AttnElem, BlockTable, DecodeOptions, Extras, FlashAttnError, ForwardParams, KvCache, KvCacheRef, PagedCache, SplitScratch, Tensor, TensorLayout, Varlen,
};
use flash_attn_tests::features::{Spec, assert_matches_reference, random};
use flash_attn_tests::{Gpu, Rng, gpu};
use ndarray::{Array4, Axis, s};

/// Where row `t` of sequence `b` of the logical cache lies in the physical
/// storage: `(physical batch or page, row in it)`.
type ToPhys = Box<dyn Fn(usize, usize) -> (usize, usize)>;

/// The physical cache: its layout, the block table and pages per sequence
/// (paged), K and V as stored, and [`ToPhys`].
type Physical<E> = (TensorLayout, Option<(Vec<i32>, usize)>, Array4<E>, Array4<E>, ToPhys);

/// One decode problem.
#[derive(Clone, Debug)]
struct Dec {
    batch: usize,
    sq: usize,
    /// Keys already cached per sequence (the ones the call starts from).
    max_cached: usize,
    s_new: usize,
    h: usize,
    hk: usize,
    d: usize,
    /// `Some(page_size)` for a paged cache.
    page: Option<usize>,
    causal: bool,
    num_splits: Option<usize>,
    /// Append with `append_kv` (k, then v) and attend with
    /// `forward_kvcache_ref` instead of one `forward_kvcache` call.
    two_step: bool,
    /// Run the `fa2d` tile kernel instead of the flash-decoding kernel.
    fa2d: bool,
    /// Force this flash-decoding kernel (`DecodeOptions::kernel`).
    dec: Option<&'static str>,
}

/// The `fa2d` tile kernel of a dtype and head dim (forced through
/// `DecodeOptions::kernel`).
fn fa2d_kernel<T: AttnElem>(d: usize) -> &'static str {
    let dt = flash_attn::advanced::dispatch::tc_head_dim(d).unwrap();
    let f = flash_attn::advanced::dispatch::Features { varlen: true, mods: true, decode: true };
    flash_attn::advanced::tc::TcKernel::default_for(flash_attn::advanced::tc::TcLoop::Fa2, T::DTYPE == flash_attn::DType::BF16, dt, f).unwrap().name
}

fn run<T: AttnElem>(g: &Gpu, rng: &mut Rng, c: &Dec) -> Result<(), FlashAttnError> {
    let s = &g.stream;
    let Dec { batch, sq, max_cached, s_new, h, hk, d, .. } = *c;
    let capacity = max_cached + s_new;
    let mut cached: Vec<i32> = (0..batch).map(|_| rng.below(max_cached + 1) as i32).collect();
    cached[0] = 0; // a sequence with an empty cache
    if batch > 1 {
        cached[1] = max_cached as i32;
    }
    // The logical cache per sequence: (batch, capacity, hk, d).
    let k_log = random::<T>(rng, (batch, capacity, hk, d));
    let v_log = random::<T>(rng, (batch, capacity, hk, d));
    let q = random::<T>(rng, (batch, sq, h, d));
    let (k_new, v_new) = (random::<T>(rng, (batch, s_new, hk, d)), random::<T>(rng, (batch, s_new, hk, d)));
    // Physical storage: contiguous, or pages in a random order.
    let (layout, table, k_phys, v_phys, to_phys): Physical<T> =
        match c.page {
            None => (TensorLayout::contiguous([batch, capacity, hk, d]), None, k_log.clone(), v_log.clone(), Box::new(|b, t| (b, t))),
            Some(p) => {
                let per = capacity.div_ceil(p);
                let n = batch * per + 3; // spare pages
                let mut perm: Vec<usize> = (0..n).collect();
                for i in (1..n).rev() {
                    perm.swap(i, rng.below(i + 1));
                }
                let table: Vec<i32> = (0..batch * per).map(|i| perm[i] as i32).collect();
                let mut kp = random::<T>(rng, (n, p, hk, d));
                let mut vp = random::<T>(rng, (n, p, hk, d));
                let tb = table.clone();
                let map = move |b: usize, t: usize| (tb[b * per + t / p] as usize, t % p);
                for b in 0..batch {
                    for t in 0..capacity {
                        let (pg, r) = map(b, t);
                        kp.slice_mut(s![pg, r, .., ..]).assign(&k_log.slice(s![b, t, .., ..]));
                        vp.slice_mut(s![pg, r, .., ..]).assign(&v_log.slice(s![b, t, .., ..]));
                    }
                }
                (TensorLayout::contiguous([n, p, hk, d]), Some((table, per)), kp, vp, Box::new(map))
            }
        };
    let mut kd = s.clone_htod(k_phys.as_slice().unwrap())?;
    let mut vd = s.clone_htod(v_phys.as_slice().unwrap())?;
    let qd = s.clone_htod(q.as_slice().unwrap())?;
    let knd = s.clone_htod(k_new.as_slice().unwrap())?;
    let vnd = s.clone_htod(v_new.as_slice().unwrap())?;
    let csd = s.clone_htod(&cached)?;
    let btd = table.as_ref().map(|(t, _)| s.clone_htod(t)).transpose()?;
    let new_layout = TensorLayout::contiguous([batch, s_new, hk, d]);
    let params = ForwardParams { causal: c.causal, ..Default::default() };
    let block_table = btd.as_ref().zip(table.as_ref()).map(|(t, (_, per))| BlockTable::new(t, *per));
    let qt = Tensor::new(&qd, TensorLayout::contiguous([batch, sq, h, d]));
    let opts = DecodeOptions { num_splits: c.num_splits, scratch: None, kernel: c.fa2d.then(|| fa2d_kernel::<T>(d)).or(c.dec), timeline: None, deterministic: false };
    let out = if c.two_step {
        if s_new > 0 {
            g.fa.append_kv::<T>(s, &mut kd, layout, Tensor::new(&knd, new_layout), &csd, None, block_table)?;
            g.fa.append_kv::<T>(s, &mut vd, layout, Tensor::new(&vnd, new_layout), &csd, None, block_table)?;
        }
        let cache = KvCacheRef { k_cache: &kd, v_cache: &vd, layout, cache_seqlens: &csd, cache_batch_idx: None, block_table, seqlen_new: s_new };
        g.fa.forward_kvcache_ref::<T, _>(s, qt, cache, &params, &Extras::default(), opts)?
    } else {
        let cache = KvCache {
            k_cache: &mut kd,
            v_cache: &mut vd,
            layout,
            cache_seqlens: &csd,
            cache_batch_idx: None,
            block_table,
            k_new: (s_new > 0).then(|| Tensor::new(&knd, new_layout).into()),
            v_new: (s_new > 0).then(|| Tensor::new(&vnd, new_layout).into()),
        };
        g.fa.forward_kvcache::<T, _>(s, qt, cache, &params, &Extras::default(), opts)?
    };
    s.synchronize()?;
    let o = Array4::from_shape_vec((batch, sq, h, d), s.clone_dtoh(&out.o)?).unwrap();
    let lse = ndarray::Array3::from_shape_vec((batch, h, sq), s.clone_dtoh(&out.lse)?).unwrap();
    // The updated cache, exactly: new rows at cached[b].., the rest untouched.
    let (k_after, v_after): (Vec<T>, Vec<T>) = (s.clone_dtoh(&kd)?, s.clone_dtoh(&vd)?);
    let k_after = Array4::from_shape_vec(k_phys.dim(), k_after).unwrap();
    let v_after = Array4::from_shape_vec(v_phys.dim(), v_after).unwrap();
    let mut k_want = k_log.clone();
    let mut v_want = v_log.clone();
    for (b, &cached_b) in cached.iter().enumerate() {
        for i in 0..s_new {
            let t = cached_b as usize + i;
            k_want.slice_mut(s![b, t, .., ..]).assign(&k_new.slice(s![b, i, .., ..]));
            v_want.slice_mut(s![b, t, .., ..]).assign(&v_new.slice(s![b, i, .., ..]));
        }
        for t in 0..capacity {
            let (pb, r) = to_phys(b, t);
            let same = |a: &Array4<T>, w: &Array4<T>| a.slice(s![pb, r, .., ..]).iter().zip(w.slice(s![b, t, .., ..]).iter()).all(|(x, y)| x.to_f32().to_bits() == y.to_f32().to_bits());
            assert!(same(&k_after, &k_want) && same(&v_after, &v_want), "{c:?}: cache row {t} of sequence {b} after the append");
        }
    }
    // Attention per sequence over its cached + new keys.
    for (b, &cached_b) in cached.iter().enumerate() {
        let len = cached_b as usize + s_new;
        let label = format!("{} {c:?} seq {b} ({len} keys)", std::any::type_name::<T>());
        let qb = q.slice(s![b..b + 1, .., .., ..]).to_owned();
        let ob = o.slice(s![b..b + 1, .., .., ..]).to_owned();
        if len == 0 {
            assert!(ob.iter().all(|x| x.to_f32() == 0.0), "{label}: no key → O = 0");
            assert!(lse.index_axis(Axis(0), b).iter().all(|&x| x == f32::NEG_INFINITY), "{label}: lse −inf");
            continue;
        }
        let kb = k_want.slice(s![b..b + 1, ..len, .., ..]).to_owned();
        let vb = v_want.slice(s![b..b + 1, ..len, .., ..]).to_owned();
        let spec = Spec { params, alibi: None, norm_seqlen_k: Some(capacity) };
        assert_matches_reference(&label, &qb, &kb, &vb, ob.view(), lse.index_axis(Axis(0), b).iter().copied(), &spec, 3.0);
    }
    Ok(())
}

/// FA2's kvcache/splitkv matrix: (sq, sk) × GQA/MQA × splits forced and
/// automatic × contiguous/paged, new k/v appended.
#[test]
fn gpu_kvcache_matrix() {
    let Some(g) = gpu("gpu_kvcache_matrix") else { return };
    let mut rng = Rng::fresh("gpu_kvcache_matrix");
    let mut n = 0;
    for (sq, sk) in [(1, 339), (3, 799), (16, 20000)] {
        for (h, hk) in [(8, 2), (6, 1), (4, 4)] {
            for (i, splits) in [Some(1), Some(2), Some(7), Some(64), None].into_iter().enumerate() {
                // Pages: a block in one page (256, 64 with Bc 64), over several
                // (16, 48: unaligned for 48), tiny (3).
                let page = [None, Some(16), Some(256), Some(3), Some(64), Some(48)][(i + h + sq) % 6];
                let d = [64, 128, 80][(i + sq) % 3];
                let c = Dec { batch: 3, sq, max_cached: sk - sq, s_new: sq, h, hk, d, page, causal: (i + hk) % 2 == 0, num_splits: splits, two_step: (i + sq + h) % 4 == 1, fa2d: (i + h) % 3 == 2, dec: None };
                if i % 2 == 0 {
                    run::<half::bf16>(g, &mut rng, &c).unwrap_or_else(|e| panic!("{c:?}: {e}"));
                } else {
                    run::<half::f16>(g, &mut rng, &c).unwrap_or_else(|e| panic!("{c:?}: {e}"));
                }
                n += 1;
            }
        }
    }
    println!("{n} KV-cache cases passed");
}

/// Long caches: 100 000 and 131 072 keys, GQA 32/8 packed, automatic splits.
#[test]
fn gpu_kvcache_long() {
    let Some(g) = gpu("gpu_kvcache_long") else { return };
    let mut rng = Rng::fresh("gpu_kvcache_long");
    for (sq, sk, page) in [(16, 100_000, None), (1, 131_072, Some(256)), (1, 131_072, Some(16))] {
        let c = Dec { batch: 1, sq, max_cached: sk - sq, s_new: sq, h: 32, hk: 8, d: 128, page, causal: true, num_splits: None, two_step: false, fa2d: false, dec: None };
        run::<half::bf16>(g, &mut rng, &c).unwrap_or_else(|e| panic!("{c:?}: {e}"));
    }
}

/// Every compiled flash-decoding kernel forced by name — the defaults and the
/// candidates `decode-tune` measures (other tiles and stage counts) —
/// against the f64 reference: contiguous and paged (pages
/// smaller than a block, pages holding whole blocks), GQA heads packed,
/// unsplit and split.
#[test]
fn gpu_every_decode_kernel() {
    let Some(g) = gpu("gpu_every_decode_kernel") else { return };
    let mut rng = Rng::fresh("gpu_every_decode_kernel");
    for k in flash_attn::advanced::decode::DEC_KERNELS {
        for (i, page) in [None, Some(16), Some(256)].into_iter().enumerate() {
            let num_splits = [Some(1), Some(5), None][i];
            let c = Dec { batch: 2, sq: 1, max_cached: 1500 + 37 * i, s_new: 1, h: 8, hk: 2, d: k.d, page, causal: false, num_splits, two_step: false, fa2d: false, dec: Some(k.name) };
            let r = if k.bf16 { run::<half::bf16>(g, &mut rng, &c) } else { run::<half::f16>(g, &mut rng, &c) };
            r.unwrap_or_else(|e| panic!("{}: {c:?}: {e}", k.name));
        }
    }
    println!("{} flash-decoding kernels × 3 layouts passed", flash_attn::advanced::decode::DEC_KERNELS.len());
}

/// Small paged split-KV GQA case for compute-sanitizer (memcheck, racecheck).
#[test]
fn gpu_decode_small_for_sanitizers() {
    let Some(g) = gpu("gpu_decode_small_for_sanitizers") else { return };
    let mut rng = Rng::fresh("gpu_decode_small_for_sanitizers");
    let c = Dec { batch: 2, sq: 1, max_cached: 90, s_new: 1, h: 4, hk: 2, d: 64, page: Some(16), causal: false, num_splits: Some(3), two_step: true, fa2d: false, dec: None };
    run::<half::f16>(g, &mut rng, &c).unwrap();
    let c = Dec { batch: 2, sq: 3, max_cached: 70, s_new: 2, h: 2, hk: 1, d: 40, page: None, causal: true, num_splits: Some(2), two_step: false, fa2d: true, dec: None };
    run::<half::bf16>(g, &mut rng, &c).unwrap();
    // Split-KV with the ticket schedule (contiguous cache, 65 key blocks of
    // 128 for 2 splits: 3 fixed each, the rest by ticket).
    let c = Dec { batch: 2, sq: 1, max_cached: 8300, s_new: 1, h: 8, hk: 2, d: 128, page: None, causal: false, num_splits: Some(2), two_step: false, fa2d: false, dec: None };
    run::<half::bf16>(g, &mut rng, &c).unwrap();
    let c = VarPaged {
        lens_q: vec![5, 1, 40],
        lens_k: vec![90, 3, 33],
        h: 4,
        hk: 2,
        d: 64,
        page: 16,
        params: ForwardParams { causal: true, window_left: Some(20), ..Default::default() },
        seqused: true,
        num_splits: Some(2),
    };
    run_varlen_paged::<half::f16>(g, &mut rng, &c).unwrap();
    // Garbage device prefix sums and block table: clamped in the kernel
    // (never out of bounds); the call completes.
    let s = &g.stream;
    let (h, hk, d, page, per) = (2, 1, 64, 16, 2);
    let q: CudaSlice<half::f16> = s.clone_htod(&vec![half::f16::from_f32(0.5); 8 * h * d]).unwrap();
    let kv: CudaSlice<half::f16> = s.clone_htod(&vec![half::f16::from_f32(0.25); 3 * page * hk * d]).unwrap();
    let cu_q = s.clone_htod(&[0i32, 1 << 30, -3]).unwrap();
    let cu_k = s.clone_htod(&[-9i32, 1 << 29, 2]).unwrap();
    let table = s.clone_htod(&[5i32, -1, 1 << 20, 2]).unwrap();
    let varlen = Varlen { cu_seqlens_q: &cu_q, cu_seqlens_k: &cu_k, max_seqlen_q: 8, max_seqlen_k: 40, seqused_k: None };
    let cache = PagedCache { k_pages: &kv, v_pages: &kv, layout: TensorLayout::contiguous([3, page, hk, d]), block_table: BlockTable { table: &table, max_blocks_per_seq: per } };
    for splits in [Some(1), Some(3)] {
        let out = g.fa.forward_varlen_paged::<half::f16, _>(s, Tensor::new(&q, TensorLayout::varlen(8, h, d)), cache, &varlen, &ForwardParams::default(), &Extras::default(), DecodeOptions { num_splits: splits, ..Default::default() }).unwrap();
        s.synchronize().unwrap();
        let o: Vec<half::f16> = s.clone_dtoh(&out.o).unwrap();
        // Sequence 0 spans all 8 rows (clamped) and every key it sees is 0.25.
        assert!(o.iter().all(|x| (x.to_f32() - 0.25).abs() < 1e-3), "garbage prefix sums: {splits:?}");
    }
}

/// New keys and values with different strides (k_new contiguous, v_new with
/// its heads 8 elements apart and a padded sequence stride), appended in
/// the one launch that writes both caches (decode step 20): the caches
/// compared exactly (new rows at `cache_seqlens[b]..`, rows past the
/// capacity not written, every other row untouched), contiguous and
/// paged (pages of 16, a shuffled block table).
#[test]
fn gpu_kvcache_append_strides() {
    let Some(g) = gpu("gpu_kvcache_append_strides") else { return };
    let mut rng = Rng::fresh("gpu_kvcache_append_strides");
    let s = &g.stream;
    let (b, cap, hk, h, d, s_new) = (3, 64, 2, 4, 64, 3);
    let lens = [5i32, 63, 0]; // sequence 1: one new row fits, two fall past the capacity
    let rnd = |rng: &mut Rng, n: usize| -> Vec<half::f16> { (0..n).map(|_| half::f16::from_f32(rng.nonzero(1.0))).collect() };
    let q: CudaSlice<half::f16> = s.clone_htod(&rnd(&mut rng, b * h * d)).unwrap();
    let (hs, ss) = (d + 8, 2 * (d + 8) + 16); // v_new: head stride, sequence-row stride
    let v_layout = TensorLayout::new([b, s_new, hk, d], [s_new * ss, ss, hs]);
    let k_new = rnd(&mut rng, b * s_new * hk * d);
    let v_new = rnd(&mut rng, v_layout.required_len().unwrap());
    let (knd, vnd) = (s.clone_htod(&k_new).unwrap(), s.clone_htod(&v_new).unwrap());
    let seqlens = s.clone_htod(&lens).unwrap();
    for paged in [false, true] {
        let page = 16;
        // Logical row (b, t) → physical row of the cache.
        let per = cap / page;
        let mut perm: Vec<i32> = (0..(b * per) as i32).collect();
        for i in (1..perm.len()).rev() {
            perm.swap(i, rng.below(i + 1));
        }
        let phys = |bb: usize, t: usize| if paged { perm[bb * per + t / page] as usize * page + t % page } else { bb * cap + t };
        let k0 = rnd(&mut rng, b * cap * hk * d);
        let v0 = rnd(&mut rng, b * cap * hk * d);
        let (mut kc, mut vc) = (s.clone_htod(&k0).unwrap(), s.clone_htod(&v0).unwrap());
        let table = s.clone_htod(&perm).unwrap();
        let layout = if paged { TensorLayout::contiguous([b * per, page, hk, d]) } else { TensorLayout::contiguous([b, cap, hk, d]) };
        let mut cache = KvCache::new(&mut kc, &mut vc, layout, &seqlens).with_new(Tensor::new(&knd, TensorLayout::contiguous([b, s_new, hk, d])), Tensor::new(&vnd, v_layout));
        cache.block_table = paged.then(|| BlockTable::new(&table, per));
        g.fa.forward_kvcache::<half::f16, _>(s, Tensor::new(&q, TensorLayout::contiguous([b, 1, h, d])), cache, &ForwardParams::default(), &Extras::default(), DecodeOptions::default()).unwrap();
        let (k1, v1): (Vec<half::f16>, Vec<half::f16>) = (s.clone_dtoh(&kc).unwrap(), s.clone_dtoh(&vc).unwrap());
        let (mut k_want, mut v_want) = (k0.clone(), v0.clone());
        for bb in 0..b {
            for i in 0..s_new {
                let t = lens[bb] as usize + i;
                if t >= cap {
                    continue; // past the capacity: not written
                }
                for hh in 0..hk {
                    for c in 0..d {
                        let dst = (phys(bb, t) * hk + hh) * d + c;
                        k_want[dst] = k_new[((bb * s_new + i) * hk + hh) * d + c];
                        v_want[dst] = v_new[bb * s_new * ss + i * ss + hh * hs + c];
                    }
                }
            }
        }
        let bits = |x: &[half::f16]| x.iter().map(|y| y.to_bits()).collect::<Vec<_>>();
        assert!(bits(&k1) == bits(&k_want), "paged {paged}: the K cache after the append");
        assert!(bits(&v1) == bits(&v_want), "paged {paged}: the V cache after the append");
    }
}

/// Host-visible bad input: typed errors naming the argument; device-side
/// garbage (cache_seqlens past the capacity, block-table entries past the
/// pages) is clamped, never out of bounds.
#[test]
fn gpu_decode_bad_input() {
    let Some(g) = gpu("gpu_decode_bad_input") else { return };
    let s = &g.stream;
    let (b, cap, hk, h, d) = (2, 64, 2, 4, 64);
    let q: CudaSlice<half::f16> = s.clone_htod(&vec![half::f16::from_f32(0.5); b * h * d]).unwrap();
    let mut kc: CudaSlice<half::f16> = s.clone_htod(&vec![half::f16::from_f32(0.25); b * cap * hk * d]).unwrap();
    let mut vc = kc.clone();
    let lay = TensorLayout::contiguous([b, cap, hk, d]);
    let ql = TensorLayout::contiguous([b, 1, h, d]);
    let garbage = s.clone_htod(&[1 << 30, -5]).unwrap();
    let call = |kc: &mut CudaSlice<half::f16>, vc: &mut CudaSlice<half::f16>, seqlens: &CudaSlice<i32>, splits: Option<usize>| {
        let cache = KvCache { k_cache: kc, v_cache: vc, layout: lay, cache_seqlens: seqlens, cache_batch_idx: None, block_table: None, k_new: None, v_new: None };
        g.fa.forward_kvcache::<half::f16, _>(s, Tensor::new(&q, ql), cache, &ForwardParams::default(), &Extras::default(), DecodeOptions { num_splits: splits, ..Default::default() })
    };
    for bad in [Some(0), Some(129)] {
        let e = call(&mut kc, &mut vc, &garbage, bad).unwrap_err();
        assert!(matches!(e, FlashAttnError::InvalidArgument { argument: "num_splits", .. }), "{e}");
    }
    let short = s.clone_htod(&[3]).unwrap();
    let e = call(&mut kc, &mut vc, &short, None).unwrap_err();
    assert!(matches!(e, FlashAttnError::InvalidArgument { argument: "cache_seqlens", .. }), "{e}");
    // Garbage lengths: clamped to [0, capacity] in the kernel.
    let out = call(&mut kc, &mut vc, &garbage, Some(4)).unwrap();
    s.synchronize().unwrap();
    let o: Vec<half::f16> = s.clone_dtoh(&out.o).unwrap();
    assert!(o[..h * d].iter().all(|x| (x.to_f32() - 0.25).abs() < 1e-3), "sequence 0 attends to the whole (clamped) cache");
    assert!(o[h * d..].iter().all(|x| x.to_f32() == 0.0), "sequence 1: negative length → no key → O = 0");
    // Paged with block-table garbage and appending past the capacity.
    let table = s.clone_htod(&[7i32, -1, 1 << 20, 2, 0, 0, 0, 0]).unwrap();
    let pages = TensorLayout::contiguous([b * cap / 16, 16, hk, d]);
    let seqlens = s.clone_htod(&[64, 10]).unwrap();
    let cache = KvCache {
        k_cache: &mut kc,
        v_cache: &mut vc,
        layout: pages,
        cache_seqlens: &seqlens,
        cache_batch_idx: None,
        block_table: Some(BlockTable { table: &table, max_blocks_per_seq: 4 }),
        k_new: None,
        v_new: None,
    };
    g.fa.forward_kvcache::<half::f16, _>(s, Tensor::new(&q, ql), cache, &ForwardParams::default(), &Extras::default(), DecodeOptions::default()).unwrap();
    s.synchronize().unwrap();
    let knew: CudaSlice<half::f16> = s.clone_htod(&vec![half::f16::from_f32(1.0); b * 65 * hk * d]).unwrap();
    let nl = TensorLayout::contiguous([b, 65, hk, d]);
    let cache = KvCache::new(&mut kc, &mut vc, lay, &seqlens).with_new(Tensor::new(&knew, nl), Tensor::new(&knew, nl));
    let e = g.fa.forward_kvcache::<half::f16, _>(s, Tensor::new(&q, ql), cache, &ForwardParams::default(), &Extras::default(), DecodeOptions::default()).unwrap_err();
    assert!(matches!(e, FlashAttnError::InvalidArgument { argument: "k_new", .. }), "{e}");
}

/// A split GQA decode call's inputs (3 sequences, one without keys; 32/8
/// heads, d = 128, a 5000-row cache, 7 splits): bf16 q, caches, lengths.
struct SplitCase {
    q: CudaSlice<half::bf16>,
    kc: CudaSlice<half::bf16>,
    vc: CudaSlice<half::bf16>,
    seqlens: CudaSlice<i32>,
    /// Rows of the cache (`DIMS.1` unless built [`SplitCase::with_capacity`]).
    cap: usize,
}

impl SplitCase {
    /// (batch, capacity, nheads_k, nheads, d, splits)
    const DIMS: (usize, usize, usize, usize, usize, usize) = (3, 5000, 8, 32, 128, 7);

    fn new(g: &Gpu, rng: &mut Rng) -> Self {
        Self::with_capacity(g, rng, Self::DIMS.1, [4999, 0, 1234])
    }

    /// The same heads with a `cap`-row cache and these key counts.
    fn with_capacity(g: &Gpu, rng: &mut Rng, cap: usize, seqlens: [i32; 3]) -> Self {
        let s = &g.stream;
        let (b, _, hk, h, d, _) = Self::DIMS;
        let mut rnd = |n: usize| -> CudaSlice<half::bf16> { s.clone_htod(&(0..n).map(|_| half::bf16::from_f32(rng.nonzero(1.0))).collect::<Vec<_>>()).unwrap() };
        Self { q: rnd(b * h * d), kc: rnd(b * cap * hk * d), vc: rnd(b * cap * hk * d), seqlens: s.clone_htod(&seqlens).unwrap(), cap }
    }

    /// The KV-cache call on this case with `opts` (7 splits unless set), synchronized.
    fn call(&mut self, g: &Gpu, opts: DecodeOptions<'_>) -> Result<flash_attn::AttnOutput<half::bf16>, FlashAttnError> {
        let (b, _, hk, h, d, _) = Self::DIMS;
        let cache = KvCache::new(&mut self.kc, &mut self.vc, TensorLayout::contiguous([b, self.cap, hk, d]), &self.seqlens);
        let out = g.fa.forward_kvcache::<half::bf16, _>(&g.stream, Tensor::new(&self.q, TensorLayout::contiguous([b, 1, h, d])), cache, &ForwardParams::default(), &Extras::default(), opts)?;
        g.stream.synchronize().unwrap();
        Ok(out)
    }

    /// [`SplitCase::call`] with `num_splits` splits through the library's
    /// scratch, `kernel` and `timeline` as given, deterministic: O's bits.
    fn o_bits(&mut self, g: &Gpu, kernel: Option<&'static str>, timeline: Option<&mut CudaSlice<u64>>) -> Result<Vec<u16>, FlashAttnError> {
        let out = self.call(g, DecodeOptions { num_splits: Some(Self::DIMS.5), scratch: None, kernel, timeline, deterministic: true })?;
        Ok(g.stream.clone_dtoh(&out.o).unwrap().iter().map(|x| x.to_bits()).collect())
    }
}

/// Split-KV scratch kinds give the same bits (deterministic splits): the library's (fused
/// combine with its per-stream counters), a caller's without counters
/// (combine launch), a caller's with counters (fused; called twice: every
/// launch puts the counts back to 0), the caller's accumulators starting
/// as NaN; counters too small: a typed error.
#[test]
fn gpu_split_scratch_kinds() {
    let Some(g) = gpu("gpu_split_scratch_kinds") else { return };
    let mut rng = Rng::fresh("gpu_split_scratch_kinds");
    let s = &g.stream;
    let mut case = SplitCase::new(g, &mut rng);
    let (b, _, hk, h, d, ns) = SplitCase::DIMS;
    // A caller's scratch holds whatever its last use left: NaN here, so a
    // partial row or LSE the combine read without this launch writing it
    // (or a zero weight times a stale row) would show in the output.
    let mut o_acc: CudaSlice<f32> = s.clone_htod(&vec![f32::NAN; ns * b * h * d]).unwrap();
    let mut l_acc: CudaSlice<f32> = s.clone_htod(&vec![f32::NAN; ns * b * h]).unwrap();
    let mut counters: CudaSlice<u32> = s.alloc_zeros(b * h).unwrap();
    let mut few: CudaSlice<u32> = s.alloc_zeros(b * hk - 1).unwrap();
    let mut call = |scratch: Option<SplitScratch<'_>>| -> Result<(Vec<u16>, Vec<f32>), FlashAttnError> {
        let out = case.call(g, DecodeOptions { num_splits: Some(ns), scratch, kernel: None, timeline: None, deterministic: true })?;
        Ok((s.clone_dtoh(&out.o).unwrap().iter().map(|x| x.to_bits()).collect(), s.clone_dtoh(&out.lse).unwrap()))
    };
    let library = call(None).unwrap();
    let launch = call(Some(SplitScratch { o_accum: &mut o_acc, lse_accum: &mut l_acc, max_splits: ns, counters: None })).unwrap();
    assert!(library == launch, "fused combine (library counters) and the combine launch differ");
    for round in 0..2 {
        let fused = call(Some(SplitScratch { o_accum: &mut o_acc, lse_accum: &mut l_acc, max_splits: ns, counters: Some(&mut counters) })).unwrap();
        assert!(library == fused, "caller counters, call {round}: differs from the library's");
    }
    let left: Vec<u32> = s.clone_dtoh(&counters).unwrap();
    assert!(left.iter().all(|&c| c == 0), "every launch puts its counts back to 0: {left:?}");
    // Sequence 1 has no key: O = 0, LSE = −inf through the fused merge too.
    assert!(library.0[h * d..2 * h * d].iter().all(|&x| x == 0) && library.1[h..2 * h].iter().all(|&x| x == f32::NEG_INFINITY));
    let e = call(Some(SplitScratch { o_accum: &mut o_acc, lse_accum: &mut l_acc, max_splits: ns, counters: Some(&mut few) })).unwrap_err();
    assert!(matches!(e, FlashAttnError::InvalidArgument { argument: "scratch.counters", .. }), "{e}");
}

/// The ticket schedule (the default for split calls of the d = 128
/// flash-decoding kernels over contiguous caches with at least 32 key
/// blocks per split): against the deterministic shares on the same inputs
/// (a 20 000-row cache: 157 key blocks of 128; sequences of 19 999, 0 and
/// 5 000 keys), the LSE to f32 rounding (a key block taken twice or skipped
/// would move it by ~1e-2) and O to bf16 rounding, over repeated calls with
/// 2 and 4 splits; the caller's counters back to 0 after every call (the
/// tickets share their word); the sequence without keys gives O = 0,
/// LSE = −inf.
#[test]
fn gpu_split_tickets() {
    let Some(g) = gpu("gpu_split_tickets") else { return };
    if !g.fa.split_tickets_pay() {
        // (The schedule then stays static: the calls below compare two
        // static runs, still checking the counters and the empty sequence.)
        let max = flash_attn::advanced::decode::MAX_TICKET_BANDWIDTH_PER_SM / 1e9;
        eprintln!("gpu_split_tickets: {} takes no tickets (more than {max} GB/s of DRAM bandwidth per SM)", g.fa.device_name());
    }
    let mut rng = Rng::fresh("gpu_split_tickets");
    let s = &g.stream;
    let mut case = SplitCase::with_capacity(g, &mut rng, 20_000, [19_999, 0, 5_000]);
    let (b, _, _, h, d, _) = SplitCase::DIMS;
    let max_splits = 64;
    let mut o_acc: CudaSlice<f32> = s.alloc_zeros(max_splits * b * h * d).unwrap();
    let mut l_acc: CudaSlice<f32> = s.alloc_zeros(max_splits * b * h).unwrap();
    let mut counters: CudaSlice<u32> = s.alloc_zeros(b * h).unwrap();
    for ns in [2, 4] {
        // O, the LSE and the counters after the call.
        let mut call = |deterministic: bool| -> (Vec<f32>, Vec<f32>, Vec<u32>) {
            let scratch = SplitScratch { o_accum: &mut o_acc, lse_accum: &mut l_acc, max_splits, counters: Some(&mut counters) };
            let out = case.call(g, DecodeOptions { num_splits: Some(ns), scratch: Some(scratch), deterministic, ..Default::default() }).unwrap();
            (s.clone_dtoh(&out.o).unwrap().iter().map(|x| x.to_f32()).collect(), s.clone_dtoh(&out.lse).unwrap(), s.clone_dtoh(&counters).unwrap())
        };
        let (o_ref, lse_ref, _) = call(true);
        for round in 0..3 {
            let (o, lse, left) = call(false);
            for (i, (a, r)) in lse.iter().zip(&lse_ref).enumerate() {
                let ok = if r.is_finite() { (a - r).abs() <= 1e-4 * r.abs().max(1.0) } else { a == r };
                assert!(ok, "{ns} splits, call {round}: LSE row {i}: {a} against {r}");
            }
            for (i, (a, r)) in o.iter().zip(&o_ref).enumerate() {
                assert!((a - r).abs() <= 1e-2 * r.abs() + 1e-4, "{ns} splits, call {round}: O element {i}: {a} against {r}");
            }
            assert!(o[h * d..2 * h * d].iter().all(|&x| x == 0.0) && lse[h..2 * h].iter().all(|&x| x == f32::NEG_INFINITY), "sequence 1 has no key");
            assert!(left.iter().all(|&c| c == 0), "{ns} splits, call {round}: counters left {left:?}");
        }
    }
}

/// The compact entry (`DecodeParams`, 184 bytes) and the full one
/// (`AttnParams`) of the same flash-decoding kernel give the same bits; a
/// plain call takes the compact one by default (forcing it succeeds), a
/// call it cannot carry (a timeline) is a typed error when it is forced.
#[test]
fn gpu_decode_compact_entry() {
    use flash_attn::advanced::decode::timeline::WORDS;
    use flash_attn::advanced::decode::DecKernel;
    let Some(g) = gpu("gpu_decode_compact_entry") else { return };
    let mut rng = Rng::fresh("gpu_decode_compact_entry");
    let s = &g.stream;
    let mut case = SplitCase::new(g, &mut rng);
    let (b, _, hk, _, d, ns) = SplitCase::DIMS;
    let k = DecKernel::default_fitting(true, d, None, 227 * 1024).unwrap();
    let compact = k.compact.expect("the default has a compact entry");
    let mut call = |kernel: Option<&'static str>, timeline: Option<&mut CudaSlice<u64>>| case.o_bits(g, kernel, timeline);
    let auto = call(None, None).unwrap();
    let full = call(Some(k.name), None).unwrap();
    let small = call(Some(compact), None).unwrap();
    assert!(auto == full && full == small, "compact and full entries differ");
    let mut words: CudaSlice<u64> = s.alloc_zeros(b * hk * ns * WORDS).unwrap();
    let e = call(Some(compact), Some(&mut words)).unwrap_err();
    assert!(matches!(e, FlashAttnError::Unsupported { argument: "opts.kernel", .. }), "{e}");
    assert!(call(None, Some(&mut words)).unwrap() == full, "a timeline call (full entry) differs");
}

/// The flash-decoding kernel's per-block timeline (`DecodeOptions::timeline`):
/// the same output bits with and without it; one record per thread block
/// with its points in order, every split of every tile once, one merging
/// block per tile; a short buffer and a call that runs another kernel are
/// typed errors.
#[test]
fn gpu_decode_timeline() {
    use flash_attn::advanced::decode::timeline::WORDS;
    use flash_attn_tests::bench::timeline::blocks;
    let Some(g) = gpu("gpu_decode_timeline") else { return };
    let mut rng = Rng::fresh("gpu_decode_timeline");
    let s = &g.stream;
    let mut case = SplitCase::new(g, &mut rng);
    let (b, _, hk, _, d, ns) = SplitCase::DIMS;
    // GQA 32/8, one token: the 4 query heads of a KV head are one tile.
    let tiles = b * hk;
    let mut words: CudaSlice<u64> = s.alloc_zeros(tiles * ns * WORDS).unwrap();
    let mut short: CudaSlice<u64> = s.alloc_zeros(tiles * ns * WORDS - 1).unwrap();
    let mut call = |timeline: Option<&mut CudaSlice<u64>>, kernel: Option<&'static str>| case.o_bits(g, kernel, timeline);
    let plain = call(None, None).unwrap();
    let traced = call(Some(&mut words), None).unwrap();
    assert!(plain == traced, "the timeline changes the output");
    let recs = blocks(&s.clone_dtoh(&words).unwrap());
    assert_eq!(recs.len(), tiles * ns, "one record per thread block");
    for r in &recs {
        let t = r.ns;
        assert!(t[0] <= t[1] && t[1] <= t[2] && t[2] <= t[3] && t[3] <= t[4], "points out of order: {r:?}");
        assert!(!r.last || t[5] >= t[4], "the merging block ends after its count: {r:?}");
        assert!((r.split as usize) < ns, "{r:?}");
    }
    for split in 0..ns as u32 {
        assert_eq!(recs.iter().filter(|r| r.split == split).count(), tiles, "split {split}: once per tile");
    }
    assert_eq!(recs.iter().filter(|r| r.last).count(), tiles, "one merging block per tile");
    let e = call(Some(&mut short), None).unwrap_err();
    assert!(matches!(e, FlashAttnError::InvalidArgument { argument: "timeline", .. }), "{e}");
    let e = call(Some(&mut words), Some(fa2d_kernel::<half::bf16>(d))).unwrap_err();
    assert!(matches!(e, FlashAttnError::Unsupported { argument: "timeline", .. }), "{e}");
}

/// Varlen prefill over a paged cache (prefix caching).
#[derive(Clone, Debug)]
struct VarPaged {
    lens_q: Vec<usize>,
    lens_k: Vec<usize>,
    h: usize,
    hk: usize,
    d: usize,
    page: usize,
    params: ForwardParams,
    seqused: bool,
    num_splits: Option<usize>,
}

fn run_varlen_paged<T: AttnElem>(g: &Gpu, rng: &mut Rng, c: &VarPaged) -> Result<(), FlashAttnError> {
    let s = &g.stream;
    let VarPaged { h, hk, d, page, .. } = *c;
    let batch = c.lens_q.len();
    let max_q = *c.lens_q.iter().max().unwrap();
    let max_k = *c.lens_k.iter().max().unwrap();
    let per = max_k.div_ceil(page).max(1);
    let n = batch * per + 2;
    let mut perm: Vec<usize> = (0..n).collect();
    for i in (1..n).rev() {
        perm.swap(i, rng.below(i + 1));
    }
    let table: Vec<i32> = (0..batch * per).map(|i| perm[i] as i32).collect();
    let k_log = random::<T>(rng, (batch, per * page, hk, d));
    let v_log = random::<T>(rng, (batch, per * page, hk, d));
    let mut kp = random::<T>(rng, (n, page, hk, d));
    let mut vp = random::<T>(rng, (n, page, hk, d));
    for b in 0..batch {
        for t in 0..per * page {
            let (pg, r) = (table[b * per + t / page] as usize, t % page);
            kp.slice_mut(s![pg, r, .., ..]).assign(&k_log.slice(s![b, t, .., ..]));
            vp.slice_mut(s![pg, r, .., ..]).assign(&v_log.slice(s![b, t, .., ..]));
        }
    }
    let total_q: usize = c.lens_q.iter().sum();
    let q = random::<T>(rng, (1, total_q, h, d));
    let prefix = |lens: &[usize]| std::iter::once(0).chain(lens.iter().scan(0, |a, &x| { *a += x; Some(*a as i32) })).collect::<Vec<i32>>();
    let (cu_q, cu_k) = (prefix(&c.lens_q), prefix(&c.lens_k));
    // seqused_k: cu_seqlens_k spans one more key than used.
    let (cu_k, used): (Vec<i32>, Option<Vec<i32>>) = if c.seqused {
        (prefix(&c.lens_k.iter().map(|&x| (x + 1).min(per * page)).collect::<Vec<_>>()), Some(c.lens_k.iter().map(|&x| x as i32).collect()))
    } else {
        (cu_k, None)
    };
    let (qd, kd, vd) = (s.clone_htod(q.as_slice().unwrap())?, s.clone_htod(kp.as_slice().unwrap())?, s.clone_htod(vp.as_slice().unwrap())?);
    let (cqd, ckd, btd) = (s.clone_htod(&cu_q)?, s.clone_htod(&cu_k)?, s.clone_htod(&table)?);
    let ud = used.as_ref().map(|u| s.clone_htod(u)).transpose()?;
    let varlen = Varlen {
        cu_seqlens_q: &cqd,
        cu_seqlens_k: &ckd,
        max_seqlen_q: max_q,
        max_seqlen_k: max_k,
        seqused_k: ud.as_ref().map(|u| u as _),
    };
    let cache = PagedCache::new(&kd, &vd, TensorLayout::contiguous([n, page, hk, d]), BlockTable::new(&btd, per));
    let out = g.fa.forward_varlen_paged::<T, _>(
        s,
        Tensor::new(&qd, TensorLayout::varlen(total_q, h, d)),
        cache,
        &varlen,
        &c.params,
        &Extras::default(),
        DecodeOptions { num_splits: c.num_splits, ..Default::default() },
    )?;
    s.synchronize()?;
    let o = Array4::from_shape_vec((1, total_q, h, d), s.clone_dtoh(&out.o)?).unwrap();
    let lse = ndarray::Array2::from_shape_vec((h, total_q), s.clone_dtoh(&out.lse)?).unwrap();
    #[allow(clippy::needless_range_loop)] // b indexes cu_q (batch + 1 offsets), lens_q, lens_k and the tensors
    for b in 0..batch {
        let (q0, lq, lk) = (cu_q[b] as usize, c.lens_q[b], c.lens_k[b]);
        if lq == 0 {
            continue;
        }
        let label = format!("{} {c:?} seq {b} ({lq} queries, {lk} keys)", std::any::type_name::<T>());
        let qb = q.slice(s![.., q0..q0 + lq, .., ..]).to_owned();
        let ob = o.slice(s![.., q0..q0 + lq, .., ..]).to_owned();
        let kb = k_log.slice(s![b..b + 1, ..lk, .., ..]).to_owned();
        let vb = v_log.slice(s![b..b + 1, ..lk, .., ..]).to_owned();
        let spec = Spec { params: c.params, alibi: None, norm_seqlen_k: Some(max_k) };
        assert_matches_reference(&label, &qb, &kb, &vb, ob.view(), lse.slice(s![.., q0..q0 + lq]).iter().copied(), &spec, 2.0);
    }
    Ok(())
}

/// Varlen prefill over a paged cache: random lengths (a query segment
/// longer than its keys, one of length 1, keys not a multiple of the page),
/// page sizes 16/64/256 and 48 (not a power of two), GQA/MQA, causal and
/// windows, seqused_k, splits forced and automatic.
#[test]
fn gpu_varlen_paged() {
    let Some(g) = gpu("gpu_varlen_paged") else { return };
    let mut rng = Rng::fresh("gpu_varlen_paged");
    let mut n = 0;
    for (i, page) in [16, 64, 256, 48].into_iter().enumerate() {
        for (h, hk, d) in [(8, 2, 128), (4, 1, 64), (6, 6, 96)] {
            let batch = 4;
            // Query segments up to 300 (fa2d tiles) or up to 16 (flash-decoding).
            let max_q = if (i + d) % 3 == 0 { 16 } else { 300 };
            let mut lens_k: Vec<usize> = (0..batch).map(|_| 1 + rng.below(700)).collect();
            let mut lens_q: Vec<usize> = lens_k.iter().map(|&k| 1 + rng.below(k.min(max_q))).collect();
            lens_q[0] = 1;
            lens_q[1] = (lens_k[1] + 5).min(max_q); // more queries than keys: early rows see nothing (causal)
            lens_k[1] = lens_k[1].min(lens_q[1] - 1).max(1);
            lens_k[2] = 3 * page + 1;
            lens_q[2] = lens_q[2].min(lens_k[2]);
            let window = [(None, None), (Some(37), Some(0)), (Some(100), None)][(i + h) % 3];
            let params = ForwardParams { causal: (i + d) % 2 == 0, window_left: window.0, window_right: window.1, ..Default::default() };
            let num_splits = [Some(1), None, Some(3), Some(8)][(i + hk) % 4];
            let c = VarPaged { lens_q, lens_k, h, hk, d, page, params, seqused: (i + h) % 2 == 1, num_splits };
            if (i + h) % 2 == 0 {
                run_varlen_paged::<half::bf16>(g, &mut rng, &c).unwrap_or_else(|e| panic!("{c:?}: {e}"));
            } else {
                run_varlen_paged::<half::f16>(g, &mut rng, &c).unwrap_or_else(|e| panic!("{c:?}: {e}"));
            }
            n += 1;
        }
    }
    println!("{n} varlen paged cases passed");
}

/// Page tables of the 8-warp page-batched `_pg` kernel (d = 128). (1)
/// Against the f64 reference over shuffled pools: pages of 8, 16, 32 and 64
/// rows (a thread's rows in one page) and 48 (per-row lookups), GQA and MHA,
/// causal speculative rows, splits forced and automatic, lengths that end
/// inside a page. (2) Block tables no permutation gives — pages repeated,
/// entries out of range (clamped to the pool), one page for every slot —
/// against the reference over the keys the clamped table names.
#[test]
fn gpu_decode_page_tables() {
    let Some(g) = gpu("gpu_decode_page_tables") else { return };
    let mut rng = Rng::fresh("gpu_decode_page_tables");
    let mut n = 0;
    for (i, page) in [16, 8, 32, 64, 48, 16].into_iter().enumerate() {
        for (j, splits) in [Some(1), Some(3), Some(7), None].into_iter().enumerate() {
            let (h, hk) = if (i + j) % 2 == 0 { (8, 2) } else { (4, 4) };
            let sq = if j == 2 { 3 } else { 1 };
            let c = Dec { batch: 3, sq, max_cached: 2600 + 113 * i + 7 * j, s_new: sq, h, hk, d: 128, page: Some(page), causal: j == 2, num_splits: splits, two_step: true, fa2d: false, dec: None };
            if (i + j) % 2 == 0 {
                run::<half::bf16>(g, &mut rng, &c).unwrap_or_else(|e| panic!("{c:?}: {e}"));
            } else {
                run::<half::f16>(g, &mut rng, &c).unwrap_or_else(|e| panic!("{c:?}: {e}"));
            }
            n += 1;
        }
    }
    // (2) Tables with repeats, out-of-range entries, one page everywhere.
    let s = &g.stream;
    let (batch, h, hk, d, page, pool) = (3, 8, 2, 128, 16, 300);
    let lens = [4000usize, 2717, 3100];
    let per = 250;
    let kp = random::<half::bf16>(&mut rng, (pool, page, hk, d));
    let vp = random::<half::bf16>(&mut rng, (pool, page, hk, d));
    let q = random::<half::bf16>(&mut rng, (batch, 1, h, d));
    let mut table = vec![0i32; batch * per];
    for (k, e) in table.iter_mut().enumerate() {
        *e = match k / per {
            0 => rng.below(pool) as i32,                                          // repeats
            1 => [rng.below(pool) as i32, -5, pool as i32 + 100][k % 3],          // out of range
            _ => 7,                                                               // one page
        };
    }
    let clamp = |x: i32| x.clamp(0, pool as i32 - 1) as usize;
    let (kd, vd) = (s.clone_htod(kp.as_slice().unwrap()).unwrap(), s.clone_htod(vp.as_slice().unwrap()).unwrap());
    let qd = s.clone_htod(q.as_slice().unwrap()).unwrap();
    let td = s.clone_htod(&table).unwrap();
    let csd = s.clone_htod(&lens.map(|l| l as i32)).unwrap();
    let layout = TensorLayout::contiguous([pool, page, hk, d]);
    for splits in [Some(1), Some(4), None] {
        let cache = KvCacheRef::new(&kd, &vd, layout, &csd).with_block_table(BlockTable::new(&td, per));
        let opts = DecodeOptions { num_splits: splits, ..Default::default() };
        let out = g.fa.forward_kvcache_ref::<half::bf16, _>(s, Tensor::new(&qd, TensorLayout::contiguous([batch, 1, h, d])), cache, &ForwardParams::default(), &Extras::default(), opts).unwrap();
        s.synchronize().unwrap();
        let o = Array4::from_shape_vec((batch, 1, h, d), s.clone_dtoh(&out.o).unwrap()).unwrap();
        let lse: Vec<f32> = s.clone_dtoh(&out.lse).unwrap();
        for b in 0..batch {
            let label = format!("table kind {b}, splits {splits:?}");
            let len = lens[b];
            let mut kl = Array4::<half::bf16>::zeros((1, len, hk, d));
            let mut vl = Array4::<half::bf16>::zeros((1, len, hk, d));
            for t in 0..len {
                let pg = clamp(table[b * per + t / page]);
                kl.slice_mut(s![0, t, .., ..]).assign(&kp.slice(s![pg, t % page, .., ..]));
                vl.slice_mut(s![0, t, .., ..]).assign(&vp.slice(s![pg, t % page, .., ..]));
            }
            let qb = q.slice(s![b..b + 1, .., .., ..]).to_owned();
            let spec = Spec { params: ForwardParams::default(), alibi: None, norm_seqlen_k: None };
            assert_matches_reference(&label, &qb, &kl, &vl, o.slice(s![b..b + 1, .., .., ..]), lse[b * h..(b + 1) * h].iter().copied(), &spec, 2.0);
        }
        n += 1;
    }
    println!("{n} page-table cases passed");
}
