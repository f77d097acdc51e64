//! `reference::attention_backward_lowp`: the definition of the gradients with
//! PyTorch's fp16/bf16 roundings (the `pt` of FlashAttention-2's gradient
//! rule, which `gpu_backward.rs` bounds the 16-bit kernels with):
//!
//! * with `T = f32` every rounding is exact: it equals the f64 definition
//!   within f32 rounding, every feature drawn at random (the emulation's
//!   math — softcap's chain rule, ALiBi, windows, GQA sums, scale — is the
//!   definition's);
//! * in f16 and bf16 on the GPU sweep's shapes and features: its error
//!   against the f64 definition is of the dtype's order (bf16 > f16 > f32,
//!   each between bounds set by the dtype's unit roundoff);
//! * exact where every intermediate is representable: all scores 0 (Q or K
//!   zero, so P = 1/8 over 8 keys), small integer V, dO, Q or K, scale ½:
//!   the f16 and bf16 gradients equal the f64 ones bit for bit, GQA included;
//! * errors are the definition's (dout's shape).

mod cpu_support;
#[path = "cpu_support/infer.rs"]
mod infer;

use cpu_support::{Rng, max_abs_diff};
use flash_attn::reference::HostAlibi;
use flash_attn::reference::backward::{Grads, LowpElem, attention_backward, attention_backward_lowp};
use flash_attn::{AlibiShape, AttnElem, FlashAttnError, ForwardParams};
use half::{bf16, f16};
use infer::{dense, host_alibi};
use ndarray::Array4;
use proptest::prelude::*;

fn up<T: AttnElem>(a: &Array4<T>) -> Array4<f64> {
    a.mapv(|x| f64::from(x.to_f32()))
}

fn down<T: AttnElem>(a: &Array4<f64>) -> Array4<T> {
    a.mapv(|x| T::from_f32(x as f32))
}

/// `max |g − ref| / (1 + max |ref|)` of dq, dk, dv.
fn errs<T: AttnElem>(got: &Grads<T>, want: &Grads<f64>) -> [f64; 3] {
    let one = |g: &Array4<T>, w: &Array4<f64>| {
        let g = up(g);
        assert!(!g.iter().any(|x| x.is_nan()), "NaN");
        max_abs_diff(g.view(), w.view()) / (1.0 + w.iter().fold(0.0f64, |a, &x| a.max(x.abs())))
    };
    [one(&got.dq, &want.dq), one(&got.dk, &want.dk), one(&got.dv, &want.dv)]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    /// `T = f32`: no rounding to speak of, so the emulation is the f64
    /// definition within f32 rounding, every feature at random.
    #[test]
    fn f32_instance_is_the_definition(
        x in dense(1..=2, 0usize..=24, 0usize..=24, (1..=2, 1..=3, 1..=16)),
    ) {
        let (q, k, v, sl) = x.inputs();
        let dout = Rng::new(x.seed.wrapping_add(17)).tensor(q.dim(), 1.0);
        let (q, k, v, dout) = (down::<f32>(&q), down::<f32>(&k), down::<f32>(&v), down::<f32>(&dout));
        let (p, al) = (x.f.params(), || host_alibi(x.f.alibi, &sl));
        let want = attention_backward(up(&q).view(), up(&k).view(), up(&v).view(), up(&dout).view(), &p, al()).unwrap();
        let got = attention_backward_lowp(q.view(), k.view(), v.view(), dout.view(), &p, al()).unwrap();
        for (name, e) in ["dq", "dk", "dv"].iter().zip(errs(&got, &want)) {
            prop_assert!(e <= 2e-4, "{name}: {e:e}");
        }
    }
}

/// One case of `gpu_backward.rs`'s feature sweep: `(b, sq, sk, h, hk, d)`,
/// causal, window (5, 0 or 3), softcap 3, ALiBi per head.
fn params(causal: bool, window: bool, softcap: bool) -> ForwardParams {
    let (wl, wr) = if window { (Some(5), Some(if causal { 0 } else { 3 })) } else { (None, None) };
    ForwardParams { causal, window_left: wl, window_right: wr, softcap: softcap.then_some(3.0), ..Default::default() }
}

/// The three errors (dq, dk, dv) of the f32 definition and of the
/// emulation in f16 and bf16 against the f64 definition, inputs uniform in
/// [-1, 1) rounded to each dtype.
fn sweep_errors(i: usize, rng: &mut Rng) -> [[f64; 3]; 3] {
    let (h, hk) = [(4, 4), (4, 2), (4, 1)][i % 3];
    let j = i / 3;
    let (causal, window, softcap, alibi) = (j & 1 == 1, j & 2 == 2, j & 4 == 4, j & 8 == 8);
    let (b, sq, sk, d) = (2, 45, 77, 64);
    let x = [(b, sq, h, d), (b, sk, hk, d), (b, sk, hk, d), (b, sq, h, d)].map(|s| rng.tensor(s, 1.0));
    let slopes: Vec<f32> = (0..h).map(|i| 0.05 + 0.03 * i as f32).collect();
    let al = || alibi.then(|| HostAlibi { slopes: &slopes, shape: AlibiShape::PerHead });
    let p = params(causal, window, softcap);
    let one = |dt| -> [f64; 3] {
        match dt {
            0 => {
                let t = x.clone().map(|a| a.mapv(|v| v as f32));
                let w = x.clone().map(|a| a.mapv(|v| v as f32 as f64));
                let want = attention_backward(w[0].view(), w[1].view(), w[2].view(), w[3].view(), &p, al()).unwrap();
                let g = attention_backward(t[0].view(), t[1].view(), t[2].view(), t[3].view(), &p, al()).unwrap();
                errs(&g, &want)
            }
            1 => lowp_errors::<f16>(&x, &p, al()),
            _ => lowp_errors::<bf16>(&x, &p, al()),
        }
    };
    [one(0), one(1), one(2)]
}

