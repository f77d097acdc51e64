//! The Hopper-native kernels (sm_90a, `kernel-crate/src/hopper`) on a
//! compute capability 9.0 GPU:
//!
//! * `gpu_hopper_probe`: one tile through TMA (128B swizzle, tensor maps as
//!   by-value parameters, a key tail zero-filled by the copy engine) and
//!   both wgmma forms (`S = Q·Kᵀ` from two K-major descriptors, `O = P·V`
//!   with P in registers and V read MN-major), compared with f64: S and O
//!   must agree to f32 accumulation (1e-5), the zero-filled columns exactly.
//! * `gpu_hopper_forward_*`: `FlashAttention::forward_into` on the default
//!   (Hopper) plan — asserted to be `Plan::Hopper`, for the compiled head
//!   dims and head dims zero-padded to them — against the f64
//!   reference with the rule of `gpu_half.rs` (`err(o) ≤ 2·err(naive)` and
//!   `< 2e-3` (f16) / `1e-2` (bf16); logsumexp within 1e-4; every output
//!   poisoned with NaN first; fresh random inputs).
//! * `gpu_hopper_small`: one small shape per kernel, the target of the
//!   compute-sanitizer runs (memcheck, racecheck, synccheck).
//! * `gpu_hopper_varlen*`, `gpu_hopper_dense_window`: the `_vw` kernels
//!   (varlen, sliding windows) through the public API, per sequence against
//!   the f64 reference of `flash_attn_tests::features` with
//!   `gpu_features.rs`'s rule; `gpu_hopper_varlen_small` and the garbage
//!   prefix-sum test are the sanitizers' targets.
//!
//! On other GPUs (or with no GPU) the tests print why and pass, except that
//! `FA_REQUIRE_GPU=1` without any GPU fails (as every GPU test).

use cudarc::driver::{CudaSlice, LaunchConfig};
use flash_attn::advanced::dispatch::Plan;
use flash_attn::advanced::hopper::{HOPPER_KERNELS, HopperKernel, PROBE_SMEM_BYTES, TensorMap, hopper_head_dim};
use flash_attn::reference;
use flash_attn::{AttnElem, DType, LoopOrder, TensorLayout};
use flash_attn_tests::case::{Case, Inputs, run_gpu, to64};
use flash_attn_tests::naive::naive_attention;
use flash_attn_tests::{Gpu, Rng, gpu, nonfinite_mismatches, rel_err};
use half::{bf16, f16};

/// The GPU if it is a compute capability 9.0 device with the sm_90a build
/// loaded; else prints why the test does nothing.
fn hopper(test: &str) -> Option<&'static Gpu> {
    let g = gpu(test)?;
    if !g.fa.has_hopper_kernels() {
        println!(
            "SKIPPED {test}: {} (compute capability {:?}) runs the {} build, not sm_90a",
            g.fa.device_name(),
            g.fa.compute_capability(),
            g.fa.ptx_build().arch
        );
        return None;
    }
    Some(g)
}

fn abs_bound<T: AttnElem>() -> f64 {
    if T::DTYPE == DType::F16 { 2e-3 } else { 1e-2 }
}

/// Runs `c` on the Hopper plan and checks it; `Err` describes a failure.
#[allow(clippy::neg_cmp_op_on_partial_ord)] // `!(err < bound)`: a NaN error fails the check
fn check_case<T: AttnElem>(g: &Gpu, c: &Case, rng: &mut Rng) -> Result<String, String> {
    let dt = T::DTYPE.name();
    let x = Inputs::<T>::random(c, rng);
    // The plan must be the Hopper kernel.
    let l = TensorLayout::contiguous(c.q_shape());
    let lk = TensorLayout::contiguous(c.k_shape());
    let problem = flash_attn::advanced::validate::validate(
        (&l, l.required_len().unwrap()),
        (&lk, lk.required_len().unwrap()),
        (&lk, lk.required_len().unwrap()),
        (&l, l.required_len().unwrap()),
        &c.params(LoopOrder::Fa2),
    )
    .map_err(|e| e.to_string())?;
    let plan = g.fa.plan::<T>(&problem, &c.params(LoopOrder::Fa2), false, false).map_err(|e| e.to_string())?;
    let Plan::Hopper { kernel, .. } = plan else { return Err(format!("{dt} {}: plan is {plan:?}, not Hopper", c.label())) };

    let out = run_gpu(g, c, &x, LoopOrder::Fa2).map_err(|e| format!("{dt} {}: {e}", c.label()))?;
    let scale = c.softmax_scale.map(|s| s as f64);
    let (q, k, v) = (to64(&x.q), to64(&x.k), to64(&x.v));
    let r = reference::standard_attention::<f64>(q.view(), k.view(), v.view(), c.causal, scale).unwrap();
    let naive = naive_attention(x.q.view(), x.k.view(), x.v.view(), c.causal, c.softmax_scale);
    let naive_err = rel_err(naive.iter().map(|x| x.to_f32() as f64), r.o.iter().copied());

    let ro: Vec<f64> = r.o.iter().copied().collect();
    let o: Vec<f64> = out.o.iter().map(|x| x.to_f32() as f64).collect();
    let lse: Vec<f64> = out.lse.iter().map(|&v| v as f64).collect();
    let rl: Vec<f64> = r.lse.iter().copied().collect();
    let (bad_o, bad_l) = (nonfinite_mismatches(&o, &ro), nonfinite_mismatches(&lse, &rl));
    let e_o = rel_err(o.iter().copied(), ro.iter().copied());
    let e_l = rel_err(lse.iter().copied(), rl.iter().copied());
    let msg = format!(
        "{dt:<4} {} {}: err(o) = {e_o:.2e}, naive = {naive_err:.2e} (ratio {:.2}), err(lse) = {e_l:.2e}",
        kernel.name,
        c.label(),
        e_o / naive_err
    );
    if !bad_o.is_empty() || !bad_l.is_empty() {
        return Err(format!(
            "{msg}; non-finite mismatches: o at {:?} (of {}), lse at {:?} (of {})",
            &bad_o[..bad_o.len().min(8)],
            bad_o.len(),
            &bad_l[..bad_l.len().min(8)],
            bad_l.len()
        ));
    }
    if !(e_o <= 2.0 * naive_err && e_o < abs_bound::<T>()) {
        return Err(format!("{msg}; O fails the rule (≤ 2× naive and < {:.0e})", abs_bound::<T>()));
    }
    if !(e_l < 1e-4) {
        return Err(format!("{msg}; logsumexp off by more than 1e-4"));
    }
    Ok(msg)
}

