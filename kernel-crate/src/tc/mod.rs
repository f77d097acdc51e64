//! Tensor-core forward kernels for f16 and bf16 (f32 accumulation):
//! `mma.sync.m16n8k16` fed by `ldmatrix` from padded shared-memory tiles that
//! `cp.async` fills while the previous tile is being computed.
//!
//! * [`tile`]: shared-memory tiles (padded rows: conflict-free `ldmatrix`)
//!   and the warp fragments read from them.
//! * [`fa2`]: the FA2 loop order (Q blocks across the grid, K/V inner, O in
//!   registers, one final 1/l, logsumexp out).
//! * [`fa1`]: the FA1 loop order on the same tiles (one block per
//!   (batch, head), K/V outer, O/l/m read and written in HBM every step).
//!
//! Entry points are named `flash_fwd_tc_{fa1,fa2,fa2v,fa2x}_{f16,bf16}_d{D}_w{warps}_m{MT}_bc{Bc}`
//! (`Br = 16 · MT · warps`: each warp owns `MT` m-tiles of 16 query rows;
//! `fa2v`: varlen (packed batches); `fa2x`: varlen and the softcap/ALiBi
//! score modifiers; `fa2d`: decode — all of `fa2x` plus the KV cache
//! (contiguous or paged) and split-KV partials; all take GQA, windows and
//! zero-padded head dims);
//! `host-crate/src/tc/table.rs` lists them and picks the default per head dim.
//! [`flash_decode`]: `flash_fwd_tc_dec_{f16,bf16}_d{D}_w{warps}_bc{Bc}_s{stages}`,
//! one m-tile of 16 query rows whose warps split the keys (decode; listed
//! in `host-crate/src/decode/kernels.rs`).

pub mod bwd;
pub mod fa1;
pub mod fa2;
pub mod flash_decode;
pub mod tile;

use crate::arch::{cvt, mma};

/// A 16-bit floating-point element type the tensor cores take.
pub trait Elem16: Copy {
    const IS_BF16: bool;
}

/// IEEE half precision (`half::f16` on the host).
#[derive(Clone, Copy)]
pub struct F16;
/// bfloat16 (`half::bf16` on the host).
#[derive(Clone, Copy)]
pub struct Bf16;

impl Elem16 for F16 {
    const IS_BF16: bool = false;
}
impl Elem16 for Bf16 {
    const IS_BF16: bool = true;
}

/// `d += a·b` on the tensor cores in `T`'s precision.
#[inline(always)]
pub fn mma<T: Elem16>(d: &mut [f32; 4], a: &[u32; 4], b: &[u32; 2]) {
    if T::IS_BF16 { mma::mma_m16n8k16_bf16_f32(d, a, b) } else { mma::mma_m16n8k16_f16_f32(d, a, b) }
}

/// Two f32 → one packed pair of `T` (`lo` in the low half).
#[inline(always)]
pub fn pack<T: Elem16>(lo: f32, hi: f32) -> u32 {
    if T::IS_BF16 { cvt::pack_bf16x2(lo, hi) } else { cvt::pack_f16x2(lo, hi) }
}

/// Kernel entry points: one per (loop order, dtype, head dim, warps, Bc).
macro_rules! tc_kernels {
    ($( $fa:ident $name:ident : $t:ty, d = $d:literal, w = $w:literal, mt = $mt:literal, bc = $bc:literal, qreg = $qreg:literal, split = $split:literal, varlen = $varlen:literal, mods = $mods:literal, decode = $decode:literal; )*) => {$(
        /// Tensor-core forward kernel; grid and shared memory as the host's
        /// dispatch table computes them.
        ///
        /// # Safety
        /// `p` must describe valid device buffers for the shapes and strides
        /// it states (checked by the host), 16-byte aligned, with strides
        /// multiple of 8 elements; launched with `32 * w` threads and the
        /// dynamic shared memory of its config.
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $name(p: flash_attn_common::AttnParams) {
            // SAFETY: forwarded to the caller (the host's launch).
            unsafe { $fa::forward::<$t, $d, { $d / 16 }, { $d / 8 }, $w, $mt, $bc, { $bc / 8 }, { $bc / 16 }, $qreg, $split, $varlen, $mods, $decode>(&p) }
        }
    )*};
}

