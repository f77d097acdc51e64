//! Our side on the GPU: one context and stream, `--sets` input sets of the
//! largest shape (uploaded per dtype), a launch of a tensor-core kernel, the
//! Hopper kernel or standard attention through the public API, and its
//! timing with the shared CUDA-event loop (`flash_attn_tests::bench`).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use cudarc::driver::sys;
use cudarc::driver::{CudaContext, CudaSlice, CudaStream, DevicePtr};
use flash_attn::advanced::tc::{TcKernel, TcLoop, TcModule};
use flash_attn::{
    AttnElem, AttnParams, FlashAttention, FlashAttnError, ForwardParams, LoopOrder, StatsMut,
    Tensor, TensorLayout, TensorMut,
};
use flash_attn_tests::bench::{Dtype, Meas, Res, Step, time_events};

use crate::check::{Check, reference};
use crate::configs::{Cfg, OURS, fill_normal};
use crate::opts::Opts;

const LOG2_E: f32 = std::f32::consts::LOG2_E;

/// Configuration → implementation key → measurement.
pub type Results = BTreeMap<Cfg, BTreeMap<&'static str, Meas>>;

pub struct DeviceInfo {
    pub name: String,
    pub cc: (i32, i32),
    pub arch: String,
}

pub struct Gpu {
    ctx: Arc<CudaContext>,
    pub stream: Arc<CudaStream>,
    /// The public API (standard attention) and its loaded module.
    pub fa: FlashAttention,
    tc: TcModule,
    /// `sets` × (q, k, v), each `tokens × hidden` 16-bit elements.
    sets: Vec<[CudaSlice<u16>; 3]>,
    pub o: CudaSlice<u16>,
    o_accum: CudaSlice<f32>,
    pub lse: CudaSlice<f32>,
    m: CudaSlice<f32>,
    /// Set 0 on the host, for the check.
    pub host0: [Vec<u16>; 3],
    loaded: Option<Dtype>,
}

fn dptr<T>(s: &CudaSlice<T>, stream: &CudaStream) -> u64 {
    // Event tracking is off (single stream): the guard records nothing.
    let (p, _guard) = s.device_ptr(stream);
    p
}

/// What runs: a tensor-core kernel, or standard attention through the API.
#[derive(Clone, Copy, Debug)]
pub enum Which {
    Tc(&'static TcKernel),
    /// The Hopper-native kernel (sm_90a build only).
    Hopper(&'static flash_attn::advanced::hopper::HopperKernel),
    Standard,
}

impl Which {
    pub fn key(self) -> &'static str {
        match self {
            Which::Tc(k) if k.loop_order == TcLoop::Fa1 => "fa1",
            Which::Tc(_) => "fa2",
            Which::Hopper(_) => "hopper",
            Which::Standard => "standard",
        }
    }
    fn kernel(self) -> Option<&'static str> {
        match self {
            Which::Tc(k) => Some(k.name),
            Which::Hopper(k) => Some(k.name),
            Which::Standard => None,
        }
    }
}

