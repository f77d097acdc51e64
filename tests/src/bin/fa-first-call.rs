//! Time to the first result in a fresh process: `fa-first-call FAMILY`
//! creates the CUDA context and a `FlashAttention`, runs one small forward
//! call of one kernel family, copies the result back, and prints the time of
//! each step and how many kernels were loaded (JIT-compiled).
//!
//! FAMILY: `f32` (f32 FA2), `tc` (bf16 FA2 on the mma.sync tensor-core
//! kernels), `hopper` (bf16 FA2 on the Hopper-native kernels, sm_90a),
//! `decode` (bf16 KV-cache decode). Measure with an empty JIT cache, one
//! fresh process per family, with the prebuilt cubins (the default where
//! they run on the GPU) and with every kernel JIT-compiled from its PTX
//! (`FLASH_ATTN_FORCE_PTX=1`):
//!
//! ```text
//! for f in f32 tc hopper decode; do
//!   CUDA_CACHE_DISABLE=1 target/release/fa-first-call $f
//!   CUDA_CACHE_DISABLE=1 FLASH_ATTN_FORCE_PTX=1 target/release/fa-first-call $f
//! done
//! ```

use std::sync::Arc;
use std::time::Instant;

use flash_attn::{ForwardParams, HostKvCache, KernelFamily, LoopOrder, flash_attn_func_on, flash_attn_with_kvcache};
use half::bf16;
use ndarray::Array4;

fn main() {
    let family = std::env::args().nth(1).unwrap_or_default();
    if let Err(e) = run(&family) {
        eprintln!("fa-first-call {family}: {e}");
        std::process::exit(1);
    }
}

fn ramp<T: Copy>(shape: (usize, usize, usize, usize), f: impl Fn(f32) -> T) -> Array4<T> {
    let n = shape.0 * shape.1 * shape.2 * shape.3;
    Array4::from_shape_vec(shape, (0..n).map(|i| f(((i * 7919) % 1000) as f32 / 1000.0 - 0.5)).collect()).unwrap()
}

fn run(family: &str) -> Result<(), Box<dyn std::error::Error>> {
    let cache = std::env::var("CUDA_CACHE_DISABLE").map(|v| v == "1").unwrap_or(false);
    let t0 = Instant::now();
    let ctx = flash_attn::try_default_context()?;
    let t_ctx = t0.elapsed().as_secs_f64();
    let kind = match family {
        "tc" => KernelFamily::MmaSync,
        "f32" | "hopper" | "decode" => KernelFamily::Auto,
        _ => return Err("usage: fa-first-call f32|tc|hopper|decode".into()),
    };
    let t1 = Instant::now();
    let fa = flash_attn::FlashAttention::with_family(&ctx, kind)?;
    let t_new = t1.elapsed().as_secs_f64();
    if family == "hopper" && !fa.has_hopper_kernels() {
        return Err(format!("no Hopper kernels on {} (compute capability {:?})", fa.device_name(), fa.compute_capability()).into());
    }
    let stream: Arc<_> = ctx.default_stream();
    let (b, n, h, d) = (1, 256, 4, 128);
    let p = ForwardParams { causal: true, loop_order: LoopOrder::Fa2, ..Default::default() };
    let t2 = Instant::now();
    let (checksum, loaded, from_cubins) = match family {
        "f32" => {
            let (q, k, v) = (ramp((b, n, h, d), |x| x), ramp((b, n, h, d), |x| -x), ramp((b, n, h, d), |x| x * x));
            let (o, _) = flash_attn_func_on(&fa, &stream, q.view(), k.view(), v.view(), &p)?;
            (o.iter().map(|x| *x as f64).sum::<f64>(), fa.loaded_kernels(), fa.loaded_cubins())
        }
        "tc" | "hopper" => {
            let (q, k, v) = (
                ramp((b, n, h, d), bf16::from_f32),
                ramp((b, n, h, d), |x| bf16::from_f32(-x)),
                ramp((b, n, h, d), |x| bf16::from_f32(x * x)),
            );
            let (o, _) = flash_attn_func_on(&fa, &stream, q.view(), k.view(), v.view(), &p)?;
            (o.iter().map(|x| x.to_f64()).sum::<f64>(), fa.loaded_kernels(), fa.loaded_cubins())
        }
        _ => {
            // One decode step: 1 query against a 1024-row cache (the
            // process-wide FlashAttention of the ndarray KV-cache API).
            let s_cache = 1024;
            let q = ramp((b, 1, h, d), bf16::from_f32);
            let mut k_cache = ramp((b, s_cache, h, d), |x| bf16::from_f32(-x));
            let mut v_cache = ramp((b, s_cache, h, d), |x| bf16::from_f32(x * x));
            let cache = HostKvCache::Contiguous { k_cache: &mut k_cache, v_cache: &mut v_cache, cache_batch_idx: None };
            let (o, _) = flash_attn_with_kvcache(q.view(), cache, &[s_cache as i32], None, None, &p, None, None)?;
            let (loaded, from_cubins) =
                flash_attn::default_flash_attention().map(|f| (f.loaded_kernels(), f.loaded_cubins())).unwrap_or((0, 0));
            (o.iter().map(|x| x.to_f64()).sum::<f64>(), loaded, from_cubins)
        }
    };
    let t_call = t2.elapsed().as_secs_f64();
    // The decode step runs on the process-wide FlashAttention: ask it.
    let status = match family {
        "decode" => flash_attn::default_flash_attention().map_err(|e| e.to_string()).and_then(|f| f.cubins().map_err(|e| e.to_string())),
        _ => fa.cubins().map_err(|e| e.to_string()),
    };
    let source = match status {
        Ok(ptxas) => format!("cubins of ptxas {ptxas}"),
        Err(why) => format!("PTX JIT: {why}"),
    };
    println!(
        "fa-first-call {family}: {} ({} build, {source}), CUDA_CACHE_DISABLE={}: context {t_ctx:.3} s, FlashAttention::new {t_new:.3} s, \
         first call {t_call:.3} s ({loaded} kernel(s) loaded, {from_cubins} from cubins), total {:.3} s; checksum {checksum:.4}",
        fa.device_name(),
        fa.ptx_build().arch,
        u8::from(cache),
        t0.elapsed().as_secs_f64()
    );
    Ok(())
}