fn sweep(test: &str, cases: &[Case]) {
    let Some(g) = hopper(test) else { return };
    let mut rng = Rng::fresh(test);
    let mut failures = Vec::new();
    let t0 = std::time::Instant::now();
    for c in cases {
        for res in [check_case::<f16>(g, c, &mut rng), check_case::<bf16>(g, c, &mut rng)] {
            match res {
                Ok(m) => println!("ok   {m}"),
                Err(m) => {
                    println!("FAIL {m}");
                    failures.push(m);
                }
            }
        }
    }
    println!("{test}: {} runs in {:.1} s", 2 * cases.len(), t0.elapsed().as_secs_f64());
    assert!(failures.is_empty(), "{} failures:\n{}", failures.len(), failures.join("\n"));
}

/// The head dims the Hopper kernels run: the compiled ones, and others
/// zero-padded to them (`hopper_head_dim`: 40 → 64; 80, 96 → 128; 136, 160
/// → 192; 224 → 256), asserted to map there.
fn head_dims() -> Vec<usize> {
    let mut d: Vec<usize> = HOPPER_KERNELS.iter().map(|k| k.d).collect();
    d.sort();
    d.dedup();
    for (padded, to) in [(40, 64), (80, 128), (96, 128), (136, 192), (160, 192), (224, 256)] {
        assert_eq!(hopper_head_dim(padded), Some(to), "head dim {padded}");
        d.push(padded);
    }
    d
}

#[test]
fn gpu_hopper_forward_lengths_and_causal() {
    let mut cases = Vec::new();
    for d in head_dims() {
        for causal in [false, true] {
            cases.push(Case::new(2, 3, 1, 1, d, causal)); // N = 1
            cases.push(Case::new(1, 2, 127, 127, d, causal));
            cases.push(Case::new(2, 2, 200, 77, d, causal)); // Nq > Nk: early rows see nothing when causal
            cases.push(Case::new(2, 2, 77, 200, d, causal)); // Nq < Nk
            cases.push(Case::new(1, 1, 1, 150, d, causal));
            cases.push(Case::new(1, 1, 150, 1, d, causal));
            cases.push(Case::new(1, 2, 129, 128, d, causal)); // one past a 128-row block
            cases.push(Case::new(1, 2, 300, 333, d, causal)); // several blocks both ways, ragged
            cases.push(Case::new(1, 1, 640, 640, d, causal)); // 5 Q blocks, several pipeline rounds
        }
    }
    sweep("gpu_hopper_forward_lengths_and_causal", &cases);
}

#[test]
fn gpu_hopper_forward_scales_strides_amplitudes() {
    let mut cases = Vec::new();
    for d in head_dims() {
        for causal in [false, true] {
            let mut c = Case::new(2, 3, 100, 140, d, causal);
            c.softmax_scale = Some(-0.07); // negative scale
            cases.push(c.clone());
            c.softmax_scale = Some(0.0); // uniform weights
            cases.push(c);
            let mut c = Case::new(2, 3, 190, 190, d, causal);
            c.strided = true; // q, k, v sliced from a packed qkv buffer; O head-major
            cases.push(c);
            let mut c = Case::new(1, 2, 260, 260, d, causal);
            c.amp = 4.0; // large logits
            cases.push(c);
        }
    }
    sweep("gpu_hopper_forward_scales_strides_amplitudes", &cases);
}

/// Small shapes for compute-sanitizer (memcheck, racecheck, synccheck).
#[test]
fn gpu_hopper_small() {
    let mut cases = Vec::new();
    for d in head_dims() {
        cases.push(Case::new(1, 2, 200, 333, d, false));
        cases.push(Case::new(1, 2, 333, 200, d, true));
    }
    sweep("gpu_hopper_small", &cases);
}