tc_kernels! {
    fa2 flash_fwd_tc_fa2_f16_d32_w4_m1_bc64: F16, d = 32, w = 4, mt = 1, bc = 64, qreg = true, split = true, varlen = false, mods = false, decode = false;
    fa2 flash_fwd_tc_fa2_bf16_d32_w4_m1_bc64: Bf16, d = 32, w = 4, mt = 1, bc = 64, qreg = true, split = true, varlen = false, mods = false, decode = false;
    fa2 flash_fwd_tc_fa2_f16_d32_w4_m2_bc64: F16, d = 32, w = 4, mt = 2, bc = 64, qreg = true, split = true, varlen = false, mods = false, decode = false;
    fa2 flash_fwd_tc_fa2_bf16_d32_w4_m2_bc64: Bf16, d = 32, w = 4, mt = 2, bc = 64, qreg = true, split = true, varlen = false, mods = false, decode = false;
    fa2 flash_fwd_tc_fa2_f16_d64_w4_m1_bc64: F16, d = 64, w = 4, mt = 1, bc = 64, qreg = true, split = false, varlen = false, mods = false, decode = false;
    fa2 flash_fwd_tc_fa2_bf16_d64_w4_m1_bc64: Bf16, d = 64, w = 4, mt = 1, bc = 64, qreg = true, split = false, varlen = false, mods = false, decode = false;
    fa2 flash_fwd_tc_fa2_f16_d64_w4_m2_bc64: F16, d = 64, w = 4, mt = 2, bc = 64, qreg = true, split = false, varlen = false, mods = false, decode = false;
    fa2 flash_fwd_tc_fa2_bf16_d64_w4_m2_bc64: Bf16, d = 64, w = 4, mt = 2, bc = 64, qreg = true, split = false, varlen = false, mods = false, decode = false;
    fa2 flash_fwd_tc_fa2_f16_d64_w4_m2_bc96: F16, d = 64, w = 4, mt = 2, bc = 96, qreg = false, split = false, varlen = false, mods = false, decode = false;
    fa2 flash_fwd_tc_fa2_bf16_d64_w4_m2_bc96: Bf16, d = 64, w = 4, mt = 2, bc = 96, qreg = false, split = false, varlen = false, mods = false, decode = false;
    fa2 flash_fwd_tc_fa2_f16_d64_w4_m2_bc128: F16, d = 64, w = 4, mt = 2, bc = 128, qreg = false, split = false, varlen = false, mods = false, decode = false;
    fa2 flash_fwd_tc_fa2_bf16_d64_w4_m2_bc128: Bf16, d = 64, w = 4, mt = 2, bc = 128, qreg = false, split = false, varlen = false, mods = false, decode = false;
    fa2 flash_fwd_tc_fa2_f16_d96_w4_m1_bc64: F16, d = 96, w = 4, mt = 1, bc = 64, qreg = true, split = false, varlen = false, mods = false, decode = false;
    fa2 flash_fwd_tc_fa2_bf16_d96_w4_m1_bc64: Bf16, d = 96, w = 4, mt = 1, bc = 64, qreg = true, split = false, varlen = false, mods = false, decode = false;
    fa2 flash_fwd_tc_fa2_f16_d96_w4_m2_bc64: F16, d = 96, w = 4, mt = 2, bc = 64, qreg = false, split = false, varlen = false, mods = false, decode = false;
    fa2 flash_fwd_tc_fa2_bf16_d96_w4_m2_bc64: Bf16, d = 96, w = 4, mt = 2, bc = 64, qreg = false, split = false, varlen = false, mods = false, decode = false;
    fa2 flash_fwd_tc_fa2_f16_d96_w4_m2_bc80: F16, d = 96, w = 4, mt = 2, bc = 80, qreg = false, split = false, varlen = false, mods = false, decode = false;
    fa2 flash_fwd_tc_fa2_bf16_d96_w4_m2_bc80: Bf16, d = 96, w = 4, mt = 2, bc = 80, qreg = false, split = false, varlen = false, mods = false, decode = false;
    fa2 flash_fwd_tc_fa2_f16_d128_w4_m1_bc64: F16, d = 128, w = 4, mt = 1, bc = 64, qreg = true, split = true, varlen = false, mods = false, decode = false;
    fa2 flash_fwd_tc_fa2_bf16_d128_w4_m1_bc64: Bf16, d = 128, w = 4, mt = 1, bc = 64, qreg = true, split = true, varlen = false, mods = false, decode = false;
    fa2 flash_fwd_tc_fa2_f16_d128_w4_m2_bc32: F16, d = 128, w = 4, mt = 2, bc = 32, qreg = false, split = true, varlen = false, mods = false, decode = false;
    fa2 flash_fwd_tc_fa2_bf16_d128_w4_m2_bc32: Bf16, d = 128, w = 4, mt = 2, bc = 32, qreg = false, split = true, varlen = false, mods = false, decode = false;
    fa2 flash_fwd_tc_fa2_f16_d128_w4_m2_bc48: F16, d = 128, w = 4, mt = 2, bc = 48, qreg = false, split = true, varlen = false, mods = false, decode = false;
    fa2 flash_fwd_tc_fa2_bf16_d128_w4_m2_bc48: Bf16, d = 128, w = 4, mt = 2, bc = 48, qreg = false, split = true, varlen = false, mods = false, decode = false;
    fa2 flash_fwd_tc_fa2_f16_d128_w4_m2_bc64: F16, d = 128, w = 4, mt = 2, bc = 64, qreg = false, split = true, varlen = false, mods = false, decode = false;
    fa2 flash_fwd_tc_fa2_bf16_d128_w4_m2_bc64: Bf16, d = 128, w = 4, mt = 2, bc = 64, qreg = false, split = true, varlen = false, mods = false, decode = false;
    fa2 flash_fwd_tc_fa2_f16_d160_w8_m1_bc64: F16, d = 160, w = 8, mt = 1, bc = 64, qreg = false, split = false, varlen = false, mods = false, decode = false;
    fa2 flash_fwd_tc_fa2_bf16_d160_w8_m1_bc64: Bf16, d = 160, w = 8, mt = 1, bc = 64, qreg = false, split = false, varlen = false, mods = false, decode = false;
    fa2 flash_fwd_tc_fa2_f16_d160_w4_m1_bc32: F16, d = 160, w = 4, mt = 1, bc = 32, qreg = false, split = false, varlen = false, mods = false, decode = false;
    fa2 flash_fwd_tc_fa2_bf16_d160_w4_m1_bc32: Bf16, d = 160, w = 4, mt = 1, bc = 32, qreg = false, split = false, varlen = false, mods = false, decode = false;
    fa2 flash_fwd_tc_fa2_f16_d192_w8_m1_bc64: F16, d = 192, w = 8, mt = 1, bc = 64, qreg = false, split = false, varlen = false, mods = false, decode = false;
    fa2 flash_fwd_tc_fa2_bf16_d192_w8_m1_bc64: Bf16, d = 192, w = 8, mt = 1, bc = 64, qreg = false, split = false, varlen = false, mods = false, decode = false;
    fa2 flash_fwd_tc_fa2_f16_d192_w4_m1_bc32: F16, d = 192, w = 4, mt = 1, bc = 32, qreg = false, split = false, varlen = false, mods = false, decode = false;
    fa2 flash_fwd_tc_fa2_bf16_d192_w4_m1_bc32: Bf16, d = 192, w = 4, mt = 1, bc = 32, qreg = false, split = false, varlen = false, mods = false, decode = false;
    fa2 flash_fwd_tc_fa2_f16_d224_w8_m1_bc64: F16, d = 224, w = 8, mt = 1, bc = 64, qreg = false, split = false, varlen = false, mods = false, decode = false;
    fa2 flash_fwd_tc_fa2_bf16_d224_w8_m1_bc64: Bf16, d = 224, w = 8, mt = 1, bc = 64, qreg = false, split = false, varlen = false, mods = false, decode = false;
    fa2 flash_fwd_tc_fa2_f16_d224_w4_m1_bc32: F16, d = 224, w = 4, mt = 1, bc = 32, qreg = false, split = false, varlen = false, mods = false, decode = false;
    fa2 flash_fwd_tc_fa2_bf16_d224_w4_m1_bc32: Bf16, d = 224, w = 4, mt = 1, bc = 32, qreg = false, split = false, varlen = false, mods = false, decode = false;
    fa2 flash_fwd_tc_fa2_f16_d256_w8_m1_bc64: F16, d = 256, w = 8, mt = 1, bc = 64, qreg = false, split = false, varlen = false, mods = false, decode = false;
    fa2 flash_fwd_tc_fa2_bf16_d256_w8_m1_bc64: Bf16, d = 256, w = 8, mt = 1, bc = 64, qreg = false, split = false, varlen = false, mods = false, decode = false;
    fa2 flash_fwd_tc_fa2_f16_d256_w4_m1_bc32: F16, d = 256, w = 4, mt = 1, bc = 32, qreg = false, split = false, varlen = false, mods = false, decode = false;
    fa2 flash_fwd_tc_fa2_bf16_d256_w4_m1_bc32: Bf16, d = 256, w = 4, mt = 1, bc = 32, qreg = false, split = false, varlen = false, mods = false, decode = false;
    fa2 flash_fwd_tc_fa2_f16_d256_w8_m1_bc32: F16, d = 256, w = 8, mt = 1, bc = 32, qreg = false, split = false, varlen = false, mods = false, decode = false;
    fa2 flash_fwd_tc_fa2_bf16_d256_w8_m1_bc32: Bf16, d = 256, w = 8, mt = 1, bc = 32, qreg = false, split = false, varlen = false, mods = false, decode = false;
    fa2 flash_fwd_tc_fa2v_f16_d32_w4_m2_bc64: F16, d = 32, w = 4, mt = 2, bc = 64, qreg = true, split = true, varlen = true, mods = false, decode = false;
    fa2 flash_fwd_tc_fa2v_bf16_d32_w4_m2_bc64: Bf16, d = 32, w = 4, mt = 2, bc = 64, qreg = true, split = true, varlen = true, mods = false, decode = false;
    fa2 flash_fwd_tc_fa2v_f16_d64_w4_m2_bc96: F16, d = 64, w = 4, mt = 2, bc = 96, qreg = false, split = false, varlen = true, mods = false, decode = false;
    fa2 flash_fwd_tc_fa2v_bf16_d64_w4_m2_bc96: Bf16, d = 64, w = 4, mt = 2, bc = 96, qreg = false, split = false, varlen = true, mods = false, decode = false;
    fa2 flash_fwd_tc_fa2v_f16_d96_w4_m2_bc80: F16, d = 96, w = 4, mt = 2, bc = 80, qreg = false, split = false, varlen = true, mods = false, decode = false;
    fa2 flash_fwd_tc_fa2v_bf16_d96_w4_m2_bc80: Bf16, d = 96, w = 4, mt = 2, bc = 80, qreg = false, split = false, varlen = true, mods = false, decode = false;
    fa2 flash_fwd_tc_fa2v_f16_d128_w4_m2_bc48: F16, d = 128, w = 4, mt = 2, bc = 48, qreg = false, split = true, varlen = true, mods = false, decode = false;
    fa2 flash_fwd_tc_fa2v_bf16_d128_w4_m2_bc48: Bf16, d = 128, w = 4, mt = 2, bc = 48, qreg = false, split = true, varlen = true, mods = false, decode = false;
    fa2 flash_fwd_tc_fa2v_f16_d160_w8_m1_bc64: F16, d = 160, w = 8, mt = 1, bc = 64, qreg = false, split = false, varlen = true, mods = false, decode = false;
    fa2 flash_fwd_tc_fa2v_bf16_d160_w8_m1_bc64: Bf16, d = 160, w = 8, mt = 1, bc = 64, qreg = false, split = false, varlen = true, mods = false, decode = false;
    fa2 flash_fwd_tc_fa2v_f16_d192_w8_m1_bc64: F16, d = 192, w = 8, mt = 1, bc = 64, qreg = false, split = false, varlen = true, mods = false, decode = false;
    fa2 flash_fwd_tc_fa2v_bf16_d192_w8_m1_bc64: Bf16, d = 192, w = 8, mt = 1, bc = 64, qreg = false, split = false, varlen = true, mods = false, decode = false;
    fa2 flash_fwd_tc_fa2v_f16_d224_w8_m1_bc64: F16, d = 224, w = 8, mt = 1, bc = 64, qreg = false, split = false, varlen = true, mods = false, decode = false;
    fa2 flash_fwd_tc_fa2v_bf16_d224_w8_m1_bc64: Bf16, d = 224, w = 8, mt = 1, bc = 64, qreg = false, split = false, varlen = true, mods = false, decode = false;
    fa2 flash_fwd_tc_fa2v_f16_d256_w8_m1_bc64: F16, d = 256, w = 8, mt = 1, bc = 64, qreg = false, split = false, varlen = true, mods = false, decode = false;
    fa2 flash_fwd_tc_fa2v_bf16_d256_w8_m1_bc64: Bf16, d = 256, w = 8, mt = 1, bc = 64, qreg = false, split = false, varlen = true, mods = false, decode = false;
    fa2 flash_fwd_tc_fa2x_f16_d32_w4_m2_bc64: F16, d = 32, w = 4, mt = 2, bc = 64, qreg = true, split = true, varlen = true, mods = true, decode = false;
    fa2 flash_fwd_tc_fa2x_bf16_d32_w4_m2_bc64: Bf16, d = 32, w = 4, mt = 2, bc = 64, qreg = true, split = true, varlen = true, mods = true, decode = false;
    fa2 flash_fwd_tc_fa2x_f16_d64_w4_m2_bc64: F16, d = 64, w = 4, mt = 2, bc = 64, qreg = false, split = false, varlen = true, mods = true, decode = false;
    fa2 flash_fwd_tc_fa2x_bf16_d64_w4_m2_bc64: Bf16, d = 64, w = 4, mt = 2, bc = 64, qreg = false, split = false, varlen = true, mods = true, decode = false;
    fa2 flash_fwd_tc_fa2x_f16_d96_w4_m2_bc64: F16, d = 96, w = 4, mt = 2, bc = 64, qreg = false, split = false, varlen = true, mods = true, decode = false;
    fa2 flash_fwd_tc_fa2x_bf16_d96_w4_m2_bc64: Bf16, d = 96, w = 4, mt = 2, bc = 64, qreg = false, split = false, varlen = true, mods = true, decode = false;
    fa2 flash_fwd_tc_fa2x_f16_d128_w4_m2_bc32: F16, d = 128, w = 4, mt = 2, bc = 32, qreg = false, split = true, varlen = true, mods = true, decode = false;
    fa2 flash_fwd_tc_fa2x_bf16_d128_w4_m2_bc32: Bf16, d = 128, w = 4, mt = 2, bc = 32, qreg = false, split = true, varlen = true, mods = true, decode = false;
    fa2 flash_fwd_tc_fa2x_f16_d160_w4_m1_bc32: F16, d = 160, w = 4, mt = 1, bc = 32, qreg = false, split = false, varlen = true, mods = true, decode = false;
    fa2 flash_fwd_tc_fa2x_bf16_d160_w4_m1_bc32: Bf16, d = 160, w = 4, mt = 1, bc = 32, qreg = false, split = false, varlen = true, mods = true, decode = false;
    fa2 flash_fwd_tc_fa2x_f16_d192_w4_m1_bc32: F16, d = 192, w = 4, mt = 1, bc = 32, qreg = false, split = false, varlen = true, mods = true, decode = false;
    fa2 flash_fwd_tc_fa2x_bf16_d192_w4_m1_bc32: Bf16, d = 192, w = 4, mt = 1, bc = 32, qreg = false, split = false, varlen = true, mods = true, decode = false;
    fa2 flash_fwd_tc_fa2x_f16_d224_w4_m1_bc32: F16, d = 224, w = 4, mt = 1, bc = 32, qreg = false, split = false, varlen = true, mods = true, decode = false;
    fa2 flash_fwd_tc_fa2x_bf16_d224_w4_m1_bc32: Bf16, d = 224, w = 4, mt = 1, bc = 32, qreg = false, split = false, varlen = true, mods = true, decode = false;
    fa2 flash_fwd_tc_fa2x_f16_d256_w4_m1_bc32: F16, d = 256, w = 4, mt = 1, bc = 32, qreg = false, split = false, varlen = true, mods = true, decode = false;
    fa2 flash_fwd_tc_fa2x_bf16_d256_w4_m1_bc32: Bf16, d = 256, w = 4, mt = 1, bc = 32, qreg = false, split = false, varlen = true, mods = true, decode = false;
    fa2 flash_fwd_tc_fa2d_f16_d32_w4_m1_bc64: F16, d = 32, w = 4, mt = 1, bc = 64, qreg = false, split = true, varlen = true, mods = true, decode = true;
    fa2 flash_fwd_tc_fa2d_bf16_d32_w4_m1_bc64: Bf16, d = 32, w = 4, mt = 1, bc = 64, qreg = false, split = true, varlen = true, mods = true, decode = true;
    fa2 flash_fwd_tc_fa2d_f16_d64_w4_m1_bc64: F16, d = 64, w = 4, mt = 1, bc = 64, qreg = false, split = false, varlen = true, mods = true, decode = true;
    fa2 flash_fwd_tc_fa2d_bf16_d64_w4_m1_bc64: Bf16, d = 64, w = 4, mt = 1, bc = 64, qreg = false, split = false, varlen = true, mods = true, decode = true;
    fa2 flash_fwd_tc_fa2d_f16_d96_w4_m1_bc64: F16, d = 96, w = 4, mt = 1, bc = 64, qreg = false, split = false, varlen = true, mods = true, decode = true;
    fa2 flash_fwd_tc_fa2d_bf16_d96_w4_m1_bc64: Bf16, d = 96, w = 4, mt = 1, bc = 64, qreg = false, split = false, varlen = true, mods = true, decode = true;
    fa2 flash_fwd_tc_fa2d_f16_d128_w4_m1_bc64: F16, d = 128, w = 4, mt = 1, bc = 64, qreg = false, split = true, varlen = true, mods = true, decode = true;
    fa2 flash_fwd_tc_fa2d_bf16_d128_w4_m1_bc64: Bf16, d = 128, w = 4, mt = 1, bc = 64, qreg = false, split = true, varlen = true, mods = true, decode = true;
    fa2 flash_fwd_tc_fa2d_f16_d160_w4_m1_bc32: F16, d = 160, w = 4, mt = 1, bc = 32, qreg = false, split = false, varlen = true, mods = true, decode = true;
    fa2 flash_fwd_tc_fa2d_bf16_d160_w4_m1_bc32: Bf16, d = 160, w = 4, mt = 1, bc = 32, qreg = false, split = false, varlen = true, mods = true, decode = true;
    fa2 flash_fwd_tc_fa2d_f16_d192_w4_m1_bc32: F16, d = 192, w = 4, mt = 1, bc = 32, qreg = false, split = false, varlen = true, mods = true, decode = true;
    fa2 flash_fwd_tc_fa2d_bf16_d192_w4_m1_bc32: Bf16, d = 192, w = 4, mt = 1, bc = 32, qreg = false, split = false, varlen = true, mods = true, decode = true;
    fa2 flash_fwd_tc_fa2d_f16_d224_w4_m1_bc32: F16, d = 224, w = 4, mt = 1, bc = 32, qreg = false, split = false, varlen = true, mods = true, decode = true;
    fa2 flash_fwd_tc_fa2d_bf16_d224_w4_m1_bc32: Bf16, d = 224, w = 4, mt = 1, bc = 32, qreg = false, split = false, varlen = true, mods = true, decode = true;
    fa2 flash_fwd_tc_fa2d_f16_d256_w4_m1_bc32: F16, d = 256, w = 4, mt = 1, bc = 32, qreg = false, split = false, varlen = true, mods = true, decode = true;
    fa2 flash_fwd_tc_fa2d_bf16_d256_w4_m1_bc32: Bf16, d = 256, w = 4, mt = 1, bc = 32, qreg = false, split = false, varlen = true, mods = true, decode = true;
    fa1 flash_fwd_tc_fa1_f16_d32_w4_m1_bc64: F16, d = 32, w = 4, mt = 1, bc = 64, qreg = false, split = false, varlen = false, mods = false, decode = false;
    fa1 flash_fwd_tc_fa1_bf16_d32_w4_m1_bc64: Bf16, d = 32, w = 4, mt = 1, bc = 64, qreg = false, split = false, varlen = false, mods = false, decode = false;
    fa1 flash_fwd_tc_fa1_f16_d64_w4_m1_bc64: F16, d = 64, w = 4, mt = 1, bc = 64, qreg = false, split = false, varlen = false, mods = false, decode = false;
    fa1 flash_fwd_tc_fa1_bf16_d64_w4_m1_bc64: Bf16, d = 64, w = 4, mt = 1, bc = 64, qreg = false, split = false, varlen = false, mods = false, decode = false;
    fa1 flash_fwd_tc_fa1_f16_d96_w4_m1_bc64: F16, d = 96, w = 4, mt = 1, bc = 64, qreg = false, split = false, varlen = false, mods = false, decode = false;
    fa1 flash_fwd_tc_fa1_bf16_d96_w4_m1_bc64: Bf16, d = 96, w = 4, mt = 1, bc = 64, qreg = false, split = false, varlen = false, mods = false, decode = false;
    fa1 flash_fwd_tc_fa1_f16_d128_w4_m1_bc64: F16, d = 128, w = 4, mt = 1, bc = 64, qreg = false, split = false, varlen = false, mods = false, decode = false;
    fa1 flash_fwd_tc_fa1_bf16_d128_w4_m1_bc64: Bf16, d = 128, w = 4, mt = 1, bc = 64, qreg = false, split = false, varlen = false, mods = false, decode = false;
    fa1 flash_fwd_tc_fa1_f16_d160_w4_m1_bc32: F16, d = 160, w = 4, mt = 1, bc = 32, qreg = false, split = false, varlen = false, mods = false, decode = false;
    fa1 flash_fwd_tc_fa1_bf16_d160_w4_m1_bc32: Bf16, d = 160, w = 4, mt = 1, bc = 32, qreg = false, split = false, varlen = false, mods = false, decode = false;
    fa1 flash_fwd_tc_fa1_f16_d192_w4_m1_bc32: F16, d = 192, w = 4, mt = 1, bc = 32, qreg = false, split = false, varlen = false, mods = false, decode = false;
    fa1 flash_fwd_tc_fa1_bf16_d192_w4_m1_bc32: Bf16, d = 192, w = 4, mt = 1, bc = 32, qreg = false, split = false, varlen = false, mods = false, decode = false;
    fa1 flash_fwd_tc_fa1_f16_d224_w4_m1_bc32: F16, d = 224, w = 4, mt = 1, bc = 32, qreg = false, split = false, varlen = false, mods = false, decode = false;
    fa1 flash_fwd_tc_fa1_bf16_d224_w4_m1_bc32: Bf16, d = 224, w = 4, mt = 1, bc = 32, qreg = false, split = false, varlen = false, mods = false, decode = false;
    fa1 flash_fwd_tc_fa1_f16_d256_w4_m1_bc32: F16, d = 256, w = 4, mt = 1, bc = 32, qreg = false, split = false, varlen = false, mods = false, decode = false;
    fa1 flash_fwd_tc_fa1_bf16_d256_w4_m1_bc32: Bf16, d = 256, w = 4, mt = 1, bc = 32, qreg = false, split = false, varlen = false, mods = false, decode = false;
}