impl Gpu {
    fn new(o: &Opts, ctx: Arc<CudaContext>) -> Res<Self> {
        // One stream only: no cross-stream tracking needed, and none of its
        // event records inside the timed region.
        // SAFETY: every buffer below is used on `stream` alone.
        unsafe { ctx.disable_event_tracking() };
        let stream = ctx.new_stream()?;
        let t = Instant::now();
        let fa = FlashAttention::new(&ctx)?;
        let tc = TcModule::new(&fa);
        eprintln!(
            "fa-bench: indexed the {} PTX ({} tensor-core kernels, each loaded on its first launch) in {:.3} s",
            fa.ptx_build().arch,
            flash_attn::advanced::tc::TC_KERNELS.len(),
            t.elapsed().as_secs_f64()
        );
        let elems = o.tokens * o.hidden;
        let min_d = *o.dims.iter().min().unwrap();
        let rows = o.tokens * (o.hidden / min_d);
        let need = o.sets * 3 * elems * 2 + elems * 2 + elems * 4 + 2 * rows * 4;
        let (free, total) = ctx.mem_get_info()?;
        eprintln!(
            "fa-bench: GPU memory {:.1} GB free of {:.1} GB; ours needs {:.2} GB ({} input sets of {:.0} MB)",
            free as f64 / 1e9,
            total as f64 / 1e9,
            need as f64 / 1e9,
            o.sets,
            (3 * elems * 2) as f64 / 1e6
        );
        if need > free {
            return Err(format!("not enough GPU memory: need {need} bytes, {free} free").into());
        }
        // SAFETY (alloc): every buffer is written before it is read (inputs
        // uploaded in `load`, outputs written by the kernels or memsets).
        let mut sets = Vec::new();
        for _ in 0..o.sets {
            sets.push(unsafe {
                [
                    stream.alloc::<u16>(elems)?,
                    stream.alloc::<u16>(elems)?,
                    stream.alloc::<u16>(elems)?,
                ]
            });
        }
        let (o_buf, o_accum, lse, m) = unsafe {
            (
                stream.alloc::<u16>(elems)?,
                stream.alloc::<f32>(elems)?,
                stream.alloc::<f32>(rows)?,
                stream.alloc::<f32>(rows)?,
            )
        };
        Ok(Gpu {
            ctx,
            stream,
            fa,
            tc,
            sets,
            o: o_buf,
            o_accum,
            lse,
            m,
            host0: [vec![], vec![], vec![]],
            loaded: None,
        })
    }

    /// Uploads fresh random inputs in `dt` to every set.
    fn load(&mut self, o: &Opts, dt: Dtype) -> Res<()> {
        if self.loaded == Some(dt) {
            return Ok(());
        }
        let t = Instant::now();
        let elems = o.tokens * o.hidden;
        let mut host = vec![0u16; elems];
        for s in 0..o.sets {
            for j in 0..3 {
                let seed = o.seed.wrapping_mul(1_000_003)
                    ^ ((dt as u64) << 40)
                    ^ ((s as u64) << 20)
                    ^ j as u64;
                fill_normal(dt, seed, &mut host);
                self.stream.memcpy_htod(&host, &mut self.sets[s][j])?;
                if s == 0 && o.check {
                    self.host0[j] = host.clone();
                }
            }
        }
        self.stream.synchronize()?;
        self.loaded = Some(dt);
        eprintln!(
            "fa-bench: {} inputs: {} sets uploaded in {:.1} s",
            dt.name(),
            o.sets,
            t.elapsed().as_secs_f64()
        );
        Ok(())
    }

    fn params(&self, o: &Opts, c: &Cfg, k: &TcKernel, set: usize) -> AttnParams {
        let (b, h, n, d) = (c.batch(o), c.heads(o), c.n, c.d);
        let st = [(n * h * d) as u64, (h * d) as u64, d as u64];
        let scale = 1.0 / (d as f32).sqrt();
        let fa1 = k.loop_order == TcLoop::Fa1;
        let s = &self.sets[set % self.sets.len()];
        AttnParams {
            q_ptr: dptr(&s[0], &self.stream),
            k_ptr: dptr(&s[1], &self.stream),
            v_ptr: dptr(&s[2], &self.stream),
            o_ptr: dptr(&self.o, &self.stream),
            lse_ptr: dptr(&self.lse, &self.stream),
            m_ptr: if fa1 { dptr(&self.m, &self.stream) } else { 0 },
            o_accum_ptr: if fa1 {
                dptr(&self.o_accum, &self.stream)
            } else {
                0
            },
            q_stride: st,
            k_stride: st,
            v_stride: st,
            o_stride: st,
            batch: b as u32,
            nheads: h as u32,
            seqlen_q: n as u32,
            seqlen_k: n as u32,
            headdim: d as u32,
            causal: c.causal as u32,
            softmax_scale: scale,
            softmax_scale_log2: scale * LOG2_E,
            br: k.br() as u32,
            bc: k.bc as u32,
            ..Default::default()
        }
    }