/// Every compiled Hopper kernel (defaults and candidates), launched directly
/// on ragged shapes, causal and not, against the f64 reference (same rule).
#[test]
fn gpu_hopper_every_kernel() {
    let test = "gpu_hopper_every_kernel";
    let Some(g) = hopper(test) else { return };
    let mut rng = Rng::fresh(test);
    let mut failures = Vec::new();
    for (i, k) in HOPPER_KERNELS.iter().enumerate() {
        // Persistent kernels: also more tiles than SMs (80 heads × 2–3 Q blocks),
        // 3 K/V blocks per tile (odd: the next tile starts on the other stage).
        let mut cases = vec![(1, 2, 300 + i, 333 - i)];
        if k.persistent {
            cases.push((2, 40, 300, 333));
        }
        for (causal, &(b, h, nq, nk)) in [i % 2 == 0, i % 2 == 1].into_iter().flat_map(|c| cases.iter().map(move |x| (c, x))) {
            let c = Case::new(b, h, nq, nk, k.d, causal);
            let res = if k.bf16 { direct::<bf16>(g, k, &c, &mut rng) } else { direct::<f16>(g, k, &c, &mut rng) };
            match res {
                Ok(m) => println!("ok   {m}"),
                Err(m) => {
                    println!("FAIL {m}");
                    failures.push(m);
                }
            }
        }
    }
    assert!(failures.is_empty(), "{} failures:\n{}", failures.len(), failures.join("\n"));
}

/// Runs kernel `k` on `c` through `hopper::launch_params` and checks O and
/// the logsumexp.
#[allow(clippy::neg_cmp_op_on_partial_ord)] // `!(err < bound)`: a NaN error fails the check
fn direct<T: AttnElem>(g: &Gpu, k: &HopperKernel, c: &Case, rng: &mut Rng) -> Result<String, String> {
    use cudarc::driver::{DevicePtr, DevicePtrMut};
    let s = &g.stream;
    let x = Inputs::<T>::random(c, rng);
    let (b, nq, nk, h, d) = (c.batch, c.seqlen_q, c.seqlen_k, c.nheads, c.headdim);
    let e = |r: cudarc::driver::DriverError| r.to_string();
    let dq = s.clone_htod(x.q.as_slice().unwrap()).map_err(e)?;
    let dk = s.clone_htod(x.k.as_slice().unwrap()).map_err(e)?;
    let dv = s.clone_htod(x.v.as_slice().unwrap()).map_err(e)?;
    let mut dout = s.clone_htod(&vec![T::from_f32(f32::NAN); b * nq * h * d]).map_err(e)?;
    let mut dlse = s.clone_htod(&vec![f32::NAN; b * h * nq]).map_err(e)?;
    let scale = 1.0 / (d as f32).sqrt();
    let qs = [(nq * h * d) as u64, (h * d) as u64, d as u64];
    let ks = [(nk * h * d) as u64, (h * d) as u64, d as u64];
    let p = {
        let (q_ptr, _g1) = dq.device_ptr(s);
        let (k_ptr, _g2) = dk.device_ptr(s);
        let (v_ptr, _g3) = dv.device_ptr(s);
        let (o_ptr, _g4) = dout.device_ptr_mut(s);
        let (lse_ptr, _g5) = dlse.device_ptr_mut(s);
        flash_attn::AttnParams {
            q_ptr,
            k_ptr,
            v_ptr,
            o_ptr,
            lse_ptr,
            q_stride: qs,
            k_stride: ks,
            v_stride: ks,
            o_stride: qs,
            batch: b as u32,
            nheads: h as u32,
            seqlen_q: nq as u32,
            seqlen_k: nk as u32,
            headdim: d as u32,
            causal: c.causal as u32,
            softmax_scale: scale,
            softmax_scale_log2: scale * flash_attn::common::LOG2_E,
            br: k.br() as u32,
            bc: k.bc as u32,
            ..Default::default()
        }
    };
    // SAFETY: the buffers hold the contiguous shapes the strides state,
    // 16-byte aligned (fresh allocations), headdim == k.d.
    unsafe { flash_attn::advanced::hopper::launch_params(&g.fa, s, k, &p) }.map_err(|e| e.to_string())?;
    s.synchronize().map_err(e)?;
    let o = s.clone_dtoh(&dout).map_err(e)?;
    let lse = s.clone_dtoh(&dlse).map_err(e)?;
    let (q, kk, v) = (to64(&x.q), to64(&x.k), to64(&x.v));
    let r = reference::standard_attention::<f64>(q.view(), kk.view(), v.view(), c.causal, None).unwrap();
    let naive = naive_attention(x.q.view(), x.k.view(), x.v.view(), c.causal, None);
    let naive_err = rel_err(naive.iter().map(|x| x.to_f32() as f64), r.o.iter().copied());
    let o64: Vec<f64> = o.iter().map(|x| x.to_f32() as f64).collect();
    let ro: Vec<f64> = r.o.iter().copied().collect();
    let l64: Vec<f64> = lse.iter().map(|&x| x as f64).collect();
    let rl: Vec<f64> = r.lse.iter().copied().collect();
    let e_o = rel_err(o64.iter().copied(), ro.iter().copied());
    let e_l = rel_err(l64.iter().copied(), rl.iter().copied());
    let bad = nonfinite_mismatches(&o64, &ro).len() + nonfinite_mismatches(&l64, &rl).len();
    let msg = format!("{} {}: err(o) = {e_o:.2e}, naive = {naive_err:.2e}, err(lse) = {e_l:.2e}", k.name, c.label());
    if bad > 0 || !(e_o <= 2.0 * naive_err && e_o < abs_bound::<T>()) || !(e_l < 1e-4) {
        return Err(format!("{msg}; {bad} non-finite mismatches"));
    }
    Ok(msg)
}