/// Flash-decoding entry points (`flash_decode`): one per (dtype, head dim,
/// warps, Bc, stages); `Bcw = Bc / warps` keys per warp.
macro_rules! dec_kernels {
    ($( $name:ident $(/ $compact:ident)? : $t:ty, d = $d:literal, w = $w:literal, bc = $bc:literal, s = $s:literal, qreg = $qreg:literal, pf = $pf:literal, tickets = $tk:literal, append = $ap:literal, page_batch = $pb:literal; )*) => {$(
        /// Flash-decoding kernel; grid and shared memory as the host's
        /// decode table computes them.
        ///
        /// # Safety
        /// As the `fa2d` kernels: `p` describes valid device buffers
        /// (host-checked), launched with `32 * w` threads and the dynamic
        /// shared memory of its config.
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $name(p: flash_attn_common::AttnParams) {
            // SAFETY: forwarded to the caller (the host's launch).
            unsafe {
                flash_decode::forward::<$t, $d, { $d / 16 }, { $d / 8 }, $w, $bc, { $bc / $w }, { $bc / $w / 8 }, { $bc / $w / 16 }, $s, $qreg, $pf, $tk, $ap, $pb>(&p)
            }
        }
        $(
            /// The same kernel taking the compact 184-byte block
            /// (`flash_attn_common::decode_params`: launches 0.3–0.85 µs
            /// sooner than with the 336-byte `AttnParams`).
            ///
            /// # Safety
            /// As the kernel above for `c.to_attn(16, bc)`.
            #[unsafe(no_mangle)]
            pub unsafe extern "ptx-kernel" fn $compact(c: flash_attn_common::DecodeParams) {
                let p = c.to_attn(flash_attn_common::tc::DEC_BR as u32, $bc);
                // SAFETY: forwarded to the caller (the host's launch).
                unsafe {
                    flash_decode::forward::<$t, $d, { $d / 16 }, { $d / 8 }, $w, $bc, { $bc / $w }, { $bc / $w / 8 }, { $bc / $w / 16 }, $s, $qreg, $pf, $tk, $ap, $pb>(&p)
                }
            }
        )?
    )*};
}

