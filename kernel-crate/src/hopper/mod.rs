//! Hopper-native (sm_90a) forward kernels: `wgmma` products from
//! 128B-swizzled shared memory filled by TMA copies that complete on
//! mbarriers, one producer warpgroup and two consumer warpgroups with
//! `setmaxnreg` (FlashAttention-3's structure; `../shared/HOPPER-KERNEL.md`).
//!
//! * [`fwd`]: the FA2-order forward kernel (Q blocks across the grid, K/V
//!   blocks through a 2-stage full/empty mbarrier pipeline), dense or, in
//!   its `_vw` variant, varlen and/or with a sliding window.
//! * [`probe`]: one warpgroup, one tile: `S = Q·Kᵀ` and `O = P·V` written out
//!   in f32, to prove the descriptors, the swizzle, the fragment layouts and
//!   the tensor-map parameter bit-exactly on the GPU.
//!
//! Entry points take three tensor maps (Q, K, V; 128 bytes each, by value,
//! first so that their parameter offsets are 0, 128, 256), then the
//! [`AttnParams`] every other kernel takes, then `g_tmaps`: 0, or the
//! address of the same three maps in global memory (384 bytes, 64-byte
//! aligned), which the kernel then reads instead of its parameters. They are compiled only into the
//! sm_90a PTX (`--cfg fa_sm90a`), and `host-crate/build.rs` adds `.maxntid`
//! and `.minnctapersm 1` to their entries so that `setmaxnreg` is honoured.

pub mod bwd;
pub mod bwd256;
pub mod fp8;
pub mod fwd;
pub mod probe;

use crate::arch::wgmma;
use crate::tc::Elem16;
use flash_attn_common::AttnParams;

/// A CUDA tensor map (`CUtensorMap`, 128 opaque bytes) as a by-value kernel
/// parameter (`.param .align 16 .b8 p[128]`). Never read in Rust: the
/// kernels take its address with [`crate::param_generic_addr`].
#[repr(C, align(16))]
#[derive(Clone, Copy)]
pub struct TensorMap(pub [u64; 16]);

/// Shared-memory matrix descriptor of a 128B-swizzled tile (PTX ISA
/// §9.7.15.5.1): start address `>> 4` in bits 0–13, leading byte offset
/// `>> 4` in 16–29, stride byte offset `>> 4` in 32–45, base offset 0 (the
/// tiles are 1024-byte aligned), swizzle mode 1 (128B) in bits 62–63.
#[inline(always)]
pub const fn desc_sw128(addr: u32, lbo: u32, sbo: u32) -> u64 {
    (((addr & 0x3FFFF) >> 4) as u64) | (((lbo >> 4) as u64) << 16) | (((sbo >> 4) as u64) << 32) | (1u64 << 62)
}

/// K-major operand (Q, K: the head dim contiguous): rows 128 bytes apart,
/// 8-row groups 1024 bytes apart (stride offset), leading offset unused (16).
#[inline(always)]
pub const fn desc_kmajor(addr: u32) -> u64 {
    desc_sw128(addr, 16, 1024)
}

/// MN-major B operand (V read as `Bc × d` with d contiguous, `trans-b = 1`):
/// 64-column panels `panel_bytes` apart (leading offset), 8-row groups 1024
/// bytes apart (stride offset).
#[inline(always)]
pub const fn desc_mnmajor(addr: u32, panel_bytes: u32) -> u64 {
    desc_sw128(addr, panel_bytes, 1024)
}

/// Reinterprets an `[[f32; 4]; N8]` accumulator as `[[f32; 4]; M]` (the
/// caller checked `N8 == M`).
#[inline(always)]
fn acc_as<const N8: usize, const M: usize>(d: &mut [[f32; 4]; N8]) -> &mut [[f32; 4]; M] {
    assert!(N8 == M);
    // SAFETY: same type and length (asserted; the check folds at compile time).
    unsafe { &mut *(d as *mut [[f32; 4]; N8] as *mut [[f32; 4]; M]) }
}

