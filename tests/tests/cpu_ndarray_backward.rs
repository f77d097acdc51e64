//! The ndarray backward (`flash_attn_backward*`, `flash_attn_varlen_backward`)
//! on the CPU path (this is what runs where there is no GPU):
//!
//! * forward through `flash_attn_func` / `flash_attn_varlen_func`, backward
//!   through the ndarray API: equal to the f64 definition
//!   (`reference::attention_backward`, `varlen_attention_backward`) on the
//!   same f32 inputs, for MHA/GQA/MQA × causal × window × softcap × ALiBi ×
//!   sq ≠ sk, and in bf16 within bf16's rounding;
//! * `flash_attn_backward_cpu_ext` = `reference::fa2_backward` bit for bit
//!   (it is that function, after the device API's validation);
//! * typed errors: dout / out / softmax_lse shapes, an LSE transposed or of
//!   the varlen layout, the Standard loop order, bad prefix sums, ALiBi
//!   slopes of another shape.

mod cpu_support;

use cpu_support::{Rng, max_abs_diff};
use flash_attn::BackwardParams;
use flash_attn::reference::{self, HostAlibi};
use flash_attn::{
    AlibiShape, FlashAttnError, ForwardParams, HostVarlen, LoopOrder, flash_attn_backward, flash_attn_backward_cpu_ext,
    flash_attn_backward_ext, flash_attn_func, flash_attn_func_ext, flash_attn_varlen_backward, flash_attn_varlen_func,
};
use ndarray::{Array3, Array4, Axis, s};

fn rand4(rng: &mut Rng, shape: (usize, usize, usize, usize)) -> Array4<f32> {
    rng.tensor(shape, 1.0).mapv(|x| x as f32)
}

fn f64s<D: ndarray::Dimension>(a: &ndarray::Array<f32, D>) -> ndarray::Array<f64, D> {
    a.mapv(f64::from)
}

/// `max |got − want| ≤ tol · (1 + max |want|)`, no NaN.
fn close<D: ndarray::Dimension>(what: &str, got: &ndarray::Array<f64, D>, want: &ndarray::Array<f64, D>, tol: f64) {
    assert_eq!(got.shape(), want.shape(), "{what}: shape");
    assert!(!got.iter().any(|x| x.is_nan()), "{what}: NaN");
    let scale = 1.0 + want.iter().fold(0.0f64, |a, &x| a.max(x.abs()));
    let err = max_abs_diff(got.view(), want.view());
    assert!(err <= tol * scale, "{what}: max |Δ| = {err:e} > {tol:e} · {scale}");
}

/// One dense case: forward and backward through the ndarray API against
/// the f64 definition on the same inputs.
fn dense_case(rng: &mut Rng, (b, sq, sk, h, hk, d): (usize, usize, usize, usize, usize, usize), p: &ForwardParams, alibi: bool) {
    let (q, k, v) = (rand4(rng, (b, sq, h, d)), rand4(rng, (b, sk, hk, d)), rand4(rng, (b, sk, hk, d)));
    let dout = rand4(rng, (b, sq, h, d));
    let slopes: Vec<f32> = (0..h).map(|i| 0.1 + 0.05 * i as f32).collect();
    let al = || alibi.then(|| HostAlibi { slopes: &slopes, shape: AlibiShape::PerHead });
    let (out, lse) = flash_attn_func_ext(q.view(), k.view(), v.view(), p, al()).unwrap();
    let bp = BackwardParams { forward: *p, deterministic: false };
    let g = flash_attn_backward_ext(q.view(), k.view(), v.view(), out.view(), dout.view(), lse.view(), &bp, al()).unwrap();
    let r = reference::attention_backward::<f64>(f64s(&q).view(), f64s(&k).view(), f64s(&v).view(), f64s(&dout).view(), p, al()).unwrap();
    let what = format!("{:?} {p:?} alibi {alibi}", (b, sq, sk, h, hk, d));
    close(&format!("{what} dq"), &f64s(&g.dq), &r.dq, 1e-4);
    close(&format!("{what} dk"), &f64s(&g.dk), &r.dk, 1e-4);
    close(&format!("{what} dv"), &f64s(&g.dv), &r.dv, 1e-4);
}

#[test]
fn dense_gradients_equal_the_definition() {
    let mut rng = Rng::new(30);
    let shapes = [(2, 7, 7, 4, 4, 16), (1, 5, 9, 4, 2, 8), (2, 9, 4, 3, 1, 24), (1, 1, 6, 2, 1, 32), (1, 6, 1, 2, 2, 8)];
    for shape in shapes {
        for causal in [false, true] {
            for (wl, wr) in [(None, None), (Some(2), Some(if causal { 0 } else { 1 }))] {
                for softcap in [None, Some(5.0)] {
                    for alibi in [false, true] {
                        let p = ForwardParams { causal, window_left: wl, window_right: wr, softcap, ..Default::default() };
                        dense_case(&mut rng, shape, &p, alibi);
                    }
                }
            }
        }
    }
    // Any loop order but Standard, and a custom scale.
    let p = ForwardParams { loop_order: LoopOrder::Fa1, softmax_scale: Some(0.3), causal: true, ..Default::default() };
    dense_case(&mut rng, (1, 6, 8, 2, 1, 16), &p, false);
}

