//! The backward pass on the GPU through the ndarray API
//! (`flash_attn_backward_on_ext`, `flash_attn_varlen_backward`), against the
//! f64 definition (`reference::attention_backward`) on the inputs as the
//! kernels see them (rounded to the dtype), by FlashAttention-2's rule
//! (tests/test_flash_attn.py) in every dtype:
//!
//! `max|g − g_ref| ≤ 2 · max|g_pt − g_ref| + ε` for dq, dk, dv, with `ref` the
//! f64 definition and `pt` standard attention computed the way PyTorch does
//! in the dtype:
//!
//! * f32: `reference::attention_backward::<f32>` (the same math in f32);
//! * f16/bf16: `reference::attention_backward_lowp::<T>`, which rounds S, P,
//!   dP, dS, the softcap steps, dQ, dK, dV and the GQA group sums to the dtype
//!   where PyTorch's fp16/bf16 autograd does (products accumulate in f32;
//!   the list is on that function) — FA2's `attention_ref(upcast=False,
//!   reorder_ops=True)`. The 16-bit kernels round only P and dS (to feed
//!   the tensor cores) and their outputs, so their error is about pt's: a
//!   throwaway CPU emulation of those roundings (f32 S, rounded P and dS,
//!   D from the rounded O) came to at most 0.63 of the bound on this sweep.
//!
//! `ε = 1e-5` (BACKWARD.md's statement of FA2's rule, the f32 bound before):
//! where pt is exact the kernels still differ by f32 summation order. With
//! one visible key per row (sk = 1) P = 1 and dS = P(dP − D) is exactly 0
//! in pt and in the reference, while a kernel's dP (a tensor-core product)
//! and D (rowsum(dO ∘ O) from the stored O) are two f32 sums of about d
//! terms of size ≤ 1 in different orders: by estimate |dS| ≲ 3e-6 at d 256,
//! dk ≲ 2e-6 after the sum over rows and the scale. Against pt's own errors
//! ε is small: the smallest 2·err_pt measured on the CPU over this sweep is
//! 5e-5 (f16) and 3.3e-4 (bf16). The largest `err / (2·err_pt + ε)` seen per
//! dtype is printed (≤ 1 passes), with `err / (1 + max|ref|)`. The CPU side
//! (f64 reference and pt) takes about 1.5 s per 16-bit sweep (test profile).
//!
//! Cases:
//!
//! * the sweep: dtype × MHA/GQA/MQA × causal × window × softcap × ALiBi
//!   (all 48 combinations at d = 64 and sq ≠ sk), × every head dim the
//!   backward takes (8..=256 step 8: softcap/ALiBi above 128 run the f32
//!   kernels, as the ndarray API converts; 136..=256 without them the
//!   Hopper kernel's d 256 build on an H100/H200) with the
//!   features and (sq, sk) pairs (1-row sequences, sq ≠ sk both ways) cycled;
//! * several key and query blocks (sequences of 200..520) for the 16-bit
//!   kernels, causal, GQA, a window; the same with softcap and ALiBi (alone
//!   and together) at d 64, 128 and two padded head dims; at d 256 (the
//!   Hopper d 256 kernel: 64 keys × 64 queries per step) causal GQA, MQA
//!   with a window, sq ≠ sk both ways, d 200 and d 136 (columns past the
//!   head dim: the last 64-column panel partly, wholly);
//! * varlen = each sequence alone (the reference's per-sequence definition,
//!   pt per sequence), f32, f16, bf16, with and without softcap and ALiBi
//!   (bf16 also at d 256);
//! * deterministic mode: the same bits over 10 runs (f32 and bf16, several
//!   key blocks, GQA; f16 d 64 and bf16 d 128 with softcap and ALiBi; bf16
//!   at d 256).
//!
//! Without a GPU every test prints why and passes; `FA_REQUIRE_GPU=1` makes
//! that a failure.