/// One tile through the probe kernel: TMA, swizzle, descriptors, both wgmma
/// forms, the tensor-map parameter, the zero-filled key tail.
#[test]
fn gpu_hopper_probe() {
    let test = "gpu_hopper_probe";
    let Some(g) = hopper(test) else { return };
    let mut rng = Rng::fresh(test);
    probe::<f16>(g, &mut rng, "hopper_probe_f16");
    probe::<bf16>(g, &mut rng, "hopper_probe_bf16");
}

fn probe<T: AttnElem>(g: &Gpu, rng: &mut Rng, name: &str) {
    const D: usize = 128;
    const M: usize = 64;
    const N: usize = 128;
    const NK: usize = 100; // rows NK..N of the K and V boxes are out of range
    let s = &g.stream;
    let r = |n: usize, rng: &mut Rng| -> Vec<T> { (0..n).map(|_| T::from_f32(rng.nonzero(1.0))).collect() };
    let (q, k, v) = (r(M * D, rng), r(NK * D, rng), r(NK * D, rng));
    let dq: CudaSlice<T> = s.clone_htod(&q).unwrap();
    let dk: CudaSlice<T> = s.clone_htod(&k).unwrap();
    let dv: CudaSlice<T> = s.clone_htod(&v).unwrap();
    let mut ds: CudaSlice<f32> = s.clone_htod(&vec![f32::NAN; M * N]).unwrap();
    let mut dout: CudaSlice<f32> = s.clone_htod(&vec![f32::NAN; M * D]).unwrap();
    let bf = T::DTYPE == DType::BF16;
    let ptr = |x: &CudaSlice<T>| {
        use cudarc::driver::DevicePtr;
        let (p, _g) = x.device_ptr(s);
        p
    };
    let tq = TensorMap::encode_bshd(ptr(&dq), [1, M, 1, D], [M * D, D, D], M as u32, bf).unwrap();
    let tk = TensorMap::encode_bshd(ptr(&dk), [1, NK, 1, D], [NK * D, D, D], N as u32, bf).unwrap();
    let tv = TensorMap::encode_bshd(ptr(&dv), [1, NK, 1, D], [NK * D, D, D], N as u32, bf).unwrap();
    let p = {
        use cudarc::driver::DevicePtrMut;
        let (sp, _g1) = ds.device_ptr_mut(s);
        let (op, _g2) = dout.device_ptr_mut(s);
        flash_attn::AttnParams { scratch_ptr: sp, o_ptr: op, ..Default::default() }
    };
    let f = g.fa.function(name).expect("probe kernel loaded");
    let cfg = LaunchConfig { grid_dim: (1, 1, 1), block_dim: (128, 1, 1), shared_mem_bytes: PROBE_SMEM_BYTES };
    // SAFETY: the probe takes (TensorMap ×3, AttnParams, u64) by value; the
    // maps describe dq, dk, dv; scratch and o hold 64 × 128 f32 each.
    unsafe { flash_attn::advanced::hopper::launch_with_maps(s, f, cfg, &[tq, tk, tv], &p) }.unwrap();
    println!("{name}: tensor maps in global memory: {}", flash_attn::advanced::hopper::tensor_maps_in_global_memory());
    s.synchronize().unwrap();
    let (sg, og) = (s.clone_dtoh(&ds).unwrap(), s.clone_dtoh(&dout).unwrap());

    let f64v = |x: &[T]| -> Vec<f64> { x.iter().map(|v| v.to_f32() as f64).collect() };
    let (q, k, v) = (f64v(&q), f64v(&k), f64v(&v));
    let mut s_ref = vec![0f64; M * N];
    for i in 0..M {
        for j in 0..NK {
            s_ref[i * N + j] = (0..D).map(|c| q[i * D + c] * k[j * D + c]).sum();
        }
    }
    let tail_exact = (0..M).all(|i| (NK..N).all(|j| sg[i * N + j] == 0.0));
    let e_s = rel_err(sg.iter().map(|&x| x as f64), s_ref.iter().copied());
    // O = round_T(S_gpu) · V over the NK valid keys (the zero-filled rows of V
    // contribute nothing).
    let p_t: Vec<f64> = sg.iter().map(|&x| T::from_f32(x).to_f32() as f64).collect();
    let mut o_ref = vec![0f64; M * D];
    for i in 0..M {
        for c in 0..D {
            o_ref[i * D + c] = (0..NK).map(|j| p_t[i * N + j] * v[j * D + c]).sum();
        }
    }
    let e_o = rel_err(og.iter().map(|&x| x as f64), o_ref.iter().copied());
    let nan = sg.iter().chain(og.iter()).filter(|x| !x.is_finite()).count();
    println!("{name}: err(S) = {e_s:.2e}, err(O) = {e_o:.2e}, key tail zero: {tail_exact}, non-finite: {nan}");
    if e_s >= 1e-5 || e_o >= 1e-5 || !tail_exact || nan > 0 {
        // Where it goes wrong, for the layout debugging.
        for (what, got, want, cols) in [("S", &sg, &s_ref, N), ("O", &og, &o_ref, D)] {
            let bad: Vec<(usize, usize, f32, f64)> = (0..got.len())
                .filter(|&i| (got[i] as f64 - want[i]).abs() > 1e-3 * (1.0 + want[i].abs()))
                .take(12)
                .map(|i| (i / cols, i % cols, got[i], want[i]))
                .collect();
            println!("{name}: first mismatches of {what} (row, col, gpu, ref): {bad:?}");
        }
        panic!("{name}: probe failed: err(S) = {e_s:.2e}, err(O) = {e_o:.2e}, tail zero {tail_exact}, non-finite {nan}");
    }
}

