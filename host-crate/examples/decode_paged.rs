//! Decode against a paged KV cache, one token per step, the step captured
//! once in a CUDA graph and replayed.
//!
//! The cache is a pool of 16-token pages `(num_pages, 16, nheads_k, d)`; a
//! block table `(batch, max_blocks_per_seq)` lists each sequence's pages
//! (here in a shuffled order, as an allocator hands them out). Each step
//! writes the new token's q, k, v and the sequence lengths into fixed
//! buffers; `forward_kvcache_into` appends k, v into the pages and attends
//! over the whole cache, split-KV with the combine fused, into the caller's
//! O and LSE. With a caller's `SplitScratch` that call allocates, copies and
//! synchronizes nothing, so it can be captured (`begin_capture` …
//! `end_capture`) and replayed: one graph launch per step.
//!
//! ```sh
//! cargo run -p flash-attn --example decode_paged
//! ```
//!
//! Every step is checked against `flash_attn_with_kvcache` on host arrays
//! (f32 runs the CPU reference), which keeps its own copy of the pages.
//! Without a GPU only that CPU decode loop runs; the example says so.

use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream, sys};
use flash_attn::{
    Backend, BlockTable, DecodeOptions, Extras, FlashAttention, ForwardParams, HostKvCache, KvCache, SplitScratch, Tensor,
    TensorLayout, TensorMut, default_backend, flash_attn_with_kvcache,
};
use half::bf16;
use ndarray::{Array2, Array4};

const BATCH: usize = 2;
const NHEADS: usize = 32;
const NHEADS_K: usize = 8;
const D: usize = 128;
const PAGE: usize = 16;
const MAX_BLOCKS: usize = 32; // 512 tokens per sequence at most
const NUM_PAGES: usize = BATCH * MAX_BLOCKS;
const SPLITS: usize = 4;
const STEPS: usize = 8;

/// Values exactly representable in bf16, so the host model and the device
/// hold the same numbers.
fn value(i: usize, salt: f32) -> f32 {
    bf16::from_f32((0.017 * i as f32 + salt).sin()).to_f32()
}

fn array4(shape: (usize, usize, usize, usize), salt: f32) -> Array4<f32> {
    let n = shape.1 * shape.2 * shape.3;
    Array4::from_shape_fn(shape, |(a, b, c, e)| value(a * n + (b * shape.2 + c) * shape.3 + e, salt))
}

/// The host side of one step: the token's inputs.
struct StepInputs {
    q: Array4<f32>,
    k_new: Array4<f32>,
    v_new: Array4<f32>,
}

fn step_inputs(step: usize) -> StepInputs {
    let salt = step as f32 * 0.61;
    StepInputs {
        q: array4((BATCH, 1, NHEADS, D), salt + 0.1),
        k_new: array4((BATCH, 1, NHEADS_K, D), salt + 0.2),
        v_new: array4((BATCH, 1, NHEADS_K, D), salt + 0.3),
    }
}

/// The device buffers of the captured step: their addresses are fixed at
/// capture, their contents change between replays.
struct DeviceStep {
    k_pages: CudaSlice<bf16>,
    v_pages: CudaSlice<bf16>,
    block_table: CudaSlice<i32>,
    cache_seqlens: CudaSlice<i32>,
    q: CudaSlice<bf16>,
    k_new: CudaSlice<bf16>,
    v_new: CudaSlice<bf16>,
    o: CudaSlice<bf16>,
    lse: CudaSlice<f32>,
    o_accum: CudaSlice<f32>,
    lse_accum: CudaSlice<f32>,
    counters: CudaSlice<u32>,
}

fn to_bf16(a: &Array4<f32>) -> Vec<bf16> {
    a.iter().map(|&x| bf16::from_f32(x)).collect()
}

impl DeviceStep {
    fn new(stream: &Arc<CudaStream>, k: &Array4<f32>, v: &Array4<f32>, table: &Array2<i32>) -> flash_attn::Result<Self> {
        Ok(Self {
            k_pages: stream.clone_htod(&to_bf16(k))?,
            v_pages: stream.clone_htod(&to_bf16(v))?,
            block_table: stream.clone_htod(&table.iter().copied().collect::<Vec<_>>())?,
            cache_seqlens: stream.alloc_zeros(BATCH)?,
            q: stream.alloc_zeros(BATCH * NHEADS * D)?,
            k_new: stream.alloc_zeros(BATCH * NHEADS_K * D)?,
            v_new: stream.alloc_zeros(BATCH * NHEADS_K * D)?,
            o: stream.alloc_zeros(BATCH * NHEADS * D)?,
            lse: stream.alloc_zeros(BATCH * NHEADS)?,
            o_accum: stream.alloc_zeros(SPLITS * BATCH * NHEADS * D)?,
            lse_accum: stream.alloc_zeros(SPLITS * BATCH * NHEADS)?,
            counters: stream.alloc_zeros(BATCH * NHEADS)?, // zeroed once; every launch leaves them at 0
        })
    }

    /// Writes one step's inputs into the fixed buffers (outside the graph).
    fn write(&mut self, stream: &Arc<CudaStream>, inp: &StepInputs, lens: &[i32]) -> flash_attn::Result<()> {
        stream.memcpy_htod(&to_bf16(&inp.q), &mut self.q)?;
        stream.memcpy_htod(&to_bf16(&inp.k_new), &mut self.k_new)?;
        stream.memcpy_htod(&to_bf16(&inp.v_new), &mut self.v_new)?;
        stream.memcpy_htod(lens, &mut self.cache_seqlens)?;
        Ok(())
    }

