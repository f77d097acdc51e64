//! The Hopper-native kernels (sm_90a, `kernel-crate/src/hopper/`): their
//! table, the tensor maps they read q, k and v through, the dispatch rule
//! and the launch.
//!
//! Kernel names are `flash_fwd_hopper_{f16,bf16}_d{D}_bc{Bc}[_ov][_pp][_w3]`;
//! `Br = 64` per consumer warpgroup (2, or 3 for `_w3`), one producer
//! warpgroup, 128 threads each. They
//! exist only in the sm_90a PTX, which the library loads on compute
//! capability 9.0 unless [`KernelFamily::MmaSync`] is asked for.
//!
//! Dispatch: f16/bf16, `LoopOrder::Fa2`, no explicit `block`, a head dim
//! that [`hopper_head_dim`] maps to a compiled one (64, 128, 192, 256, or a
//! multiple of 8 in 33..=255 zero-padded to the next of them), on an sm_90a
//! module → the Hopper kernel (varlen or sliding window: its `_vw`
//! variant); everything else (FA1, explicit `(Br, Bc)` choices, softcap,
//! ALiBi, decode, d ≤ 32, other GPUs) keeps the `mma.sync` kernels.

use std::sync::Arc;

use cudarc::driver::sys::{
    self, CUtensorMap, CUtensorMapDataType, CUtensorMapFloatOOBfill, CUtensorMapInterleave, CUtensorMapL2promotion,
    CUtensorMapSwizzle, cudaError_enum,
};
use cudarc::driver::{CudaStream, DeviceRepr, DriverError, PushKernelArg};
use flash_attn_common::AttnParams;
use flash_attn_common::hopper::{HOPPER_PANEL_COLS, HopperSmem, hopper_br, hopper_threads};

use crate::api::LoopOrder;
use crate::device::FlashAttention;
use crate::dispatch::{DType, Dims, DispatchKey, Launch, Plan};
use crate::error::{FlashAttnError, Result};

/// Which kernels a [`FlashAttention`] may run on a compute capability 9.0
/// device.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum KernelFamily {
    /// The Hopper-native kernels where they apply (sm_90a PTX on CC 9.0),
    /// the `mma.sync` kernels elsewhere.
    #[default]
    Auto,
    /// Only the `mma.sync` kernels (the sm_80/sm_90 PTX), on every device.
    MmaSync,
}

/// One compiled Hopper kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HopperKernel {
    pub name: &'static str,
    pub bf16: bool,
    /// Head dim.
    pub d: usize,
    /// Keys per K/V block.
    pub bc: usize,
    /// Consumer warpgroups (64 query rows each).
    pub wgs: usize,
    /// Persistent: launched with at most one block per SM, each looping
    /// over tiles.
    pub persistent: bool,
    /// Varlen and sliding windows (`_vw`): packed batches (prefix sums on
    /// the device) and window masks, dense or varlen. The dense kernels take
    /// neither (a separate variant keeps their code unchanged).
    pub vw: bool,
}