// ---- varlen and sliding windows: the `_vw` kernels -------------------------
//
// The accuracy rule of `gpu_features.rs` (FlashAttention-2's): per sequence,
// `max|out − ref| ≤ 2·max|naive − ref| + 1e-5` against the f64 reference
// of [`features`], the logsumexp within `1e-4·max(1, |ref|)`, −inf exactly
// (and O = 0) for rows that see no key. Outputs poisoned with NaN first.

use flash_attn::{Extras, FlashAttnError, ForwardParams, StatsMut, Tensor, TensorMut, Varlen};
use flash_attn_tests::features::{self, Spec};
use ndarray::{Array2, Array3, Array4, Axis, s};

fn max_abs_diff(a: impl IntoIterator<Item = f64>, b: impl IntoIterator<Item = f64>) -> f64 {
    a.into_iter().zip(b).map(|(x, y)| if x.is_nan() { f64::INFINITY } else { (x - y).abs() }).fold(0.0, f64::max)
}

/// The 2×-naive rule on O and the LSE rule for one (sequence's) dense view.
#[allow(clippy::neg_cmp_op_on_partial_ord)] // `!(err < bound)`: a NaN error fails the check
fn rule<T: AttnElem>(q: &Array4<T>, k: &Array4<T>, v: &Array4<T>, spec: &Spec, o: &Array4<T>, lse: &[f32]) -> Result<String, String> {
    let r = features::reference(q.view(), k.view(), v.view(), spec);
    let n = features::naive(q.view(), k.view(), v.view(), spec);
    let err = max_abs_diff(o.iter().map(|x| x.to_f32() as f64), r.o.iter().copied());
    let naive_err = max_abs_diff(n.o.iter().map(|x| x.to_f32() as f64), r.o.iter().copied());
    if !(err <= 2.0 * naive_err + 1e-5) {
        return Err(format!("max error {err:.3e} > 2 × naive {naive_err:.3e} + 1e-5"));
    }
    for (i, (&g, &w)) in lse.iter().zip(r.lse.iter()).enumerate() {
        let g = g as f64;
        let ok = if w == f64::NEG_INFINITY { g == w } else { (g - w).abs() <= 1e-4 * w.abs().max(1.0) };
        if !ok {
            return Err(format!("lse[{i}] = {g}, reference {w}"));
        }
    }
    Ok(format!("max error {err:.2e} (naive {naive_err:.2e})"))
}

fn random4<T: AttnElem>(rng: &mut Rng, shape: (usize, usize, usize, usize)) -> Array4<T> {
    Array4::from_shape_simple_fn(shape, || T::from_f32(rng.nonzero(1.0)))
}

/// One varlen problem: lengths per sequence (queries, keys), heads, and
/// optionally the keys used per sequence (`seqused_k`).
struct VarlenCase {
    d: usize,
    h: usize,
    hk: usize,
    lens_q: Vec<usize>,
    lens_k: Vec<usize>,
    used: Option<Vec<usize>>,
    params: ForwardParams,
}

