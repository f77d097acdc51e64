//! The ndarray FP8 KV-cache API (`flash_attn_with_kvcache_fp8`) against the
//! f64 reference over the dequantized cache: on a machine without a GPU
//! (CI) its CPU path, on a GPU with the FP8 kernels the device path — the
//! same test either way. The cache's codes after the append are compared
//! exactly with `e4m3_from_f32(x / scale)`; bad inputs give typed errors.

use flash_attn::reference::fp8::{e4m3_from_f32, e4m3_to_f32};
use flash_attn::reference::{self, PagedKvMut};
use flash_attn::{AttnElem, FlashAttnError, ForwardParams, HostKvCache, flash_attn_with_kvcache_fp8};
use flash_attn_tests::Rng;
use ndarray::{Array2, Array4, s};

fn random<T: AttnElem>(rng: &mut Rng, shape: (usize, usize, usize, usize), amp: f32) -> Array4<T> {
    Array4::from_shape_simple_fn(shape, || T::from_f32(rng.nonzero(amp)))
}

fn codes(rng: &mut Rng, shape: (usize, usize, usize, usize)) -> Array4<u8> {
    Array4::from_shape_simple_fn(shape, || e4m3_from_f32(rng.nonzero(200.0)))
}

fn scale(sc: &[f32], h: usize) -> f32 {
    if sc.len() == 1 { sc[0] } else { sc[h] }
}

fn case<T: AttnElem>(rng: &mut Rng, paged: Option<usize>, per_head: bool, causal: bool) {
    let (batch, sq, s_new, h, hk, d, cap) = (3, 1, 2, 4, 2, 64, 80);
    let q = random::<T>(rng, (batch, sq, h, d), 1.0);
    let (kn, vn) = (random::<T>(rng, (batch, s_new, hk, d), 2.0), random::<T>(rng, (batch, s_new, hk, d), 2.0));
    let (ks, vs): (Vec<f32>, Vec<f32>) = if per_head { (vec![0.011, 0.02], vec![0.007, 0.013]) } else { (vec![0.01], vec![0.009]) };
    let cached = [0, 41, (cap - s_new) as i32];
    let params = ForwardParams { causal, ..Default::default() };
    let (mut kc, mut vc, tab) = match paged {
        None => (codes(rng, (batch, cap, hk, d)), codes(rng, (batch, cap, hk, d)), None),
        Some(p) => {
            let per = cap.div_ceil(p);
            let n = batch * per + 2;
            let mut perm: Vec<i32> = (0..n as i32).collect();
            for i in (1..n).rev() {
                perm.swap(i, rng.below(i + 1));
            }
            (codes(rng, (n, p, hk, d)), codes(rng, (n, p, hk, d)), Some(Array2::from_shape_fn((batch, per), |(b, i)| perm[b * per + i])))
        }
    };
    // Expected: codes of the new rows, then the f64 reference over the
    // dequantized cache with the dequantized new rows appended.
    let quant = |a: &Array4<T>, sc: &[f32]| Array4::from_shape_fn(a.dim(), |(b, i, hh, e)| e4m3_from_f32(a[(b, i, hh, e)].to_f32() / scale(sc, hh)));
    let deq = |a: &Array4<u8>, sc: &[f32]| Array4::from_shape_fn(a.dim(), |(r, t, hh, e)| e4m3_to_f32(a[(r, t, hh, e)]) as f64 * scale(sc, hh) as f64);
    let (knq, vnq) = (quant(&kn, &ks), quant(&vn, &vs));
    let (mut kf, mut vf) = (deq(&kc, &ks), deq(&vc, &vs));
    let qf = q.mapv(|x| x.to_f32() as f64);
    let (knf, vnf) = (deq(&knq, &ks), deq(&vnq, &vs));
    let want = match &tab {
        None => reference::kvcache_attention::<f64>(qf.view(), &mut kf, &mut vf, &cached, Some(knf.view()), Some(vnf.view()), None, &params, None).unwrap(),
        Some(t) => {
            let pages = PagedKvMut { k_pages: kf.view_mut(), v_pages: vf.view_mut(), block_table: t.view() };
            reference::paged_kvcache_attention::<f64>(qf.view(), pages, &cached, Some(knf.view()), Some(vnf.view()), &params, None).unwrap()
        }
    };
    let mut k_want = kc.clone();
    let mut v_want = vc.clone();
    for b in 0..batch {
        for i in 0..s_new {
            let t = cached[b] as usize + i;
            let (r, row) = match &tab {
                None => (b, t),
                Some(tb) => (tb[(b, t / kc.dim().1)] as usize, t % kc.dim().1),
            };
            k_want.slice_mut(s![r, row, .., ..]).assign(&knq.slice(s![b, i, .., ..]));
            v_want.slice_mut(s![r, row, .., ..]).assign(&vnq.slice(s![b, i, .., ..]));
        }
    }
    let cache = match &tab {
        None => HostKvCache::Contiguous { k_cache: &mut kc, v_cache: &mut vc, cache_batch_idx: None },
        Some(t) => HostKvCache::Paged { k_pages: &mut kc, v_pages: &mut vc, block_table: t.view() },
    };
    let (o, lse) = flash_attn_with_kvcache_fp8(q.view(), cache, &ks, &vs, &cached, Some(kn.view()), Some(vn.view()), &params, None, None).unwrap();
    assert_eq!(kc, k_want, "K codes after the append ({paged:?}, per_head {per_head})");
    assert_eq!(vc, v_want, "V codes after the append");
    let tol = if T::DTYPE == flash_attn::DType::F32 { 1e-5 } else { 2e-2 };
    let err = o.iter().zip(want.o.iter()).map(|(x, y)| (x.to_f32() as f64 - y).abs()).fold(0.0, f64::max);
    assert!(err <= tol, "O error {err:.3e} ({paged:?}, per_head {per_head}, causal {causal})");
    for (x, y) in lse.iter().zip(want.lse.iter()) {
        assert!((*x as f64 - y).abs() <= 1e-3 * y.abs().max(1.0), "lse {x} vs {y}");
    }
}