/// Every Hopper kernel compiled into the sm_90a PTX (mirrors
/// `hopper_kernels!` in `kernel-crate/src/hopper/mod.rs`). The first entry
/// of a (dtype, d) is the default ([`HopperKernel::find`]); the others are
/// the candidates it was measured against (docs/perf-notes.md, Hopper
/// section). Suffixes: `_ov` intra-warpgroup overlap, `_pp` pingpong, `_w3`
/// three consumer warpgroups, `_ps` persistent, `_vw` varlen and sliding
/// windows (the dense default's tile; [`HopperKernel::find_vw`]).
///
/// Defaults, from H100 runs of every candidate (perf notes, Hopper steps
/// 4–5; TFLOP/s at N = 16384 non-causal, f16/bf16): d = 64: three consumer
/// warpgroups (Br = 192), Bc = 128, overlap 452/462, and +8% at N = 4096
/// over Bc = 192 with overlap and pingpong (451/447; overlap only 437/444,
/// Bc = 128 overlap 430/433); d = 128: Bc = 128 with overlap 640/660 (pingpong added
/// 611/633, Bc = 176 + pingpong 640/661 but slower at N = 4096, no overlap
/// 578/581); d = 256: Bc = 64 with overlap 715/764 (no overlap 628/616, with
/// pingpong 734/736); d = 192 (session 18): Bc = 64 with overlap, as d = 256
/// (618 bf16 at N = 4096; 136..184 zero-padded onto it).
pub const HOPPER_KERNELS: &[HopperKernel] = &[
    HopperKernel { name: "flash_fwd_hopper_f16_d64_bc128_ov_w3", bf16: false, d: 64, bc: 128, wgs: 3, persistent: false, vw: false },
    HopperKernel { name: "flash_fwd_hopper_bf16_d64_bc128_ov_w3", bf16: true, d: 64, bc: 128, wgs: 3, persistent: false, vw: false },
    HopperKernel { name: "flash_fwd_hopper_f16_d64_bc192_ov_pp", bf16: false, d: 64, bc: 192, wgs: 2, persistent: false, vw: false },
    HopperKernel { name: "flash_fwd_hopper_bf16_d64_bc192_ov_pp", bf16: true, d: 64, bc: 192, wgs: 2, persistent: false, vw: false },
    HopperKernel { name: "flash_fwd_hopper_f16_d64_bc128_ov", bf16: false, d: 64, bc: 128, wgs: 2, persistent: false, vw: false },
    HopperKernel { name: "flash_fwd_hopper_bf16_d64_bc128_ov", bf16: true, d: 64, bc: 128, wgs: 2, persistent: false, vw: false },
    HopperKernel { name: "flash_fwd_hopper_f16_d64_bc192_ov", bf16: false, d: 64, bc: 192, wgs: 2, persistent: false, vw: false },
    HopperKernel { name: "flash_fwd_hopper_bf16_d64_bc192_ov", bf16: true, d: 64, bc: 192, wgs: 2, persistent: false, vw: false },
    HopperKernel { name: "flash_fwd_hopper_f16_d128_bc128_ov", bf16: false, d: 128, bc: 128, wgs: 2, persistent: false, vw: false },
    HopperKernel { name: "flash_fwd_hopper_bf16_d128_bc128_ov", bf16: true, d: 128, bc: 128, wgs: 2, persistent: false, vw: false },
    HopperKernel { name: "flash_fwd_hopper_f16_d128_bc128", bf16: false, d: 128, bc: 128, wgs: 2, persistent: false, vw: false },
    HopperKernel { name: "flash_fwd_hopper_bf16_d128_bc128", bf16: true, d: 128, bc: 128, wgs: 2, persistent: false, vw: false },
    HopperKernel { name: "flash_fwd_hopper_f16_d128_bc128_ov_pp", bf16: false, d: 128, bc: 128, wgs: 2, persistent: false, vw: false },
    HopperKernel { name: "flash_fwd_hopper_bf16_d128_bc128_ov_pp", bf16: true, d: 128, bc: 128, wgs: 2, persistent: false, vw: false },
    HopperKernel { name: "flash_fwd_hopper_f16_d256_bc64_ov", bf16: false, d: 256, bc: 64, wgs: 2, persistent: false, vw: false },
    HopperKernel { name: "flash_fwd_hopper_bf16_d256_bc64_ov", bf16: true, d: 256, bc: 64, wgs: 2, persistent: false, vw: false },
    HopperKernel { name: "flash_fwd_hopper_f16_d256_bc64", bf16: false, d: 256, bc: 64, wgs: 2, persistent: false, vw: false },
    HopperKernel { name: "flash_fwd_hopper_bf16_d256_bc64", bf16: true, d: 256, bc: 64, wgs: 2, persistent: false, vw: false },
    HopperKernel { name: "flash_fwd_hopper_f16_d64_bc128_ov_w3_ps", bf16: false, d: 64, bc: 128, wgs: 3, persistent: true, vw: false },
    HopperKernel { name: "flash_fwd_hopper_bf16_d64_bc128_ov_w3_ps", bf16: true, d: 64, bc: 128, wgs: 3, persistent: true, vw: false },
    HopperKernel { name: "flash_fwd_hopper_f16_d128_bc128_ov_ps", bf16: false, d: 128, bc: 128, wgs: 2, persistent: true, vw: false },
    HopperKernel { name: "flash_fwd_hopper_bf16_d128_bc128_ov_ps", bf16: true, d: 128, bc: 128, wgs: 2, persistent: true, vw: false },
    HopperKernel { name: "flash_fwd_hopper_f16_d256_bc64_ov_ps", bf16: false, d: 256, bc: 64, wgs: 2, persistent: true, vw: false },
    HopperKernel { name: "flash_fwd_hopper_bf16_d256_bc64_ov_ps", bf16: true, d: 256, bc: 64, wgs: 2, persistent: true, vw: false },
    HopperKernel { name: "flash_fwd_hopper_f16_d64_bc128_ov_w3_vw", bf16: false, d: 64, bc: 128, wgs: 3, persistent: false, vw: true },
    HopperKernel { name: "flash_fwd_hopper_bf16_d64_bc128_ov_w3_vw", bf16: true, d: 64, bc: 128, wgs: 3, persistent: false, vw: true },
    HopperKernel { name: "flash_fwd_hopper_f16_d128_bc128_ov_vw", bf16: false, d: 128, bc: 128, wgs: 2, persistent: false, vw: true },
    HopperKernel { name: "flash_fwd_hopper_bf16_d128_bc128_ov_vw", bf16: true, d: 128, bc: 128, wgs: 2, persistent: false, vw: true },
    HopperKernel { name: "flash_fwd_hopper_f16_d256_bc64_ov_vw", bf16: false, d: 256, bc: 64, wgs: 2, persistent: false, vw: true },
    HopperKernel { name: "flash_fwd_hopper_bf16_d256_bc64_ov_vw", bf16: true, d: 256, bc: 64, wgs: 2, persistent: false, vw: true },
    HopperKernel { name: "flash_fwd_hopper_f16_d192_bc64_ov", bf16: false, d: 192, bc: 64, wgs: 2, persistent: false, vw: false },
    HopperKernel { name: "flash_fwd_hopper_bf16_d192_bc64_ov", bf16: true, d: 192, bc: 64, wgs: 2, persistent: false, vw: false },
    HopperKernel { name: "flash_fwd_hopper_f16_d192_bc64_ov_vw", bf16: false, d: 192, bc: 64, wgs: 2, persistent: false, vw: true },
    HopperKernel { name: "flash_fwd_hopper_bf16_d192_bc64_ov_vw", bf16: true, d: 192, bc: 64, wgs: 2, persistent: false, vw: true },
];