/// Flash-decoding entry points over an FP8 (e4m3) KV cache
/// (`flash_decode::forward_f8`): q and O in f16/bf16, the cache's codes staged in
/// shared memory and read from there straight into tensor-core fragments
/// (the sm_90 builds only), K's and V's scales from `AttnParams::k_descale_ptr`/`v_descale_ptr`.
/// The static split schedule; new keys are appended (quantized) by
/// `kv_append_e4m3_*` before the launch.
#[cfg(fa_ptx74)]
macro_rules! dec_f8_kernels {
    ($( $name:ident : $t:ty, d = $d:literal, w = $w:literal, bc = $bc:literal, s = $s:literal, pf = $pf:literal; )*) => {$(
        /// Flash-decoding kernel over an FP8 KV cache; grid and shared
        /// memory as the host's decode table computes them.
        ///
        /// # Safety
        /// As the `fa2d` kernels, with one-byte cache elements and the
        /// scale arrays set: `p` describes valid device buffers
        /// (host-checked), launched with `32 * w` threads and the dynamic
        /// shared memory of its config.
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $name(p: flash_attn_common::AttnParams) {
            // SAFETY: forwarded to the caller (the host's launch).
            unsafe {
                flash_decode::forward_f8::<$t, $d, { $d / 16 }, { $d / 8 }, $w, $bc, { $bc / $w }, { $bc / $w / 8 }, { $bc / $w / 16 }, $s, $pf>(&p)
            }
        }
    )*};
}

