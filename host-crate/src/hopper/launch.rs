//! The launch of the Hopper kernels: the tensor maps they read q, k and v
//! through, and the launch itself (the only `unsafe` of the family).

use std::sync::Arc;

use cudarc::driver::sys::{
    self, CUtensorMap, CUtensorMapDataType, CUtensorMapFloatOOBfill, CUtensorMapInterleave, CUtensorMapL2promotion,
    CUtensorMapSwizzle, cudaError_enum,
};
use cudarc::driver::{CudaStream, DeviceRepr, DriverError, PushKernelArg};
use flash_attn_common::AttnParams;
use flash_attn_common::hopper::HOPPER_PANEL_COLS;

use crate::device::FlashAttention;
use crate::dispatch::Launch;
use crate::error::Result;
use crate::tc::KernelArg;

use super::table::HopperKernel;

/// `cuTensorMapEncodeTiled` of a `dims.len()`-dimensional tensor
/// (innermost first; `gstrides` the byte strides of the outer dims),
/// element strides 1, no interleave, L2 promotion 128B, out-of-range
/// elements read as zero (and skipped by reductions).
fn encode_tiled(dtype: CUtensorMapDataType, ptr: u64, dims: &[u64], gstrides: &[u64], boxes: &[u32], swizzle: CUtensorMapSwizzle) -> std::result::Result<TensorMap, DriverError> {
    if dims.is_empty() || dims.len() > 5 || boxes.len() != dims.len() || gstrides.len() + 1 != dims.len() {
        return Err(DriverError(cudaError_enum::CUDA_ERROR_INVALID_VALUE));
    }
    let estrides = [1u32; 5];
    let mut map = std::mem::MaybeUninit::<CUtensorMap>::zeroed();
    // SAFETY: `dims`, `boxes` and `estrides` hold at least `rank` entries
    // and `gstrides` `rank − 1` (checked above); `map` is writable.
    let r = unsafe {
        sys::cuTensorMapEncodeTiled(
            map.as_mut_ptr(),
            dtype,
            dims.len() as u32,
            ptr as *mut std::ffi::c_void,
            dims.as_ptr(),
            gstrides.as_ptr(),
            boxes.as_ptr(),
            estrides.as_ptr(),
            CUtensorMapInterleave::CU_TENSOR_MAP_INTERLEAVE_NONE,
            swizzle,
            CUtensorMapL2promotion::CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
            CUtensorMapFloatOOBfill::CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
        )
    };
    if r != cudaError_enum::CUDA_SUCCESS {
        return Err(DriverError(r));
    }
    // SAFETY: initialized (zeroed, then written by the driver on success).
    Ok(TensorMap(unsafe { map.assume_init() }))
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
        encode_tiled(dtype, ptr, &dims, &gstrides, &boxes, CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_128B)
    }
}

impl TensorMap {
    /// Encodes a tiled tensor map of a `(batch, seqlen, nheads, headdim)`
    /// tensor of one-byte e4m3 codes (`UINT8`) with element (= byte)
    /// `strides` of `[batch, seqlen, nheads]`: box `{box_cols, box_rows, 1,
    /// 1}`, `swizzle_bytes` 128, 64 or 0 (none), out-of-range bytes read as
    /// zero.
    ///
    /// Errors: the driver's (an address not 16-byte aligned, strides not
    /// multiples of 16 bytes, …).
    pub fn encode_bshd_e4m3(ptr: u64, shape: [usize; 4], strides: [usize; 3], box_cols: u32, box_rows: u32, swizzle_bytes: u32) -> std::result::Result<Self, DriverError> {
        let [b, s, h, d] = shape;
        let stride_bytes = |n: usize, st: usize| if n == 1 { d.next_multiple_of(16) as u64 } else { st as u64 };
        let dims: [u64; 4] = [d as u64, s as u64, h as u64, b as u64];
        let gstrides: [u64; 3] = [stride_bytes(s, strides[1]), stride_bytes(h, strides[2]), stride_bytes(b, strides[0])];
        let boxes: [u32; 4] = [box_cols, box_rows, 1, 1];
        let swizzle = match swizzle_bytes {
            128 => CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_128B,
            64 => CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_64B,
            _ => CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_NONE,
        };
        encode_tiled(CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_UINT8, ptr, &dims, &gstrides, &boxes, swizzle)
    }
}

impl TensorMap {
    /// Encodes a tiled tensor map of a row-major `rows × cols` f32 matrix
    /// at device address `ptr` (`cols` contiguous): box `{32, box_rows}`
    /// (128-byte rows), 128B swizzle; elements outside the matrix are
    /// skipped by reductions (and read as zero by loads).
    ///
    /// Errors: the driver's (an address not 16-byte aligned, `cols · 4`
    /// not a multiple of 16, …).
    pub fn encode_f32_2d(ptr: u64, rows: usize, cols: usize, box_rows: u32) -> std::result::Result<Self, DriverError> {
        let dims: [u64; 2] = [cols as u64, rows as u64];
        let gstrides: [u64; 1] = [(cols * 4) as u64];
        let boxes: [u32; 2] = [32, box_rows];
        encode_tiled(CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_FLOAT32, ptr, &dims, &gstrides, &boxes, CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_128B)
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

/// The `g_tmaps` argument of a launch with `maps`: 0 (the kernel reads its
/// by-value parameters), or, when [`tensor_maps_in_global_memory`], the
/// address of a copy of the maps in a device buffer, returned with it (keep
/// it until the launch is enqueued; it is freed stream-ordered).
pub fn maps_argument(stream: &Arc<CudaStream>, maps: &[TensorMap]) -> Result<(Option<cudarc::driver::CudaSlice<u8>>, u64)> {
    if !tensor_maps_in_global_memory() {
        return Ok((None, 0));
    }
    let mut bytes = Vec::with_capacity(maps.len() * 128);
    for m in maps {
        // SAFETY: CUtensorMap is 128 plain bytes.
        bytes.extend_from_slice(unsafe { std::slice::from_raw_parts(m as *const TensorMap as *const u8, 128) });
    }
    let buf = stream.clone_htod(&bytes)?;
    let ptr = {
        use cudarc::driver::DevicePtr;
        let (ptr, _guard) = buf.device_ptr(stream);
        ptr
    };
    Ok((Some(buf), ptr))
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
    let arg = KernelArg(*p);
    let (global, g_ptr) = maps_argument(stream, maps)?;
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