/// The probe kernels (one warpgroup, one 64 × 128 tile at d = 128; see
/// `kernel-crate/src/hopper/probe.rs`), for the GPU tests.
pub const PROBE_KERNELS: &[&str] = &["hopper_probe_f16", "hopper_probe_bf16"];
/// Dynamic shared memory of the probe kernels.
pub const PROBE_SMEM_BYTES: u32 = (64 * 128 * 2 + 2 * 128 * 128 * 2 + 8 + 1024) as u32;

impl HopperKernel {
    /// Query rows per block.
    pub const fn br(&self) -> usize {
        hopper_br(self.wgs)
    }
    pub const fn threads(&self) -> u32 {
        hopper_threads(self.wgs) as u32
    }
    /// Dynamic shared memory per block, bytes (tiles, barriers, 1 KB of
    /// alignment slack).
    pub const fn smem_bytes(&self) -> usize {
        HopperSmem::new(self.d, self.bc, self.wgs).request_bytes()
    }
    /// Blocks of the 1-D grid, or `None` past 2³¹ − 1.
    pub fn grid_blocks(&self, batch: usize, nheads: usize, seqlen_q: usize) -> Option<u32> {
        let n = seqlen_q.div_ceil(self.br()).checked_mul(batch.checked_mul(nheads)?)?;
        u32::try_from(n).ok().filter(|&n| n <= i32::MAX as u32 && n > 0)
    }
    /// The default dense kernel for a dtype and head dim, if one is compiled.
    pub fn find(bf16: bool, d: usize) -> Option<&'static HopperKernel> {
        HOPPER_KERNELS.iter().find(|k| k.bf16 == bf16 && k.d == d && !k.vw)
    }

    /// The varlen/window kernel (`_vw`) for a dtype and head dim, if one is
    /// compiled (the dense default's tile and warpgroups).
    pub fn find_vw(bf16: bool, d: usize) -> Option<&'static HopperKernel> {
        HOPPER_KERNELS.iter().find(|k| k.bf16 == bf16 && k.d == d && k.vw)
    }

    /// The kernel for a dtype and head dim whose name ends with
    /// `_d{d}_{variant}` (e.g. `bc128_ov_pp`), if one is compiled.
    pub fn find_variant(bf16: bool, d: usize, variant: &str) -> Option<&'static HopperKernel> {
        let tail = format!("_d{d}_{variant}");
        HOPPER_KERNELS.iter().find(|k| k.bf16 == bf16 && k.d == d && k.name.ends_with(&tail))
    }
}