/// Runs a varlen case through `forward_varlen_into` on the Hopper `_vw`
/// plan (asserted) and checks every sequence against the f64 reference of
/// that sequence alone. Keys a sequence does not use (past `seqused_k`) are
/// NaN in K and V: they must not reach any output.
fn varlen_check<T: AttnElem>(g: &Gpu, rng: &mut Rng, c: &VarlenCase) -> Result<String, String> {
    let s = &g.stream;
    let e = |x: cudarc::driver::DriverError| x.to_string();
    let (d, h, hk, batch) = (c.d, c.h, c.hk, c.lens_q.len());
    let (max_q, max_k) = (*c.lens_q.iter().max().unwrap(), *c.lens_k.iter().max().unwrap());
    let (q, cu_q) = features::pack::<T>(rng, &c.lens_q, h, d);
    let (mut k, cu_k) = features::pack::<T>(rng, &c.lens_k, hk, d);
    let (mut v, _) = features::pack::<T>(rng, &c.lens_k, hk, d);
    let used: Vec<usize> = c.used.clone().unwrap_or_else(|| c.lens_k.clone());
    for b in 0..batch {
        for t in cu_k[b] as usize + used[b]..cu_k[b + 1] as usize {
            k.slice_mut(s![t, .., ..]).fill(T::from_f32(f32::NAN));
            v.slice_mut(s![t, .., ..]).fill(T::from_f32(f32::NAN));
        }
    }
    let (tq, tk) = (q.dim().0, k.dim().0);
    let label = format!(
        "{} varlen d{d} h{h}/{hk} lens_q {:?} lens_k {:?} used {:?} {:?}",
        T::DTYPE.name(),
        c.lens_q,
        c.lens_k,
        c.used,
        c.params
    );
    let (lq, lk) = (TensorLayout::varlen(tq, h, d), TensorLayout::varlen(tk, hk, d));
    let used_i32: Vec<i32> = used.iter().map(|&u| u as i32).collect();
    let problem = flash_attn::advanced::validate::validate_varlen(
        (&lq, q.len()),
        (&lk, k.len()),
        (&lk, v.len()),
        (&lq, q.len()),
        (cu_q.len(), cu_k.len(), c.used.as_ref().map(|u| u.len())),
        (max_q, max_k),
        &c.params,
    )
    .map_err(|x| format!("{label}: {x}"))?;
    let plan = g.fa.plan::<T>(&problem, &c.params, false, true).map_err(|x| x.to_string())?;
    let kernel = match plan {
        Plan::Hopper { kernel, .. } if kernel.vw => kernel.name,
        other => return Err(format!("{label}: plan is {other:?}, not the Hopper _vw kernel")),
    };
    let (qd, kd, vd) = (s.clone_htod(q.as_slice().unwrap()).map_err(e)?, s.clone_htod(k.as_slice().unwrap()).map_err(e)?, s.clone_htod(v.as_slice().unwrap()).map_err(e)?);
    let (cqd, ckd, sud) = (s.clone_htod(&cu_q).map_err(e)?, s.clone_htod(&cu_k).map_err(e)?, s.clone_htod(&used_i32).map_err(e)?);
    let varlen = Varlen { cu_seqlens_q: &cqd, cu_seqlens_k: &ckd, max_seqlen_q: max_q, max_seqlen_k: max_k, seqused_k: c.used.as_ref().map(|_| &sud as _) };
    let mut od: CudaSlice<T> = s.clone_htod(&vec![T::from_f32(f32::NAN); q.len()]).map_err(e)?;
    let mut lse: CudaSlice<f32> = s.clone_htod(&vec![f32::NAN; h * tq]).map_err(e)?;
    g.fa
        .forward_varlen_into(
            s,
            Tensor::new(&qd, lq),
            Tensor::new(&kd, lk),
            Tensor::new(&vd, lk),
            TensorMut::new(&mut od, lq),
            &mut lse,
            &varlen,
            &c.params,
            &Extras::default(),
        )
        .map_err(|x| format!("{label}: {x}"))?;
    s.synchronize().map_err(e)?;
    let o = Array3::from_shape_vec((tq, h, d), s.clone_dtoh(&od).map_err(e)?).unwrap();
    let lse = Array2::from_shape_vec((h, tq), s.clone_dtoh(&lse).map_err(e)?).unwrap();
    let seg = |a: &Array3<T>, cu: &[i32], b: usize, n: usize| a.slice(s![cu[b] as usize..cu[b] as usize + n, .., ..]).to_owned().insert_axis(Axis(0));
    let mut worst = String::new();
    for b in 0..batch {
        let (qb, kb, vb) = (seg(&q, &cu_q, b, c.lens_q[b]), seg(&k, &cu_k, b, used[b]), seg(&v, &cu_k, b, used[b]));
        let ob = seg(&o, &cu_q, b, c.lens_q[b]);
        let lseb: Vec<f32> = (0..h).flat_map(|hh| (cu_q[b]..cu_q[b + 1]).map(move |i| (hh, i as usize))).map(|(hh, i)| lse[[hh, i]]).collect();
        let what = format!("{label}: {kernel} seq {b} ({} q, {} of {} k)", c.lens_q[b], used[b], c.lens_k[b]);
        if used[b] == 0 {
            if !(ob.iter().all(|x| x.to_f32() == 0.0) && lseb.iter().all(|&x| x == f32::NEG_INFINITY)) {
                return Err(format!("{what}: no key → O = 0 and lse = −inf expected"));
            }
            continue;
        }
        let spec = Spec { params: c.params, alibi: None, norm_seqlen_k: Some(max_k) };
        worst = rule(&qb, &kb, &vb, &spec, &ob, &lseb).map_err(|m| format!("{what}: {m}"))?;
    }
    Ok(format!("{label}: {kernel}: ok (last: {worst})"))
}

fn run_all(test: &str, f: impl FnOnce(&Gpu, &mut Rng, &mut Vec<String>)) {
    let Some(g) = hopper(test) else { return };
    let mut rng = Rng::fresh(test);
    let mut failures = Vec::new();
    f(g, &mut rng, &mut failures);
    assert!(failures.is_empty(), "{} failures:\n{}", failures.len(), failures.join("\n"));
}

fn report(res: Result<String, String>, failures: &mut Vec<String>) {
    match res {
        Ok(m) => println!("ok   {m}"),
        Err(m) => {
            println!("FAIL {m}");
            failures.push(m);
        }
    }
}

