//! End-to-end: the f32 kernels (FA1, FA2, standard) against the f64 CPU
//! reference, over a sweep of shapes, masks, scales, block sizes and
//! layouts. Fresh random inputs every run (never zeros), outputs poisoned
//! with NaN before every launch and checked fully written, relative error
//! `‖out − ref‖ / ‖ref‖ < 1e-4`.
//!
//! Without a GPU every test prints why and passes; `FA_REQUIRE_GPU=1` makes
//! that a failure.

use flash_attn::reference::{self, AttnOutput};
use flash_attn::{ForwardParams, LoopOrder, RowState, StatsMut, Tensor, TensorLayout, TensorMut};
use flash_attn_tests::{Gpu, Rng, gpu, nonfinite_mismatches, rel_err};
use ndarray::{Array3, Array4};

const TOL: f64 = 1e-4;
const ORDERS: [LoopOrder; 3] = [LoopOrder::Fa1, LoopOrder::Fa2, LoopOrder::Standard];

/// One problem: shapes, mask, scale, block, input amplitude, layouts.
#[derive(Clone, Debug)]
struct Case {
    batch: usize,
    nheads: usize,
    seqlen_q: usize,
    seqlen_k: usize,
    headdim: usize,
    causal: bool,
    softmax_scale: Option<f32>,
    block: Option<(usize, usize)>,
    /// Inputs uniform in `[-amp, amp]`.
    amp: f32,
    /// q, k, v as slices of one packed `(batch, seqlen, 3, nheads, headdim)`
    /// buffer (only when seqlen_q == seqlen_k), and O in `(batch, nheads,
    /// seqlen, headdim)` memory order.
    strided: bool,
}

impl Case {
    fn new(batch: usize, nheads: usize, seqlen_q: usize, seqlen_k: usize, headdim: usize, causal: bool) -> Self {
        Self { batch, nheads, seqlen_q, seqlen_k, headdim, causal, softmax_scale: None, block: None, amp: 1.0, strided: false }
    }
    fn q_shape(&self) -> [usize; 4] {
        [self.batch, self.seqlen_q, self.nheads, self.headdim]
    }
    fn k_shape(&self) -> [usize; 4] {
        [self.batch, self.seqlen_k, self.nheads, self.headdim]
    }
    fn params(&self, loop_order: LoopOrder) -> ForwardParams {
        ForwardParams { causal: self.causal, softmax_scale: self.softmax_scale, loop_order, block: self.block }
    }
}

/// Inputs in the contiguous `(batch, seqlen, nheads, headdim)` layout.
struct Inputs {
    q: Array4<f32>,
    k: Array4<f32>,
    v: Array4<f32>,
}

impl Inputs {
    fn random(c: &Case, rng: &mut Rng) -> Self {
        let qs = c.q_shape();
        let ks = c.k_shape();
        let arr = |s: [usize; 4], rng: &mut Rng| {
            Array4::from_shape_vec((s[0], s[1], s[2], s[3]), rng.vec(s.iter().product(), c.amp)).unwrap()
        };
        Self { q: arr(qs, rng), k: arr(ks, rng), v: arr(ks, rng) }
    }
}

/// What the GPU produced, downloaded.
struct GpuOut {
    o: Array4<f32>,
    /// Natural-log logsumexp (for FA1 computed from l and m with `RowState::lse`).
    lse: Array3<f32>,
    /// FA1 only: l and m (m in base-2 units).
    l_m: Option<(Array3<f32>, Array3<f32>)>,
}

fn to64(a: &Array4<f32>) -> Array4<f64> {
    a.mapv(|x| x as f64)
}

fn reference_f64(c: &Case, x: &Inputs) -> AttnOutput<f64> {
    let scale = c.softmax_scale.map(|s| s as f64);
    reference::standard_attention::<f64>(to64(&x.q).view(), to64(&x.k).view(), to64(&x.v).view(), c.causal, scale).unwrap()
}

/// Packs q, k, v into one `(batch, seqlen, 3, nheads, headdim)` buffer
/// (the layout of a fused qkv projection) and returns it with their layouts.
fn pack_qkv(x: &Inputs) -> (Vec<f32>, [TensorLayout; 3]) {
    let (b, n, h, d) = x.q.dim();
    let mut buf = vec![0.0f32; b * n * 3 * h * d];
    for (t, a) in [&x.q, &x.k, &x.v].into_iter().enumerate() {
        for ((bi, i, hi, c), &val) in a.indexed_iter() {
            buf[(((bi * n + i) * 3 + t) * h + hi) * d + c] = val;
        }
    }
    // All three share the strides; they start at offsets 0, h·d and 2·h·d.
    let lay = TensorLayout::new([b, n, h, d], [n * 3 * h * d, 3 * h * d, d]);
    (buf, [lay, lay, lay])
}

