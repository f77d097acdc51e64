//! Warp-level tensor-core products (PTX ISA §9.7.14.5.8,
//! `mma.sync.aligned.m16n8k16`), f16/bf16 inputs, f32 accumulators.
//!
//! Fragment layouts (`g = lane / 4`, `t = lane % 4`):
//! * A (16×16, row-major), 4 × b32, each two 16-bit values (low half first):
//!   `a0 = A[g][2t..2t+2]`, `a1 = A[g+8][2t..]`, `a2 = A[g][2t+8..]`,
//!   `a3 = A[g+8][2t+8..]`.
//! * B (16×8, "col"), 2 × b32: `b0 = B[2t..2t+2][g]`, `b1 = B[2t+8..2t+10][g]`.
//! * C/D (16×8, f32): `c0, c1 = C[g][2t], C[g][2t+1]`; `c2, c3 = C[g+8][2t..]`.

/// `mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32`: `d = a·b + d`.
#[inline(always)]
pub fn mma_m16n8k16_f16_f32(d: &mut [f32; 4], a: &[u32; 4], b: &[u32; 2]) {
    // SAFETY: register-only warp-synchronous instruction; the kernels call it
    // from all 32 lanes of converged warps.
    unsafe {
        core::arch::asm!(
            "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {{{d0}, {d1}, {d2}, {d3}}}, {{{a0}, {a1}, {a2}, {a3}}}, {{{b0}, {b1}}}, {{{d0}, {d1}, {d2}, {d3}}};",
            d0 = inout(reg32) d[0], d1 = inout(reg32) d[1], d2 = inout(reg32) d[2], d3 = inout(reg32) d[3],
            a0 = in(reg32) a[0], a1 = in(reg32) a[1], a2 = in(reg32) a[2], a3 = in(reg32) a[3],
            b0 = in(reg32) b[0], b1 = in(reg32) b[1],
            options(pure, nomem, nostack)
        )
    }
}

/// `mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32`: `d = a·b + d`.
#[inline(always)]
pub fn mma_m16n8k16_bf16_f32(d: &mut [f32; 4], a: &[u32; 4], b: &[u32; 2]) {
    // SAFETY: as `mma_m16n8k16_f16_f32`.
    unsafe {
        core::arch::asm!(
            "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {{{d0}, {d1}, {d2}, {d3}}}, {{{a0}, {a1}, {a2}, {a3}}}, {{{b0}, {b1}}}, {{{d0}, {d1}, {d2}, {d3}}};",
            d0 = inout(reg32) d[0], d1 = inout(reg32) d[1], d2 = inout(reg32) d[2], d3 = inout(reg32) d[3],
            a0 = in(reg32) a[0], a1 = in(reg32) a[1], a2 = in(reg32) a[2], a3 = in(reg32) a[3],
            b0 = in(reg32) b[0], b1 = in(reg32) b[1],
            options(pure, nomem, nostack)
        )
    }
}