/// `d (64 × 8·N8) = A·B (+ d)` with A and B K-major in shared memory.
///
/// # Safety
/// As `wgmma::wgmma_ss_*`.
#[inline(always)]
pub unsafe fn mma_ss<T: Elem16, const N8: usize>(d: &mut [[f32; 4]; N8], da: u64, db: u64, scale_d: u32) {
    const { assert!(N8 == 8 || N8 == 16 || N8 == 22 || N8 == 24) };
    // SAFETY: forwarded to the caller.
    unsafe {
        match (N8, T::IS_BF16) {
            (8, false) => wgmma::wgmma_ss_m64n64k16_f16(acc_as(d), da, db, scale_d),
            (8, true) => wgmma::wgmma_ss_m64n64k16_bf16(acc_as(d), da, db, scale_d),
            (16, false) => wgmma::wgmma_ss_m64n128k16_f16(acc_as(d), da, db, scale_d),
            (16, true) => wgmma::wgmma_ss_m64n128k16_bf16(acc_as(d), da, db, scale_d),
            (22, false) => wgmma::wgmma_ss_m64n176k16_f16(acc_as(d), da, db, scale_d),
            (22, true) => wgmma::wgmma_ss_m64n176k16_bf16(acc_as(d), da, db, scale_d),
            (_, false) => wgmma::wgmma_ss_m64n192k16_f16(acc_as(d), da, db, scale_d),
            (_, true) => wgmma::wgmma_ss_m64n192k16_bf16(acc_as(d), da, db, scale_d),
        }
    }
}

/// `d (64 × 8·N8) = A·B (+ d)`, A from registers, B MN-major in shared memory.
///
/// # Safety
/// As `wgmma::wgmma_rs_*`.
#[inline(always)]
pub unsafe fn mma_rs<T: Elem16, const N8: usize>(d: &mut [[f32; 4]; N8], a: [u32; 4], db: u64, scale_d: u32) {
    const { assert!(N8 == 8 || N8 == 16 || N8 == 24 || N8 == 32) };
    // SAFETY: forwarded to the caller.
    unsafe {
        match (N8, T::IS_BF16) {
            (8, false) => wgmma::wgmma_rs_m64n64k16_f16(acc_as(d), a, db, scale_d),
            (8, true) => wgmma::wgmma_rs_m64n64k16_bf16(acc_as(d), a, db, scale_d),
            (16, false) => wgmma::wgmma_rs_m64n128k16_f16(acc_as(d), a, db, scale_d),
            (16, true) => wgmma::wgmma_rs_m64n128k16_bf16(acc_as(d), a, db, scale_d),
            (24, false) => wgmma::wgmma_rs_m64n192k16_f16(acc_as(d), a, db, scale_d),
            (24, true) => wgmma::wgmma_rs_m64n192k16_bf16(acc_as(d), a, db, scale_d),
            (_, false) => wgmma::wgmma_rs_m64n256k16_f16(acc_as(d), a, db, scale_d),
            (_, true) => wgmma::wgmma_rs_m64n256k16_bf16(acc_as(d), a, db, scale_d),
        }
    }
}

/// `d (64 × 64) = A·B (+ d)` with A and B both MN-major in shared memory
/// (the backward's `dQ = dS·K`: `dSᵀ` and K stored with the k rows).
///
/// # Safety
/// As `wgmma::wgmma_tt_*`.
#[inline(always)]
pub unsafe fn mma_tt<T: Elem16>(d: &mut [[f32; 4]; 8], da: u64, db: u64, scale_d: u32) {
    // SAFETY: forwarded to the caller.
    unsafe {
        if T::IS_BF16 {
            wgmma::wgmma_tt_m64n64k16_bf16(d, da, db, scale_d)
        } else {
            wgmma::wgmma_tt_m64n64k16_f16(d, da, db, scale_d)
        }
    }
}