/// The compiled Hopper head dim that runs a caller's head dim `d`: `d`
/// itself (a head dim of [`HOPPER_KERNELS`]: 64, 128, 192, 256), or for
/// another multiple of 8 in 33..=255 the next of them — the tensor maps
/// keep the caller's `d` as the head axis' extent, so the copy engine
/// zero-fills the columns past it (exact products) and the epilogue stores
/// only `d` columns. At most half of a
/// tile is padding; d ≤ 32 stays on the `mma.sync` kernels (their d = 32
/// tile). Padded tiles beat the `mma.sync` kernels' own (which pad too, to
/// 32/64/96/…/256) on the H100: docs/perf-notes.md, "Hopper: head dims by
/// padding".
pub fn hopper_head_dim(d: usize) -> Option<usize> {
    if d <= 32 || d % 8 != 0 {
        return None;
    }
    HOPPER_KERNELS.iter().map(|k| k.d).filter(|&k| k >= d).min()
}

/// The Hopper plan of a problem, or `None` when the rule in the module docs
/// sends it to the other kernels. `sm90a` says whether the loaded module is
/// the sm_90a build (it holds the Hopper kernels); `windowed`, whether the
/// call has a sliding window (a bounded side other than causal's right 0).
/// Varlen or windowed calls take the `_vw` kernel of the (dtype, d); score
/// modifiers (softcap, ALiBi) and decode never come here.
pub fn plan(
    sm90a: bool,
    key: &DispatchKey,
    windowed: bool,
    dims: &Dims,
    block: Option<(usize, usize)>,
    max_smem_per_block: usize,
) -> Result<Option<Plan>> {
    if !sm90a || key.arch != (9, 0) || key.loop_order != LoopOrder::Fa2 || block.is_some() || key.dtype == DType::F32 {
        return Ok(None);
    }
    if key.features.mods || key.features.decode {
        return Ok(None);
    }
    let bf16 = key.dtype == DType::BF16;
    let Some(d) = hopper_head_dim(key.headdim) else { return Ok(None) };
    let found = if key.features.varlen || windowed { HopperKernel::find_vw(bf16, d) } else { HopperKernel::find(bf16, d) };
    let Some(kernel) = found else { return Ok(None) };
    if kernel.smem_bytes() > max_smem_per_block {
        return Ok(None);
    }
    let blocks = kernel.grid_blocks(dims.batch, dims.nheads, dims.seqlen_q).ok_or(FlashAttnError::DimTooLarge {
        argument: "q",
        axis: "batch·nheads·ceil(seqlen/Br) (grid blocks)",
        value: dims.batch.saturating_mul(dims.nheads).saturating_mul(dims.seqlen_q.div_ceil(kernel.br())),
        max: i32::MAX as usize,
    })?;
    let main = Launch { kernel: kernel.name, grid: blocks, threads: kernel.threads(), smem_bytes: kernel.smem_bytes() as u32 };
    Ok(Some(Plan::Hopper { kernel, main }))
}