#[cfg(fa_ptx74)]
dec_f8_kernels! {
    flash_fwd_tc_dec_f16_e4m3_d32_w4_bc64_s4: F16, d = 32, w = 4, bc = 64, s = 4, pf = 0;
    flash_fwd_tc_dec_bf16_e4m3_d32_w4_bc64_s4: Bf16, d = 32, w = 4, bc = 64, s = 4, pf = 0;
    flash_fwd_tc_dec_f16_e4m3_d64_w4_bc64_s4: F16, d = 64, w = 4, bc = 64, s = 4, pf = 0;
    flash_fwd_tc_dec_bf16_e4m3_d64_w4_bc64_s4: Bf16, d = 64, w = 4, bc = 64, s = 4, pf = 0;
    flash_fwd_tc_dec_f16_e4m3_d96_w4_bc64_s4: F16, d = 96, w = 4, bc = 64, s = 4, pf = 0;
    flash_fwd_tc_dec_bf16_e4m3_d96_w4_bc64_s4: Bf16, d = 96, w = 4, bc = 64, s = 4, pf = 0;
    flash_fwd_tc_dec_f16_e4m3_d128_w8_bc128_s4: F16, d = 128, w = 8, bc = 128, s = 4, pf = 128;
    flash_fwd_tc_dec_bf16_e4m3_d128_w8_bc128_s4: Bf16, d = 128, w = 8, bc = 128, s = 4, pf = 128;
    flash_fwd_tc_dec_f16_e4m3_d128_w4_bc128_s3: F16, d = 128, w = 4, bc = 128, s = 3, pf = 128;
    flash_fwd_tc_dec_bf16_e4m3_d128_w4_bc128_s3: Bf16, d = 128, w = 4, bc = 128, s = 3, pf = 128;
    flash_fwd_tc_dec_f16_e4m3_d128_w4_bc64_s4: F16, d = 128, w = 4, bc = 64, s = 4, pf = 128;
    flash_fwd_tc_dec_bf16_e4m3_d128_w4_bc64_s4: Bf16, d = 128, w = 4, bc = 64, s = 4, pf = 128;
    flash_fwd_tc_dec_f16_e4m3_d160_w4_bc64_s4: F16, d = 160, w = 4, bc = 64, s = 4, pf = 0;
    flash_fwd_tc_dec_bf16_e4m3_d160_w4_bc64_s4: Bf16, d = 160, w = 4, bc = 64, s = 4, pf = 0;
    flash_fwd_tc_dec_f16_e4m3_d192_w4_bc64_s4: F16, d = 192, w = 4, bc = 64, s = 4, pf = 0;
    flash_fwd_tc_dec_bf16_e4m3_d192_w4_bc64_s4: Bf16, d = 192, w = 4, bc = 64, s = 4, pf = 0;
    flash_fwd_tc_dec_f16_e4m3_d224_w4_bc64_s4: F16, d = 224, w = 4, bc = 64, s = 4, pf = 0;
    flash_fwd_tc_dec_bf16_e4m3_d224_w4_bc64_s4: Bf16, d = 224, w = 4, bc = 64, s = 4, pf = 0;
    flash_fwd_tc_dec_f16_e4m3_d256_w4_bc64_s4: F16, d = 256, w = 4, bc = 64, s = 4, pf = 0;
    flash_fwd_tc_dec_bf16_e4m3_d256_w4_bc64_s4: Bf16, d = 256, w = 4, bc = 64, s = 4, pf = 0;
}

