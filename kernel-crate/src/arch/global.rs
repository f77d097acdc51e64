//! Global-memory primitives beyond plain loads and stores: L2-only loads
//! (`ld.global.cg`, PTX ISA §9.7.9.8), a relaxed GPU-scope atomic add
//! (`atom`, §9.7.13.5) and the GPU-scope acquire-release fence (`fence`,
//! §9.7.13.4) — what a block needs to read data other blocks of the same
//! launch wrote (the L1 is not coherent across SMs).

/// `fence.acq_rel.gpu`: this thread's earlier memory operations are ordered
/// before its later ones for every thread of the GPU (a release before a
/// signalling atomic, an acquire after observing one).
#[inline(always)]
pub fn fence_acq_rel_gpu() {
    // SAFETY: a fence; no operands.
    unsafe { core::arch::asm!("fence.acq_rel.gpu;", options(nostack)) };
}

/// `atom.relaxed.gpu.global.add.u32`: adds `v` to `*p`, returns the old value.
///
/// # Safety
/// `p` a 4-byte aligned global address.
#[inline(always)]
pub unsafe fn atom_add_u32_gpu(p: *mut u32, v: u32) -> u32 {
    let old: u32;
    // SAFETY: caller.
    unsafe {
        core::arch::asm!(
            "atom.relaxed.gpu.global.add.u32 {o}, [{p}], {v};",
            o = out(reg32) old, p = in(reg64) p, v = in(reg32) v,
            options(nostack)
        )
    };
    old
}

/// `atom.acq_rel.gpu.global.add.u32`: adds `v` to `*p`, returns the old
/// value; a release of this thread's earlier writes (and, cumulatively, of
/// what it observed: a CTA barrier's) and an acquire of what other
/// releases published. SASS on sm_90: `MEMBAR.ALL.GPU`, the atomic, then
/// `CCTL.IVALL` (no second `MEMBAR` as `fence.acq_rel` after the atomic
/// would add).
///
/// # Safety
/// `p` a 4-byte aligned global address.
#[inline(always)]
pub unsafe fn atom_add_acq_rel_u32_gpu(p: *mut u32, v: u32) -> u32 {
    let old: u32;
    // SAFETY: caller.
    unsafe {
        core::arch::asm!(
            "atom.acq_rel.gpu.global.add.u32 {o}, [{p}], {v};",
            o = out(reg32) old, p = in(reg64) p, v = in(reg32) v,
            options(nostack)
        )
    };
    old
}

/// `st.relaxed.gpu.global.u32`.
///
/// # Safety
/// `p` a 4-byte aligned global address.
#[inline(always)]
pub unsafe fn st_relaxed_u32_gpu(p: *mut u32, v: u32) {
    // SAFETY: caller.
    unsafe { core::arch::asm!("st.relaxed.gpu.global.u32 [{p}], {v};", p = in(reg64) p, v = in(reg32) v, options(nostack)) };
}

/// `ld.global.cg.f32`: one f32 from the L2 (never a stale L1 line).
///
/// # Safety
/// `p` a 4-byte aligned global address.
#[inline(always)]
pub unsafe fn ld_cg_f32(p: *const f32) -> f32 {
    let x: f32;
    // SAFETY: caller.
    unsafe { core::arch::asm!("ld.global.cg.f32 {x}, [{p}];", x = out(reg32) x, p = in(reg64) p, options(pure, readonly, nostack)) };
    x
}

/// `ld.global.cg.v4.f32`: four f32 from the L2.
///
/// # Safety
/// `p` a 16-byte aligned global address of four f32.
#[inline(always)]
pub unsafe fn ld_cg_f32x4(p: *const f32) -> [f32; 4] {
    let (a, b, c, d): (f32, f32, f32, f32);
    // SAFETY: caller.
    unsafe {
        core::arch::asm!(
            "ld.global.cg.v4.f32 {{{a}, {b}, {c}, {d}}}, [{p}];",
            a = out(reg32) a, b = out(reg32) b, c = out(reg32) c, d = out(reg32) d, p = in(reg64) p,
            options(pure, readonly, nostack)
        )
    };
    [a, b, c, d]
}

/// `red.relaxed.gpu.global.add.f32 [p], v;`: `*p += v` in the L2, no
/// result (the backward's dQ accumulation). The vector forms
/// (`red.global.add.v2.f32`, sm_90) need PTX ISA 8.1: neither build (7.1,
/// 8.0) has them.
///
/// # Safety
/// `p` a 4-byte aligned global address.
#[inline(always)]
pub unsafe fn red_add_f32(p: *mut f32, v: f32) {
    // SAFETY: caller.
    unsafe { core::arch::asm!("red.relaxed.gpu.global.add.f32 [{p}], {v};", p = in(reg64) p, v = in(reg32) v, options(nostack)) };
}

/// `ld.acquire.gpu.global.u32`: a load that later memory operations of
/// this thread cannot pass (the backward's deterministic semaphore wait).
///
/// # Safety
/// `p` a 4-byte aligned global address.
#[inline(always)]
pub unsafe fn ld_acquire_u32_gpu(p: *const u32) -> u32 {
    let x: u32;
    // SAFETY: caller.
    unsafe { core::arch::asm!("ld.acquire.gpu.global.u32 {x}, [{p}];", x = out(reg32) x, p = in(reg64) p, options(nostack)) };
    x
}

/// `nanosleep.u32`: backs off a spinning thread for about `ns` nanoseconds (sm_70+).
#[inline(always)]
pub fn nanosleep(ns: u32) {
    // SAFETY: no memory operands.
    unsafe { core::arch::asm!("nanosleep.u32 {n};", n = in(reg32) ns, options(nostack)) };
}
