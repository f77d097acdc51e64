//! The Hopper (sm_90a) FA2-order backward main kernel (f16/bf16, `wgmma`,
//! `kernel-crate/src/hopper/bwd.rs`): its table, when it runs, its launch.
//! The preprocess (`D_i`, zeroed dQ accumulator) and the dQ conversion
//! around it are the tensor-core kernel's (`backward/`).
//!
//! It runs a call when the loaded PTX is the sm_90a build on an sm_90
//! device, the head dim is at most 256 (`hopper_bwd_head_dim`: 136..=256
//! on the d 256 build; softcap or ALiBi only up to 128), the call has no
//! explicit block size, and the environment does not set
//! `FLASH_ATTN_BACKWARD_KERNEL=tc` (read once per process: the tensor-core
//! kernel for every call, e.g. to compare the two). Kernel names:
//! `flash_bwd_hopper_{f16,bf16}_d{64,128,256}`, and with softcap or ALiBi
//! `flash_bwd_hopper_x_{f16,bf16}_d{64,128}` (64 query rows per step at
//! both head dims: `hopper_bwd_kernel_br`). Grid: `batch · nheads_k ·
//! ceil(seqlen_k / Bc)` blocks of 384 threads (`Bc` 128, 64 at d 256); the
//! kernel reads q, dO, k and v through tensor maps (TMA) encoded here.

use std::sync::Arc;

use cudarc::driver::{CudaStream, DriverError, PushKernelArg};
use flash_attn_common::BwdParams;
use flash_attn_common::hopper_bwd::{HOPPER_BWD_THREADS, HopperBwdSmem, hopper_bwd_bc, hopper_bwd_head_dim, hopper_bwd_kernel_br};

use crate::device::FlashAttention;
use crate::error::Result;
use crate::hopper::{TensorMap, maps_argument};
use crate::tc::KernelArg;
use crate::types::DType;

use super::BackwardParams;

use super::tc::key_block_launch;

/// Every Hopper backward kernel compiled into the sm_90a PTX (mirrors the
/// `hopper_bwd_kernels!` list of `kernel-crate/src/hopper/mod.rs`):
/// `(name, bf16, compiled head dim, softcap/ALiBi)`.
pub(crate) const HOPPER_BWD_KERNELS: &[(&str, bool, usize, bool)] = &[
    ("flash_bwd_hopper_f16_d64", false, 64, false),
    ("flash_bwd_hopper_bf16_d64", true, 64, false),
    ("flash_bwd_hopper_f16_d128", false, 128, false),
    ("flash_bwd_hopper_bf16_d128", true, 128, false),
    ("flash_bwd_hopper_f16_d256", false, 256, false),
    ("flash_bwd_hopper_bf16_d256", true, 256, false),
    ("flash_bwd_hopper_x_f16_d64", false, 64, true),
    ("flash_bwd_hopper_x_bf16_d64", true, 64, true),
    ("flash_bwd_hopper_x_f16_d128", false, 128, true),
    ("flash_bwd_hopper_x_bf16_d128", true, 128, true),
];

/// `FLASH_ATTN_BACKWARD_KERNEL=tc` (read once per process): the tensor-core
/// kernel for every call.
fn tc_only() -> bool {
    static TC_ONLY: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *TC_ONLY.get_or_init(|| std::env::var("FLASH_ATTN_BACKWARD_KERNEL").is_ok_and(|v| v == "tc"))
}

/// Whether the Hopper kernel can run a backward call of `dtype` and
/// `headdim` with `params` on this device, ALiBi aside (known only at
/// launch; it takes the tensor-core kernel): the plan's test for the head
/// dims only the Hopper kernel has (136..=256).
pub(crate) fn hopper_backward_available(fa: &FlashAttention, dtype: DType, headdim: usize, params: &BackwardParams) -> bool {
    let mods = params.forward.softcap.is_some_and(|c| c != 0.0);
    params.forward.block.is_none()
        && !tc_only()
        && hopper_backward_kernel(fa.has_hopper_kernels(), fa.compute_capability(), dtype, headdim, mods, fa.limits().max_smem_per_block).is_some()
}