dec_kernels! {
    flash_fwd_tc_dec_f16_d32_w4_bc64_s3 / flash_fwd_tc_dec_f16_d32_w4_bc64_s3_c: F16, d = 32, w = 4, bc = 64, s = 3, qreg = false, pf = 0, tickets = false, append = false, page_batch = false;
    flash_fwd_tc_dec_bf16_d32_w4_bc64_s3 / flash_fwd_tc_dec_bf16_d32_w4_bc64_s3_c: Bf16, d = 32, w = 4, bc = 64, s = 3, qreg = false, pf = 0, tickets = false, append = false, page_batch = false;
    flash_fwd_tc_dec_f16_d64_w4_bc64_s3 / flash_fwd_tc_dec_f16_d64_w4_bc64_s3_c: F16, d = 64, w = 4, bc = 64, s = 3, qreg = false, pf = 0, tickets = false, append = false, page_batch = false;
    flash_fwd_tc_dec_bf16_d64_w4_bc64_s3 / flash_fwd_tc_dec_bf16_d64_w4_bc64_s3_c: Bf16, d = 64, w = 4, bc = 64, s = 3, qreg = false, pf = 0, tickets = false, append = false, page_batch = false;
    flash_fwd_tc_dec_f16_d96_w4_bc64_s3 / flash_fwd_tc_dec_f16_d96_w4_bc64_s3_c: F16, d = 96, w = 4, bc = 64, s = 3, qreg = false, pf = 0, tickets = false, append = false, page_batch = false;
    flash_fwd_tc_dec_bf16_d96_w4_bc64_s3 / flash_fwd_tc_dec_bf16_d96_w4_bc64_s3_c: Bf16, d = 96, w = 4, bc = 64, s = 3, qreg = false, pf = 0, tickets = false, append = false, page_batch = false;
    flash_fwd_tc_dec_f16_d128_w4_bc64_s2: F16, d = 128, w = 4, bc = 64, s = 2, qreg = false, pf = 0, tickets = true, append = true, page_batch = false;
    flash_fwd_tc_dec_bf16_d128_w4_bc64_s2: Bf16, d = 128, w = 4, bc = 64, s = 2, qreg = false, pf = 0, tickets = true, append = true, page_batch = false;
    flash_fwd_tc_dec_f16_d128_w4_bc64_s3 / flash_fwd_tc_dec_f16_d128_w4_bc64_s3_c: F16, d = 128, w = 4, bc = 64, s = 3, qreg = false, pf = 0, tickets = false, append = false, page_batch = true;
    flash_fwd_tc_dec_bf16_d128_w4_bc64_s3 / flash_fwd_tc_dec_bf16_d128_w4_bc64_s3_c: Bf16, d = 128, w = 4, bc = 64, s = 3, qreg = false, pf = 0, tickets = false, append = false, page_batch = true;
    flash_fwd_tc_dec_f16_d128_w4_bc128_s2: F16, d = 128, w = 4, bc = 128, s = 2, qreg = false, pf = 0, tickets = true, append = true, page_batch = false;
    flash_fwd_tc_dec_bf16_d128_w4_bc128_s2: Bf16, d = 128, w = 4, bc = 128, s = 2, qreg = false, pf = 0, tickets = true, append = true, page_batch = false;
    flash_fwd_tc_dec_f16_d128_w8_bc128_s3 / flash_fwd_tc_dec_f16_d128_w8_bc128_s3_c: F16, d = 128, w = 8, bc = 128, s = 3, qreg = false, pf = 128, tickets = true, append = true, page_batch = false;
    flash_fwd_tc_dec_bf16_d128_w8_bc128_s3 / flash_fwd_tc_dec_bf16_d128_w8_bc128_s3_c: Bf16, d = 128, w = 8, bc = 128, s = 3, qreg = false, pf = 128, tickets = true, append = true, page_batch = false;
    flash_fwd_tc_dec_f16_d128_w8_bc128_s2 / flash_fwd_tc_dec_f16_d128_w8_bc128_s2_c: F16, d = 128, w = 8, bc = 128, s = 2, qreg = false, pf = 128, tickets = true, append = true, page_batch = false;
    flash_fwd_tc_dec_bf16_d128_w8_bc128_s2 / flash_fwd_tc_dec_bf16_d128_w8_bc128_s2_c: Bf16, d = 128, w = 8, bc = 128, s = 2, qreg = false, pf = 128, tickets = true, append = true, page_batch = false;
    flash_fwd_tc_dec_f16_d128_w8_bc128_s3_pg / flash_fwd_tc_dec_f16_d128_w8_bc128_s3_pg_c: F16, d = 128, w = 8, bc = 128, s = 3, qreg = true, pf = 128, tickets = false, append = false, page_batch = true;
    flash_fwd_tc_dec_bf16_d128_w8_bc128_s3_pg / flash_fwd_tc_dec_bf16_d128_w8_bc128_s3_pg_c: Bf16, d = 128, w = 8, bc = 128, s = 3, qreg = true, pf = 128, tickets = false, append = false, page_batch = true;
    flash_fwd_tc_dec_f16_d128_w8_bc128_s3_pga: F16, d = 128, w = 8, bc = 128, s = 3, qreg = false, pf = 128, tickets = false, append = true, page_batch = true;
    flash_fwd_tc_dec_bf16_d128_w8_bc128_s3_pga: Bf16, d = 128, w = 8, bc = 128, s = 3, qreg = false, pf = 128, tickets = false, append = true, page_batch = true;
    flash_fwd_tc_dec_f16_d160_w4_bc64_s2 / flash_fwd_tc_dec_f16_d160_w4_bc64_s2_c: F16, d = 160, w = 4, bc = 64, s = 2, qreg = false, pf = 0, tickets = false, append = false, page_batch = false;
    flash_fwd_tc_dec_bf16_d160_w4_bc64_s2 / flash_fwd_tc_dec_bf16_d160_w4_bc64_s2_c: Bf16, d = 160, w = 4, bc = 64, s = 2, qreg = false, pf = 0, tickets = false, append = false, page_batch = false;
    flash_fwd_tc_dec_f16_d192_w4_bc64_s2 / flash_fwd_tc_dec_f16_d192_w4_bc64_s2_c: F16, d = 192, w = 4, bc = 64, s = 2, qreg = false, pf = 0, tickets = false, append = false, page_batch = false;
    flash_fwd_tc_dec_bf16_d192_w4_bc64_s2 / flash_fwd_tc_dec_bf16_d192_w4_bc64_s2_c: Bf16, d = 192, w = 4, bc = 64, s = 2, qreg = false, pf = 0, tickets = false, append = false, page_batch = false;
    flash_fwd_tc_dec_f16_d224_w4_bc64_s2 / flash_fwd_tc_dec_f16_d224_w4_bc64_s2_c: F16, d = 224, w = 4, bc = 64, s = 2, qreg = false, pf = 0, tickets = false, append = false, page_batch = false;
    flash_fwd_tc_dec_bf16_d224_w4_bc64_s2 / flash_fwd_tc_dec_bf16_d224_w4_bc64_s2_c: Bf16, d = 224, w = 4, bc = 64, s = 2, qreg = false, pf = 0, tickets = false, append = false, page_batch = false;
    flash_fwd_tc_dec_f16_d256_w4_bc64_s2 / flash_fwd_tc_dec_f16_d256_w4_bc64_s2_c: F16, d = 256, w = 4, bc = 64, s = 2, qreg = false, pf = 0, tickets = false, append = false, page_batch = false;
    flash_fwd_tc_dec_bf16_d256_w4_bc64_s2 / flash_fwd_tc_dec_bf16_d256_w4_bc64_s2_c: Bf16, d = 256, w = 4, bc = 64, s = 2, qreg = false, pf = 0, tickets = false, append = false, page_batch = false;
}