use flash_attn::BackwardParams;
use flash_attn::reference::{self, HostAlibi};
use flash_attn::{
    AlibiShape, AttnElem, DType, ForwardParams, HostVarlen, flash_attn_backward_on_ext, flash_attn_func_on_ext,
    flash_attn_varlen_backward, flash_attn_varlen_func,
};
use flash_attn_tests::{Gpu, Rng, gpu};
use half::{bf16, f16};
use ndarray::{Array, Array4, Axis, Dimension, s};

/// One problem: shape `(b, sq, sk, h, hk, d)` and features.
#[derive(Clone, Copy, Debug)]
struct Case {
    shape: (usize, usize, usize, usize, usize, usize),
    causal: bool,
    window: bool,
    softcap: bool,
    alibi: bool,
}

impl Case {
    fn params(&self) -> ForwardParams {
        let (wl, wr) = if self.window { (Some(5), Some(if self.causal { 0 } else { 3 })) } else { (None, None) };
        ForwardParams { causal: self.causal, window_left: wl, window_right: wr, softcap: self.softcap.then_some(3.0), ..Default::default() }
    }
}

fn max_abs(a: &Array4<f64>) -> f64 {
    a.iter().fold(0.0f64, |m, &x| m.max(x.abs()))
}

fn max_diff<D: Dimension>(a: &Array<f64, D>, b: &Array<f64, D>) -> f64 {
    a.iter().zip(b).fold(0.0f64, |m, (&x, &y)| if x.is_nan() { f64::INFINITY } else { m.max((x - y).abs()) })
}

/// FA2's additive term (see the module docs).
const EPS: f64 = 1e-5;

/// The largest `err / (2·err_pt + ε)` (the rule's ratio: ≤ 1 passes) and
/// `err / (1 + max|ref|)` of a set of checks.
#[derive(Clone, Copy, Debug, Default)]
struct Worst {
    ratio: f64,
    rel: f64,
}

impl Worst {
    fn max(self, o: Worst) -> Worst {
        Worst { ratio: self.ratio.max(o.ratio), rel: self.rel.max(o.rel) }
    }
}

/// FA2's rule for one gradient: `max|g − ref| ≤ 2·max|pt − ref| + ε`.
fn check(what: &str, got: &Array4<f64>, want: &Array4<f64>, pt: &Array4<f64>) -> Worst {
    let err = max_diff(got, want);
    let bound = 2.0 * max_diff(pt, want) + EPS;
    assert!(err <= bound, "{what}: max |g − ref| = {err:e} > 2·max |pt − ref| + {EPS:e} = {bound:e}");
    Worst { ratio: err / bound, rel: err / (1.0 + max_abs(want)) }
}

/// `pt` of FA2's rule: standard attention's gradients computed in `T` on
/// the CPU (f32: the definition in f32; f16/bf16: PyTorch's roundings).
fn pt_grads<T: AttnElem>(
    (q, k, v, dout): (&Array4<T>, &Array4<T>, &Array4<T>, &Array4<T>),
    p: &ForwardParams,
    al: Option<HostAlibi>,
) -> [Array4<f64>; 3] {
    if T::DTYPE == DType::F32 {
        let f = |a: &Array4<T>| a.mapv(|x| x.to_f32());
        let g = reference::attention_backward::<f32>(f(q).view(), f(k).view(), f(v).view(), f(dout).view(), p, al).unwrap();
        [g.dq, g.dk, g.dv].map(|x| x.mapv(f64::from))
    } else {
        // The reference's own element type (it imports no GPU-side trait):
        // the same 16-bit values, converted exactly.
        fn lowp<L: reference::LowpElem + AttnElem, T: AttnElem>(
            (q, k, v, dout): (&Array4<T>, &Array4<T>, &Array4<T>, &Array4<T>),
            p: &ForwardParams,
            al: Option<HostAlibi>,
        ) -> [Array4<f64>; 3] {
            let c = |a: &Array4<T>| a.mapv(|x| L::from_f32(x.to_f32()));
            let g = reference::attention_backward_lowp::<L>(c(q).view(), c(k).view(), c(v).view(), c(dout).view(), p, al).unwrap();
            [g.dq, g.dk, g.dv].map(|x| up(&x))
        }
        if T::DTYPE == DType::F16 { lowp::<half::f16, T>((q, k, v, dout), p, al) } else { lowp::<half::bf16, T>((q, k, v, dout), p, al) }
    }
}