    pub fn memset32(&self, p: &CudaSlice<impl Sized>, value: u32, count: usize) -> Res<()> {
        // SAFETY: `p` is a live allocation of at least `count` 4-byte words (callers pass counts within it).
        unsafe {
            sys::cuMemsetD32Async(dptr(p, &self.stream), value, count, self.stream.cu_stream())
                .result()?
        };
        Ok(())
    }

    /// FA1's contract: O accumulator = 0, l = 0, m = −inf before every launch.
    fn fa1_init(&self, o: &Opts, c: &Cfg) -> Res<()> {
        let rows = c.batch(o) * c.heads(o) * c.n;
        self.memset32(&self.o_accum, 0, c.elems(o))?;
        self.memset32(&self.lse, 0, rows)?;
        self.memset32(&self.m, f32::NEG_INFINITY.to_bits(), rows)
    }

    fn launch(&self, o: &Opts, c: &Cfg, k: &TcKernel, set: usize) -> Res<()> {
        let p = self.params(o, c, k, set);
        // SAFETY: q/k/v/o are `tokens × hidden` = batch·seqlen·nheads·d
        // elements with the contiguous strides of `params` (multiples of 8
        // elements, d >= 32), 256-byte aligned by cuMemAlloc; lse and m hold
        // batch·nheads·seqlen f32 (sized for the smallest d); o_accum is
        // contiguous f32 of O's shape; br/bc/headdim come from `k`; FA1's
        // buffers are initialized by `fa1_init` before every launch.
        unsafe { self.tc.launch(&self.stream, k, &p)? };
        Ok(())
    }

    /// Standard attention through the public API (`LoopOrder::Standard`:
    /// three kernels over an f32 S/P scratch matrix it allocates on the
    /// stream), reading our 16-bit buffers as `T`.
    fn standard<T: AttnElem>(
        &mut self,
        o: &Opts,
        c: &Cfg,
        set: usize,
    ) -> Result<(), FlashAttnError> {
        let elems = c.elems(o);
        let layout = TensorLayout::contiguous([c.batch(o), c.n, c.heads(o), c.d]);
        let params = ForwardParams {
            causal: c.causal,
            softmax_scale: Some(1.0 / (c.d as f32).sqrt()),
            loop_order: LoopOrder::Standard,
            block: None,
            ..Default::default()
        };
        let s = &self.sets[set % self.sets.len()];
        // SAFETY: u16 and T (f16 or bf16) have the same size and alignment,
        // and every bit pattern is a valid T; `elems` is each buffer's length.
        let (q, k, v, mut out) = unsafe {
            (
                s[0].transmute::<T>(elems).expect("q length"),
                s[1].transmute::<T>(elems).expect("k length"),
                s[2].transmute::<T>(elems).expect("v length"),
                self.o.transmute_mut::<T>(elems).expect("o length"),
            )
        };
        let lse = self.lse.as_view_mut();
        self.fa.forward_into(
            &self.stream,
            Tensor::new(&q, layout),
            Tensor::new(&k, layout),
            Tensor::new(&v, layout),
            TensorMut::new(&mut out, layout),
            StatsMut::LogSumExp(lse),
            &params,
        )
    }

    /// Work before a timed run, outside the events (FA1's initialization).
    pub fn pre(&self, o: &Opts, c: &Cfg, w: Which) -> Res<()> {
        match w {
            Which::Tc(k) if k.loop_order == TcLoop::Fa1 => self.fa1_init(o, c),
            _ => Ok(()),
        }
    }

