//! Our side on the GPU: one context and stream, per-case input sets (random,
//! rotated, together far over the 50 MB L2), one call through the public API
//! (`forward_into` / `forward_varlen_into`: caller buffers, nothing
//! allocated inside the timed region), and its timing with CUDA events
//! (warm-up, then the median of `--reps` runs, each on the next input set).
//! The method is `fa-bench`'s (`shared/GPU-NOTES.md`, "Method").

use std::sync::Arc;
use std::time::Instant;

use cudarc::driver::sys;
use cudarc::driver::{CudaContext, CudaSlice, CudaStream, DevicePtr};
use flash_attn::{AttnElem, Extras, FlashAttention, FlashAttnError, ForwardParams, StatsMut, Tensor, TensorLayout, TensorMut, Varlen};
use flash_attn_tests::bench::{Step, Timing, time_events};

use crate::Opts;
use crate::configs::{Case, Dtype, Shape};

pub use flash_attn_tests::bench::{Meas, Res};

pub struct Gpu {
    pub ctx: Arc<CudaContext>,
    pub stream: Arc<CudaStream>,
    pub fa: FlashAttention,
    pub name: String,
    pub cc: (i32, i32),
}

/// A case's device buffers: `sets` × (q, k, v) as 16-bit words, O, the LSE,
/// the prefix sums (varlen), and set 0 on the host for the check.
pub struct Inputs {
    pub sets: Vec<[CudaSlice<u16>; 3]>,
    pub o: CudaSlice<u16>,
    pub lse: CudaSlice<f32>,
    pub cu: Option<CudaSlice<i32>>,
    pub host0: [Vec<u16>; 3],
}

pub fn dptr<T>(s: &CudaSlice<T>, stream: &CudaStream) -> u64 {
    // Event tracking is off (one stream): the guard records nothing.
    let (p, _guard) = s.device_ptr(stream);
    p
}

/// Fills `out` with values uniform in (−√3, √3) (unit variance, never 0),
/// rounded to `dt`; parallel, deterministic in `seed`.
pub fn fill(dt: Dtype, seed: u64, out: &mut [u16]) {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).min(64);
    let per = out.len().div_ceil(threads).max(1 << 16);
    std::thread::scope(|s| {
        for (t, part) in out.chunks_mut(per).enumerate() {
            s.spawn(move || {
                for (i, x) in part.iter_mut().enumerate() {
                    let mut z = seed ^ ((t * per + i) as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
                    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
                    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
                    z ^= z >> 31;
                    let u = ((z >> 40) as f32 + 0.5) * (1.0 / 16_777_216.0);
                    *x = dt.bits((2.0 * u - 1.0) * 1.732_050_8);
                }
            });
        }
    });
}

impl Gpu {
    pub fn new() -> Res<Self> {
        // SAFETY: only tries to dlopen the driver library.
        if !unsafe { sys::is_culib_present() } {
            return Err("no CUDA driver library (libcuda.so) on this machine".into());
        }
        let ctx = CudaContext::new(0)?;
        // SAFETY: one stream only; every buffer is used on it alone, so no
        // cross-stream events are needed (and none land in the timed region).
        unsafe { ctx.disable_event_tracking() };
        let stream = ctx.new_stream()?;
        let t = Instant::now();
        // FA_BENCH_FAMILY=mma-sync: the mma.sync kernels only (to compare
        // with the Hopper kernels on the same GPU).
        let family = if std::env::var("FA_BENCH_FAMILY").is_ok_and(|v| v == "mma-sync") {
            flash_attn::KernelFamily::MmaSync
        } else {
            flash_attn::KernelFamily::Auto
        };
        let fa = FlashAttention::with_family(&ctx, family)?;
        eprintln!("fa-bench-infer: loaded the {} PTX in {:.1} s", fa.ptx_build().arch, t.elapsed().as_secs_f64());
        let (name, cc) = (ctx.name()?, ctx.compute_capability()?);
        Ok(Gpu { ctx, stream, fa, name, cc })
    }

