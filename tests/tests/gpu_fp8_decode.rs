//! End-to-end: decode against an FP8 (e4m3) KV cache, contiguous and paged,
//! new keys and values quantized into it, split-KV, GQA head packing, per
//! tensor and per KV head scales. Each sequence is checked against the f64
//! reference over the **dequantized** cache (FA2's rule: error ≤ 3 × the
//! naive same-dtype error over the same inputs, + 1e-5; the logsumexp
//! within 1e-4·max(1, |ref|)), and the cache's bytes after the append
//! exactly against `reference::fp8::e4m3_from_f32` (round to nearest even,
//! saturating). Scales are powers of two here, so that the dequantized
//! cache is exact in f16/bf16 and the naive reference sees exactly the
//! kernel's inputs; `gpu_fp8_decode_scale_any` covers other scales.

use flash_attn::reference::fp8::{e4m3_from_f32, e4m3_to_f32};
use flash_attn::{AttnElem, BlockTable, DecodeOptions, Extras, FlashAttnError, ForwardParams, KvCacheFp8, Tensor, TensorLayout};
use flash_attn_tests::features::{Spec, assert_matches_reference, random};
use flash_attn_tests::{Gpu, Rng, gpu};
use ndarray::{Array4, Axis, s};

/// Where row `t` of sequence `b` of the logical cache lies in the physical
/// storage: `(physical batch or page, row in it)`.
type ToPhys = Box<dyn Fn(usize, usize) -> (usize, usize)>;

/// The physical cache: its layout, the block table and pages per sequence
/// (paged), K and V as stored, and [`ToPhys`].
type Physical<E> = (TensorLayout, Option<(Vec<i32>, usize)>, Array4<E>, Array4<E>, ToPhys);

#[derive(Clone, Debug)]
struct Case {
    batch: usize,
    sq: usize,
    max_cached: usize,
    s_new: usize,
    h: usize,
    hk: usize,
    d: usize,
    page: Option<usize>,
    causal: bool,
    num_splits: Option<usize>,
    per_head: bool,
    softcap: f32,
}

/// Codes of random values over a range that uses the e4m3 exponents
/// (|x| up to ~300, some tiny, some zero), and the power-of-two scales.
fn codes(rng: &mut Rng, n: usize) -> Vec<u8> {
    (0..n)
        .map(|_| {
            let r = rng.below(16);
            let x = rng.nonzero(1.0) * if r == 0 { 300.0 } else if r == 1 { 0.01 } else { 4.0 };
            if r == 2 { 0 } else { e4m3_from_f32(x) }
        })
        .collect()
}