/// The Hopper kernel of a call (its table entry: name, bf16, compiled head
/// dim, softcap/ALiBi), or `None` when the tensor-core kernel runs it (see
/// the module docs): `sm90a` whether the loaded PTX is the sm_90a build,
/// `cc` the device's compute capability, `mods` softcap or ALiBi.
pub(crate) fn hopper_backward_kernel(sm90a: bool, cc: (i32, i32), dtype: DType, headdim: usize, mods: bool, max_smem: usize) -> Option<&'static (&'static str, bool, usize, bool)> {
    let bf16 = match dtype {
        DType::F16 => false,
        DType::BF16 => true,
        DType::F32 => return None,
    };
    if !sm90a || cc != (9, 0) {
        return None;
    }
    let d = hopper_bwd_head_dim(headdim)?;
    if HopperBwdSmem::for_kernel(d, mods).request_bytes() > max_smem {
        return None;
    }
    HOPPER_BWD_KERNELS.iter().find(|k| k.1 == bf16 && k.2 == d && k.3 == mods)
}

/// Launches the Hopper backward main kernel on `stream` for `p` when it
/// runs the call ([`hopper_backward_kernel`]); `Ok(false)`: it does not
/// (launch the tensor-core kernel instead). `p.br`/`p.bc` are set here.
///
/// # Safety
/// As `tc::launch_tc_backward`: `p` satisfies the kernel's contract (every
/// pointer valid for the shapes and strides it states, 16-byte aligned,
/// element strides multiples of 8, the dq accumulator zeroed and delta
/// computed on `stream` before this launch, `dq_accum_ptr` 16-byte aligned).
pub(crate) unsafe fn launch_hopper_backward(fa: &FlashAttention, stream: &Arc<CudaStream>, p: &BwdParams, dtype: DType) -> Result<bool> {
    if tc_only() {
        return Ok(false);
    }
    let mods = p.fwd.softcap != 0.0 || p.fwd.alibi_ptr != 0;
    let max_smem = fa.limits().max_smem_per_block;
    let Some(&(name, _, d, mods)) = hopper_backward_kernel(fa.has_hopper_kernels(), fa.compute_capability(), dtype, p.fwd.headdim as usize, mods, max_smem) else {
        return Ok(false);
    };
    let Some(f) = fa.kernel(name)? else { return Ok(false) };
    let (br, bc) = (hopper_bwd_kernel_br(d, mods), hopper_bwd_bc(d));
    let Some((p, cfg)) = key_block_launch(p, (br, bc), HOPPER_BWD_THREADS, HopperBwdSmem::for_kernel(d, mods).request_bytes())? else { return Ok(true) };
    let maps = backward_tensor_maps(&p, br, bc, dtype == DType::BF16)?;
    let (global, g_ptr) = maps_argument(stream, &maps)?;
    let arg = KernelArg(p);
    let mut b = stream.launch_builder(f);
    b.arg(&maps[0]).arg(&maps[1]).arg(&maps[2]).arg(&maps[3]).arg(&maps[4]).arg(&arg).arg(&g_ptr);
    // SAFETY: `flash_bwd_hopper_*(tq, tdo, tk, tv, tdq: TensorMap, p:
    // BwdParams, g_tmaps: u64)`; the maps describe the buffers `p` names (encoded
    // above from the same pointers, shapes and strides); threads, grid and
    // shared memory are the kernel's for compiled head dim `d`; `p` is the
    // caller's contract (see `# Safety`); `global` (when used) lives until
    // the launch is enqueued and is freed stream-ordered after it.
    unsafe { b.launch(cfg) }?;
    drop(global);
    Ok(true)
}

