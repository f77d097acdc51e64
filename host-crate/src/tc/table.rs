//! The table of compiled tensor-core configurations and the default choice
//! per head dim with the measurement that chose it: pure data and rules
//! (no GPU), below `dispatch`, which plans from it.

use crate::types::Features;
use flash_attn_common::tc::{fa1_tc_smem_bytes, fa2_tc_smem_bytes, tc_br};

/// Which loop order a tensor-core kernel runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TcLoop {
    /// K/V blocks outer, Q blocks inner, O/l/m through HBM every step.
    Fa1,
    /// Q blocks across the grid, K/V inner, O on chip.
    Fa2,
}

/// One compiled tensor-core kernel configuration.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TcKernel {
    pub name: &'static str,
    pub loop_order: TcLoop,
    pub bf16: bool,
    /// Varlen (packed batches) compiled in (`fa2v`, `fa2x` kernels).
    pub varlen: bool,
    /// Softcap/ALiBi score modifiers compiled in (`fa2x`, `fa2d` kernels).
    pub mods: bool,
    /// KV cache (contiguous, paged) and split-KV partials (`fa2d` kernels).
    pub decode: bool,
    /// Head dim (compiled; the caller's may be smaller: zero-padded).
    pub d: usize,
    /// Warps per block.
    pub warps: usize,
    /// m-tiles of 16 query rows per warp.
    pub mt: usize,
    /// Keys per K/V block (`Bc`).
    pub bc: usize,
}

macro_rules! table {
    ($( $lo:ident $name:ident $bf:literal $varlen:literal $mods:literal $decode:literal $d:literal $w:literal $mt:literal $bc:literal; )*) => {
        /// Every tensor-core kernel compiled into the PTX (mirrors the
        /// `tc_kernels!` list of `kernel-crate/src/tc/mod.rs`).
        pub const TC_KERNELS: &[TcKernel] = &[$(
            TcKernel { name: stringify!($name), loop_order: TcLoop::$lo, bf16: $bf, varlen: $varlen, mods: $mods, decode: $decode, d: $d, warps: $w, mt: $mt, bc: $bc },
        )*];
    };
}