    /// The decode step: append k_new/v_new at `cache_seqlens`, attend over
    /// the pages, write O and the LSE. Only enqueues kernels.
    fn run(&mut self, fa: &FlashAttention, stream: &Arc<CudaStream>, params: &ForwardParams) -> flash_attn::Result<()> {
        let q_layout = TensorLayout::contiguous([BATCH, 1, NHEADS, D]);
        let new_layout = TensorLayout::contiguous([BATCH, 1, NHEADS_K, D]);
        let pool = TensorLayout::contiguous([NUM_PAGES, PAGE, NHEADS_K, D]);
        let cache = KvCache::new(&mut self.k_pages, &mut self.v_pages, pool, &self.cache_seqlens)
            .with_block_table(BlockTable::new(&self.block_table, MAX_BLOCKS))
            .with_new(Tensor::new(&self.k_new, new_layout), Tensor::new(&self.v_new, new_layout));
        let scratch = SplitScratch {
            o_accum: &mut self.o_accum,
            lse_accum: &mut self.lse_accum,
            max_splits: SPLITS,
            counters: Some(&mut self.counters),
        };
        let opts = DecodeOptions { num_splits: Some(SPLITS), scratch: Some(scratch), deterministic: true, ..Default::default() };
        let o = TensorMut::new(&mut self.o, q_layout);
        fa.forward_kvcache_into::<bf16, _, _>(stream, Tensor::new(&self.q, q_layout), cache, o, &mut self.lse, params, &Extras::default(), opts)
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let params = ForwardParams { causal: true, ..Default::default() };
    let mut lens: Vec<i32> = vec![300, 129];

    // The page pool and a shuffled block table: sequence b's j-th page is
    // pool page table[b][j].
    let mut k_pages = Array4::<f32>::zeros((NUM_PAGES, PAGE, NHEADS_K, D));
    let mut v_pages = Array4::<f32>::zeros((NUM_PAGES, PAGE, NHEADS_K, D));
    let table = Array2::from_shape_fn((BATCH, MAX_BLOCKS), |(b, j)| ((b * MAX_BLOCKS + j) * 37 % NUM_PAGES) as i32);
    for (b, &len) in lens.iter().enumerate() {
        for t in 0..len as usize {
            let page = table[[b, t / PAGE]] as usize;
            for h in 0..NHEADS_K {
                for c in 0..D {
                    k_pages[[page, t % PAGE, h, c]] = value(((b * 1000 + t) * NHEADS_K + h) * D + c, 5.0);
                    v_pages[[page, t % PAGE, h, c]] = value(((b * 1000 + t) * NHEADS_K + h) * D + c, 7.0);
                }
            }
        }
    }

    let gpu = match default_backend() {
        Backend::Gpu(fa) => {
            println!("backend: GPU ({}): decode steps captured in a CUDA graph", fa.device_name());
            Some(fa)
        }
        Backend::Cpu { reason } => {
            println!("backend: CPU reference ({reason}); no CUDA graph without a GPU");
            None
        }
    };

    // A stream of our own (the legacy default stream cannot be captured),
    // and the step's buffers made with cudarc's event tracking off: a graph
    // cannot wait on events recorded outside it.
    let mut device = match &gpu {
        Some(fa) => {
            let stream = fa.context().new_stream()?;
            // SAFETY: every buffer made while tracking is off is used on `stream` alone.
            unsafe { fa.context().disable_event_tracking() };
            let dev = DeviceStep::new(&stream, &k_pages, &v_pages, &table);
            // SAFETY: as above; buffers made from here on track their events again.
            unsafe { fa.context().enable_event_tracking() };
            Some((fa.clone(), stream, dev?))
        }
        None => None,
    };
    let mut graph = None;

    for step in 0..STEPS {
        let inp = step_inputs(step);

        // The expected output, on host arrays (f32: the CPU reference); this
        // appends the token into the host pages too.
        let cache = HostKvCache::Paged { k_pages: &mut k_pages, v_pages: &mut v_pages, block_table: table.view() };
        let (want, _want_lse) =
            flash_attn_with_kvcache(inp.q.view(), cache, &lens, Some(inp.k_new.view()), Some(inp.v_new.view()), &params, None, None)?;

        match &mut device {
            None => println!("step {step}: cache lengths {lens:?}, o[0,0,0,..4] = {:?}", want.slice(ndarray::s![0, 0, 0, ..4]).to_vec()),
            Some((fa, stream, dev)) => {
                dev.write(stream, &inp, &lens)?;
                let how = match &graph {
                    // Step 0 runs eagerly (the kernels' first use), then the
                    // same call is captured: nothing runs during capture.
                    None => {
                        dev.run(fa, stream, &params)?;
                        stream.synchronize()?;
                        stream.begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)?;
                        let captured = dev.run(fa, stream, &params);
                        let g = stream.end_capture(sys::CUgraphInstantiate_flags(0));
                        captured?;
                        graph = Some(g?.ok_or("the capture recorded no launch")?);
                        "eager, then captured"
                    }
                    Some(g) => {
                        g.launch()?;
                        "graph replay"
                    }
                };
                let o: Vec<bf16> = stream.clone_dtoh(&dev.o)?; // synchronizes
                let err = o.iter().zip(want.iter()).map(|(a, b)| (a.to_f32() - b).abs()).fold(0.0f32, f32::max);
                println!("step {step} ({how}): cache lengths {lens:?}, max |error| against the CPU reference {err:.2e}");
                if err > 2e-2 {
                    return Err(format!("step {step}: max |error| {err} is above the bf16 tolerance 2e-2").into());
                }
            }
        }
        for l in &mut lens {
            *l += 1;
        }
    }
    println!("ok");
    Ok(())
}