fn run<T: AttnElem>(g: &Gpu, rng: &mut Rng, c: &Case) -> Result<(), FlashAttnError> {
    let st = &g.stream;
    let Case { batch, sq, max_cached, s_new, h, hk, d, .. } = *c;
    let capacity = max_cached + s_new;
    let mut cached: Vec<i32> = (0..batch).map(|_| rng.below(max_cached + 1) as i32).collect();
    cached[0] = max_cached as i32;
    if batch > 1 {
        cached[1] = 0;
    }
    // Scales: powers of two, per tensor or per KV head.
    let pick = |rng: &mut Rng| f32::powi(2.0, rng.below(7) as i32 - 5);
    let (ks, vs): (Vec<f32>, Vec<f32>) = if c.per_head { ((0..hk).map(|_| pick(rng)).collect(), (0..hk).map(|_| pick(rng)).collect()) } else { (vec![pick(rng)], vec![pick(rng)]) };
    let scale_of = |s: &[f32], kh: usize| if s.len() == 1 { s[0] } else { s[kh] };
    // The logical cache of codes (batch, capacity, hk, d).
    let k_log = Array4::from_shape_vec((batch, capacity, hk, d), codes(rng, batch * capacity * hk * d)).unwrap();
    let v_log = Array4::from_shape_vec((batch, capacity, hk, d), codes(rng, batch * capacity * hk * d)).unwrap();
    let q = random::<T>(rng, (batch, sq, h, d));
    // New rows in T: some beyond ±448·scale (saturate).
    let mut k_new = random::<T>(rng, (batch, s_new, hk, d));
    let v_new = random::<T>(rng, (batch, s_new, hk, d));
    if s_new > 0 {
        k_new[(0, 0, 0, 0)] = T::from_f32(1e4);
        k_new[(0, 0, 0, 1)] = T::from_f32(-1e4);
    }
    let (layout, table, k_phys, v_phys, to_phys): Physical<u8> = match c.page {
        None => (TensorLayout::contiguous([batch, capacity, hk, d]), None, k_log.clone(), v_log.clone(), Box::new(|b, t| (b, t))),
        Some(p) => {
            let per = capacity.div_ceil(p);
            let n = batch * per + 2;
            let mut perm: Vec<usize> = (0..n).collect();
            for i in (1..n).rev() {
                perm.swap(i, rng.below(i + 1));
            }
            let table: Vec<i32> = (0..batch * per).map(|i| perm[i] as i32).collect();
            let mut kp = Array4::from_shape_vec((n, p, hk, d), codes(rng, n * p * hk * d)).unwrap();
            let mut vp = Array4::from_shape_vec((n, p, hk, d), codes(rng, n * p * hk * d)).unwrap();
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
    let mut kd = st.clone_htod(k_phys.as_slice().unwrap())?;
    let mut vd = st.clone_htod(v_phys.as_slice().unwrap())?;
    let qd = st.clone_htod(q.as_slice().unwrap())?;
    let knd = st.clone_htod(k_new.as_slice().unwrap())?;
    let vnd = st.clone_htod(v_new.as_slice().unwrap())?;
    let csd = st.clone_htod(&cached)?;
    let ksd = st.clone_htod(&ks)?;
    let vsd = st.clone_htod(&vs)?;
    let btd = table.as_ref().map(|(t, _)| st.clone_htod(t)).transpose()?;
    let new_layout = TensorLayout::contiguous([batch, s_new, hk, d]);
    let params = ForwardParams { causal: c.causal, softcap: (c.softcap > 0.0).then_some(c.softcap), ..Default::default() };
    let block_table = btd.as_ref().zip(table.as_ref()).map(|(t, (_, per))| BlockTable::new(t, *per));
    let qt = Tensor::new(&qd, TensorLayout::contiguous([batch, sq, h, d]));
    let opts = DecodeOptions { num_splits: c.num_splits, ..Default::default() };
    let cache = KvCacheFp8 {
        k_cache: &mut kd,
        v_cache: &mut vd,
        layout,
        k_scale: &ksd,
        v_scale: &vsd,
        cache_seqlens: &csd,
        cache_batch_idx: None,
        block_table,
        k_new: (s_new > 0).then(|| Tensor::new(&knd, new_layout).into()),
        v_new: (s_new > 0).then(|| Tensor::new(&vnd, new_layout).into()),
    };
    let out = g.fa.forward_kvcache_fp8::<T, _>(st, qt, cache, &params, &Extras::default(), opts)?;
    st.synchronize()?;
    let o = Array4::from_shape_vec((batch, sq, h, d), st.clone_dtoh(&out.o)?).unwrap();
    let lse = ndarray::Array3::from_shape_vec((batch, h, sq), st.clone_dtoh(&out.lse)?).unwrap();
    // The cache's bytes: new rows quantized at cached[b].., the rest untouched.
    let k_after = Array4::from_shape_vec(k_phys.dim(), st.clone_dtoh(&kd)?).unwrap();
    let v_after = Array4::from_shape_vec(v_phys.dim(), st.clone_dtoh(&vd)?).unwrap();
    let mut k_want = k_log.clone();
    let mut v_want = v_log.clone();
    for b in 0..batch {
        for i in 0..s_new {
            let t = cached[b] as usize + i;
            for kh in 0..hk {
                for e in 0..d {
                    k_want[(b, t, kh, e)] = e4m3_from_f32(k_new[(b, i, kh, e)].to_f32() / scale_of(&ks, kh));
                    v_want[(b, t, kh, e)] = e4m3_from_f32(v_new[(b, i, kh, e)].to_f32() / scale_of(&vs, kh));
                }
            }
        }
        for t in 0..capacity {
            let (pb, r) = to_phys(b, t);
            assert_eq!(k_after.slice(s![pb, r, .., ..]), k_want.slice(s![b, t, .., ..]), "{c:?}: K codes of row {t} of sequence {b}");
            assert_eq!(v_after.slice(s![pb, r, .., ..]), v_want.slice(s![b, t, .., ..]), "{c:?}: V codes of row {t} of sequence {b}");
        }
    }
    if s_new > 0 {
        assert_eq!(e4m3_to_f32(k_want[(0, cached[0] as usize, 0, 0)]).abs(), 448.0, "saturated code");
    }
    // The dequantized cache in T (exact: power-of-two scales).
    let deq = |a: &Array4<u8>, sc: &[f32]| Array4::from_shape_fn(a.dim(), |(b, t, kh, e)| T::from_f32(e4m3_to_f32(a[(b, t, kh, e)]) * scale_of(sc, kh)));
    let (kq, vq) = (deq(&k_want, &ks), deq(&v_want, &vs));
    for (b, &cached_b) in cached.iter().enumerate() {
        let len = cached_b as usize + s_new;
        let label = format!("{} {c:?} seq {b} ({len} keys)", std::any::type_name::<T>());
        let ob = o.slice(s![b..b + 1, .., .., ..]).to_owned();
        if len == 0 {
            assert!(ob.iter().all(|x| x.to_f32() == 0.0), "{label}: no key → O = 0");
            continue;
        }
        let qb = q.slice(s![b..b + 1, .., .., ..]).to_owned();
        let kb = kq.slice(s![b..b + 1, ..len, .., ..]).to_owned();
        let vb = vq.slice(s![b..b + 1, ..len, .., ..]).to_owned();
        let spec = Spec { params, alibi: None, norm_seqlen_k: Some(capacity) };
        assert_matches_reference(&label, &qb, &kb, &vb, ob.view(), lse.index_axis(Axis(0), b).iter().copied(), &spec, 3.0);
    }
    Ok(())
}

/// The matrix: dtype × head dim × contiguous/paged (pages of a block and
/// more, smaller than a block, unaligned, tiny) × MHA/GQA/MQA × splits
/// forced and automatic × one token / speculative rows × per tensor / per
/// KV head scales, new rows appended.
#[test]
fn gpu_fp8_decode_matrix() {
    let Some(g) = gpu("gpu_fp8_decode_matrix") else { return };
    if !g.fa.has_fp8_kv_cache() {
        println!("skipped: {} has no FP8 KV-cache kernels", g.fa.device_name());
        return;
    }
    let mut rng = Rng::fresh("gpu_fp8_decode_matrix");
    let mut n = 0;
    for (i, d) in [32, 64, 96, 128, 160, 192, 224, 256].into_iter().enumerate() {
        for (j, (h, hk)) in [(8, 2), (4, 4), (6, 1)].into_iter().enumerate() {
            let k = i + j;
            let page = [None, Some(16), Some(256), Some(48), Some(3), Some(128)][k % 6];
            let sq = [1, 1, 3][k % 3];
            let splits = [None, Some(1), Some(5), None][k % 4];
            let sk = [700, 2100, 333][(i + 2 * j) % 3];
            let c = Case { batch: 3, sq, max_cached: sk, s_new: [1, 0, 2][k % 3].max(sq), h, hk, d, page, causal: k % 2 == 0, num_splits: splits, per_head: k % 2 == 1, softcap: 0.0 };
            if k % 2 == 0 {
                run::<half::bf16>(g, &mut rng, &c).unwrap_or_else(|e| panic!("{c:?}: {e}"));
            } else {
                run::<half::f16>(g, &mut rng, &c).unwrap_or_else(|e| panic!("{c:?}: {e}"));
            }
            n += 1;
        }
    }
    println!("{n} FP8 KV-cache cases passed");
}

/// Long caches (GQA 32/8 packed, automatic splits), and softcap.
#[test]
fn gpu_fp8_decode_long_and_softcap() {
    let Some(g) = gpu("gpu_fp8_decode_long_and_softcap") else { return };
    if !g.fa.has_fp8_kv_cache() {
        return;
    }
    let mut rng = Rng::fresh("gpu_fp8_decode_long_and_softcap");
    for (sk, page, softcap) in [(65_536, None, 0.0), (65_536, Some(256), 0.0), (20_000, Some(16), 30.0), (4_000, None, 5.0)] {
        let c = Case { batch: 1, sq: 1, max_cached: sk - 1, s_new: 1, h: 32, hk: 8, d: 128, page, causal: true, num_splits: None, per_head: true, softcap };
        run::<half::bf16>(g, &mut rng, &c).unwrap_or_else(|e| panic!("{c:?}: {e}"));
    }
}

/// Scales that are not powers of two: attention over `scale · codes` is
/// attention over the codes with the softmax scale times `k_scale`, times
/// `v_scale` — checked that way (the codes are exact in bf16).
#[test]
fn gpu_fp8_decode_scale_any() {
    let Some(g) = gpu("gpu_fp8_decode_scale_any") else { return };
    if !g.fa.has_fp8_kv_cache() {
        return;
    }
    let st = &g.stream;
    let mut rng = Rng::fresh("gpu_fp8_decode_scale_any");
    let (batch, sk, h, hk, d) = (2, 1500, 8, 2, 128);
    let (k_scale, v_scale) = (0.0123f32, 3.7f32);
    let k = Array4::from_shape_vec((batch, sk, hk, d), codes(&mut rng, batch * sk * hk * d)).unwrap();
    let v = Array4::from_shape_vec((batch, sk, hk, d), codes(&mut rng, batch * sk * hk * d)).unwrap();
    let q = random::<half::bf16>(&mut rng, (batch, 1, h, d));
    let (mut kd, mut vd) = (st.clone_htod(k.as_slice().unwrap()).unwrap(), st.clone_htod(v.as_slice().unwrap()).unwrap());
    let qd = st.clone_htod(q.as_slice().unwrap()).unwrap();
    let csd = st.clone_htod(&vec![sk as i32; batch]).unwrap();
    let (ksd, vsd) = (st.clone_htod(&[k_scale]).unwrap(), st.clone_htod(&[v_scale]).unwrap());
    let cache = KvCacheFp8::<half::bf16> {
        k_cache: &mut kd,
        v_cache: &mut vd,
        layout: TensorLayout::contiguous([batch, sk, hk, d]),
        k_scale: &ksd,
        v_scale: &vsd,
        cache_seqlens: &csd,
        cache_batch_idx: None,
        block_table: None,
        k_new: None,
        v_new: None,
    };
    let out = g.fa.forward_kvcache_fp8(st, Tensor::new(&qd, TensorLayout::contiguous([batch, 1, h, d])), cache, &ForwardParams::default(), &Extras::default(), DecodeOptions::default()).unwrap();
    let o = Array4::from_shape_vec((batch, 1, h, d), st.clone_dtoh(&out.o).unwrap()).unwrap();
    let lse: Vec<f32> = st.clone_dtoh(&out.lse).unwrap();
    // O / v_scale against attention over the codes with softmax_scale·k_scale.
    let o_unscaled = o.mapv(|x| half::bf16::from_f32(x.to_f32() / v_scale));
    let as_t = |a: &Array4<u8>| a.mapv(|c| half::bf16::from_f32(e4m3_to_f32(c)));
    let params = ForwardParams { softmax_scale: Some(flash_attn::default_softmax_scale(d) * k_scale), ..Default::default() };
    let spec = Spec { params, alibi: None, norm_seqlen_k: None };
    // One more bf16 rounding (of O / v_scale) than the naive path: factor 4.
    assert_matches_reference("scale_any", &q, &as_t(&k), &as_t(&v), o_unscaled.view(), lse, &spec, 4.0);
}

/// Every e4m3 code through the kernels' in-register conversion, exactly:
/// one cached key whose K and V rows hold every finite code (`d` = 256:
/// all 254 of them; smaller `d`: a rotating slice) and `d` query heads over
/// it (GQA, 16 per KV head, every KV head the same row), head `i` a
/// one-hot query at dim `i`. With one key
/// the softmax is 1: O of every head is V's row exactly (each code is exact
/// in f16 and bf16) and head `i`'s logsumexp is its score, K's code at dim
/// `i` — subnormal codes included (a flushed subnormal would read 0).
#[test]
fn gpu_fp8_decode_every_code() {
    let Some(g) = gpu("gpu_fp8_decode_every_code") else { return };
    if !g.fa.has_fp8_kv_cache() {
        return;
    }
    fn one<T: AttnElem>(g: &Gpu, d: usize, shift: usize) {
        let st = &g.stream;
        let h = d;
        // The 254 finite codes (0x7f and 0xff are NaN), from `shift`.
        let finite: Vec<u8> = (0u8..=255).filter(|&c| c & 0x7f != 0x7f).collect();
        let row: Vec<u8> = (0..d).map(|j| finite[(j + shift) % finite.len()]).collect();
        // 16 query heads per KV head (the kernels pack at most 16 rows).
        let hk = h / 16;
        let rows = row.repeat(hk);
        let (mut kd, mut vd) = (st.clone_htod(&rows).unwrap(), st.clone_htod(&rows).unwrap());
        let mut q = vec![T::from_f32(0.0); h * d];
        for i in 0..h {
            q[i * d + i] = T::from_f32(1.0);
        }
        let qd = st.clone_htod(&q).unwrap();
        let csd = st.clone_htod(&[1i32]).unwrap();
        let (ksd, vsd) = (st.clone_htod(&[1.0f32]).unwrap(), st.clone_htod(&[1.0f32]).unwrap());
        let cache = KvCacheFp8::<T> {
            k_cache: &mut kd,
            v_cache: &mut vd,
            layout: TensorLayout::contiguous([1, 1, hk, d]),
            k_scale: &ksd,
            v_scale: &vsd,
            cache_seqlens: &csd,
            cache_batch_idx: None,
            block_table: None,
            k_new: None,
            v_new: None,
        };
        let params = ForwardParams { softmax_scale: Some(1.0), ..Default::default() };
        let out = g.fa.forward_kvcache_fp8(st, Tensor::new(&qd, TensorLayout::contiguous([1, 1, h, d])), cache, &params, &Extras::default(), DecodeOptions::default()).unwrap();
        let o: Vec<T> = st.clone_dtoh(&out.o).unwrap();
        let lse: Vec<f32> = st.clone_dtoh(&out.lse).unwrap();
        for i in 0..h {
            for j in 0..d {
                let want = e4m3_to_f32(row[j]);
                assert_eq!(o[i * d + j].to_f32(), want, "{} d {d}: head {i} O[{j}] of code {:#04x}", std::any::type_name::<T>(), row[j]);
            }
            let want = e4m3_to_f32(row[i]);
            assert!((lse[i] - want).abs() <= 1e-6 * want.abs().max(1.0), "{} d {d}: head {i} logsumexp {} for code {:#04x} = {want}", std::any::type_name::<T>(), lse[i], row[i]);
        }
    }
    for (d, shift) in [(256, 0), (128, 0), (128, 128), (64, 64), (96, 150), (32, 200)] {
        one::<half::bf16>(g, d, shift);
        one::<half::f16>(g, d, shift);
    }
}

/// Bad inputs: typed errors, nothing enqueued.
#[test]
fn gpu_fp8_decode_rejects_bad_inputs() {
    let Some(g) = gpu("gpu_fp8_decode_rejects_bad_inputs") else { return };
    let st = &g.stream;
    let (batch, sk, h, hk) = (1, 64, 4, 2);
    let call = |d: usize, layout: TensorLayout, k_scales: usize, v_scales: usize| -> Result<(), FlashAttnError> {
        let mut kd = st.alloc_zeros::<u8>(layout.required_len().unwrap()).unwrap();
        let mut vd = st.alloc_zeros::<u8>(layout.required_len().unwrap()).unwrap();
        let qd = st.alloc_zeros::<half::bf16>(batch * h * d).unwrap();
        let csd = st.clone_htod(&[sk as i32]).unwrap();
        let ksd = st.clone_htod(&vec![1.0f32; k_scales]).unwrap();
        let vsd = st.clone_htod(&vec![1.0f32; v_scales]).unwrap();
        let cache = KvCacheFp8::<half::bf16> { k_cache: &mut kd, v_cache: &mut vd, layout, k_scale: &ksd, v_scale: &vsd, cache_seqlens: &csd, cache_batch_idx: None, block_table: None, k_new: None, v_new: None };
        g.fa.forward_kvcache_fp8(st, Tensor::new(&qd, TensorLayout::contiguous([batch, 1, h, d])), cache, &ForwardParams::default(), &Extras::default(), DecodeOptions::default()).map(|_| ())
    };
    if !g.fa.has_fp8_kv_cache() {
        let e = call(128, TensorLayout::contiguous([batch, sk, hk, 128]), 1, 1).unwrap_err();
        assert!(matches!(e, FlashAttnError::DeviceLacks { .. }), "{e}");
        return;
    }
    call(128, TensorLayout::contiguous([batch, sk, hk, 128]), 1, 1).unwrap();
    call(128, TensorLayout::contiguous([batch, sk, hk, 128]), hk, hk).unwrap();
    for (d, layout, ksn, vsn) in [
        (40, TensorLayout::contiguous([batch, sk, hk, 40]), 1, 1),
        (128, TensorLayout { shape: [batch, sk, hk, 128], strides: [sk * hk * 136 + 8, hk * 136, 136] }, 1, 1),
        (128, TensorLayout::contiguous([batch, sk, hk, 128]), 3, 3),
        (128, TensorLayout::contiguous([batch, sk, hk, 128]), 1, hk),
    ] {
        let e = call(d, layout, ksn, vsn).unwrap_err();
        assert!(matches!(e, FlashAttnError::InvalidArgument { .. }), "{e}");
        println!("refused: {e}");
    }
}