/// A `CUtensorMap` as a by-value kernel argument (128 bytes; the kernels
/// declare `.param .align 16 .b8 [128]`).
#[derive(Clone, Copy)]
#[repr(transparent)]
pub struct TensorMap(CUtensorMap);

impl std::fmt::Debug for TensorMap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TensorMap(..)")
    }
}

// SAFETY: plain 128 bytes of data that the driver copies into the kernel's
// parameter space; the kernels read it only through TMA.
unsafe impl DeviceRepr for TensorMap {}

impl TensorMap {
    /// Encodes a tiled tensor map of a `(batch, seqlen, nheads, headdim)`
    /// tensor of 16-bit elements at device address `ptr` with element
    /// `strides` of `[batch, seqlen, nheads]` (headdim contiguous): dims
    /// `{d, seqlen, nheads, batch}`, box `{64, box_rows, 1, 1}`, 128B
    /// swizzle, out-of-range elements read as zero.
    ///
    /// Errors: the driver's (`CUDA_ERROR_INVALID_VALUE` for an address not
    /// 16-byte aligned, strides not multiples of 16 bytes, …).
    pub fn encode_bshd(ptr: u64, shape: [usize; 4], strides: [usize; 3], box_rows: u32, bf16: bool) -> std::result::Result<Self, DriverError> {
        let [b, s, h, d] = shape;
        let dtype = if bf16 {
            CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
        } else {
            CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_FLOAT16
        };
        // The stride of an axis of extent 1 is never used; the driver still
        // wants a multiple of 16 bytes there.
        let stride_bytes = |n: usize, st: usize| if n == 1 { (d * 2) as u64 } else { (st * 2) as u64 };
        let dims: [u64; 4] = [d as u64, s as u64, h as u64, b as u64];
        let gstrides: [u64; 3] = [stride_bytes(s, strides[1]), stride_bytes(h, strides[2]), stride_bytes(b, strides[0])];
        let boxes: [u32; 4] = [HOPPER_PANEL_COLS as u32, box_rows, 1, 1];
        let estrides: [u32; 4] = [1; 4];
        let mut map = std::mem::MaybeUninit::<CUtensorMap>::zeroed();
        // SAFETY: every pointer argument points to an array of the length
        // the rank (4, and 3 strides) requires; `map` is writable.
        let r = unsafe {
            sys::cuTensorMapEncodeTiled(
                map.as_mut_ptr(),
                dtype,
                4,
                ptr as *mut std::ffi::c_void,
                dims.as_ptr(),
                gstrides.as_ptr(),
                boxes.as_ptr(),
                estrides.as_ptr(),
                CUtensorMapInterleave::CU_TENSOR_MAP_INTERLEAVE_NONE,
                CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_128B,
                CUtensorMapL2promotion::CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
                CUtensorMapFloatOOBfill::CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
            )
        };
        if r != cudaError_enum::CUDA_SUCCESS {
            return Err(DriverError(r));
        }
        // SAFETY: initialized (zeroed, then written by the driver on success).
        Ok(Self(unsafe { map.assume_init() }))
    }
}