#[test]
fn cpu_path_is_the_reference_fa2_backward() {
    let mut rng = Rng::new(31);
    let (q, k, v) = (rand4(&mut rng, (2, 9, 4, 16)), rand4(&mut rng, (2, 11, 2, 16)), rand4(&mut rng, (2, 11, 2, 16)));
    let dout = rand4(&mut rng, (2, 9, 4, 16));
    let p = ForwardParams { causal: true, block: Some((4, 3)), ..Default::default() };
    let (out, lse) = flash_attn_func(q.view(), k.view(), v.view(), &p).unwrap();
    let bp = BackwardParams { forward: p, deterministic: true };
    let g = flash_attn_backward_cpu_ext(q.view(), k.view(), v.view(), out.view(), dout.view(), lse.view(), &bp, None).unwrap();
    let r = reference::fa2_backward::<f32>(q.view(), k.view(), v.view(), out.view(), dout.view(), lse.view(), &p, None, 4, 3).unwrap();
    assert_eq!((g.dq, g.dk, g.dv), (r.dq, r.dk, r.dv));
}

#[test]
fn bf16_gradients_within_rounding() {
    use half::bf16;
    let mut rng = Rng::new(32);
    let (q, k, v) = (rand4(&mut rng, (1, 8, 4, 32)), rand4(&mut rng, (1, 10, 2, 32)), rand4(&mut rng, (1, 10, 2, 32)));
    let dout = rand4(&mut rng, (1, 8, 4, 32));
    let h = |a: &Array4<f32>| a.mapv(bf16::from_f32);
    let (qh, kh, vh, doh) = (h(&q), h(&k), h(&v), h(&dout));
    let p = ForwardParams { causal: true, ..Default::default() };
    let (out, lse) = flash_attn_func(qh.view(), kh.view(), vh.view(), &p).unwrap();
    let bp = BackwardParams { forward: p, deterministic: false };
    let g = flash_attn_backward(qh.view(), kh.view(), vh.view(), out.view(), doh.view(), lse.view(), &bp).unwrap();
    let up = |a: &Array4<bf16>| a.mapv(|x| f64::from(x.to_f32()));
    let r = reference::attention_backward::<f64>(up(&qh).view(), up(&kh).view(), up(&vh).view(), up(&doh).view(), &p, None).unwrap();
    close("bf16 dq", &up(&g.dq), &r.dq, 2e-2);
    close("bf16 dk", &up(&g.dk), &r.dk, 2e-2);
    close("bf16 dv", &up(&g.dv), &r.dv, 2e-2);
}

fn prefix(lens: &[usize]) -> Vec<i32> {
    std::iter::once(0).chain(lens.iter().scan(0, |a, &l| {
        *a += l as i32;
        Some(*a)
    })).collect()
}

#[test]
fn varlen_gradients_equal_each_sequence_alone() {
    let mut rng = Rng::new(33);
    let (lq, lk) = ([3usize, 1, 6], [5usize, 4, 2]);
    let (cq, ck) = (prefix(&lq), prefix(&lk));
    let (tq, tk, h, hk, d) = (10, 11, 4, 2, 16);
    let r3 = |rng: &mut Rng, t, n| rand4(rng, (1, t, n, d)).index_axis_move(Axis(0), 0);
    let (q, k, v, dout) = (r3(&mut rng, tq, h), r3(&mut rng, tk, hk), r3(&mut rng, tk, hk), r3(&mut rng, tq, h));
    for causal in [false, true] {
        let p = ForwardParams { causal, softcap: Some(4.0), ..Default::default() };
        let max = (6, 5);
        let (out, lse) = flash_attn_varlen_func(q.view(), k.view(), v.view(), &cq, &ck, None, max, &p, None).unwrap();
        let vl = HostVarlen { cu_seqlens_q: &cq, cu_seqlens_k: &ck, seqused_k: None, max_seqlen: max };
        let bp = BackwardParams { forward: p, deterministic: false };
        let g = flash_attn_varlen_backward(q.view(), k.view(), v.view(), out.view(), dout.view(), lse.view(), &vl, &bp, None).unwrap();
        for bi in 0..3 {
            let (rq, rk) = (cq[bi] as usize..cq[bi + 1] as usize, ck[bi] as usize..ck[bi + 1] as usize);
            let one = |a: &Array3<f32>, r: std::ops::Range<usize>| f64s(&a.slice(s![r, .., ..]).to_owned()).insert_axis(Axis(0));
            let want = reference::attention_backward::<f64>(
                one(&q, rq.clone()).view(),
                one(&k, rk.clone()).view(),
                one(&v, rk.clone()).view(),
                one(&dout, rq.clone()).view(),
                &p,
                None,
            )
            .unwrap();
            let what = format!("causal {causal} sequence {bi}");
            close(&format!("{what} dq"), &one(&g.dq, rq.clone()), &want.dq, 1e-4);
            close(&format!("{what} dk"), &one(&g.dk, rk.clone()), &want.dk, 1e-4);
            close(&format!("{what} dv"), &one(&g.dv, rk), &want.dv, 1e-4);
        }
    }
}

