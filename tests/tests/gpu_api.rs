//! The host API on a GPU: the allocating `forward`, the ndarray API for f32,
//! f16 and bf16, typed errors that need a device (shared-memory limits,
//! unsupported element types, stats of the wrong kind), and the loaded
//! kernels' resources (no local memory).
//!
//! Without a GPU every test prints why and passes; `FA_REQUIRE_GPU=1` makes
//! that a failure.

use flash_attn::reference;
use flash_attn::{
    Backend, FlashAttnError, ForwardParams, LoopOrder, RowState, RowStats, StatsMut, Tensor, TensorLayout, TensorMut,
    default_backend, flash_attn_func, flash_attn_func_on,
};
use flash_attn_tests::{Rng, gpu, nonfinite_mismatches, rel_err};
use ndarray::{Array3, Array4};

fn random(rng: &mut Rng, s: (usize, usize, usize, usize)) -> Array4<f32> {
    Array4::from_shape_vec(s, rng.vec(s.0 * s.1 * s.2 * s.3, 1.0)).unwrap()
}

#[test]
fn gpu_forward_allocates_and_returns_stats() {
    let Some(g) = gpu("gpu_forward_allocates_and_returns_stats") else { return };
    let mut rng = Rng::fresh("gpu_forward_allocates_and_returns_stats");
    let (b, nq, nk, h, d) = (2, 100, 150, 3, 64);
    let (q, k, v) = (random(&mut rng, (b, nq, h, d)), random(&mut rng, (b, nk, h, d)), random(&mut rng, (b, nk, h, d)));
    let r = reference::standard_attention::<f64>(
        q.mapv(f64::from).view(),
        k.mapv(f64::from).view(),
        v.mapv(f64::from).view(),
        true,
        None,
    )
    .unwrap();
    let s = &g.stream;
    let (qd, kd, vd) = (
        s.clone_htod(q.as_slice().unwrap()).unwrap(),
        s.clone_htod(k.as_slice().unwrap()).unwrap(),
        s.clone_htod(v.as_slice().unwrap()).unwrap(),
    );
    for lo in [LoopOrder::Fa1, LoopOrder::Fa2, LoopOrder::Standard] {
        let p = ForwardParams { causal: true, loop_order: lo, ..Default::default() };
        let out =
            g.fa.forward(
                s,
                Tensor::new(&qd, TensorLayout::contiguous([b, nq, h, d])),
                Tensor::new(&kd, TensorLayout::contiguous([b, nk, h, d])),
                Tensor::new(&vd, TensorLayout::contiguous([b, nk, h, d])),
                &p,
            )
            .unwrap();
        assert_eq!(out.o_layout, TensorLayout::contiguous([b, nq, h, d]));
        let o = s.clone_dtoh(&out.o).unwrap();
        let lse: Vec<f32> = match &out.stats {
            RowStats::LogSumExp(lse) => {
                assert_ne!(lo, LoopOrder::Fa1);
                s.clone_dtoh(lse).unwrap()
            }
            RowStats::Fa1 { l, m } => {
                assert_eq!(lo, LoopOrder::Fa1);
                let (l, m) = (s.clone_dtoh(l).unwrap(), s.clone_dtoh(m).unwrap());
                l.into_iter().zip(m).map(|(l, m)| RowState { m, l }.lse()).collect()
            }
        };
        let e_o = rel_err(o.iter().map(|&x| x as f64), r.o.iter().copied());
        let e_l = rel_err(lse.iter().map(|&x| x as f64), r.lse.iter().copied());
        println!("{lo:?}: err(o) = {e_o:.2e}, err(lse) = {e_l:.2e}");
        assert!(e_o < 1e-4 && e_l < 1e-4, "{lo:?}: err(o) = {e_o:.2e}, err(lse) = {e_l:.2e}");
        let o64: Vec<f64> = o.iter().map(|&x| x as f64).collect();
        assert!(nonfinite_mismatches(&o64, &r.o.iter().copied().collect::<Vec<_>>()).is_empty());
    }
}

#[test]
fn gpu_ndarray_api_all_element_types() {
    let Some(g) = gpu("gpu_ndarray_api_all_element_types") else { return };
    assert!(matches!(default_backend(), Backend::Gpu(_)), "the default backend should be the GPU here");
    let mut rng = Rng::fresh("gpu_ndarray_api_all_element_types");
    let (b, nq, nk, h, d) = (2, 90, 70, 4, 32);
    let (q, k, v) = (random(&mut rng, (b, nq, h, d)), random(&mut rng, (b, nk, h, d)), random(&mut rng, (b, nk, h, d)));
    for lo in [LoopOrder::Fa1, LoopOrder::Fa2, LoopOrder::Standard] {
        let p = ForwardParams { causal: true, softmax_scale: Some(0.2), loop_order: lo, block: None, ..Default::default() };
        // f32, through the default backend and through an explicit FlashAttention.
        let r = reference::standard_attention::<f64>(
            q.mapv(f64::from).view(),
            k.mapv(f64::from).view(),
            v.mapv(f64::from).view(),
            true,
            Some(0.2),
        )
        .unwrap();
        let (o, lse) = flash_attn_func(q.view(), k.view(), v.view(), &p).unwrap();
        let (o2, _) = flash_attn_func_on(&g.fa, &g.stream, q.view(), k.view(), v.view(), &p).unwrap();
        assert_eq!(o, o2);
        let e = rel_err(o.iter().map(|&x| x as f64), r.o.iter().copied());
        let el = rel_err(lse.iter().map(|&x| x as f64), r.lse.iter().copied());
        println!("{lo:?} f32: err(o) = {e:.2e}, err(lse) = {el:.2e}");
        assert!(e < 1e-4 && el < 1e-4);
        check_lse_shape(&lse, (b, h, nq));

        // f16 and bf16: inputs rounded to the type, computed in f32, output rounded.
        macro_rules! half_case {
            ($t:ty, $tol:expr) => {{
                let (qh, kh, vh) = (q.mapv(<$t>::from_f32), k.mapv(<$t>::from_f32), v.mapv(<$t>::from_f32));
                let r = reference::standard_attention::<f64>(
                    qh.mapv(|x| x.to_f64()).view(),
                    kh.mapv(|x| x.to_f64()).view(),
                    vh.mapv(|x| x.to_f64()).view(),
                    true,
                    Some(0.2),
                )
                .unwrap();
                let (o, lse) = flash_attn_func(qh.view(), kh.view(), vh.view(), &p).unwrap();
                let e = rel_err(o.iter().map(|x| x.to_f64()), r.o.iter().copied());
                let el = rel_err(lse.iter().map(|&x| x as f64), r.lse.iter().copied());
                println!("{lo:?} {}: err(o) = {e:.2e}, err(lse) = {el:.2e}", stringify!($t));
                assert!(e < $tol && el < 1e-4, "{lo:?} {}: err(o) = {e:.2e}", stringify!($t));
            }};
        }
        half_case!(half::f16, 2e-3);
        half_case!(half::bf16, 1e-2);
    }
}