    /// Allocates and fills `c`'s input sets (fresh random data per set).
    pub fn inputs(&self, o: &Opts, c: &Case, case_ix: usize) -> Res<Inputs> {
        let (qe, ke, le) = c.shape.elems();
        let need = o.sets * (qe + 2 * ke) * 2 + qe * 2 + le * 4;
        let (free, _) = self.ctx.mem_get_info()?;
        if need + (1 << 30) > free {
            return Err(format!("needs {:.1} GB of GPU memory, {:.1} GB free", need as f64 / 1e9, free as f64 / 1e9).into());
        }
        let t = Instant::now();
        let mut host0: [Vec<u16>; 3] = [vec![], vec![], vec![]];
        let mut sets = Vec::new();
        let mut host = vec![0u16; qe.max(ke)];
        for s in 0..o.sets {
            let mut set = Vec::new();
            for (j, len) in [qe, ke, ke].into_iter().enumerate() {
                let seed = o.seed.wrapping_mul(1_000_003) ^ ((case_ix as u64) << 40) ^ ((s as u64) << 20) ^ j as u64;
                fill(c.dtype, seed, &mut host[..len]);
                // SAFETY: written right below, before any read.
                let mut d = unsafe { self.stream.alloc::<u16>(len)? };
                self.stream.memcpy_htod(&host[..len], &mut d)?;
                if s == 0 && o.check {
                    host0[j] = host[..len].to_vec();
                }
                set.push(d);
            }
            sets.push(<[CudaSlice<u16>; 3]>::try_from(set).map_err(|_| "three tensors")?);
        }
        let cu = match &c.shape {
            Shape::Varlen(p) => Some(self.stream.clone_htod(&p.cu())?),
            Shape::Dense(_) => None,
        };
        // SAFETY: written by every call (checked by the poisoned check run).
        let (out, lse) = unsafe { (self.stream.alloc::<u16>(qe)?, self.stream.alloc::<f32>(le)?) };
        self.stream.synchronize()?;
        eprintln!(
            "fa-bench-infer: {}: {} input sets of {:.0} MB in {:.1} s",
            c.id,
            o.sets,
            ((qe + 2 * ke) * 2) as f64 / 1e6,
            t.elapsed().as_secs_f64()
        );
        Ok(Inputs { sets, o: out, lse, cu, host0 })
    }

    /// One call of our library on input set `set`.
    pub fn call(&self, c: &Case, inp: &mut Inputs, set: usize) -> Result<(), FlashAttnError> {
        match c.dtype {
            Dtype::F16 => self.call_t::<half::f16>(c, inp, set),
            Dtype::Bf16 => self.call_t::<half::bf16>(c, inp, set),
        }
    }

    fn call_t<T: AttnElem>(&self, c: &Case, inp: &mut Inputs, set: usize) -> Result<(), FlashAttnError> {
        let (qe, ke, le) = c.shape.elems();
        let s = &inp.sets[set % inp.sets.len()];
        // SAFETY: u16 and T (f16/bf16) have the same size and alignment and
        // every bit pattern is a valid T; the lengths are the buffers'.
        let (q, k, v, mut out) = unsafe {
            (
                s[0].transmute::<T>(qe).expect("q length"),
                s[1].transmute::<T>(ke).expect("k length"),
                s[2].transmute::<T>(ke).expect("v length"),
                inp.o.transmute_mut::<T>(qe).expect("o length"),
            )
        };
        let mut lse = inp.lse.slice_mut(0..le);
        let params = ForwardParams { causal: c.causal, block: c.block, ..Default::default() };
        match &c.shape {
            Shape::Dense(d) => {
                let ql = TensorLayout::contiguous([d.b, d.n, d.h, d.d]);
                let kl = TensorLayout::contiguous([d.b, d.n, d.hk, d.d]);
                let (q, k, v) = (Tensor::new(&q, ql), Tensor::new(&k, kl), Tensor::new(&v, kl));
                self.fa.forward_into(&self.stream, q, k, v, TensorMut::new(&mut out, ql), StatsMut::LogSumExp(lse), &params)
            }
            Shape::Varlen(p) => {
                let l = TensorLayout::varlen(p.total(), p.h, p.d);
                let cu = inp.cu.as_ref().expect("varlen prefix sums");
                let vl = Varlen { cu_seqlens_q: cu, cu_seqlens_k: cu, max_seqlen_q: p.max(), max_seqlen_k: p.max(), seqused_k: None };
                let (q, k, v) = (Tensor::new(&q, l), Tensor::new(&k, l), Tensor::new(&v, l));
                let o = TensorMut::new(&mut out, l);
                self.fa.forward_varlen_into(&self.stream, q, k, v, o, &mut lse, &vl, &params, &Extras::default())
            }
        }
    }

    /// Warm-up (each run timed: the fastest sizes the repetition count),
    /// then up to `--reps` runs on rotating sets between CUDA events; the
    /// median (the shared loop, `flash_attn_tests::bench::time_events`).
    pub fn time(&self, o: &Opts, c: &Case, inp: &mut Inputs) -> Res<Meas> {
        let t = Timing { warmup: o.warmup, reps: o.reps, budget_s: o.budget_s };
        time_events(&self.ctx, &self.stream, t, |step| match step {
            Step::Setup(_) => Ok(()),
            Step::Timed(i) => Ok(self.call(c, inp, i)?),
        })
    }

    /// Fills O with NaN (0xFFFF in f16 and bf16) and the LSE with NaN.
    pub fn poison(&self, inp: &Inputs) -> Res<()> {
        let cs = self.stream.cu_stream();
        // SAFETY: each pointer starts a live allocation of exactly `len` elements.
        unsafe {
            sys::cuMemsetD16Async(dptr(&inp.o, &self.stream), 0xFFFF, inp.o.len(), cs).result()?;
            sys::cuMemsetD32Async(dptr(&inp.lse, &self.stream), u32::MAX, inp.lse.len(), cs).result()?;
        }
        Ok(())
    }
}