fn up<T: AttnElem>(a: &Array4<T>) -> Array4<f64> {
    a.mapv(|x| f64::from(x.to_f32()))
}

/// Runs one case in `T` on the GPU (forward then backward) and checks it.
fn run_case<T: AttnElem>(g: &Gpu, rng: &mut Rng, c: &Case) -> Worst {
    let (b, sq, sk, h, hk, d) = c.shape;
    let t = |rng: &mut Rng, s| rng.tensor(s, 1.0).mapv(|x| T::from_f32(x as f32));
    let (q, k, v, dout) = (t(rng, (b, sq, h, d)), t(rng, (b, sk, hk, d)), t(rng, (b, sk, hk, d)), t(rng, (b, sq, h, d)));
    let slopes: Vec<f32> = (0..h).map(|i| 0.05 + 0.03 * i as f32).collect();
    let al = || c.alibi.then(|| HostAlibi { slopes: &slopes, shape: AlibiShape::PerHead });
    let p = c.params();
    let (out, lse) = flash_attn_func_on_ext(&g.fa, &g.stream, q.view(), k.view(), v.view(), &p, al()).unwrap();
    let bp = BackwardParams { forward: p, deterministic: false };
    let gr = flash_attn_backward_on_ext(&g.fa, &g.stream, q.view(), k.view(), v.view(), out.view(), dout.view(), lse.view(), &bp, al())
        .unwrap_or_else(|e| panic!("{c:?} {:?}: {e}", T::DTYPE));
    let r = reference::attention_backward::<f64>(up(&q).view(), up(&k).view(), up(&v).view(), up(&dout).view(), &p, al()).unwrap();
    let pt = pt_grads((&q, &k, &v, &dout), &p, al());
    let what = format!("{:?} {c:?}", T::DTYPE);
    let mut worst = Worst::default();
    for (i, (name, got, want)) in [("dq", &gr.dq, &r.dq), ("dk", &gr.dk, &r.dk), ("dv", &gr.dv, &r.dv)].into_iter().enumerate() {
        worst = worst.max(check(&format!("{what} {name}"), &up(got), want, &pt[i]));
    }
    worst
}

const HEADS: [(usize, usize); 3] = [(4, 4), (4, 2), (4, 1)];
const PAIRS: [(usize, usize); 6] = [(1, 1), (1, 37), (37, 1), (63, 129), (128, 65), (70, 70)];

fn cases(d: usize, i: usize) -> Case {
    let (h, hk) = HEADS[i % 3];
    let (sq, sk) = PAIRS[i % PAIRS.len()];
    Case { shape: (2, sq, sk, h, hk, d), causal: i & 1 == 1, window: i & 2 == 2, softcap: i & 4 == 4, alibi: i & 8 == 8 }
}

