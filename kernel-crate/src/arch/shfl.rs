//! Warp shuffles (PTX ISA §9.7.9.6 `shfl.sync`). Full-warp mask: every lane
//! of the warp must execute the call.

/// `shfl.sync.bfly.b32 d, a, lane_mask, 0x1f, 0xffffffff`: the value of lane
/// `lane ^ lane_mask`.
#[inline(always)]
pub fn shfl_xor_f32(x: f32, lane_mask: u32) -> f32 {
    let y: f32;
    // SAFETY: register-only instruction; callers call it from all 32 lanes.
    unsafe {
        core::arch::asm!(
            "shfl.sync.bfly.b32 {y}, {x}, {m}, 0x1f, 0xffffffff;",
            y = out(reg32) y, x = in(reg32) x, m = in(reg32) lane_mask,
            options(nomem, nostack)
        )
    };
    y
}

/// `shfl.sync.idx.b32`: the value of lane `src_lane`.
#[inline(always)]
pub fn shfl_idx_f32(x: f32, src_lane: u32) -> f32 {
    let y: f32;
    // SAFETY: register-only instruction; callers call it from all 32 lanes.
    unsafe {
        core::arch::asm!(
            "shfl.sync.idx.b32 {y}, {x}, {l}, 0x1f, 0xffffffff;",
            y = out(reg32) y, x = in(reg32) x, l = in(reg32) src_lane,
            options(nomem, nostack)
        )
    };
    y
}
