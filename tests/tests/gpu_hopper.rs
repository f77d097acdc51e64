//! The Hopper-native kernels (sm_90a, `kernel-crate/src/hopper`) on a
//! compute capability 9.0 GPU:
//!
//! * `gpu_hopper_probe`: one tile through TMA (128B swizzle, tensor maps as
//!   by-value parameters, a key tail zero-filled by the copy engine) and
//!   both wgmma forms (`S = Q·Kᵀ` from two K-major descriptors, `O = P·V`
//!   with P in registers and V read MN-major), compared with f64: S and O
//!   must agree to f32 accumulation (1e-5), the zero-filled columns exactly.
//! * `gpu_hopper_forward_*`: `FlashAttention::forward_into` on the default
//!   (Hopper) plan — asserted to be `Plan::Hopper` — against the f64
//!   reference with the rule of `gpu_half.rs` (`err(o) ≤ 2·err(naive)` and
//!   `< 2e-3` (f16) / `1e-2` (bf16); logsumexp within 1e-4; every output
//!   poisoned with NaN first; fresh random inputs).
//! * `gpu_hopper_small`: one small shape per kernel, the target of the
//!   compute-sanitizer runs (memcheck, racecheck, synccheck).
//!
//! On other GPUs (or with no GPU) the tests print why and pass, except that
//! `FA_REQUIRE_GPU=1` without any GPU fails (as every GPU test).

use cudarc::driver::{CudaSlice, LaunchConfig};
use flash_attn::dispatch::Plan;
use flash_attn::hopper::{HOPPER_KERNELS, HopperKernel, PROBE_SMEM_BYTES, TensorMap};
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
fn check_case<T: AttnElem>(g: &Gpu, c: &Case, rng: &mut Rng) -> Result<String, String> {
    let dt = T::DTYPE.name();
    let x = Inputs::<T>::random(c, rng);
    // The plan must be the Hopper kernel.
    let l = TensorLayout::contiguous(c.q_shape());
    let lk = TensorLayout::contiguous(c.k_shape());
    let problem = flash_attn::api::validate(
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

/// The head dims with a Hopper kernel.
fn head_dims() -> Vec<usize> {
    let mut d: Vec<usize> = HOPPER_KERNELS.iter().map(|k| k.d).collect();
    d.sort();
    d.dedup();
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
    unsafe { flash_attn::hopper::launch_params(&g.fa, s, k, &p) }.map_err(|e| e.to_string())?;
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
    unsafe { flash_attn::hopper::launch_with_maps(s, f, cfg, &[tq, tk, tv], &p) }.unwrap();
    println!("{name}: tensor maps in global memory: {}", flash_attn::hopper::tensor_maps_in_global_memory());
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
