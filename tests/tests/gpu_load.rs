//! Kernels load on first use: `FlashAttention::new` loads none, the first
//! forward call loads (JIT-compiles) only the kernel it runs, a second
//! `FlashAttention` on the same context works beside the first, and the
//! time of each step is printed (run with `CUDA_CACHE_DISABLE=1` for the
//! fresh-machine cost; `fa-first-call` measures it per kernel family).
//!
//! Without a GPU the test prints why and passes; `FA_REQUIRE_GPU=1` makes
//! that a failure.

use std::time::Instant;

use flash_attn::advanced::dispatch::F32_KERNELS;
use flash_attn::{FlashAttention, ForwardParams, LoopOrder, flash_attn_func_on, reference};
use flash_attn_tests::{Rng, gpu, rel_err};
use ndarray::Array4;

fn random(rng: &mut Rng, s: (usize, usize, usize, usize)) -> Array4<f32> {
    Array4::from_shape_vec(s, rng.vec(s.0 * s.1 * s.2 * s.3, 1.0)).unwrap()
}

#[test]
fn gpu_kernels_load_on_first_use() {
    let Some(g) = gpu("gpu_kernels_load_on_first_use") else { return };
    let mut rng = Rng::fresh("gpu_kernels_load_on_first_use");
    let (b, n, h, d) = (1, 200, 2, 64);
    let (q, k, v) = (random(&mut rng, (b, n, h, d)), random(&mut rng, (b, n, h, d)), random(&mut rng, (b, n, h, d)));
    let r = reference::standard_attention::<f64>(
        q.mapv(f64::from).view(),
        k.mapv(f64::from).view(),
        v.mapv(f64::from).view(),
        true,
        None,
    )
    .unwrap();
    let p = ForwardParams { causal: true, loop_order: LoopOrder::Fa2, ..Default::default() };

    let t = Instant::now();
    let fa = FlashAttention::new(&g.ctx).unwrap();
    let t_new = t.elapsed().as_secs_f64();
    assert_eq!(fa.loaded_kernels(), 0, "FlashAttention::new loads no kernel");
    // "Is it compiled in" answers from the index, loading nothing.
    assert!(F32_KERNELS.iter().all(|name| fa.has_kernel(name)));
    assert!(!fa.has_kernel("no_such_kernel") && fa.function("no_such_kernel").is_none());
    assert!(matches!(fa.kernel("no_such_kernel"), Ok(None)));
    assert_eq!(fa.loaded_kernels(), 0);

    let t = Instant::now();
    let (o, _) = flash_attn_func_on(&fa, &g.stream, q.view(), k.view(), v.view(), &p).unwrap();
    let t_first = t.elapsed().as_secs_f64();
    let loaded = fa.loaded_kernels();
    assert!(fa.function("fa2_forward_f32").is_some());
    assert_eq!(fa.loaded_kernels(), loaded, "the kernel the call ran was loaded by the call");
    assert!((1..=3).contains(&loaded), "one f32 FA2 call loaded {loaded} kernels");
    let err = rel_err(o.iter().map(|&x| f64::from(x)), r.o.iter().copied());
    assert!(err < 1e-4, "first call: rel err {err:.2e}");

    let t = Instant::now();
    let (o2, _) = flash_attn_func_on(&fa, &g.stream, q.view(), k.view(), v.view(), &p).unwrap();
    let t_second = t.elapsed().as_secs_f64();
    assert_eq!(o, o2, "the same call twice on one FlashAttention");
    assert_eq!(fa.loaded_kernels(), loaded, "the second call loads nothing");

    // A second FlashAttention on the same context, beside the first.
    let t = Instant::now();
    let fa2 = FlashAttention::new(&g.ctx).unwrap();
    let (o3, _) = flash_attn_func_on(&fa2, &g.stream, q.view(), k.view(), v.view(), &p).unwrap();
    let t_again = t.elapsed().as_secs_f64();
    assert_eq!(o, o3, "a second FlashAttention on the same context");
    assert_eq!(fa2.loaded_kernels(), loaded);
    drop(fa2);
    let (o4, _) = flash_attn_func_on(&fa, &g.stream, q.view(), k.view(), v.view(), &p).unwrap();
    assert_eq!(o, o4, "the first FlashAttention after the second is dropped");

    println!(
        "gpu_load ({}, {} PTX, CUDA_CACHE_DISABLE={}): FlashAttention::new {t_new:.3} s; first f32 FA2 call {t_first:.3} s \
         ({loaded} kernel(s) loaded); second call {t_second:.4} s; second FlashAttention + call {t_again:.3} s",
        fa.device_name(),
        fa.ptx_build().arch,
        std::env::var("CUDA_CACHE_DISABLE").unwrap_or_default()
    );
}
