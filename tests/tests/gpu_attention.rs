//! End-to-end: the f32 kernels (FA1, FA2, standard) against the f64 CPU
//! reference, over a sweep of shapes, masks, scales, block sizes and
//! layouts. Fresh random inputs every run (never zeros), outputs poisoned
//! with NaN before every launch and checked fully written, relative error
//! `‖out − ref‖ / ‖ref‖ < 1e-4`.
//!
//! Without a GPU every test prints why and passes; `FA_REQUIRE_GPU=1` makes
//! that a failure.

use flash_attn::reference::{self, AttnOutput};
use flash_attn::LoopOrder;
use flash_attn_tests::case::{Case, GpuOut, Inputs, run_gpu, to64};
use flash_attn_tests::{Rng, gpu, nonfinite_mismatches, rel_err};

const TOL: f64 = 1e-4;
const ORDERS: [LoopOrder; 3] = [LoopOrder::Fa1, LoopOrder::Fa2, LoopOrder::Standard];

fn reference_f64(c: &Case, x: &Inputs<f32>) -> AttnOutput<f64> {
    let scale = c.softmax_scale.map(|s| s as f64);
    reference::standard_attention::<f64>(to64(&x.q).view(), to64(&x.k).view(), to64(&x.v).view(), c.causal, scale).unwrap()
}

/// Compares one GPU result with the reference; returns a description of
/// the failure, if any.
fn check(c: &Case, x: &Inputs<f32>, loop_order: LoopOrder, out: &GpuOut<f32>, r: &AttnOutput<f64>, tol: f64) -> Result<String, String> {
    let o: Vec<f64> = out.o.iter().map(|&v| v as f64).collect();
    let ro: Vec<f64> = r.o.iter().copied().collect();
    let lse: Vec<f64> = out.lse.iter().map(|&v| v as f64).collect();
    let rl: Vec<f64> = r.lse.iter().copied().collect();
    let bad_o = nonfinite_mismatches(&o, &ro);
    let bad_l = nonfinite_mismatches(&lse, &rl);
    let e_o = rel_err(o.iter().copied(), ro.iter().copied());
    let e_l = rel_err(lse.iter().copied(), rl.iter().copied());
    let mut msg = format!("{loop_order:?} {c:?}: err(o) = {e_o:.2e}, err(lse) = {e_l:.2e}");
    if let Some((l, m)) = &out.l_m {
        // FA1's l and m against the f64 reference's (its m is natural-log: m2·ln 2).
        let scale = c.softmax_scale.map(|s| s as f64);
        let f = reference::fa1_forward::<f64>(to64(&x.q).view(), to64(&x.k).view(), to64(&x.v).view(), c.causal, scale, 16, 16)
            .unwrap();
        let e_l1 = rel_err(l.iter().map(|&v| v as f64), f.l.iter().copied());
        let e_m = rel_err(m.iter().map(|&v| v as f64 * std::f64::consts::LN_2), f.m.iter().copied());
        let bad_lm =
            nonfinite_mismatches(&l.iter().map(|&v| v as f64).collect::<Vec<_>>(), &f.l.iter().copied().collect::<Vec<_>>())
                .len()
                + nonfinite_mismatches(
                    &m.iter().map(|&v| v as f64 * std::f64::consts::LN_2).collect::<Vec<_>>(),
                    &f.m.iter().copied().collect::<Vec<_>>(),
                )
                .len();
        msg += &format!(", err(l) = {e_l1:.2e}, err(m) = {e_m:.2e}");
        if !(e_l1 < tol && e_m < tol) || bad_lm > 0 {
            return Err(format!("{msg}; FA1 l/m wrong ({bad_lm} non-finite mismatches)"));
        }
    }
    if !bad_o.is_empty() || !bad_l.is_empty() {
        return Err(format!(
            "{msg}; non-finite mismatches: o at {:?} (of {}), lse at {:?} (of {})",
            &bad_o[..bad_o.len().min(8)],
            bad_o.len(),
            &bad_l[..bad_l.len().min(8)],
            bad_l.len()
        ));
    }
    if !(e_o < tol && e_l < tol) {
        return Err(msg);
    }
    Ok(msg)
}

