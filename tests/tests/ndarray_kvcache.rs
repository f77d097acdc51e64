//! The ndarray KV-cache API (`flash_attn_with_kvcache`,
//! `flash_attn_varlen_paged_func`) against the f64 reference: on a machine
//! without a GPU (CI) its CPU path, on a GPU the device kernels for
//! f16/bf16 — the same test either way. The updated cache is compared
//! exactly; errors are typed and leave the cache untouched.

use flash_attn::reference::{self, PagedKv};
use flash_attn::{AttnElem, FlashAttnError, ForwardParams, HostKvCache, flash_attn_varlen_paged_func, flash_attn_with_kvcache};
use flash_attn_tests::Rng;
use ndarray::{Array2, Array4};

fn random<T: AttnElem>(rng: &mut Rng, shape: (usize, usize, usize, usize)) -> Array4<T> {
    Array4::from_shape_simple_fn(shape, || T::from_f32(rng.nonzero(1.0)))
}

fn f64s<T: AttnElem, D: ndarray::Dimension>(a: &ndarray::Array<T, D>) -> ndarray::Array<f64, D> {
    a.mapv(|x| x.to_f32() as f64)
}

fn tol<T: AttnElem>() -> f64 {
    if T::DTYPE == flash_attn::DType::F32 { 1e-5 } else { 2e-2 }
}

fn max_diff(a: impl IntoIterator<Item = f64>, b: impl IntoIterator<Item = f64>) -> f64 {
    a.into_iter().zip(b).map(|(x, y)| if x.is_nan() || y.is_nan() { f64::INFINITY } else if x == y { 0.0 } else { (x - y).abs() }).fold(0.0, f64::max)
}

/// A random block table: `batch` rows of `per` distinct pages out of `n`.
fn table(rng: &mut Rng, batch: usize, per: usize, n: usize) -> Array2<i32> {
    let mut perm: Vec<i32> = (0..n as i32).collect();
    for i in (1..n).rev() {
        perm.swap(i, rng.below(i + 1));
    }
    Array2::from_shape_fn((batch, per), |(b, i)| perm[b * per + i])
}

fn kvcache_case<T: AttnElem>(rng: &mut Rng, paged: Option<usize>, causal: bool) {
    let (batch, sq, s_new, h, hk, d, cap) = (3, 2, 2, 4, 2, 64, 48);
    let q = random::<T>(rng, (batch, sq, h, d));
    let (kn, vn) = (random::<T>(rng, (batch, s_new, hk, d)), random::<T>(rng, (batch, s_new, hk, d)));
    let cached = [0, 30, (cap - s_new) as i32];
    let params = ForwardParams { causal, ..Default::default() };
    let (mut kc, mut vc, tab) = match paged {
        None => (random::<T>(rng, (batch, cap, hk, d)), random::<T>(rng, (batch, cap, hk, d)), None),
        Some(p) => {
            let per = cap.div_ceil(p);
            let n = batch * per + 2;
            (random::<T>(rng, (n, p, hk, d)), random::<T>(rng, (n, p, hk, d)), Some(table(rng, batch, per, n)))
        }
    };
    // The reference in f64 on the same values.
    let (mut kr, mut vr) = (f64s(&kc), f64s(&vc));
    let (knr, vnr) = (f64s(&kn), f64s(&vn));
    let want = match &tab {
        None => reference::kvcache_attention::<f64>(f64s(&q).view(), &mut kr, &mut vr, &cached, Some(knr.view()), Some(vnr.view()), None, &params, None),
        Some(t) => {
            let pages = reference::PagedKvMut { k_pages: kr.view_mut(), v_pages: vr.view_mut(), block_table: t.view() };
            reference::paged_kvcache_attention::<f64>(f64s(&q).view(), pages, &cached, Some(knr.view()), Some(vnr.view()), &params, None)
        }
    }
    .unwrap();
    let cache = match &tab {
        None => HostKvCache::Contiguous { k_cache: &mut kc, v_cache: &mut vc, cache_batch_idx: None },
        Some(t) => HostKvCache::Paged { k_pages: &mut kc, v_pages: &mut vc, block_table: t.view() },
    };
    let (o, lse) = flash_attn_with_kvcache(q.view(), cache, &cached, Some(kn.view()), Some(vn.view()), &params, None, Some(2)).unwrap();
    let label = format!("{} paged {paged:?} causal {causal}", std::any::type_name::<T>());
    let err = max_diff(o.iter().map(|x| x.to_f32() as f64), want.o.iter().copied());
    assert!(err <= tol::<T>(), "{label}: O error {err:.3e}");
    let lerr = max_diff(lse.iter().map(|&x| x as f64), want.lse.iter().copied());
    assert!(lerr <= 1e-3, "{label}: LSE error {lerr:.3e}");
    // The cache after the append: exactly the reference's (values copied as they are).
    assert_eq!(f64s(&kc), kr, "{label}: k cache after the append");
    assert_eq!(f64s(&vc), vr, "{label}: v cache after the append");
}