#[test]
fn errors_are_typed() {
    let z = |s| Array4::<f32>::zeros(s);
    let (q, k) = (z((2, 5, 4, 8)), z((2, 6, 2, 8)));
    let lse = Array3::<f32>::zeros((2, 4, 5));
    let bp = BackwardParams::default();
    let call = |out: &Array4<f32>, dout: &Array4<f32>, lse: &Array3<f32>, bp: &BackwardParams| {
        flash_attn_backward_cpu_ext(q.view(), k.view(), k.view(), out.view(), dout.view(), lse.view(), bp, None).unwrap_err()
    };
    let e = call(&q, &z((2, 5, 4, 16)), &lse, &bp);
    assert!(matches!(e, FlashAttnError::ShapeMismatch { argument: "dout", axis: "headdim", .. }), "{e}");
    let e = call(&z((2, 4, 4, 8)), &q, &lse, &bp);
    assert!(matches!(e, FlashAttnError::ShapeMismatch { argument: "out", axis: "seqlen", .. }), "{e}");
    // The LSE of another layout ((batch, seqlen_q, nheads)) or call.
    let e = call(&q, &q, &Array3::zeros((2, 5, 4)), &bp);
    assert!(matches!(e, FlashAttnError::ShapeMismatch { argument: "softmax_lse", axis: "nheads", actual: 5, expected: 4, .. }), "{e}");
    let e = call(&q, &q, &Array3::zeros((1, 4, 5)), &bp);
    assert!(matches!(e, FlashAttnError::ShapeMismatch { argument: "softmax_lse", axis: "batch", .. }), "{e}");
    let std = BackwardParams { forward: ForwardParams { loop_order: LoopOrder::Standard, ..Default::default() }, deterministic: false };
    let e = call(&q, &q, &lse, &std);
    assert!(matches!(e, FlashAttnError::InvalidArgument { argument: "params.loop_order", .. }), "{e}");
    let slopes = [0.5f32; 3];
    let al = Some(HostAlibi { slopes: &slopes, shape: AlibiShape::PerHead });
    let e = flash_attn_backward_ext(q.view(), k.view(), k.view(), q.view(), q.view(), lse.view(), &bp, al).unwrap_err();
    assert!(matches!(e, FlashAttnError::InvalidArgument { argument: "alibi_slopes", .. }), "{e}");

    // Varlen: q (7, 4, 8), k (6, 2, 8), two sequences.
    let z3 = |t, n| Array3::<f32>::zeros((t, n, 8));
    let (q3, k3) = (z3(7, 4), z3(6, 2));
    let (cq, ck) = ([0, 3, 7], [0, 2, 6]);
    let vl = HostVarlen { cu_seqlens_q: &cq, cu_seqlens_k: &ck, seqused_k: None, max_seqlen: (4, 4) };
    let vcall = |dout: &Array3<f32>, lse: ndarray::ArrayView2<'_, f32>, vl: &HostVarlen<'_>, bp: &BackwardParams| {
        flash_attn_varlen_backward(q3.view(), k3.view(), k3.view(), q3.view(), dout.view(), lse, vl, bp, None).unwrap_err()
    };
    let lse2 = ndarray::Array2::<f32>::zeros((4, 7));
    let e = vcall(&z3(6, 4), lse2.view(), &vl, &bp);
    assert!(matches!(e, FlashAttnError::ShapeMismatch { argument: "dout", .. }), "{e}");
    let e = vcall(&q3, ndarray::Array2::zeros((7, 4)).view(), &vl, &bp);
    assert!(matches!(e, FlashAttnError::ShapeMismatch { argument: "softmax_lse", axis: "nheads", .. }), "{e}");
    let bad = [0, 5, 3];
    let e = vcall(&q3, lse2.view(), &HostVarlen { cu_seqlens_q: &bad, ..vl }, &bp);
    assert!(matches!(e, FlashAttnError::InvalidArgument { argument: "cu_seqlens_q", .. }), "{e}");
    let short = [0, 6];
    let e = vcall(&q3, lse2.view(), &HostVarlen { cu_seqlens_k: &short, ..vl }, &bp);
    assert!(matches!(e, FlashAttnError::InvalidArgument { argument: "cu_seqlens_k", .. }), "{e}");
    let fa1 = BackwardParams { forward: ForwardParams { loop_order: LoopOrder::Fa1, ..Default::default() }, deterministic: false };
    let e = vcall(&q3, lse2.view(), &vl, &fa1);
    assert!(matches!(e, FlashAttnError::InvalidArgument { argument: "params.loop_order", .. }), "{e}");
}