/// The tensor maps of q, k and v of one launch (boxes `64 × Br` for Q and
/// `64 × Bc` for K and V), in the kernel's parameter order. Varlen: the
/// packed tensors as one batch of `total_q` / `total_k` rows (the kernels
/// add each sequence's first row to the row coordinate; copies past a
/// sequence's end read the next sequence's rows, never past the tensor).
pub fn tensor_maps(k: &HopperKernel, p: &AttnParams) -> std::result::Result<[TensorMap; 3], DriverError> {
    let (h, d) = (p.nheads as usize, p.headdim as usize);
    let (b, nq, nk) = if p.is_varlen() {
        (1, p.total_q as usize, p.total_k as usize)
    } else {
        (p.batch as usize, p.seqlen_q as usize, p.seqlen_k as usize)
    };
    // K and V have nheads_k heads (GQA/MQA; 0 in older parameter blocks = MHA).
    let hk = p.kv_heads() as usize;
    let st = |s: [u64; 3]| s.map(|x| x as usize);
    Ok([
        TensorMap::encode_bshd(p.q_ptr, [b, nq, h, d], st(p.q_stride), k.br() as u32, k.bf16)?,
        TensorMap::encode_bshd(p.k_ptr, [b, nk, hk, d], st(p.k_stride), k.bc as u32, k.bf16)?,
        TensorMap::encode_bshd(p.v_ptr, [b, nk, hk, d], st(p.v_stride), k.bc as u32, k.bf16)?,
    ])
}

/// Where the kernels read their tensor maps: from their by-value
/// parameters (the default, as nvcc's `__grid_constant__`), or, with the
/// environment variable `FLASH_ATTN_HOPPER_TMAP=global`, from a 384-byte
/// device buffer written before the launch (the fallback if a driver does
/// not place the parameters where TMA can read them).
pub fn tensor_maps_in_global_memory() -> bool {
    static GLOBAL: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *GLOBAL.get_or_init(|| std::env::var("FLASH_ATTN_HOPPER_TMAP").is_ok_and(|v| v == "global"))
}

/// Launches `f` (a Hopper kernel or probe: `(TensorMap ×3, AttnParams, u64)`)
/// with the tensor maps passed as [`tensor_maps_in_global_memory`] says.
///
/// # Safety
/// `f` has that signature; the maps describe the buffers `p` names and
/// `p` and `cfg` satisfy the kernel's contract.
pub unsafe fn launch_with_maps(
    stream: &Arc<CudaStream>,
    f: &cudarc::driver::CudaFunction,
    cfg: cudarc::driver::LaunchConfig,
    maps: &[TensorMap; 3],
    p: &AttnParams,
) -> Result<()> {
    let arg = crate::tc::KernelArg(*p);
    let global = if tensor_maps_in_global_memory() {
        let mut bytes = Vec::with_capacity(3 * 128);
        for m in maps {
            // SAFETY: CUtensorMap is 128 plain bytes.
            bytes.extend_from_slice(unsafe { std::slice::from_raw_parts(m as *const TensorMap as *const u8, 128) });
        }
        Some(stream.clone_htod(&bytes)?)
    } else {
        None
    };
    let g_ptr: u64 = match &global {
        Some(buf) => {
            use cudarc::driver::DevicePtr;
            let (ptr, _guard) = buf.device_ptr(stream);
            ptr
        }
        None => 0,
    };
    let mut b = stream.launch_builder(f);
    b.arg(&maps[0]).arg(&maps[1]).arg(&maps[2]).arg(&arg).arg(&g_ptr);
    // SAFETY: forwarded to the caller; `global` (when used) lives until
    // after the launch is enqueued and is freed stream-ordered after it.
    unsafe { b.launch(cfg) }?;
    drop(global);
    Ok(())
}