fn sweep<T: AttnElem>(test: &str) {
    let Some(g) = gpu(test) else { return };
    let mut rng = Rng::fresh(test);
    let mut worst = Worst::default();
    // Every feature combination at d = 64, sq ≠ sk.
    for i in 0..48 {
        let (h, hk) = HEADS[i % 3];
        let j = i / 3;
        let c = Case { shape: (2, 45, 77, h, hk, 64), causal: j & 1 == 1, window: j & 2 == 2, softcap: j & 4 == 4, alibi: j & 8 == 8 };
        worst = worst.max(run_case::<T>(g, &mut rng, &c));
    }
    // Every head dim, the features and shapes cycled.
    for (i, d) in (8..=256).step_by(8).enumerate() {
        worst = worst.max(run_case::<T>(g, &mut rng, &cases(d, i * 7 + 1)));
    }
    // Several key and query blocks of the 16-bit kernels (Hopper: 128 keys
    // × 64 queries per step): long tails both ways, causal, GQA, window.
    if T::DTYPE != DType::F32 {
        for (i, &(sq, sk, d)) in [(300, 520, 128), (520, 300, 64), (257, 257, 128), (200, 391, 96)].iter().enumerate() {
            let c = Case { shape: (2, sq, sk, 4, if i % 2 == 0 { 2 } else { 4 }, d), causal: i != 1, window: i == 3, softcap: false, alibi: false };
            worst = worst.max(run_case::<T>(g, &mut rng, &c));
        }
        // d 256 (Hopper: 64 keys × 64 queries per step, the head dim split
        // between the consumers): causal GQA over several blocks both ways,
        // MQA with a window, no mask with sq ≠ sk (rows past the sequence in
        // the last Q block), d 200 and d 136 (its last 64-column panel
        // partly, wholly past the head dim).
        let d256 = [
            ((2, 300, 520, 4, 2, 256), true, false),
            ((1, 520, 300, 4, 1, 256), false, true),
            ((2, 131, 77, 2, 2, 256), false, false),
            ((1, 190, 257, 4, 2, 200), true, false),
            ((2, 257, 190, 4, 2, 136), false, false),
        ];
        for (shape, causal, window) in d256 {
            worst = worst.max(run_case::<T>(g, &mut rng, &Case { shape, causal, window, softcap: false, alibi: false }));
        }
        // The same with softcap and ALiBi (Hopper: `flash_bwd_hopper_x_*`,
        // 128 keys × 64 queries per step at d 64 and d 128): causal and
        // not, GQA and MHA, each modifier alone and both, a window.
        let mods = [
            (300, 520, 128, 2, true, false, true, false),
            (520, 300, 128, 4, false, false, true, true),
            (257, 391, 128, 1, true, true, false, true),
            (520, 300, 64, 4, false, false, true, true),
            (300, 520, 64, 2, true, false, false, true),
            (257, 257, 64, 1, true, false, true, false),
            (200, 391, 96, 2, true, true, true, true),
            (391, 200, 40, 4, false, false, true, true),
        ];
        for (sq, sk, d, hk, causal, window, softcap, alibi) in mods {
            let c = Case { shape: (2, sq, sk, 4, hk, d), causal, window, softcap, alibi };
            worst = worst.max(run_case::<T>(g, &mut rng, &c));
        }
    }
    println!(
        "{test}: largest max|g − ref| / (2·max|pt − ref| + {EPS:e}) = {:.3} (≤ 1 passes), largest max|g − ref| / (1 + max|ref|) = {:.3e}",
        worst.ratio, worst.rel
    );
}

#[test]
fn f32_gradients_follow_fa2s_rule() {
    sweep::<f32>("f32_gradients_follow_fa2s_rule");
}

#[test]
fn f16_gradients_follow_fa2s_rule() {
    sweep::<f16>("f16_gradients_follow_fa2s_rule");
}

#[test]
fn bf16_gradients_follow_fa2s_rule() {
    sweep::<bf16>("bf16_gradients_follow_fa2s_rule");
}