/// Random lengths (with 1, tile multiples and one past them), Nq ≠ Nk per
/// sequence, causal or not, GQA and MHA, seqused_k (unused keys NaN),
/// windows: every head dim, both dtypes.
#[test]
fn gpu_hopper_varlen() {
    run_all("gpu_hopper_varlen", |g, rng, failures| {
        for (i, d) in head_dims().into_iter().enumerate() {
            let rand_lens = |rng: &mut Rng, n: usize, max: usize| -> Vec<usize> { (0..n).map(|_| 1 + rng.below(max)).collect() };
            let mut cases = Vec::new();
            // Causal, Nq ≠ Nk per sequence, GQA 6/2; lengths 1 and random.
            let mut lq = rand_lens(rng, 5, 300);
            let mut lk = rand_lens(rng, 5, 300);
            lq[1] = 1;
            lk[3] = 1;
            cases.push(VarlenCase { d, h: 6, hk: 2, lens_q: lq, lens_k: lk, used: None, params: ForwardParams { causal: true, ..Default::default() } });
            // Not causal, MHA, tile multiples and one past, seqused_k.
            let lens = vec![128, 129, 256, 64, 1, 257];
            let used: Vec<usize> = lens.iter().map(|&l| if l > 1 { rng.below(l + 1) } else { 1 }).collect();
            cases.push(VarlenCase { d, h: 4, hk: 4, lens_q: lens.clone(), lens_k: lens, used: Some(used), params: ForwardParams::default() });
            // Causal + seqused_k + MQA, Nq ≠ Nk.
            let lq = rand_lens(rng, 4, 260);
            let lk = rand_lens(rng, 4, 260);
            let used: Vec<usize> = lk.iter().map(|&l| rng.below(l + 1)).collect();
            cases.push(VarlenCase { d, h: 4, hk: 1, lens_q: lq, lens_k: lk, used: Some(used), params: ForwardParams { causal: true, ..Default::default() } });
            // Sliding windows: causal + left, and both sides (not causal).
            let lq = rand_lens(rng, 4, 300);
            let lk = rand_lens(rng, 4, 300);
            let left = Some(rng.below(200));
            cases.push(VarlenCase { d, h: 4, hk: 2, lens_q: lq.clone(), lens_k: lk.clone(), used: None, params: ForwardParams { causal: true, window_left: left, ..Default::default() } });
            let (l, r) = (Some(rng.below(150)), Some(rng.below(60)));
            cases.push(VarlenCase { d, h: 4, hk: 2, lens_q: lq, lens_k: lk, used: None, params: ForwardParams { window_left: l, window_right: r, ..Default::default() } });
            for (j, c) in cases.iter().enumerate() {
                let res = if (i + j) % 2 == 0 { varlen_check::<f16>(g, rng, c) } else { varlen_check::<bf16>(g, rng, c) };
                report(res, failures);
            }
        }
    });
}

/// Dense calls with a sliding window run the `_vw` kernels too: windows on
/// both sides, causal + left, rows that see no key (Nq > Nk with a right
/// side of 0); a window wider than the keys is no window (normalized away:
/// the dense kernel).
#[test]
fn gpu_hopper_dense_window() {
    run_all("gpu_hopper_dense_window", |g, rng, failures| {
        for (i, d) in head_dims().into_iter().enumerate() {
            let shapes = [
                (2, 300, 333, 4, 2, false, Some(37), Some(11), true),
                (1, 333, 300, 4, 4, true, Some(100), None, true),
                (2, 200, 77, 2, 1, false, Some(5), Some(0), true),
                (1, 129, 640, 2, 2, false, None, Some(3), true),
                (1, 256, 256, 2, 2, true, Some(1000), None, false),
            ];
            for (j, &(b, sq, sk, h, hk, causal, wl, wr, vw)) in shapes.iter().enumerate() {
                let params = ForwardParams { causal, window_left: wl, window_right: wr, ..Default::default() };
                let res = if (i + j) % 2 == 0 {
                    dense_window_check::<f16>(g, rng, (b, sq, sk, h, hk, d), &params, vw)
                } else {
                    dense_window_check::<bf16>(g, rng, (b, sq, sk, h, hk, d), &params, vw)
                };
                report(res, failures);
            }
        }
    });
}