#[test]
fn with_kvcache_matches_the_reference() {
    let mut rng = Rng::fresh("with_kvcache_matches_the_reference");
    for (i, paged) in [None, Some(16), Some(12)].into_iter().enumerate() {
        kvcache_case::<half::bf16>(&mut rng, paged, i % 2 == 0);
        kvcache_case::<half::f16>(&mut rng, paged, i % 2 == 1);
        kvcache_case::<f32>(&mut rng, paged, true);
    }
}

#[test]
fn varlen_paged_matches_the_reference() {
    let mut rng = Rng::fresh("varlen_paged_matches_the_reference");
    let (h, hk, d, page) = (4, 1, 32, 16);
    let (lens_q, lens_k) = ([5usize, 1, 20], [40usize, 3, 20]);
    let per = 3;
    let n = 3 * per + 1;
    let kp = random::<half::bf16>(&mut rng, (n, page, hk, d));
    let vp = random::<half::bf16>(&mut rng, (n, page, hk, d));
    let t = table(&mut rng, 3, per, n);
    let total_q: usize = lens_q.iter().sum();
    let q = random::<half::bf16>(&mut rng, (1, total_q, h, d)).index_axis_move(ndarray::Axis(0), 0);
    let prefix = |l: &[usize]| std::iter::once(0).chain(l.iter().scan(0, |a, &x| { *a += x as i32; Some(*a) })).collect::<Vec<i32>>();
    let (cu_q, cu_k) = (prefix(&lens_q), prefix(&lens_k));
    let params = ForwardParams { causal: true, window_left: Some(9), ..Default::default() };
    let (kr, vr) = (f64s(&kp), f64s(&vp));
    let pages = PagedKv { k_pages: kr.view(), v_pages: vr.view(), block_table: t.view() };
    let want = reference::attention_varlen_paged::<f64>(f64s(&q).view(), &pages, &cu_q, &cu_k, None, 20, 40, &params, None).unwrap();
    let (o, lse) = flash_attn_varlen_paged_func(q.view(), kp.view(), vp.view(), t.view(), &cu_q, &cu_k, None, (20, 40), &params, None).unwrap();
    let err = max_diff(o.iter().map(|x| x.to_f32() as f64), want.o.iter().copied());
    assert!(err <= 2e-2, "O error {err:.3e}");
    let lerr = max_diff(lse.iter().map(|&x| x as f64), want.lse.iter().copied());
    assert!(lerr <= 1e-3, "LSE error {lerr:.3e}");
}

#[test]
fn kvcache_bad_input_is_typed_and_leaves_the_cache() {
    let mut rng = Rng::fresh("kvcache_bad_input_is_typed_and_leaves_the_cache");
    let q = random::<half::f16>(&mut rng, (2, 1, 4, 32));
    let mut kc = random::<half::f16>(&mut rng, (2, 16, 2, 32));
    let mut vc = kc.clone();
    let (k0, v0) = (kc.clone(), vc.clone());
    let kn = random::<half::f16>(&mut rng, (2, 1, 2, 32));
    let p = ForwardParams::default();
    let call = |seqlens: &[i32], splits: Option<usize>, kc: &mut Array4<half::f16>, vc: &mut Array4<half::f16>| {
        let cache = HostKvCache::Contiguous { k_cache: kc, v_cache: vc, cache_batch_idx: None };
        flash_attn_with_kvcache(q.view(), cache, seqlens, Some(kn.view()), Some(kn.view()), &p, None, splits).unwrap_err()
    };
    let e = call(&[1, 2], Some(0), &mut kc, &mut vc);
    assert!(matches!(e, FlashAttnError::InvalidArgument { argument: "num_splits", .. }), "{e}");
    let e = call(&[1, 17], None, &mut kc, &mut vc);
    assert!(matches!(e, FlashAttnError::InvalidArgument { argument: "cache_seqlens", .. }), "{e}");
    let e = call(&[1, 16], None, &mut kc, &mut vc);
    assert!(matches!(e, FlashAttnError::InvalidArgument { argument: "k_new", .. }), "appending past the capacity: {e}");
    let e = call(&[1], None, &mut kc, &mut vc);
    assert!(matches!(e, FlashAttnError::InvalidArgument { argument: "cache_seqlens", .. }), "{e}");
    assert!(kc == k0 && vc == v0, "a failed call leaves the cache untouched");
    // A block-table entry out of range.
    let t = Array2::from_shape_vec((2, 1), vec![0, 5]).unwrap();
    let mut kp = random::<half::f16>(&mut rng, (2, 16, 2, 32));
    let mut vp = kp.clone();
    let cache = HostKvCache::Paged { k_pages: &mut kp, v_pages: &mut vp, block_table: t.view() };
    let e = flash_attn_with_kvcache(q.view(), cache, &[3, 3], None, None, &p, None, None).unwrap_err();
    assert!(matches!(e, FlashAttnError::InvalidArgument { argument: "block_table", .. }), "{e}");
}