    /// One run of `w` on input set `set`.
    pub fn go(&mut self, o: &Opts, c: &Cfg, w: Which, set: usize) -> Res<()> {
        match w {
            Which::Tc(k) => self.launch(o, c, k, set),
            Which::Hopper(k) => {
                let fa2 = TcKernel::default_for(TcLoop::Fa2, k.bf16, k.d, Default::default())
                    .ok_or("no FA2 kernel")?;
                let p = AttnParams {
                    br: k.br() as u32,
                    bc: k.bc as u32,
                    ..self.params(o, c, fa2, set)
                };
                // SAFETY: as `launch` (same buffers and contiguous strides);
                // headdim a multiple of 8 ≤ k.d (`hopper_head_dim`).
                unsafe { flash_attn::advanced::hopper::launch_params(&self.fa, &self.stream, k, &p)? };
                Ok(())
            }
            Which::Standard => match c.dtype {
                Dtype::F16 => Ok(self.standard::<half::f16>(o, c, set)?),
                Dtype::Bf16 => Ok(self.standard::<half::bf16>(o, c, set)?),
            },
        }
    }

    /// Times `w`: warm-up, then up to `--reps` runs on rotating input sets,
    /// each between two CUDA events; the median.
    fn time(&mut self, o: &Opts, c: &Cfg, w: Which) -> Res<Meas> {
        let (ctx, stream) = (self.ctx.clone(), self.stream.clone());
        let m = time_events(&ctx, &stream, o.timing(), |step| match step {
            Step::Setup(_) => self.pre(o, c, w),
            Step::Timed(i) => self.go(o, c, w, i),
        })?;
        Ok(Meas {
            kernel: w.kernel(),
            ..m
        })
    }
}

fn progress(
    i: usize,
    total: usize,
    c: &Cfg,
    imp: &str,
    m: &Meas,
    flops: f64,
    requested_reps: usize,
) {
    let what = match m.ms {
        Some(ms) => format!(
            "{ms:9.3} ms {:7.1} TFLOP/s ({} runs{})",
            flops / ms / 1e9,
            m.reps,
            if m.reps < requested_reps {
                ", time budget"
            } else {
                ""
            }
        ),
        None => format!("n/a ({})", m.note),
    };
    let k = m.kernel.map_or(String::new(), |k| format!(" {k}"));
    eprintln!("[ours  {i:3}/{total}] {} {imp:15} {what}{k}", c.label());
}