/// Varlen: each sequence's gradients = the reference's per-sequence
/// definition by FA2's rule (pt: that sequence alone through the dense
/// `pt_grads`; empty and 1-row sequences included), f32, f16 and bf16, with
/// and without softcap and ALiBi (on Hopper, the wgmma kernels, `_x_` with
/// either; sequences over several of their 64/128-row blocks).
#[test]
fn varlen_is_each_sequence_alone() {
    let Some(_) = gpu("varlen_is_each_sequence_alone") else { return };
    let mut rng = Rng::fresh("varlen_is_each_sequence_alone");
    varlen_case::<f32>(&mut rng, Some(4.0), false, 64);
    varlen_case::<bf16>(&mut rng, Some(4.0), false, 64);
    varlen_case::<bf16>(&mut rng, None, false, 64);
    varlen_case::<f16>(&mut rng, None, false, 128);
    varlen_case::<f16>(&mut rng, Some(4.0), true, 64);
    varlen_case::<bf16>(&mut rng, Some(4.0), true, 128);
    varlen_case::<f16>(&mut rng, None, true, 128);
    varlen_case::<bf16>(&mut rng, None, false, 256);
}

fn varlen_case<T: AttnElem>(rng: &mut Rng, softcap: Option<f32>, alibi: bool, d: usize) {
    let (lq, lk) = ([1usize, 40, 0, 77, 5, 300], [9usize, 33, 4, 130, 1, 260]);
    let cum = |l: &[usize]| std::iter::once(0).chain(l.iter().scan(0i32, |a, &x| {
        *a += x as i32;
        Some(*a)
    })).collect::<Vec<i32>>();
    let (cq, ck) = (cum(&lq), cum(&lk));
    let (tq, tk, h, hk) = (*cq.last().unwrap() as usize, *ck.last().unwrap() as usize, 4, 2);
    let t = |rng: &mut Rng, n, hh| rng.tensor((1, n, hh, d), 1.0).index_axis_move(Axis(0), 0).mapv(|x| T::from_f32(x as f32));
    let (q, k, v, dout) = (t(rng, tq, h), t(rng, tk, hk), t(rng, tk, hk), t(rng, tq, h));
    let slopes: Vec<f32> = (0..h).map(|i| 0.05 + 0.03 * i as f32).collect();
    let al = || alibi.then(|| HostAlibi { slopes: &slopes, shape: AlibiShape::PerHead });
    for causal in [false, true] {
        let p = ForwardParams { causal, softcap, ..Default::default() };
        let max = (300, 260);
        let (out, lse) = flash_attn_varlen_func(q.view(), k.view(), v.view(), &cq, &ck, None, max, &p, al()).unwrap();
        let vl = HostVarlen { cu_seqlens_q: &cq, cu_seqlens_k: &ck, seqused_k: None, max_seqlen: max };
        let bp = BackwardParams { forward: p, deterministic: false };
        let g = flash_attn_varlen_backward(q.view(), k.view(), v.view(), out.view(), dout.view(), lse.view(), &vl, &bp, al()).unwrap();
        let u = |a: &ndarray::Array3<T>| a.mapv(|x| f64::from(x.to_f32()));
        let r = reference::varlen_attention_backward::<f64>(u(&q).view(), u(&k).view(), u(&v).view(), u(&dout).view(), &cq, &ck, None, max.0, max.1, &p, al()).unwrap();
        for (b, (&nq, &nk)) in lq.iter().zip(&lk).enumerate() {
            let (rq, rk) = (cq[b] as usize..cq[b] as usize + nq, ck[b] as usize..ck[b] as usize + nk);
            let one = |a: &ndarray::Array3<f64>, r: std::ops::Range<usize>| a.slice(s![r, .., ..]).to_owned().insert_axis(Axis(0));
            let what = format!("varlen {:?} d {d} softcap {softcap:?} alibi {alibi} causal {causal} sequence {b}", T::DTYPE);
            // pt of this sequence alone (dense, batch 1).
            let seq = |a: &ndarray::Array3<T>, r: std::ops::Range<usize>| a.slice(s![r, .., ..]).to_owned().insert_axis(Axis(0));
            let x = [seq(&q, rq.clone()), seq(&k, rk.clone()), seq(&v, rk.clone()), seq(&dout, rq.clone())];
            let pt = pt_grads((&x[0], &x[1], &x[2], &x[3]), &p, al());
            for (i, (name, got, want, r)) in [("dq", &g.dq, &r.dq, rq.clone()), ("dk", &g.dk, &r.dk, rk.clone()), ("dv", &g.dv, &r.dv, rk)].into_iter().enumerate() {
                check(&format!("{what} {name}"), &one(&u(got), r.clone()), &one(want, r), &pt[i]);
            }
        }
    }
}

