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

/// [`shfl_xor_f32`] for 32-bit integers (the same bits moved).
#[inline(always)]
pub fn shfl_xor_i32(x: i32, lane_mask: u32) -> i32 {
    shfl_xor_f32(f32::from_bits(x as u32), lane_mask).to_bits() as i32
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

/// `vote.sync.all.pred`: true in every lane iff `pred` holds in all 32 lanes.
#[inline(always)]
pub fn vote_all(pred: bool) -> bool {
    let r: u32;
    // SAFETY: register-only instruction; callers call it from all 32 lanes.
    unsafe {
        core::arch::asm!(
            "{{ .reg .pred p, q; setp.ne.u32 p, {x}, 0; vote.sync.all.pred q, p, 0xffffffff; selp.u32 {r}, 1, 0, q; }}",
            r = out(reg32) r, x = in(reg32) pred as u32,
            options(nomem, nostack)
        )
    };
    r != 0
}