/// Runs every loop order on every case; fails with all failures listed.
fn sweep(test: &str, cases: &[Case], tol: f64) {
    let Some(g) = gpu(test) else { return };
    let mut rng = Rng::fresh(test);
    let mut failures = Vec::new();
    for c in cases {
        let x = Inputs::<f32>::random(c, &mut rng);
        let r = reference_f64(c, &x);
        for lo in ORDERS {
            match run_gpu(g, c, &x, lo) {
                Ok(out) => match check(c, &x, lo, &out, &r, tol) {
                    Ok(msg) => println!("ok   {msg}"),
                    Err(msg) => {
                        println!("FAIL {msg}");
                        failures.push(msg);
                    }
                },
                Err(e) => {
                    println!("FAIL {lo:?} {c:?}: {e}");
                    failures.push(format!("{lo:?} {c:?}: {e}"));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{} failures:\n{}", failures.len(), failures.join("\n"));
}

#[test]
fn gpu_sequence_lengths_and_causal_alignment() {
    let mut cases = Vec::new();
    for causal in [false, true] {
        cases.push(Case::new(2, 3, 1, 1, 64, causal)); // N = 1
        cases.push(Case::new(1, 2, 127, 127, 16, causal)); // N = 127
        cases.push(Case::new(2, 2, 200, 77, 32, causal)); // Nq > Nk: early rows see nothing when causal
        cases.push(Case::new(2, 2, 77, 200, 32, causal)); // Nq < Nk
        cases.push(Case::new(1, 1, 1, 150, 48, causal)); // one query row, many keys
        cases.push(Case::new(1, 1, 150, 1, 48, causal)); // many query rows, one key
        cases.push(Case::new(1, 2, 65, 64, 64, causal)); // one past a block
    }
    sweep("gpu_sequence_lengths_and_causal_alignment", &cases, TOL);
}

#[test]
fn gpu_head_dims() {
    let mut cases = Vec::new();
    for (i, d) in [1usize, 16, 64, 96, 128, 256, 3, 200].into_iter().enumerate() {
        cases.push(Case::new(2, 2, 130, 130, d, i % 2 == 0));
        cases.push(Case::new(1, 1, 97, 131, d, i % 2 == 1));
    }
    sweep("gpu_head_dims", &cases, TOL);
}

#[test]
fn gpu_scale_blocks_and_strides() {
    let mut cases = Vec::new();
    for causal in [false, true] {
        let mut c = Case::new(2, 3, 100, 100, 64, causal);
        c.softmax_scale = Some(0.37);
        cases.push(c.clone());
        c.softmax_scale = Some(-0.05);
        cases.push(c.clone());
        c.softmax_scale = None;
        c.block = Some((7, 13)); // odd blocks that divide nothing
        cases.push(c.clone());
        c.block = Some((16, 96));
        cases.push(c.clone());
        c.block = Some((128, 8));
        cases.push(c.clone());
        let mut c = Case::new(2, 3, 90, 90, 40, causal);
        c.strided = true; // q, k, v from a packed qkv buffer, O head-major
        cases.push(c);
    }
    sweep("gpu_scale_blocks_and_strides", &cases, TOL);
}

#[test]
fn gpu_more_than_65535_blocks() {
    // batch·nheads = 66 000 > 65 535: every kernel's grid runs along grid.x
    // (limit 2³¹ − 1), never along y/z (limit 65 535).
    let cases = [Case::new(33, 2000, 3, 2, 4, true), Case::new(66, 1000, 2, 3, 8, false)];
    sweep("gpu_more_than_65535_blocks", &cases, TOL);
}

#[test]
fn gpu_large_logits_stay_finite() {
    // |softmax_scale · q·k| up to ~1e4: the online softmax subtracts the
    // running maximum, so nothing overflows. f32 rounding of the scores
    // themselves is ~1e4 · 2⁻²⁴ · √d, so the tolerance is looser here.
    let mut cases = Vec::new();
    for causal in [false, true] {
        let mut c = Case::new(2, 2, 96, 96, 64, causal);
        c.amp = 30.0;
        c.softmax_scale = Some(1.0);
        cases.push(c);
    }
    if gpu("gpu_large_logits_stay_finite").is_some() {
        let mut rng = Rng::fresh("gpu_large_logits_stay_finite");
        let x = Inputs::<f32>::random(&cases[0], &mut rng);
        let max_logit = x.max_abs_logit();
        println!("largest |logit| of a sample input of the first case: {max_logit:.3e}");
        assert!(max_logit > 3e3, "the inputs should give logits of order 1e4");
    }
    sweep("gpu_large_logits_stay_finite", &cases, 1e-3);
}

/// NaN and inf inputs: the outputs must be non-finite exactly where the f64
/// reference's are (FA2 loop order, which shares `RowState` with the kernels:
/// a row whose state turns NaN finalizes to O = NaN and lse = −inf), and
/// agree elsewhere.
#[test]
fn gpu_nan_and_inf_inputs_behave_as_the_reference() {
    let Some(g) = gpu("gpu_nan_and_inf_inputs_behave_as_the_reference") else { return };
    let mut rng = Rng::fresh("gpu_nan_and_inf_inputs_behave_as_the_reference");
    let mut failures = Vec::new();
    type Poison = fn(&mut Inputs<f32>, &mut Rng);
    let poisons: [(&str, bool, Poison); 5] = [
        ("NaN in one q element", true, |x, rng| {
            let (b, n, h, d) = x.q.dim();
            x.q[[rng.below(b), rng.below(n), rng.below(h), rng.below(d)]] = f32::NAN;
        }),
        ("NaN in one k element", true, |x, rng| {
            let (b, n, h, d) = x.k.dim();
            x.k[[rng.below(b), rng.below(n), rng.below(h), rng.below(d)]] = f32::NAN;
        }),
        ("+inf in one q element", true, |x, rng| {
            let (b, n, h, d) = x.q.dim();
            x.q[[rng.below(b), rng.below(n), rng.below(h), rng.below(d)]] = f32::INFINITY;
        }),
        ("-inf in one k element", true, |x, rng| {
            let (b, n, h, d) = x.k.dim();
            x.k[[rng.below(b), rng.below(n), rng.below(h), rng.below(d)]] = f32::NEG_INFINITY;
        }),
        // Non-causal only: the kernels multiply masked/underflowed P = 0 by
        // V (0·NaN = NaN) where the reference skips P = 0 terms.
        ("NaN in one v element", false, |x, rng| {
            let (b, n, h, d) = x.v.dim();
            x.v[[rng.below(b), rng.below(n), rng.below(h), rng.below(d)]] = f32::NAN;
        }),
    ];
    for (what, causal_too, poison) in poisons {
        for causal in [false, true] {
            if causal && !causal_too {
                continue;
            }
            let c = Case::new(2, 2, 70, 70, 16, causal);
            let mut x = Inputs::<f32>::random(&c, &mut rng);
            poison(&mut x, &mut rng);
            let (q, k, v) = (to64(&x.q), to64(&x.k), to64(&x.v));
            let r = reference::fa2_forward::<f64>(q.view(), k.view(), v.view(), causal, None, 16, 16).unwrap();
            let n_nan = r.o.iter().filter(|v| v.is_nan()).count();
            for lo in ORDERS {
                match run_gpu(g, &c, &x, lo).map_err(|e| e.to_string()).and_then(|out| check(&c, &x, lo, &out, &r, TOL)) {
                    Ok(msg) => println!("ok   {what} ({n_nan} NaN outputs in the reference): {msg}"),
                    Err(msg) => {
                        println!("FAIL {what}: {msg}");
                        failures.push(format!("{what}: {msg}"));
                    }
                }
            }
        }
    }
    assert!(failures.is_empty(), "{} failures:\n{}", failures.len(), failures.join("\n"));
}

/// Same inputs twice: bit-identical outputs (a moving result is a race).
#[test]
fn gpu_results_are_deterministic() {
    let Some(g) = gpu("gpu_results_are_deterministic") else { return };
    let mut rng = Rng::fresh("gpu_results_are_deterministic");
    let c = Case::new(2, 4, 300, 257, 64, true);
    let x = Inputs::<f32>::random(&c, &mut rng);
    for lo in ORDERS {
        let a = run_gpu(g, &c, &x, lo).unwrap();
        let b = run_gpu(g, &c, &x, lo).unwrap();
        let same = a.o.iter().zip(b.o.iter()).all(|(x, y)| x.to_bits() == y.to_bits());
        assert!(same, "{lo:?}: two runs on the same inputs differ");
    }
}

/// One small shape per loop order, for `compute-sanitizer --tool memcheck`
/// and `--tool racecheck` (filter on this name).
#[test]
fn gpu_small_shape_for_sanitizers() {
    let mut c = Case::new(1, 2, 70, 50, 40, true);
    c.block = Some((32, 32));
    sweep("gpu_small_shape_for_sanitizers", &[c], TOL);
}
