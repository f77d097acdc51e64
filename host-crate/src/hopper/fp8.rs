//! The FP8 (e4m3) Hopper forward kernels (`kernel-crate/src/hopper/fp8.rs`):
//! their table and their launch (tensor maps of one-byte codes).

use std::sync::Arc;

use cudarc::driver::{CudaStream, DriverError};
use flash_attn_common::AttnParams;
use flash_attn_common::hopper_fp8::{HOPPER_FP8_BR, HOPPER_FP8_THREADS, HopperFp8Smem, hopper_fp8_bc, hopper_fp8_panel_bytes};

use super::launch::{TensorMap, launch_with_maps};
use crate::device::FlashAttention;
use crate::dispatch::Launch;
use crate::error::Result;

/// One compiled FP8 forward kernel: head dim `d` (inputs of a head dim
/// below it, a multiple of 16, run zero-padded), O in bf16 or f16.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HopperFp8Kernel {
    /// Entry name in the sm_90a PTX.
    pub name: &'static str,
    /// Compiled head dim.
    pub d: usize,
    /// O in bf16 (else f16).
    pub bf16: bool,
}

/// Every FP8 forward kernel (keep in step with `hopper_fp8_kernels!` in
/// kernel-crate/src/hopper/mod.rs).
pub const HOPPER_FP8_KERNELS: &[HopperFp8Kernel] = &[
    HopperFp8Kernel { name: "flash_fwd_hopper_e4m3_f16_d64", d: 64, bf16: false },
    HopperFp8Kernel { name: "flash_fwd_hopper_e4m3_bf16_d64", d: 64, bf16: true },
    HopperFp8Kernel { name: "flash_fwd_hopper_e4m3_f16_d128", d: 128, bf16: false },
    HopperFp8Kernel { name: "flash_fwd_hopper_e4m3_bf16_d128", d: 128, bf16: true },
    HopperFp8Kernel { name: "flash_fwd_hopper_e4m3_f16_d256", d: 256, bf16: false },
    HopperFp8Kernel { name: "flash_fwd_hopper_e4m3_bf16_d256", d: 256, bf16: true },
];

impl HopperFp8Kernel {
    /// The kernel for a head dim (a multiple of 16 in 16..=256: the next
    /// compiled one of 64, 128, 256) and output type.
    pub fn find(bf16: bool, headdim: usize) -> Option<&'static Self> {
        if headdim == 0 || !headdim.is_multiple_of(16) || headdim > 256 {
            return None;
        }
        HOPPER_FP8_KERNELS.iter().filter(|k| k.bf16 == bf16 && k.d >= headdim).min_by_key(|k| k.d)
    }

    /// Keys per K/V block.
    pub fn bc(&self) -> usize {
        hopper_fp8_bc(self.d)
    }

    /// Dynamic shared memory the launch requests.
    pub fn smem_bytes(&self) -> usize {
        HopperFp8Smem::new(self.d).request_bytes()
    }

    /// Blocks of a launch over `batch · nheads` heads of up to `seqlen_q`
    /// query rows; `None` past the grid's limit.
    pub fn grid_blocks(&self, batch: usize, nheads: usize, seqlen_q: usize) -> Option<u32> {
        let n = seqlen_q.div_ceil(HOPPER_FP8_BR).max(1).checked_mul(batch)?.checked_mul(nheads)?;
        u32::try_from(n).ok().filter(|&n| n < (1 << 31))
    }
}

/// The tensor maps of q, k and v (panels of `min(d, 128)`-byte rows, 128B or
/// 64B swizzle: K-major for q and k; the kernel transposes v's) of one
/// launch; varlen tensors as one batch of `total` rows.
fn tensor_maps(k: &HopperFp8Kernel, p: &AttnParams) -> std::result::Result<[TensorMap; 3], DriverError> {
    let (h, hd) = (p.nheads as usize, p.headdim as usize);
    let (b, nq, nk) = if p.is_varlen() { (1, p.total_q as usize, p.total_k as usize) } else { (p.batch as usize, p.seqlen_q as usize, p.seqlen_k as usize) };
    let hk = p.kv_heads() as usize;
    let st = |s: [u64; 3]| s.map(|x| x as usize);
    let rb = hopper_fp8_panel_bytes(k.d) as u32;
    Ok([
        TensorMap::encode_bshd_e4m3(p.q_ptr, [b, nq, h, hd], st(p.q_stride), rb, HOPPER_FP8_BR as u32, rb)?,
        TensorMap::encode_bshd_e4m3(p.k_ptr, [b, nk, hk, hd], st(p.k_stride), rb, k.bc() as u32, rb)?,
        TensorMap::encode_bshd_e4m3(p.v_ptr, [b, nk, hk, hd], st(p.v_stride), rb, k.bc() as u32, rb)?,
    ])
}

/// Launches FP8 kernel `k` on a filled parameter block.
///
/// # Safety
/// `p` satisfies the kernel's contract (validated by the caller): q, k, v
/// e4m3 and o, lse valid for the shapes and strides it states, 16-byte
/// aligned, q/k/v strides multiples of 16 bytes and o's of 8 elements,
/// `p.headdim` a multiple of 16 ≤ `k.d`, the descale pointers null or
/// holding the scales at the strides `p` states; `fa` holds the sm_90a build.
pub(crate) unsafe fn launch(fa: &FlashAttention, stream: &Arc<CudaStream>, k: &HopperFp8Kernel, p: &AttnParams) -> Result<()> {
    let grid = k.grid_blocks(p.batch as usize, p.nheads as usize, p.seqlen_q as usize).ok_or(DriverError(cudarc::driver::sys::cudaError_enum::CUDA_ERROR_INVALID_VALUE))?;
    let maps = tensor_maps(k, p)?;
    let main = Launch { kernel: k.name, grid, threads: HOPPER_FP8_THREADS as u32, smem_bytes: k.smem_bytes() as u32 };
    let (f, cfg) = fa.prepare(&main)?;
    // SAFETY: `flash_fwd_hopper_e4m3_*(tq, tk, tv: TensorMap, p: AttnParams,
    // g_tmaps: u64)`; the maps describe the buffers `p` names; the rest
    // forwarded to the caller.
    unsafe { launch_with_maps(stream, f, cfg, &maps, p) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn head_dims_pad_to_the_next_fp8_kernel() {
        for (d, want) in [(16, Some(64)), (48, Some(64)), (64, Some(64)), (80, Some(128)), (128, Some(128)), (144, Some(256)), (256, Some(256))] {
            for bf16 in [false, true] {
                let k = HopperFp8Kernel::find(bf16, d).map(|k| (k.d, k.bf16));
                assert_eq!(k, want.map(|w| (w, bf16)), "d = {d}");
            }
        }
        for d in [0, 8, 40, 100, 264, 512] {
            assert!(HopperFp8Kernel::find(true, d).is_none(), "d = {d}");
        }
        for k in HOPPER_FP8_KERNELS {
            assert!(k.smem_bytes() <= 227 * 1024 && k.name.contains(&format!("_d{}", k.d)) && k.name.contains(if k.bf16 { "_bf16_" } else { "_f16_" }));
        }
        assert_eq!(HopperFp8Kernel::find(true, 128).unwrap().grid_blocks(2, 3, 300), Some(18));
    }
}