/// The tensor maps of q, dO (boxes `64 × br`), k and v (`64 × bc`) and of
/// the f32 dQ accumulator (`lse rows × d`, boxes `32 × 64`) of a backward
/// launch, in the kernel's parameter order. Varlen: the packed
/// tensors as one batch of `total_q` / `total_k` rows (the kernel adds each
/// sequence's first row to the row coordinate; copies past a sequence's end
/// read the next sequence's rows, which its masks and `P = 0` rows ignore).
fn backward_tensor_maps(p: &BwdParams, br: usize, bc: usize, bf16: bool) -> std::result::Result<[TensorMap; 5], DriverError> {
    let f = &p.fwd;
    let (h, hk, d) = (f.nheads as usize, f.kv_heads() as usize, f.headdim as usize);
    let (b, nq, nk) = if f.is_varlen() { (1, f.total_q as usize, f.total_k as usize) } else { (f.batch as usize, f.seqlen_q as usize, f.seqlen_k as usize) };
    let st = |s: [u64; 3]| s.map(|x| x as usize);
    // The accumulator's rows are the LSE's: `(batch · nheads + h) · seqlen_q
    // + row`, varlen `h · total_q + packed row`.
    let lse_rows = if f.is_varlen() { h * f.total_q as usize } else { f.batch as usize * h * f.seqlen_q as usize };
    Ok([
        TensorMap::encode_bshd(f.q_ptr, [b, nq, h, d], st(f.q_stride), br as u32, bf16)?,
        TensorMap::encode_bshd(p.do_ptr, [b, nq, h, d], st(p.do_stride), br as u32, bf16)?,
        TensorMap::encode_bshd(f.k_ptr, [b, nk, hk, d], st(f.k_stride), bc as u32, bf16)?,
        TensorMap::encode_bshd(f.v_ptr, [b, nk, hk, d], st(f.v_stride), bc as u32, bf16)?,
        TensorMap::encode_f32_2d(p.dq_accum_ptr, lse_rows, d, 64)?,
    ])
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The table names exactly the kernels of `hopper/mod.rs`.
    #[test]
    fn table_mirrors_the_kernel_list() {
        let src = include_str!("../../../kernel-crate/src/hopper/mod.rs");
        let listed: Vec<&str> = src.lines().map(str::trim_start).filter(|l| l.starts_with("flash_bwd_hopper_")).collect();
        assert_eq!(listed.len(), HOPPER_BWD_KERNELS.len());
        for (name, bf16, d, mods) in HOPPER_BWD_KERNELS {
            assert!(listed.iter().any(|l| l.starts_with(&format!("{name}: {}, d = {d}, mods = {mods};", if *bf16 { "Bf16" } else { "F16" }))), "{name}");
            assert_eq!(name.starts_with("flash_bwd_hopper_x_"), *mods, "{name}");
        }
    }

    #[test]
    fn runs_what_it_can() {
        let big = 227 * 1024;
        assert_eq!(hopper_backward_kernel(true, (9, 0), DType::BF16, 128, false, big), Some(&("flash_bwd_hopper_bf16_d128", true, 128, false)));
        assert_eq!(hopper_backward_kernel(true, (9, 0), DType::F16, 40, false, big), Some(&("flash_bwd_hopper_f16_d64", false, 64, false)));
        assert_eq!(hopper_backward_kernel(true, (9, 0), DType::F16, 96, false, big), Some(&("flash_bwd_hopper_f16_d128", false, 128, false)));
        assert_eq!(hopper_backward_kernel(true, (9, 0), DType::F16, 136, false, big), Some(&("flash_bwd_hopper_f16_d256", false, 256, false)));
        assert_eq!(hopper_backward_kernel(true, (9, 0), DType::F16, 192, false, big), Some(&("flash_bwd_hopper_f16_d256", false, 256, false)));
        assert_eq!(hopper_backward_kernel(true, (9, 0), DType::F16, 200, false, big), Some(&("flash_bwd_hopper_f16_d256", false, 256, false)));
        assert_eq!(hopper_backward_kernel(true, (9, 0), DType::BF16, 256, false, big), Some(&("flash_bwd_hopper_bf16_d256", true, 256, false)));
        assert_eq!(hopper_backward_kernel(true, (9, 0), DType::BF16, 264, false, big), None);
        assert_eq!(hopper_backward_kernel(true, (9, 0), DType::BF16, 256, true, big), None, "softcap/ALiBi at d 256");
        assert_eq!(hopper_backward_kernel(true, (9, 0), DType::BF16, 160, true, big), None, "softcap/ALiBi above 128");
        assert_eq!(hopper_backward_kernel(true, (9, 0), DType::BF16, 256, false, 210 * 1024), None, "d 256 needs 210 KB");
        assert_eq!(hopper_backward_kernel(true, (9, 0), DType::F16, 128, true, big), Some(&("flash_bwd_hopper_x_f16_d128", false, 128, true)), "softcap/ALiBi");
        assert_eq!(hopper_backward_kernel(true, (9, 0), DType::BF16, 64, true, big), Some(&("flash_bwd_hopper_x_bf16_d64", true, 64, true)));
        assert_eq!(hopper_backward_kernel(false, (9, 0), DType::F16, 128, false, big), None, "sm_90 PTX");
        assert_eq!(hopper_backward_kernel(true, (8, 0), DType::F16, 128, false, big), None);
        assert_eq!(hopper_backward_kernel(true, (9, 0), DType::F32, 128, false, big), None);
        assert_eq!(hopper_backward_kernel(true, (9, 0), DType::F16, 128, false, 99 * 1024), None);
    }
}