fn dense_window_check<T: AttnElem>(
    g: &Gpu,
    rng: &mut Rng,
    (b, sq, sk, h, hk, d): (usize, usize, usize, usize, usize, usize),
    params: &ForwardParams,
    vw: bool,
) -> Result<String, String> {
    let s = &g.stream;
    let e = |x: cudarc::driver::DriverError| x.to_string();
    let (q, k, v) = (random4::<T>(rng, (b, sq, h, d)), random4::<T>(rng, (b, sk, hk, d)), random4::<T>(rng, (b, sk, hk, d)));
    let label = format!("{} dense b{b} sq{sq} sk{sk} h{h}/{hk} d{d} {params:?}", T::DTYPE.name());
    let (lq, lk) = (TensorLayout::contiguous([b, sq, h, d]), TensorLayout::contiguous([b, sk, hk, d]));
    let problem = flash_attn::advanced::validate::validate((&lq, q.len()), (&lk, k.len()), (&lk, v.len()), (&lq, q.len()), params).map_err(|x| format!("{label}: {x}"))?;
    let kernel = match g.fa.plan::<T>(&problem, params, false, false).map_err(|x| x.to_string())? {
        Plan::Hopper { kernel, .. } if kernel.vw == vw => kernel.name,
        other => return Err(format!("{label}: plan is {other:?}, not the Hopper {} kernel", if vw { "_vw" } else { "dense" })),
    };
    let (qd, kd, vd) = (s.clone_htod(q.as_slice().unwrap()).map_err(e)?, s.clone_htod(k.as_slice().unwrap()).map_err(e)?, s.clone_htod(v.as_slice().unwrap()).map_err(e)?);
    let mut od: CudaSlice<T> = s.clone_htod(&vec![T::from_f32(f32::NAN); q.len()]).map_err(e)?;
    let mut lse: CudaSlice<f32> = s.clone_htod(&vec![f32::NAN; b * h * sq]).map_err(e)?;
    g.fa
        .forward_into_ext(s, Tensor::new(&qd, lq), Tensor::new(&kd, lk), Tensor::new(&vd, lk), TensorMut::new(&mut od, lq), StatsMut::LogSumExp(lse.as_view_mut()), params, &Extras::default())
        .map_err(|x| format!("{label}: {x}"))?;
    s.synchronize().map_err(e)?;
    let o = Array4::from_shape_vec((b, sq, h, d), s.clone_dtoh(&od).map_err(e)?).unwrap();
    let lse = s.clone_dtoh(&lse).map_err(e)?;
    let spec = Spec { params: *params, alibi: None, norm_seqlen_k: None };
    let m = rule(&q, &k, &v, &spec, &o, &lse).map_err(|m| format!("{label}: {kernel}: {m}"))?;
    Ok(format!("{label}: {kernel}: {m}"))
}

/// Small varlen + window cases of every `_vw` kernel for compute-sanitizer
/// (memcheck, racecheck, synccheck): a sequence of one row, tails, seqused_k
/// with NaN beyond it (the shared-memory zeroing of V's tail rows).
#[test]
fn gpu_hopper_varlen_small() {
    run_all("gpu_hopper_varlen_small", |g, rng, failures| {
        for d in head_dims() {
            let c = VarlenCase {
                d,
                h: 2,
                hk: 1,
                lens_q: vec![1, 70, 131],
                lens_k: vec![90, 1, 150],
                used: Some(vec![77, 1, 140]),
                params: ForwardParams { causal: true, window_left: Some(50), ..Default::default() },
            };
            report(varlen_check::<f16>(g, rng, &c), failures);
            let c = VarlenCase { params: ForwardParams::default(), used: None, ..c };
            report(varlen_check::<bf16>(g, rng, &c), failures);
        }
    });
}

/// Device-side prefix sums the host cannot see are clamped in the kernel:
/// garbage (negative, decreasing, past the buffer) never makes a Hopper
/// kernel read or write out of bounds (the stage script runs this under
/// compute-sanitizer memcheck), the launch succeeds and every output is
/// finite.
#[test]
fn gpu_hopper_varlen_garbage_prefix_sums_stay_in_bounds() {
    run_all("gpu_hopper_varlen_garbage_prefix_sums_stay_in_bounds", |g, _rng, failures| {
        let s = &g.stream;
        for d in head_dims() {
            let (tq, tk, h) = (40, 50, 2);
            let q = s.clone_htod(&vec![half::f16::from_f32(0.5); tq * h * d]).unwrap();
            let k = s.clone_htod(&vec![half::f16::from_f32(0.25); tk * h * d]).unwrap();
            let cu_q = s.clone_htod(&[0i32, 30, -7, 1 << 30]).unwrap();
            let cu_k = s.clone_htod(&[5i32, 2, 1 << 30, -1]).unwrap();
            let used = s.clone_htod(&[1000i32, -3, 7]).unwrap();
            let params = ForwardParams { causal: true, ..Default::default() };
            let (lq, lk) = (TensorLayout::varlen(tq, h, d), TensorLayout::varlen(tk, h, d));
            let problem = flash_attn::advanced::validate::validate_varlen((&lq, tq * h * d), (&lk, tk * h * d), (&lk, tk * h * d), (&lq, tq * h * d), (4, 4, Some(3)), (64, 64), &params).unwrap();
            match g.fa.plan::<f16>(&problem, &params, false, true) {
                Ok(Plan::Hopper { kernel, .. }) if kernel.vw => {}
                other => failures.push(format!("d{d}: plan {other:?}, not the Hopper _vw kernel")),
            }
            let varlen = Varlen { cu_seqlens_q: &cu_q, cu_seqlens_k: &cu_k, max_seqlen_q: 64, max_seqlen_k: 64, seqused_k: Some(&used) };
            let out: Result<_, FlashAttnError> = g.fa.forward_varlen::<half::f16, _, _, _>(s, Tensor::new(&q, lq), Tensor::new(&k, lk), Tensor::new(&k, lk), &varlen, &params, &Extras::default());
            match out {
                Ok(out) => {
                    s.synchronize().unwrap();
                    let o: Vec<half::f16> = s.clone_dtoh(&out.o).unwrap();
                    let ok = o.iter().all(|x| x.to_f32().is_finite());
                    report(if ok { Ok(format!("d{d}: garbage prefix sums: finite output")) } else { Err(format!("d{d}: non-finite output")) }, failures);
                }
                Err(x) => failures.push(format!("d{d}: {x}")),
            }
        }
    });
}