/// `d (64 × 32) = A·B (+ d)` with A and B K-major in shared memory (the d
/// 256 backward's `Sᵀ`, `dPᵀ` query halves). A function of its own, not an
/// arm of [`mma_ss`]: another arm there changes the other kernels' PTX.
///
/// # Safety
/// As `wgmma::wgmma_ss_*`.
#[inline(always)]
pub unsafe fn mma_ss_n32<T: Elem16>(d: &mut [[f32; 4]; 4], da: u64, db: u64, scale_d: u32) {
    // SAFETY: forwarded to the caller.
    unsafe {
        if T::IS_BF16 {
            wgmma::wgmma_ss_m64n32k16_bf16(d, da, db, scale_d)
        } else {
            wgmma::wgmma_ss_m64n32k16_f16(d, da, db, scale_d)
        }
    }
}

/// `d (64 × 128) = A·B (+ d)` with A and B both MN-major in shared memory
/// (the d 256 backward's `dQ = dS·K` column halves).
///
/// # Safety
/// As `wgmma::wgmma_tt_*`.
#[inline(always)]
pub unsafe fn mma_tt_n128<T: Elem16>(d: &mut [[f32; 4]; 16], da: u64, db: u64, scale_d: u32) {
    // SAFETY: forwarded to the caller.
    unsafe {
        if T::IS_BF16 {
            wgmma::wgmma_tt_m64n128k16_bf16(d, da, db, scale_d)
        } else {
            wgmma::wgmma_tt_m64n128k16_f16(d, da, db, scale_d)
        }
    }
}

/// `d (64 × 128) = A·B (+ d)`, A K-major and B MN-major in shared memory
/// (the d 256 backward's `dV += Pᵀ·dO` and `dK += dSᵀ·Q` with `Pᵀ`, `dSᵀ`
/// exchanged through shared memory).
///
/// # Safety
/// As `wgmma::wgmma_st_*`.
#[inline(always)]
pub unsafe fn mma_st<T: Elem16>(d: &mut [[f32; 4]; 16], da: u64, db: u64, scale_d: u32) {
    // SAFETY: forwarded to the caller.
    unsafe {
        if T::IS_BF16 {
            wgmma::wgmma_st_m64n128k16_bf16(d, da, db, scale_d)
        } else {
            wgmma::wgmma_st_m64n128k16_f16(d, da, db, scale_d)
        }
    }
}

/// The accumulator fence (see `wgmma::acc_fence_n*`) for `N8 · 8` columns.
#[inline(always)]
pub fn acc_fence<const N8: usize>(d: &mut [[f32; 4]; N8]) {
    const { assert!(N8 == 8 || N8 == 16 || N8 == 22 || N8 == 24 || N8 == 32) };
    match N8 {
        8 => wgmma::acc_fence_n64(acc_as(d)),
        16 => wgmma::acc_fence_n128(acc_as(d)),
        22 => wgmma::acc_fence_n176(acc_as(d)),
        24 => wgmma::acc_fence_n192(acc_as(d)),
        _ => wgmma::acc_fence_n256(acc_as(d)),
    }
}