/// Deterministic mode: 10 runs, the same bits (dq through ordered
/// accumulation; dk, dv have no atomics); with softcap and ALiBi too (on
/// Hopper the `_x_` kernels, whose d 64 build adds two dQ blocks per step).
#[test]
fn deterministic_mode_is_bit_identical() {
    let Some(g) = gpu("deterministic_mode_is_bit_identical") else { return };
    let mut rng = Rng::fresh("deterministic_mode_is_bit_identical");
    repeat_bits::<f32>(g, &mut rng, 64, false);
    repeat_bits::<bf16>(g, &mut rng, 64, false);
    repeat_bits::<f16>(g, &mut rng, 64, true);
    repeat_bits::<bf16>(g, &mut rng, 128, true);
    repeat_bits::<bf16>(g, &mut rng, 256, false);
}

fn repeat_bits<T: AttnElem>(g: &Gpu, rng: &mut Rng, d: usize, mods: bool) {
    let (b, sq, sk, h, hk) = (2, 257, 300, 8, 2);
    let t = |rng: &mut Rng, s| rng.tensor(s, 1.0).mapv(|x| T::from_f32(x as f32));
    let (q, k, v, dout) = (t(rng, (b, sq, h, d)), t(rng, (b, sk, hk, d)), t(rng, (b, sk, hk, d)), t(rng, (b, sq, h, d)));
    let slopes: Vec<f32> = (0..h).map(|i| 0.05 + 0.03 * i as f32).collect();
    let al = || mods.then(|| HostAlibi { slopes: &slopes, shape: AlibiShape::PerHead });
    let p = ForwardParams { causal: true, softcap: mods.then_some(3.0), ..Default::default() };
    let (out, lse) = flash_attn_func_on_ext(&g.fa, &g.stream, q.view(), k.view(), v.view(), &p, al()).unwrap();
    let bp = BackwardParams { forward: p, deterministic: true };
    let bits = |a: &Array4<T>| a.iter().map(|x| x.to_f32().to_bits()).collect::<Vec<u32>>();
    let mut first = None;
    for run in 0..10 {
        let gr = flash_attn_backward_on_ext(&g.fa, &g.stream, q.view(), k.view(), v.view(), out.view(), dout.view(), lse.view(), &bp, al()).unwrap();
        let now = [bits(&gr.dq), bits(&gr.dk), bits(&gr.dv)];
        match &first {
            None => {
                // The ordered sums are the same sums: against the free-running
                // mode, within the last bits of T.
                let free = BackwardParams { forward: p, deterministic: false };
                let gf = flash_attn_backward_on_ext(&g.fa, &g.stream, q.view(), k.view(), v.view(), out.view(), dout.view(), lse.view(), &free, al()).unwrap();
                for (name, a, b) in [("dq", &gr.dq, &gf.dq), ("dk", &gr.dk, &gf.dk), ("dv", &gr.dv, &gf.dv)] {
                    let (a, b) = (up(a), up(b));
                    let tol = if T::DTYPE == DType::F32 { 1e-5 } else { 2e-2 } * (1.0 + max_abs(&b));
                    let diff = max_diff(&a, &b);
                    assert!(diff <= tol, "{:?} d {d} {name}: deterministic differs from free-running by {diff:e} (> {tol:e})", T::DTYPE);
                }
                first = Some(now)
            }
            Some(f) => assert!(f == &now, "{:?} d {d} mods {mods}: run {run} differs from run 0", T::DTYPE),
        }
    }
}