table! {
    Fa2 flash_fwd_tc_fa2_f16_d32_w4_m1_bc64 false false false false 32 4 1 64;
    Fa2 flash_fwd_tc_fa2_bf16_d32_w4_m1_bc64 true false false false 32 4 1 64;
    Fa2 flash_fwd_tc_fa2_f16_d32_w4_m2_bc64 false false false false 32 4 2 64;
    Fa2 flash_fwd_tc_fa2_bf16_d32_w4_m2_bc64 true false false false 32 4 2 64;
    Fa2 flash_fwd_tc_fa2_f16_d64_w4_m1_bc64 false false false false 64 4 1 64;
    Fa2 flash_fwd_tc_fa2_bf16_d64_w4_m1_bc64 true false false false 64 4 1 64;
    Fa2 flash_fwd_tc_fa2_f16_d64_w4_m2_bc64 false false false false 64 4 2 64;
    Fa2 flash_fwd_tc_fa2_bf16_d64_w4_m2_bc64 true false false false 64 4 2 64;
    Fa2 flash_fwd_tc_fa2_f16_d64_w4_m2_bc96 false false false false 64 4 2 96;
    Fa2 flash_fwd_tc_fa2_bf16_d64_w4_m2_bc96 true false false false 64 4 2 96;
    Fa2 flash_fwd_tc_fa2_f16_d64_w4_m2_bc128 false false false false 64 4 2 128;
    Fa2 flash_fwd_tc_fa2_bf16_d64_w4_m2_bc128 true false false false 64 4 2 128;
    Fa2 flash_fwd_tc_fa2_f16_d96_w4_m1_bc64 false false false false 96 4 1 64;
    Fa2 flash_fwd_tc_fa2_bf16_d96_w4_m1_bc64 true false false false 96 4 1 64;
    Fa2 flash_fwd_tc_fa2_f16_d96_w4_m2_bc64 false false false false 96 4 2 64;
    Fa2 flash_fwd_tc_fa2_bf16_d96_w4_m2_bc64 true false false false 96 4 2 64;
    Fa2 flash_fwd_tc_fa2_f16_d96_w4_m2_bc80 false false false false 96 4 2 80;
    Fa2 flash_fwd_tc_fa2_bf16_d96_w4_m2_bc80 true false false false 96 4 2 80;
    Fa2 flash_fwd_tc_fa2_f16_d128_w4_m1_bc64 false false false false 128 4 1 64;
    Fa2 flash_fwd_tc_fa2_bf16_d128_w4_m1_bc64 true false false false 128 4 1 64;
    Fa2 flash_fwd_tc_fa2_f16_d128_w4_m2_bc32 false false false false 128 4 2 32;
    Fa2 flash_fwd_tc_fa2_bf16_d128_w4_m2_bc32 true false false false 128 4 2 32;
    Fa2 flash_fwd_tc_fa2_f16_d128_w4_m2_bc48 false false false false 128 4 2 48;
    Fa2 flash_fwd_tc_fa2_bf16_d128_w4_m2_bc48 true false false false 128 4 2 48;
    Fa2 flash_fwd_tc_fa2_f16_d128_w4_m2_bc64 false false false false 128 4 2 64;
    Fa2 flash_fwd_tc_fa2_bf16_d128_w4_m2_bc64 true false false false 128 4 2 64;
    Fa2 flash_fwd_tc_fa2_f16_d160_w8_m1_bc64 false false false false 160 8 1 64;
    Fa2 flash_fwd_tc_fa2_bf16_d160_w8_m1_bc64 true false false false 160 8 1 64;
    Fa2 flash_fwd_tc_fa2_f16_d160_w4_m1_bc32 false false false false 160 4 1 32;
    Fa2 flash_fwd_tc_fa2_bf16_d160_w4_m1_bc32 true false false false 160 4 1 32;
    Fa2 flash_fwd_tc_fa2_f16_d192_w8_m1_bc64 false false false false 192 8 1 64;
    Fa2 flash_fwd_tc_fa2_bf16_d192_w8_m1_bc64 true false false false 192 8 1 64;
    Fa2 flash_fwd_tc_fa2_f16_d192_w4_m1_bc32 false false false false 192 4 1 32;
    Fa2 flash_fwd_tc_fa2_bf16_d192_w4_m1_bc32 true false false false 192 4 1 32;
    Fa2 flash_fwd_tc_fa2_f16_d224_w8_m1_bc64 false false false false 224 8 1 64;
    Fa2 flash_fwd_tc_fa2_bf16_d224_w8_m1_bc64 true false false false 224 8 1 64;
    Fa2 flash_fwd_tc_fa2_f16_d224_w4_m1_bc32 false false false false 224 4 1 32;
    Fa2 flash_fwd_tc_fa2_bf16_d224_w4_m1_bc32 true false false false 224 4 1 32;
    Fa2 flash_fwd_tc_fa2_f16_d256_w8_m1_bc64 false false false false 256 8 1 64;
    Fa2 flash_fwd_tc_fa2_bf16_d256_w8_m1_bc64 true false false false 256 8 1 64;
    Fa2 flash_fwd_tc_fa2_f16_d256_w4_m1_bc32 false false false false 256 4 1 32;
    Fa2 flash_fwd_tc_fa2_bf16_d256_w4_m1_bc32 true false false false 256 4 1 32;
    Fa2 flash_fwd_tc_fa2_f16_d256_w8_m1_bc32 false false false false 256 8 1 32;
    Fa2 flash_fwd_tc_fa2_bf16_d256_w8_m1_bc32 true false false false 256 8 1 32;
    Fa2 flash_fwd_tc_fa2v_f16_d32_w4_m2_bc64 false true false false 32 4 2 64;
    Fa2 flash_fwd_tc_fa2v_bf16_d32_w4_m2_bc64 true true false false 32 4 2 64;
    Fa2 flash_fwd_tc_fa2v_f16_d64_w4_m2_bc96 false true false false 64 4 2 96;
    Fa2 flash_fwd_tc_fa2v_bf16_d64_w4_m2_bc96 true true false false 64 4 2 96;
    Fa2 flash_fwd_tc_fa2v_f16_d96_w4_m2_bc80 false true false false 96 4 2 80;
    Fa2 flash_fwd_tc_fa2v_bf16_d96_w4_m2_bc80 true true false false 96 4 2 80;
    Fa2 flash_fwd_tc_fa2v_f16_d128_w4_m2_bc48 false true false false 128 4 2 48;
    Fa2 flash_fwd_tc_fa2v_bf16_d128_w4_m2_bc48 true true false false 128 4 2 48;
    Fa2 flash_fwd_tc_fa2v_f16_d160_w8_m1_bc64 false true false false 160 8 1 64;
    Fa2 flash_fwd_tc_fa2v_bf16_d160_w8_m1_bc64 true true false false 160 8 1 64;
    Fa2 flash_fwd_tc_fa2v_f16_d192_w8_m1_bc64 false true false false 192 8 1 64;
    Fa2 flash_fwd_tc_fa2v_bf16_d192_w8_m1_bc64 true true false false 192 8 1 64;
    Fa2 flash_fwd_tc_fa2v_f16_d224_w8_m1_bc64 false true false false 224 8 1 64;
    Fa2 flash_fwd_tc_fa2v_bf16_d224_w8_m1_bc64 true true false false 224 8 1 64;
    Fa2 flash_fwd_tc_fa2v_f16_d256_w8_m1_bc64 false true false false 256 8 1 64;
    Fa2 flash_fwd_tc_fa2v_bf16_d256_w8_m1_bc64 true true false false 256 8 1 64;
    Fa2 flash_fwd_tc_fa2x_f16_d32_w4_m2_bc64 false true true false 32 4 2 64;
    Fa2 flash_fwd_tc_fa2x_bf16_d32_w4_m2_bc64 true true true false 32 4 2 64;
    Fa2 flash_fwd_tc_fa2x_f16_d64_w4_m2_bc64 false true true false 64 4 2 64;
    Fa2 flash_fwd_tc_fa2x_bf16_d64_w4_m2_bc64 true true true false 64 4 2 64;
    Fa2 flash_fwd_tc_fa2x_f16_d96_w4_m2_bc64 false true true false 96 4 2 64;
    Fa2 flash_fwd_tc_fa2x_bf16_d96_w4_m2_bc64 true true true false 96 4 2 64;
    Fa2 flash_fwd_tc_fa2x_f16_d128_w4_m2_bc32 false true true false 128 4 2 32;
    Fa2 flash_fwd_tc_fa2x_bf16_d128_w4_m2_bc32 true true true false 128 4 2 32;
    Fa2 flash_fwd_tc_fa2x_f16_d160_w4_m1_bc32 false true true false 160 4 1 32;
    Fa2 flash_fwd_tc_fa2x_bf16_d160_w4_m1_bc32 true true true false 160 4 1 32;
    Fa2 flash_fwd_tc_fa2x_f16_d192_w4_m1_bc32 false true true false 192 4 1 32;
    Fa2 flash_fwd_tc_fa2x_bf16_d192_w4_m1_bc32 true true true false 192 4 1 32;
    Fa2 flash_fwd_tc_fa2x_f16_d224_w4_m1_bc32 false true true false 224 4 1 32;
    Fa2 flash_fwd_tc_fa2x_bf16_d224_w4_m1_bc32 true true true false 224 4 1 32;
    Fa2 flash_fwd_tc_fa2x_f16_d256_w4_m1_bc32 false true true false 256 4 1 32;
    Fa2 flash_fwd_tc_fa2x_bf16_d256_w4_m1_bc32 true true true false 256 4 1 32;
    Fa2 flash_fwd_tc_fa2d_f16_d32_w4_m1_bc64 false true true true 32 4 1 64;
    Fa2 flash_fwd_tc_fa2d_bf16_d32_w4_m1_bc64 true true true true 32 4 1 64;
    Fa2 flash_fwd_tc_fa2d_f16_d64_w4_m1_bc64 false true true true 64 4 1 64;
    Fa2 flash_fwd_tc_fa2d_bf16_d64_w4_m1_bc64 true true true true 64 4 1 64;
    Fa2 flash_fwd_tc_fa2d_f16_d96_w4_m1_bc64 false true true true 96 4 1 64;
    Fa2 flash_fwd_tc_fa2d_bf16_d96_w4_m1_bc64 true true true true 96 4 1 64;
    Fa2 flash_fwd_tc_fa2d_f16_d128_w4_m1_bc64 false true true true 128 4 1 64;
    Fa2 flash_fwd_tc_fa2d_bf16_d128_w4_m1_bc64 true true true true 128 4 1 64;
    Fa2 flash_fwd_tc_fa2d_f16_d160_w4_m1_bc32 false true true true 160 4 1 32;
    Fa2 flash_fwd_tc_fa2d_bf16_d160_w4_m1_bc32 true true true true 160 4 1 32;
    Fa2 flash_fwd_tc_fa2d_f16_d192_w4_m1_bc32 false true true true 192 4 1 32;
    Fa2 flash_fwd_tc_fa2d_bf16_d192_w4_m1_bc32 true true true true 192 4 1 32;
    Fa2 flash_fwd_tc_fa2d_f16_d224_w4_m1_bc32 false true true true 224 4 1 32;
    Fa2 flash_fwd_tc_fa2d_bf16_d224_w4_m1_bc32 true true true true 224 4 1 32;
    Fa2 flash_fwd_tc_fa2d_f16_d256_w4_m1_bc32 false true true true 256 4 1 32;
    Fa2 flash_fwd_tc_fa2d_bf16_d256_w4_m1_bc32 true true true true 256 4 1 32;
    Fa1 flash_fwd_tc_fa1_f16_d32_w4_m1_bc64 false false false false 32 4 1 64;
    Fa1 flash_fwd_tc_fa1_bf16_d32_w4_m1_bc64 true false false false 32 4 1 64;
    Fa1 flash_fwd_tc_fa1_f16_d64_w4_m1_bc64 false false false false 64 4 1 64;
    Fa1 flash_fwd_tc_fa1_bf16_d64_w4_m1_bc64 true false false false 64 4 1 64;
    Fa1 flash_fwd_tc_fa1_f16_d96_w4_m1_bc64 false false false false 96 4 1 64;
    Fa1 flash_fwd_tc_fa1_bf16_d96_w4_m1_bc64 true false false false 96 4 1 64;
    Fa1 flash_fwd_tc_fa1_f16_d128_w4_m1_bc64 false false false false 128 4 1 64;
    Fa1 flash_fwd_tc_fa1_bf16_d128_w4_m1_bc64 true false false false 128 4 1 64;
    Fa1 flash_fwd_tc_fa1_f16_d160_w4_m1_bc32 false false false false 160 4 1 32;
    Fa1 flash_fwd_tc_fa1_bf16_d160_w4_m1_bc32 true false false false 160 4 1 32;
    Fa1 flash_fwd_tc_fa1_f16_d192_w4_m1_bc32 false false false false 192 4 1 32;
    Fa1 flash_fwd_tc_fa1_bf16_d192_w4_m1_bc32 true false false false 192 4 1 32;
    Fa1 flash_fwd_tc_fa1_f16_d224_w4_m1_bc32 false false false false 224 4 1 32;
    Fa1 flash_fwd_tc_fa1_bf16_d224_w4_m1_bc32 true false false false 224 4 1 32;
    Fa1 flash_fwd_tc_fa1_f16_d256_w4_m1_bc32 false false false false 256 4 1 32;
    Fa1 flash_fwd_tc_fa1_bf16_d256_w4_m1_bc32 true false false false 256 4 1 32;
}