/// Checks (with `--check`) and times our implementations on every
/// configuration; fills `info` with the device.
pub fn run_ours(
    o: &Opts,
    cfgs: &[Cfg],
    results: &mut Results,
    checks: &mut BTreeMap<Cfg, Vec<Check>>,
    info: &mut Option<DeviceInfo>,
) -> Res<()> {
    let ours: Vec<&'static str> = o
        .impls
        .iter()
        .copied()
        .filter(|k| OURS.contains(k))
        .collect();
    if ours.is_empty() && !o.check {
        return Ok(());
    }
    // SAFETY: only tries to dlopen the driver library (cudarc panics instead
    // of returning an error when it is missing).
    if !unsafe { sys::is_culib_present() } {
        return Err("no CUDA driver library (libcuda.so) on this machine".into());
    }
    let ctx = CudaContext::new(0)?;
    let cc = ctx.compute_capability()?;
    let build = flash_attn::advanced::ptx::for_compute_capability(cc.0, cc.1).ok_or_else(|| {
        format!(
            "compute capability {}.{} is below sm_80: no tensor-core PTX",
            cc.0, cc.1
        )
    })?;
    *info = Some(DeviceInfo {
        name: ctx.name()?,
        cc,
        arch: build.arch.to_string(),
    });
    eprintln!(
        "fa-bench: {} (sm_{}{}), {} configurations",
        ctx.name()?,
        cc.0,
        cc.1,
        cfgs.len()
    );
    let mut gpu = Gpu::new(o, ctx)?;
    let smem_limit = gpu.fa.limits().max_smem_per_block;
    let total = cfgs.len();
    for (ci, c) in cfgs.iter().enumerate() {
        gpu.load(o, c.dtype)?;
        let flops = c.flops(o);
        // What the library picks on this device (the tuned default, or a
        // smaller tile where shared memory is short).
        let kernel = |lo| {
            TcKernel::default_fitting(
                lo,
                c.dtype == Dtype::Bf16,
                c.d,
                Default::default(),
                smem_limit,
            )
        };
        let fa1_skip = c.n > o.fa1_max_seqlen;
        let std_skip = c.s_bytes(o) > o.mem_cap_gb * 1e9;
        // What runs for each of our implementations, or why not.
        let (has_hopper, build_arch) = (gpu.fa.has_hopper_kernels(), gpu.fa.ptx_build().arch);
        let plan = |key: &str| -> Result<Which, String> {
            match key {
                "fa2" => kernel(TcLoop::Fa2)
                    .map(Which::Tc)
                    .ok_or_else(|| "no FA2 tensor-core kernel for this dtype/d".into()),
                "hopper" if !has_hopper => {
                    Err(format!("no sm_90a build on this device ({build_arch})"))
                }
                // FA_BENCH_HOPPER=<variant> (e.g. bc128_ov_pp): a candidate
                // kernel instead of the default. Head dims without their own
                // kernel run the one the library pads them onto.
                "hopper" => flash_attn::advanced::hopper::hopper_head_dim(c.d)
                    .and_then(|kd| {
                        let bf16 = c.dtype == Dtype::Bf16;
                        std::env::var("FA_BENCH_HOPPER")
                            .ok()
                            .and_then(|v| flash_attn::advanced::hopper::HopperKernel::find_variant(bf16, kd, &v))
                            .or_else(|| flash_attn::advanced::hopper::HopperKernel::find(bf16, kd))
                    })
                    .map(Which::Hopper)
                    .ok_or_else(|| "no Hopper kernel for this dtype/d".into()),
                "fa1" if fa1_skip => Err(format!(
                    "skipped: N > --fa1-max-seqlen {} (FA1's grid is batch·heads = {} blocks)",
                    o.fa1_max_seqlen,
                    c.batch(o) * c.heads(o)
                )),
                "fa1" => kernel(TcLoop::Fa1)
                    .map(Which::Tc)
                    .ok_or_else(|| "no FA1 tensor-core kernel for this dtype/d".into()),
                _ if std_skip => Err(format!(
                    "skipped: the f32 S matrix would need {:.0} GB > --mem-cap-gb {}",
                    c.s_bytes(o) / 1e9,
                    o.mem_cap_gb
                )),
                _ => Ok(Which::Standard),
            }
        };
        // Standard goes through the public API: probe it once (it refuses
        // what it does not support before launching anything).
        let mut std_err: Option<String> = None;
        if ours.contains(&"standard")
            && !std_skip
            && !o.check_only
            && let Err(e) = gpu
                .go(o, c, Which::Standard, 0)
                .and_then(|_| Ok(gpu.stream.synchronize()?))
        {
            std_err = Some(format!("public API: {e}"));
        }
        if o.check {
            let refs = reference(o, c, &gpu.host0);
            let mut v = Vec::new();
            for &key in &ours {
                let Ok(w) = plan(key) else { continue };
                if key == "standard" && std_err.is_some() {
                    continue;
                }
                let ch = match gpu.check(o, c, w, &refs) {
                    Err(e) if key == "standard" => {
                        std_err = Some(format!("public API: {e}"));
                        continue;
                    }
                    r => r?,
                };
                eprintln!(
                    "[check {:3}/{total}] {} {key:15} {}",
                    ci + 1,
                    c.label(),
                    ch.line(c.dtype)
                );
                v.push(ch);
            }
            checks.insert(*c, v);
        }
        if o.check_only {
            continue;
        }
        let row = results.entry(*c).or_default();
        for &key in &ours {
            let m = match (plan(key), &std_err) {
                (Err(why), _) => Meas::na(why),
                (Ok(Which::Standard), Some(e)) => Meas::na(e.clone()),
                (Ok(w), _) => gpu.time(o, c, w)?,
            };
            progress(ci + 1, total, c, key, &m, flops, o.reps);
            row.insert(key, m);
        }
    }
    Ok(())
}