/// Kernel entry points: `flash_fwd_hopper_{dtype}_d{D}_bc{Bc}[_ov][_pp][_w3][_ps][_vw]`
/// (`_ov`: intra-warpgroup overlap, `_pp`: pingpong between the consumer
/// warpgroups, `_w3`: three consumer warpgroups (Br = 192) instead of two,
/// `_ps`: persistent, a grid of at most one block per SM looping over tiles,
/// `_vw`: varlen (packed batches, prefix sums on the device) and sliding
/// windows, dense or varlen — a separate variant so that the dense kernels
/// keep their code).
macro_rules! hopper_kernels {
    ($( $name:ident : $t:ty, d = $d:literal, bc = $bc:literal, ov = $ov:literal, pp = $pp:literal, wgs = $wgs:literal, ps = $ps:literal $(, vw = $vw:literal)?; )*) => {$(
        /// Hopper forward kernel (see [`fwd`]).
        ///
        /// # Safety
        /// The tensor maps describe q, k and v as `host-crate/src/hopper.rs`
        /// encodes them (boxes of 64 × Br for Q, 64 × Bc for K and V,
        /// 128B swizzle); `p` valid as for the tensor-core kernels; launched
        /// with `hopper_threads(WGS)` threads, `HopperSmem::new(D, Bc, WGS).request_bytes()`
        /// bytes of dynamic shared memory, `ceil(seqlen_q / Br)·batch·nheads` blocks.
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $name(_tq: TensorMap, _tk: TensorMap, _tv: TensorMap, p: AttnParams, g_tmaps: u64) {
            let (tq, tk, tv) = if g_tmaps != 0 {
                (g_tmaps, g_tmaps + 128, g_tmaps + 256)
            } else {
                (
                    crate::param_generic_addr!(concat!(stringify!($name), "_param_0")),
                    crate::param_generic_addr!(concat!(stringify!($name), "_param_1")),
                    crate::param_generic_addr!(concat!(stringify!($name), "_param_2")),
                )
            };
            // SAFETY: forwarded to the host's launch.
            unsafe { fwd::forward::<$t, $d, $bc, { $d / 8 }, { $bc / 8 }, { $bc / 16 }, $ov, $pp, $wgs, $ps, { false $(|| $vw)? }>(tq, tk, tv, &p) }
        }
    )*};
}

use crate::tc::{Bf16, F16};