/// Launches a planned Hopper kernel.
///
/// # Safety
/// `p` satisfies the kernel's contract: q, k, v, o and lse valid for the
/// shapes and strides it states (validated by the caller), 16-byte aligned
/// with strides multiples of 8 elements, `p.headdim` a multiple of 8 ≤ `k.d`; `main` is the
/// plan's launch for `k`.
pub(crate) unsafe fn launch(
    fa: &FlashAttention,
    stream: &Arc<CudaStream>,
    k: &HopperKernel,
    main: &Launch,
    p: &AttnParams,
) -> Result<()> {
    let maps = tensor_maps(k, p)?;
    let (f, mut cfg) = fa.prepare(main)?;
    if k.persistent {
        // One block per SM at most (the register file holds one), each
        // looping over the tiles blockIdx.x, + gridDim.x, ….
        let sms = fa
            .context()
            .attribute(cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?;
        cfg.grid_dim.0 = cfg.grid_dim.0.min(sms.max(1) as u32);
    }
    // SAFETY: `flash_fwd_hopper_*(tq, tk, tv: TensorMap, p: AttnParams,
    // g_tmaps: u64)`; the maps describe the buffers `p` names (encoded above
    // from the same pointers, shapes and strides); the caller guarantees the
    // buffers; `cfg` has the kernel's threads, grid and dynamic
    // shared memory (within the limit set at load).
    unsafe { launch_with_maps(stream, f, cfg, &maps, p) }
}

/// Launches the Hopper kernel `k` on a parameter block filled by the caller
/// (tools and benchmarks that bypass [`FlashAttention::forward_into`]): the
/// grid and shared memory of its plan.
///
/// # Safety
/// As `launch`; `fa` holds the sm_90a build.
pub unsafe fn launch_params(fa: &FlashAttention, stream: &Arc<CudaStream>, k: &HopperKernel, p: &AttnParams) -> Result<()> {
    let blocks = k
        .grid_blocks(p.batch as usize, p.nheads as usize, p.seqlen_q as usize)
        .ok_or(DriverError(cudaError_enum::CUDA_ERROR_INVALID_VALUE))?;
    let main = Launch { kernel: k.name, grid: blocks, threads: k.threads(), smem_bytes: k.smem_bytes() as u32 };
    // SAFETY: forwarded to the caller.
    unsafe { launch(fa, stream, k, &main, p) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dispatch::Features;

    #[test]
    fn head_dims_pad_to_the_next_compiled_one() {
        for (d, want) in [(64, Some(64)), (40, Some(64)), (72, Some(128)), (96, Some(128)), (136, Some(192)), (192, Some(192)), (200, Some(256)), (248, Some(256)), (256, Some(256))] {
            assert_eq!(hopper_head_dim(d), want, "d = {d}");
        }
        for d in [0, 8, 32, 44, 100, 264] {
            assert_eq!(hopper_head_dim(d), None, "d = {d}");
        }
        // Every mapped head dim has a dense and a `_vw` kernel in both dtypes.
        for d in (40..=256).step_by(8) {
            let k = hopper_head_dim(d).unwrap();
            for bf16 in [false, true] {
                assert!(HopperKernel::find(bf16, k).is_some() && HopperKernel::find_vw(bf16, k).is_some(), "d = {d} → {k}");
            }
        }
        // The plan: d = 96 runs the d = 128 kernel; d = 32 and softcap stay on mma.sync.
        let key = |headdim, mods| DispatchKey {
            dtype: DType::BF16,
            headdim,
            causal: true,
            loop_order: LoopOrder::Fa2,
            arch: (9, 0),
            features: Features { varlen: false, mods, decode: false },
        };
        let dims = |headdim| Dims { batch: 1, nheads: 2, nheads_k: 2, seqlen_q: 300, seqlen_k: 300, headdim };
        let Ok(Some(Plan::Hopper { kernel, .. })) = plan(true, &key(96, false), false, &dims(96), None, 232_448) else { panic!() };
        assert_eq!((kernel.d, kernel.bf16, kernel.vw), (128, true, false));
        assert!(matches!(plan(true, &key(32, false), false, &dims(32), None, 232_448), Ok(None)));
        assert!(matches!(plan(true, &key(96, true), false, &dims(96), None, 232_448), Ok(None)));
        assert!(matches!(plan(false, &key(96, false), false, &dims(96), None, 232_448), Ok(None)));
    }
}