/// On the GPU sweep's feature combinations (d 64, sq 45 ≠ sk 77, MHA, GQA,
/// MQA): f32 ≈ 1e-7, f16 ≈ 5e-5..4e-4, bf16 ≈ 3e-4..3e-3 of `1 + max|ref|`
/// (measured); each 16-bit error is many times the f32 one and bf16's is
/// above f16's (units roundoff 2^-24, 2^-11, 2^-8).
#[test]
fn sixteen_bit_errors_are_the_dtypes() {
    let mut rng = Rng::new(7);
    for i in 0..48 {
        let [e32, e16, ebf] = sweep_errors(i, &mut rng);
        let max = |e: [f64; 3]| e.into_iter().fold(0.0f64, f64::max);
        let min = |e: [f64; 3]| e.into_iter().fold(f64::INFINITY, f64::min);
        let what = format!("case {i}: f32 {e32:?}, f16 {e16:?}, bf16 {ebf:?}");
        assert!(max(e32) < 1e-6, "{what}");
        assert!(min(e16) > 1e-5 && max(e16) < 2e-3, "{what}");
        assert!(min(ebf) > 8e-5 && max(ebf) < 1.5e-2, "{what}");
        assert!(min(e16) > 30.0 * max(e32) && max(ebf) > 2.0 * max(e16), "{what}");
    }
}

/// Every intermediate representable in both dtypes: all scores 0 (K = 0,
/// then Q = 0), so `P = 1/8` over 8 keys; Q or K, V, dO in {-1, 0, 1}; d 4
/// (scale ½); GQA groups of 2. Then dP, D, dS, the products and the group
/// sums are exact, and f16 and bf16 give the f64 gradients bit for bit.
#[test]
fn exact_where_every_intermediate_is_representable() {
    let mut rng = Rng::new(3);
    let mut ints = |s: (usize, usize, usize, usize)| Array4::from_shape_simple_fn(s, || (rng.below(3) as f64) - 1.0);
    let (b, sq, sk, h, hk, d) = (2, 5, 8, 4, 2, 4);
    let (q, k, v, dout) = (ints((b, sq, h, d)), ints((b, sk, hk, d)), ints((b, sk, hk, d)), ints((b, sq, h, d)));
    let p = ForwardParams::default();
    for zero_q in [false, true] {
        let (q, k) = if zero_q { (q.mapv(|_| 0.0), k.clone()) } else { (q.clone(), k.mapv(|_| 0.0)) };
        let want = attention_backward(q.view(), k.view(), v.view(), dout.view(), &p, None).unwrap();
        assert!([&want.dq, &want.dk, &want.dv].iter().any(|g| g.iter().any(|&x| x != 0.0)));
        exact::<f16>(&[q.clone(), k.clone(), v.clone(), dout.clone()], &p, &want);
        exact::<bf16>(&[q, k, v.clone(), dout.clone()], &p, &want);
    }
}

fn exact<T: AttnElem + LowpElem>(x: &[Array4<f64>; 4], p: &ForwardParams, want: &Grads<f64>) {
    let t = x.clone().map(|a| down::<T>(&a));
    let got = attention_backward_lowp(t[0].view(), t[1].view(), t[2].view(), t[3].view(), p, None).unwrap();
    for (name, g, w) in [("dq", &got.dq, &want.dq), ("dk", &got.dk, &want.dk), ("dv", &got.dv, &want.dv)] {
        assert_eq!(&up(g), w, "{:?} {name}", T::DTYPE);
    }
}

/// The emulation's errors in `T` on inputs `x` rounded to `T`.
fn lowp_errors<T: AttnElem + LowpElem>(x: &[Array4<f64>; 4], p: &ForwardParams, al: Option<HostAlibi>) -> [f64; 3] {
    let t = x.clone().map(|a| down::<T>(&a));
    let want = attention_backward(up(&t[0]).view(), up(&t[1]).view(), up(&t[2]).view(), up(&t[3]).view(), p, al).unwrap();
    errs(&attention_backward_lowp(t[0].view(), t[1].view(), t[2].view(), t[3].view(), p, al).unwrap(), &want)
}

/// Typed errors: dout not shaped like q.
#[test]
fn dout_shape_is_checked() {
    let q = Array4::from_elem((1, 3, 2, 8), f16::ZERO);
    let k = Array4::from_elem((1, 4, 2, 8), f16::ZERO);
    let dout = Array4::from_elem((1, 4, 2, 8), f16::ZERO);
    let r = attention_backward_lowp(q.view(), k.view(), k.view(), dout.view(), &ForwardParams::default(), None);
    assert!(matches!(r, Err(FlashAttnError::ShapeMismatch { argument: "dout", .. })), "{r:?}");
}