// Keep in step with `HOPPER_KERNELS` in host-crate/src/hopper.rs (the first
// kernel of a (dtype, d) there is the default).
hopper_kernels! {
    flash_fwd_hopper_f16_d64_bc128_ov: F16, d = 64, bc = 128, ov = true, pp = false, wgs = 2, ps = false;
    flash_fwd_hopper_bf16_d64_bc128_ov: Bf16, d = 64, bc = 128, ov = true, pp = false, wgs = 2, ps = false;
    flash_fwd_hopper_f16_d64_bc192_ov: F16, d = 64, bc = 192, ov = true, pp = false, wgs = 2, ps = false;
    flash_fwd_hopper_bf16_d64_bc192_ov: Bf16, d = 64, bc = 192, ov = true, pp = false, wgs = 2, ps = false;
    flash_fwd_hopper_f16_d64_bc192_ov_pp: F16, d = 64, bc = 192, ov = true, pp = true, wgs = 2, ps = false;
    flash_fwd_hopper_bf16_d64_bc192_ov_pp: Bf16, d = 64, bc = 192, ov = true, pp = true, wgs = 2, ps = false;
    flash_fwd_hopper_f16_d64_bc128_ov_w3: F16, d = 64, bc = 128, ov = true, pp = false, wgs = 3, ps = false;
    flash_fwd_hopper_bf16_d64_bc128_ov_w3: Bf16, d = 64, bc = 128, ov = true, pp = false, wgs = 3, ps = false;
    flash_fwd_hopper_f16_d64_bc128_ov_w3_ps: F16, d = 64, bc = 128, ov = true, pp = false, wgs = 3, ps = true;
    flash_fwd_hopper_bf16_d64_bc128_ov_w3_ps: Bf16, d = 64, bc = 128, ov = true, pp = false, wgs = 3, ps = true;
    flash_fwd_hopper_f16_d128_bc128_ov_ps: F16, d = 128, bc = 128, ov = true, pp = false, wgs = 2, ps = true;
    flash_fwd_hopper_bf16_d128_bc128_ov_ps: Bf16, d = 128, bc = 128, ov = true, pp = false, wgs = 2, ps = true;
    flash_fwd_hopper_f16_d256_bc64_ov_ps: F16, d = 256, bc = 64, ov = true, pp = false, wgs = 2, ps = true;
    flash_fwd_hopper_bf16_d256_bc64_ov_ps: Bf16, d = 256, bc = 64, ov = true, pp = false, wgs = 2, ps = true;
    flash_fwd_hopper_f16_d128_bc128: F16, d = 128, bc = 128, ov = false, pp = false, wgs = 2, ps = false;
    flash_fwd_hopper_bf16_d128_bc128: Bf16, d = 128, bc = 128, ov = false, pp = false, wgs = 2, ps = false;
    flash_fwd_hopper_f16_d128_bc128_ov: F16, d = 128, bc = 128, ov = true, pp = false, wgs = 2, ps = false;
    flash_fwd_hopper_bf16_d128_bc128_ov: Bf16, d = 128, bc = 128, ov = true, pp = false, wgs = 2, ps = false;
    flash_fwd_hopper_f16_d128_bc128_ov_pp: F16, d = 128, bc = 128, ov = true, pp = true, wgs = 2, ps = false;
    flash_fwd_hopper_bf16_d128_bc128_ov_pp: Bf16, d = 128, bc = 128, ov = true, pp = true, wgs = 2, ps = false;
    flash_fwd_hopper_f16_d256_bc64: F16, d = 256, bc = 64, ov = false, pp = false, wgs = 2, ps = false;
    flash_fwd_hopper_bf16_d256_bc64: Bf16, d = 256, bc = 64, ov = false, pp = false, wgs = 2, ps = false;
    flash_fwd_hopper_f16_d256_bc64_ov: F16, d = 256, bc = 64, ov = true, pp = false, wgs = 2, ps = false;
    flash_fwd_hopper_bf16_d256_bc64_ov: Bf16, d = 256, bc = 64, ov = true, pp = false, wgs = 2, ps = false;
    flash_fwd_hopper_f16_d64_bc128_ov_w3_vw: F16, d = 64, bc = 128, ov = true, pp = false, wgs = 3, ps = false, vw = true;
    flash_fwd_hopper_bf16_d64_bc128_ov_w3_vw: Bf16, d = 64, bc = 128, ov = true, pp = false, wgs = 3, ps = false, vw = true;
    flash_fwd_hopper_f16_d128_bc128_ov_vw: F16, d = 128, bc = 128, ov = true, pp = false, wgs = 2, ps = false, vw = true;
    flash_fwd_hopper_bf16_d128_bc128_ov_vw: Bf16, d = 128, bc = 128, ov = true, pp = false, wgs = 2, ps = false, vw = true;
    flash_fwd_hopper_f16_d256_bc64_ov_vw: F16, d = 256, bc = 64, ov = true, pp = false, wgs = 2, ps = false, vw = true;
    flash_fwd_hopper_bf16_d256_bc64_ov_vw: Bf16, d = 256, bc = 64, ov = true, pp = false, wgs = 2, ps = false, vw = true;
    flash_fwd_hopper_f16_d192_bc64_ov: F16, d = 192, bc = 64, ov = true, pp = false, wgs = 2, ps = false;
    flash_fwd_hopper_bf16_d192_bc64_ov: Bf16, d = 192, bc = 64, ov = true, pp = false, wgs = 2, ps = false;
    flash_fwd_hopper_f16_d192_bc64_ov_vw: F16, d = 192, bc = 64, ov = true, pp = false, wgs = 2, ps = false, vw = true;
    flash_fwd_hopper_bf16_d192_bc64_ov_vw: Bf16, d = 192, bc = 64, ov = true, pp = false, wgs = 2, ps = false, vw = true;
}