/// Head dims the tensor-core kernels are compiled for.
pub const TC_HEAD_DIMS: &[usize] = &[32, 64, 96, 128, 160, 192, 224, 256];

impl TcKernel {
    /// Query rows per block (`Br`).
    pub const fn br(&self) -> usize {
        tc_br(self.warps, self.mt)
    }

    /// Threads per block.
    pub const fn threads(&self) -> u32 {
        32 * self.warps as u32
    }

    /// Dynamic shared memory per block, in bytes.
    pub const fn smem_bytes(&self) -> usize {
        match self.loop_order {
            TcLoop::Fa1 => fa1_tc_smem_bytes(self.d, self.br(), self.bc),
            TcLoop::Fa2 => fa2_tc_smem_bytes(self.d, self.br(), self.bc),
        }
    }

    /// Blocks of the (1-D) grid, or `None` past the grid limit (2³¹ − 1).
    pub fn grid_blocks(&self, batch: usize, nheads: usize, seqlen_q: usize) -> Option<u32> {
        let bh = batch.checked_mul(nheads)?;
        let n = match self.loop_order {
            TcLoop::Fa1 => bh,
            TcLoop::Fa2 => seqlen_q.div_ceil(self.br()).checked_mul(bh)?,
        };
        u32::try_from(n).ok().filter(|&n| n <= i32::MAX as u32 && n > 0)
    }

