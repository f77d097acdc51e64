//! Warp-wide shared-memory matrix loads (PTX ISA §9.7.14.5.15 `ldmatrix`).
//!
//! `ldmatrix.sync.aligned.m8n8.x4.shared.b16` loads four 8×8 matrices of
//! 16-bit elements. Lanes `8i..8i+7` give the addresses of the 8 rows (16
//! bytes each, 16-byte aligned) of matrix `i`. Register `r[i]` of lane `l`
//! receives elements `(row l/4, cols 2(l%4), 2(l%4)+1)` of matrix `i` — the
//! layout of an `mma.m16n8k16` A/B fragment. With `.trans`, lane `l` receives
//! `(rows 2(l%4), 2(l%4)+1, col l/4)`: the transposed matrix.

/// `ldmatrix.sync.aligned.m8n8.x4.shared.b16 {r0,r1,r2,r3}, [addr];`
///
/// # Safety
/// All 32 lanes call it; `addr` (shared-window address, 16-byte aligned)
/// points to 16 bytes of this block's shared memory that were written and
/// made visible (barrier) before the call.
#[inline(always)]
pub unsafe fn ldmatrix_x4(addr: u32) -> [u32; 4] {
    let (a, b, c, d): (u32, u32, u32, u32);
    // SAFETY: forwarded to the caller.
    unsafe {
        core::arch::asm!(
            "ldmatrix.sync.aligned.m8n8.x4.shared.b16 {{{a}, {b}, {c}, {d}}}, [{p}];",
            a = out(reg32) a, b = out(reg32) b, c = out(reg32) c, d = out(reg32) d, p = in(reg32) addr,
            options(nostack, readonly)
        )
    };
    [a, b, c, d]
}

/// `ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {r0,r1,r2,r3}, [addr];`
///
/// # Safety
/// As [`ldmatrix_x4`].
#[inline(always)]
pub unsafe fn ldmatrix_x4_trans(addr: u32) -> [u32; 4] {
    let (a, b, c, d): (u32, u32, u32, u32);
    // SAFETY: forwarded to the caller.
    unsafe {
        core::arch::asm!(
            "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {{{a}, {b}, {c}, {d}}}, [{p}];",
            a = out(reg32) a, b = out(reg32) b, c = out(reg32) c, d = out(reg32) d, p = in(reg32) addr,
            options(nostack, readonly)
        )
    };
    [a, b, c, d]
}

/// `ldmatrix.sync.aligned.m8n8.x2.shared.b16 {r0,r1}, [addr];` — two
/// matrices, their row addresses from lanes 0–15 (the other lanes' are
/// ignored but must be valid shared addresses).
///
/// # Safety
/// As [`ldmatrix_x4`].
#[inline(always)]
pub unsafe fn ldmatrix_x2(addr: u32) -> [u32; 2] {
    let (a, b): (u32, u32);
    // SAFETY: forwarded to the caller.
    unsafe { core::arch::asm!("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {{{a}, {b}}}, [{p}];", a = out(reg32) a, b = out(reg32) b, p = in(reg32) addr, options(nostack, readonly)) };
    [a, b]
}

/// `ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {r0,r1}, [addr];`
///
/// # Safety
/// As [`ldmatrix_x2`].
#[inline(always)]
pub unsafe fn ldmatrix_x2_trans(addr: u32) -> [u32; 2] {
    let (a, b): (u32, u32);
    // SAFETY: forwarded to the caller.
    unsafe { core::arch::asm!("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {{{a}, {b}}}, [{p}];", a = out(reg32) a, b = out(reg32) b, p = in(reg32) addr, options(nostack, readonly)) };
    [a, b]
}

/// `stmatrix.sync.aligned.m8n8.x4.shared.b16 [addr], {r0,r1,r2,r3};` — the
/// store twin of [`ldmatrix_x4`] (sm_90): lanes `8i..8i+7` give the row
/// addresses of matrix `i`, and register `r[i]` of lane `l` is written to
/// elements `(row l/4, cols 2(l%4), 2(l%4)+1)` of matrix `i`.
///
/// # Safety
/// All 32 lanes call it; `addr` (shared-window address, 16-byte aligned)
/// points to 16 bytes of this block's shared memory that no other thread
/// reads or writes until a barrier orders them after the call.
#[cfg(fa_sm90a)]
#[inline(always)]
pub unsafe fn stmatrix_x4(addr: u32, r: [u32; 4]) {
    // SAFETY: forwarded to the caller.
    unsafe {
        core::arch::asm!(
            "stmatrix.sync.aligned.m8n8.x4.shared.b16 [{p}], {{{a}, {b}, {c}, {d}}};",
            p = in(reg32) addr, a = in(reg32) r[0], b = in(reg32) r[1], c = in(reg32) r[2], d = in(reg32) r[3],
            options(nostack)
        )
    };
}