/// FP8 (e4m3) forward entry points: `flash_fwd_hopper_e4m3_{out}_d{D}`, O
/// in `out` (f16/bf16) ([`fp8`]).
macro_rules! hopper_fp8_kernels {
    ($( $name:ident : $t:ty, d = $d:literal; )*) => {$(
        /// Hopper FP8 forward kernel (see [`fp8`]).
        ///
        /// # Safety
        /// The tensor maps describe q, k (e4m3, boxes `min(d, 128) × 128`
        /// and `min(d, 128) × Bc`, 128B swizzle, 64B at d = 64) and v (box
        /// `d × Bc`, no swizzle) as `host-crate/src/hopper/fp8.rs` encodes
        /// them; `p` valid as for the 16-bit kernels, its descale pointers
        /// null or valid; launched with `HOPPER_FP8_THREADS` threads,
        /// `HopperFp8Smem::new(D).request_bytes()` bytes of dynamic shared
        /// memory, `ceil(seqlen_q / 128)·batch·nheads` blocks.
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $name(_tq: TensorMap, _tk: TensorMap, _tv: TensorMap, p: AttnParams, g_tmaps: u64) {
            let (tq, tk, tv) = if g_tmaps != 0 {
                (g_tmaps, g_tmaps + 128, g_tmaps + 256)
            } else {
                (
                    crate::param_generic_addr!(concat!(stringify!($name), "_param_0")),
                    crate::param_generic_addr!(concat!(stringify!($name), "_param_1")),
                    crate::param_generic_addr!(concat!(stringify!($name), "_param_2")),
                )
            };
            const BC: usize = flash_attn_common::hopper_fp8::hopper_fp8_bc($d);
            // SAFETY: forwarded to the host's launch.
            unsafe { fp8::forward::<$t, $d, BC, { $d / 8 }, { BC / 8 }, { BC / 32 }>(tq, tk, tv, &p) }
        }
    )*};
}

// Keep in step with `HOPPER_FP8_KERNELS` in host-crate/src/hopper/fp8.rs.
hopper_fp8_kernels! {
    flash_fwd_hopper_e4m3_f16_d64: F16, d = 64;
    flash_fwd_hopper_e4m3_bf16_d64: Bf16, d = 64;
    flash_fwd_hopper_e4m3_f16_d128: F16, d = 128;
    flash_fwd_hopper_e4m3_bf16_d128: Bf16, d = 128;
    flash_fwd_hopper_e4m3_f16_d256: F16, d = 256;
    flash_fwd_hopper_e4m3_bf16_d256: Bf16, d = 256;
}

/// Backward entry points: `flash_bwd_hopper_{dtype}_d{D}`, and
/// `flash_bwd_hopper_x_{dtype}_d{D}` with softcap and ALiBi ([`bwd`]; d 256,
/// without softcap/ALiBi: its consumers are [`bwd256`]'s).
macro_rules! hopper_bwd_kernels {
    (@body $t:ty, 256, false, $maps:ident, $p:ident) => {
        bwd256::backward::<$t>($maps, &$p)
    };
    (@body $t:ty, $d:tt, $mods:tt, $maps:ident, $p:ident) => {{
        const BR: usize = flash_attn_common::hopper_bwd::hopper_bwd_kernel_br($d, $mods);
        bwd::backward::<$t, $d, { $d / 8 }, BR, { BR / 8 }, { BR / 16 }, $mods>($maps, &$p)
    }};
    ($( $name:ident : $t:ty, d = $d:tt, mods = $mods:tt; )*) => {$(
        /// Hopper backward main kernel (see [`bwd`]): tensor maps of q,
        /// dO (boxes `64 × Br`), k and v (`64 × Bc`) and the f32 dQ
        /// accumulator (`32 × 64`), then the parameters, then `g_tmaps` (0,
        /// or the five maps in global memory, 640 bytes).
        ///
        /// # Safety
        /// `p` describes valid device buffers for the shapes and strides it
        /// states (host-checked), 16-byte aligned, strides multiples of 8
        /// elements, dq_accum zeroed and delta computed (the preprocess
        /// kernel), the maps those buffers; launched with
        /// `HOPPER_BWD_THREADS` threads, `HopperBwdSmem::with_br(D, Br)
        /// .request_bytes()` of dynamic shared memory (`HopperBwdSmem::new(D)`
        /// at d 256) and `batch · nheads_k · ceil(seqlen_k / Bc)` blocks
        /// (`Br = hopper_bwd_kernel_br(D, mods)`, also the q/dO boxes; `Bc =
        /// hopper_bwd_bc(D)`).
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $name(_tq: TensorMap, _tdo: TensorMap, _tk: TensorMap, _tv: TensorMap, _tdq: TensorMap, p: flash_attn_common::BwdParams, g_tmaps: u64) {
            let maps = if g_tmaps != 0 {
                [g_tmaps, g_tmaps + 128, g_tmaps + 256, g_tmaps + 384, g_tmaps + 512]
            } else {
                [
                    crate::param_generic_addr!(concat!(stringify!($name), "_param_0")),
                    crate::param_generic_addr!(concat!(stringify!($name), "_param_1")),
                    crate::param_generic_addr!(concat!(stringify!($name), "_param_2")),
                    crate::param_generic_addr!(concat!(stringify!($name), "_param_3")),
                    crate::param_generic_addr!(concat!(stringify!($name), "_param_4")),
                ]
            };
            // SAFETY: forwarded to the caller (the host's launch).
            unsafe { hopper_bwd_kernels!(@body $t, $d, $mods, maps, p) }
        }
    )*};
}