    /// Looks a configuration up by kernel name.
    pub fn by_name(name: &str) -> Option<&'static TcKernel> {
        TC_KERNELS.iter().find(|k| k.name == name)
    }

    /// Whether this kernel computes a call with these features.
    pub const fn serves(&self, f: Features) -> bool {
        (!f.varlen || self.varlen) && (!f.mods || self.mods) && (!f.decode || self.decode)
    }

    /// The configurations for a loop order, dtype, compiled head dim and
    /// features, fastest first as measured on the H100 (`docs/perf-notes.md`
    /// records the measurements behind the order). The dense kernels come
    /// first; a call with varlen takes the `fa2v` kernel (then `fa2x`), one
    /// with softcap/ALiBi the `fa2x` kernel.
    pub fn preferred(loop_order: TcLoop, bf16: bool, d: usize, features: Features) -> impl Iterator<Item = &'static TcKernel> {
        // FA2: two m-tiles per warp (32 query rows) halve the shared-memory
        // traffic per mma and win by 20–35% over one; Bc is the largest that
        // stays free of spills at 255 registers (steps 6–7 of the notes:
        // d = 128 Bc = 64 +7% over 48, d = 64 Bc = 128 +4–7% over 96; d = 96
        // Bc = 96 measured −1 to +6% over 80 but spills since the kernels
        // take windows and GQA, so 80); d ≥ 64 re-reads Q from shared memory
        // to afford the larger Bc; d = 32 keeps Q in registers (Bc = 128
        // measured up to 3% slower than 64); d = 256 fits one m-tile per warp
        // only: 8 warps with Bc = 64 (1 block/SM) beat 4 warps with Bc = 32
        // (2 blocks/SM) by 3–9% (step 9), and 8 warps with Bc = 32 are last;
        // d = 160, 192, 224 take d = 256's shape. The larger tiles need more
        // shared memory than some GPUs have, hence the smaller fallbacks
        // ([`TcKernel::default_fitting`]).
        let order: &[(usize, usize, usize)] = match (loop_order, d) {
            (TcLoop::Fa2, 32) => &[(4, 2, 64), (4, 1, 64)],
            (TcLoop::Fa2, 64) => &[(4, 2, 128), (4, 2, 96), (4, 2, 64), (4, 1, 64)],
            (TcLoop::Fa2, 96) => &[(4, 2, 80), (4, 2, 64), (4, 1, 64)],
            (TcLoop::Fa2, 128) => &[(4, 2, 64), (4, 2, 48), (4, 2, 32), (4, 1, 64)],
            (TcLoop::Fa2, 160 | 192 | 224) => &[(8, 1, 64), (4, 1, 32)],
            (TcLoop::Fa2, 256) => &[(8, 1, 64), (4, 1, 32), (8, 1, 32)],
            (TcLoop::Fa1, 32..=128) => &[(4, 1, 64)],
            (TcLoop::Fa1, _) => &[(4, 1, 32)],
            _ => &[],
        };
        let dense = order.iter().filter_map(move |&(warps, mt, bc)| {
            TC_KERNELS.iter().find(|k| {
                k.loop_order == loop_order
                    && k.bf16 == bf16
                    && k.d == d
                    && !k.varlen
                    && !k.mods
                    && !k.decode
                    && k.warps == warps
                    && k.mt == mt
                    && k.bc == bc
            })
        });
        let variants = [(true, false, false), (true, true, false), (true, true, true)].into_iter().flat_map(move |(varlen, mods, decode)| {
            TC_KERNELS.iter().filter(move |k| {
                k.loop_order == loop_order && k.bf16 == bf16 && k.d == d && k.varlen == varlen && k.mods == mods && k.decode == decode
            })
        });
        dense.chain(variants).filter(move |k| k.serves(features))
    }

    /// The default configuration for a loop order, dtype, compiled head dim
    /// and features: the fastest measured on the H100, whatever shared
    /// memory it needs.
    pub fn default_for(loop_order: TcLoop, bf16: bool, d: usize, features: Features) -> Option<&'static TcKernel> {
        Self::preferred(loop_order, bf16, d, features).next()
    }

    /// The fastest configuration whose shared memory fits `max_smem_bytes`
    /// per block (the device's opt-in limit): the H100 default, or a smaller
    /// tile on GPUs with less shared memory (A100: 163 KB, sm_86/sm_89:
    /// 99 KB).
    pub fn default_fitting(
        loop_order: TcLoop,
        bf16: bool,
        d: usize,
        features: Features,
        max_smem_bytes: usize,
    ) -> Option<&'static TcKernel> {
        Self::preferred(loop_order, bf16, d, features).find(|k| k.smem_bytes() <= max_smem_bytes)
    }
}