#[test]
fn fp8_kvcache_matches_the_dequantized_reference() {
    let mut rng = Rng::fresh("fp8_kvcache_matches_the_dequantized_reference");
    for (i, paged) in [None, Some(16), Some(32), Some(5)].into_iter().enumerate() {
        case::<half::bf16>(&mut rng, paged, i % 2 == 0, i < 2);
        case::<half::f16>(&mut rng, paged, i % 2 == 1, i >= 2);
        case::<f32>(&mut rng, paged, true, true);
    }
}

#[test]
fn fp8_kvcache_rejects_bad_inputs() {
    let (batch, cap, hk, d) = (1, 32, 2, 64);
    let q = Array4::from_elem((batch, 1, 4, d), half::bf16::from_f32(0.5));
    let call = |d: usize, ks: &[f32], vs: &[f32]| {
        let (mut k, mut v) = (Array4::<u8>::zeros((batch, cap, hk, d)), Array4::<u8>::zeros((batch, cap, hk, d)));
        let q = Array4::from_elem((batch, 1, 4, d), half::bf16::from_f32(0.5));
        let cache = HostKvCache::Contiguous { k_cache: &mut k, v_cache: &mut v, cache_batch_idx: None };
        flash_attn_with_kvcache_fp8(q.view(), cache, ks, vs, &[8], None, None, &ForwardParams::default(), None, None)
    };
    assert!(call(d, &[1.0], &[1.0]).is_ok());
    assert!(call(d, &[1.0, 2.0], &[1.0, 2.0]).is_ok());
    for (dd, ks, vs) in [(40, vec![1.0], vec![1.0]), (d, vec![1.0; 3], vec![1.0; 3]), (d, vec![1.0], vec![1.0, 1.0]), (d, vec![0.0], vec![1.0]), (d, vec![f32::NAN], vec![1.0])] {
        let e = call(dd, &ks, &vs).unwrap_err();
        assert!(matches!(e, FlashAttnError::InvalidArgument { .. }), "{e}");
    }
    // A cache too short for the new rows: the reference's checks, cache untouched.
    let (mut k, mut v) = (Array4::<u8>::from_elem((batch, cap, hk, d), 7), Array4::<u8>::from_elem((batch, cap, hk, d), 7));
    let kn = Array4::from_elem((batch, 4, hk, d), half::bf16::from_f32(1.0));
    let cache = HostKvCache::Contiguous { k_cache: &mut k, v_cache: &mut v, cache_batch_idx: None };
    let e = flash_attn_with_kvcache_fp8(q.view(), cache, &[1.0], &[1.0], &[cap as i32 - 2], Some(kn.view()), Some(kn.view()), &ForwardParams::default(), None, None);
    assert!(e.is_err());
    assert!(k.iter().chain(v.iter()).all(|&c| c == 7), "a refused call leaves the cache untouched");
}