// Keep in step with `HOPPER_BWD_KERNELS` in host-crate/src/backward/hopper.rs.
hopper_bwd_kernels! {
    flash_bwd_hopper_f16_d64: F16, d = 64, mods = false;
    flash_bwd_hopper_bf16_d64: Bf16, d = 64, mods = false;
    flash_bwd_hopper_f16_d128: F16, d = 128, mods = false;
    flash_bwd_hopper_bf16_d128: Bf16, d = 128, mods = false;
    flash_bwd_hopper_f16_d256: F16, d = 256, mods = false;
    flash_bwd_hopper_bf16_d256: Bf16, d = 256, mods = false;
    flash_bwd_hopper_x_f16_d64: F16, d = 64, mods = true;
    flash_bwd_hopper_x_bf16_d64: Bf16, d = 64, mods = true;
    flash_bwd_hopper_x_f16_d128: F16, d = 128, mods = true;
    flash_bwd_hopper_x_bf16_d128: Bf16, d = 128, mods = true;
}

/// The probe kernels (one warpgroup, d = 128, one 64 × 128 tile).
macro_rules! probe_kernels {
    ($( $name:ident : $t:ty; )*) => {$(
        /// `S = Q·Kᵀ` (64 × 128, f32, to `p.scratch_ptr`) and `O = P·V` with
        /// `P = S` rounded to the dtype (64 × 128, f32, to `p.o_ptr`), for
        /// batch 0, head 0 of tensor maps with boxes 64 × 64 (Q) and 64 × 128
        /// (K, V).
        ///
        /// # Safety
        /// As above; 128 threads, one block, `probe::PROBE_SMEM` bytes.
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $name(_tq: TensorMap, _tk: TensorMap, _tv: TensorMap, p: AttnParams, g_tmaps: u64) {
            let (tq, tk, tv) = if g_tmaps != 0 {
                (g_tmaps, g_tmaps + 128, g_tmaps + 256)
            } else {
                (
                    crate::param_generic_addr!(concat!(stringify!($name), "_param_0")),
                    crate::param_generic_addr!(concat!(stringify!($name), "_param_1")),
                    crate::param_generic_addr!(concat!(stringify!($name), "_param_2")),
                )
            };
            // SAFETY: forwarded to the host's launch.
            unsafe { probe::probe::<$t>(tq, tk, tv, &p) }
        }
    )*};
}

probe_kernels! {
    hopper_probe_f16: F16;
    hopper_probe_bf16: Bf16;
}