/// Runs one loop order through `forward_into`, with every output poisoned
/// with NaN first.
fn run_gpu(g: &Gpu, c: &Case, x: &Inputs, loop_order: LoopOrder) -> Result<GpuOut, flash_attn::FlashAttnError> {
    let s = &g.stream;
    let (b, nq, h, d) = (c.batch, c.seqlen_q, c.nheads, c.headdim);
    let nstats = b * h * nq;
    let params = c.params(loop_order);
    let mut o_dev = s.clone_htod(&vec![f32::NAN; b * nq * h * d])?;
    // O in (batch, nheads, seqlen, headdim) memory order when strided.
    let o_layout = if c.strided {
        TensorLayout::new([b, nq, h, d], [h * nq * d, d, nq * d])
    } else {
        TensorLayout::contiguous([b, nq, h, d])
    };
    let mut l_dev = s.clone_htod(&vec![f32::NAN; nstats])?;
    let mut m_dev = s.clone_htod(&vec![f32::NAN; nstats])?;
    let stats = match loop_order {
        LoopOrder::Fa1 => StatsMut::Fa1 { l: l_dev.as_view_mut(), m: m_dev.as_view_mut() },
        _ => StatsMut::LogSumExp(l_dev.as_view_mut()),
    };
    if c.strided {
        let (buf, lays) = pack_qkv(x);
        let dev = s.clone_htod(&buf)?;
        let (hd, ntot) = (h * d, buf.len());
        let (qv, kv, vv) = (dev.slice(0..ntot), dev.slice(hd..ntot), dev.slice(2 * hd..ntot));
        g.fa.forward_into(
            s,
            Tensor::new(&qv, lays[0]),
            Tensor::new(&kv, lays[1]),
            Tensor::new(&vv, lays[2]),
            TensorMut::new(&mut o_dev, o_layout),
            stats,
            &params,
        )?;
    } else {
        let q = s.clone_htod(x.q.as_slice().unwrap())?;
        let k = s.clone_htod(x.k.as_slice().unwrap())?;
        let v = s.clone_htod(x.v.as_slice().unwrap())?;
        g.fa.forward_into(
            s,
            Tensor::new(&q, TensorLayout::contiguous(c.q_shape())),
            Tensor::new(&k, TensorLayout::contiguous(c.k_shape())),
            Tensor::new(&v, TensorLayout::contiguous(c.k_shape())),
            TensorMut::new(&mut o_dev, o_layout),
            stats,
            &params,
        )?;
    }
    s.synchronize()?;
    let o_raw = s.clone_dtoh(&o_dev)?;
    let o = Array4::from_shape_fn((b, nq, h, d), |(bi, i, hi, ci)| {
        o_raw[bi * o_layout.strides[0] + i * o_layout.strides[1] + hi * o_layout.strides[2] + ci]
    });
    let l = Array3::from_shape_vec((b, h, nq), s.clone_dtoh(&l_dev)?).unwrap();
    let m = Array3::from_shape_vec((b, h, nq), s.clone_dtoh(&m_dev)?).unwrap();
    Ok(match loop_order {
        LoopOrder::Fa1 => {
            let lse = Array3::from_shape_fn((b, h, nq), |ix| RowState { m: m[ix], l: l[ix] }.lse());
            GpuOut { o, lse, l_m: Some((l, m)) }
        }
        _ => GpuOut { o, lse: l, l_m: None },
    })
}

/// Compares one GPU result with the reference; returns a description of
/// the failure, if any.
fn check(c: &Case, x: &Inputs, loop_order: LoopOrder, out: &GpuOut, r: &AttnOutput<f64>, tol: f64) -> Result<String, String> {
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
        let x = Inputs::random(c, &mut rng);
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
        let x = Inputs::random(&cases[0], &mut rng);
        let max_logit =
            x.q.outer_iter()
                .zip(x.k.outer_iter())
                .map(|(qb, kb)| {
                    let mut m = 0.0f64;
                    for qi in qb.outer_iter() {
                        for kj in kb.outer_iter() {
                            for (qh, kh) in qi.outer_iter().zip(kj.outer_iter()) {
                                m = m.max(qh.iter().zip(kh.iter()).map(|(a, b)| (*a as f64) * (*b as f64)).sum::<f64>().abs());
                            }
                        }
                    }
                    m
                })
                .fold(0.0, f64::max);
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
    type Poison = fn(&mut Inputs, &mut Rng);
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
            let mut x = Inputs::random(&c, &mut rng);
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
    let x = Inputs::random(&c, &mut rng);
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