fn check_lse_shape(lse: &Array3<f32>, s: (usize, usize, usize)) {
    assert_eq!(lse.dim(), s);
}

#[test]
fn gpu_typed_errors() {
    let Some(g) = gpu("gpu_typed_errors") else { return };
    let s = &g.stream;
    let shape = [1, 8, 2, 256];
    let lay = TensorLayout::contiguous(shape);
    let n = shape.iter().product::<usize>();
    let x = s.clone_htod(&vec![0.5f32; n]).unwrap();

    // A block whose tiles do not fit the device's shared memory.
    let p = ForwardParams { block: Some((256, 256)), ..Default::default() };
    let e = g.fa.forward(s, Tensor::new(&x, lay), Tensor::new(&x, lay), Tensor::new(&x, lay), &p).unwrap_err();
    println!("{e}");
    assert!(matches!(e, FlashAttnError::BlockTooLarge { br: 256, bc: 256, headdim: 256, .. }), "{e}");

    // A buffer shorter than its layout.
    let short = s.clone_htod(&vec![0.5f32; n - 1]).unwrap();
    let e =
        g.fa.forward(s, Tensor::new(&x, lay), Tensor::new(&short, lay), Tensor::new(&x, lay), &ForwardParams::default())
            .unwrap_err();
    println!("{e}");
    assert!(matches!(e, FlashAttnError::BufferTooShort { argument: "k", .. }), "{e}");

    // f16 device buffers run on the tensor cores, but not with standard
    // attention (more 16-bit typed errors: gpu_half.rs).
    let xh = s.clone_htod(&vec![half::f16::from_f32(0.5); n]).unwrap();
    let p = ForwardParams { loop_order: LoopOrder::Standard, ..Default::default() };
    let e = g.fa.forward(s, Tensor::new(&xh, lay), Tensor::new(&xh, lay), Tensor::new(&xh, lay), &p).unwrap_err();
    println!("{e}");
    assert!(matches!(e, FlashAttnError::Unsupported { dtype: "f16", .. }), "{e}");

    // `forward_into` on x with an lse buffer of `lse_len`: the error.
    let mut o = s.clone_htod(&vec![0.0f32; n]).unwrap();
    let mut forward_into_lse = |lse_len: usize, p: &ForwardParams| -> FlashAttnError {
        let mut lse = s.clone_htod(&vec![0.0f32; lse_len]).unwrap();
        g.fa.forward_into(
            s,
            Tensor::new(&x, lay),
            Tensor::new(&x, lay),
            Tensor::new(&x, lay),
            TensorMut::new(&mut o, lay),
            StatsMut::LogSumExp(lse.as_view_mut()),
            p,
        )
        .unwrap_err()
    };

    // Row statistics of the wrong kind for the loop order.
    let e = forward_into_lse(16, &ForwardParams { loop_order: LoopOrder::Fa1, ..Default::default() });
    println!("{e}");
    assert!(matches!(e, FlashAttnError::StatsMismatch { loop_order: LoopOrder::Fa1, .. }), "{e}");

    // An lse buffer that is too short.
    let e = forward_into_lse(15, &ForwardParams::default());
    println!("{e}");
    assert!(matches!(e, FlashAttnError::StatsTooShort { argument: "lse", len: 15, required: 16 }), "{e}");
}

#[test]
fn gpu_kernels_use_no_local_memory() {
    let Some(g) = gpu("gpu_kernels_use_no_local_memory") else { return };
    println!(
        "device {} (sm_{}{}), PTX build {}, max shared memory per block {} bytes",
        g.fa.device_name(),
        g.fa.compute_capability().0,
        g.fa.compute_capability().1,
        g.fa.ptx_build().arch,
        g.fa.limits().max_smem_per_block
    );
    for &name in flash_attn::advanced::dispatch::F32_KERNELS {
        let f = g.fa.function(name).unwrap();
        let (regs, local) = (f.num_regs().unwrap(), f.local_size_bytes().unwrap());
        println!("{name}: {regs} registers, {local} bytes local memory");
        assert_eq!(local, 0, "{name} uses local memory (spills or a stack frame)");
    }
}
