//! Asynchronous global→shared copies (PTX ISA §9.7.9.25 `cp.async`, sm_80+).
//!
//! A copy is issued by one thread, lands in shared memory asynchronously, and
//! is waited for per *group*: [`cp_async_commit`] closes the group of copies
//! issued so far by this thread; [`cp_async_wait`]`::<N>` blocks until at most
//! `N` of this thread's most recent groups are still pending. A block-wide
//! barrier after the wait makes the data visible to the other threads.

/// `cp.async.cg.shared.global [dst], [src], 16, src_size;` — copies
/// `src_size` (0 or 16) bytes and zero-fills the rest of the 16-byte chunk
/// (`src_size = 0` writes 16 zero bytes and reads nothing), bypassing L1.
///
/// # Safety
/// `dst` is a 16-byte aligned shared-window address inside the block's shared
/// memory; when `src_size > 0`, `src` points to 16 readable, 16-byte aligned
/// bytes of global memory.
#[inline(always)]
pub unsafe fn cp_async_cg_16(dst: u32, src: *const u8, src_size: u32) {
    // SAFETY: forwarded to the caller.
    unsafe {
        core::arch::asm!(
            "cp.async.cg.shared.global [{d}], [{s}], 16, {n};",
            d = in(reg32) dst, s = in(reg64) src, n = in(reg32) src_size,
            options(nostack)
        )
    }
}

/// [`cp_async_cg_16`] with an L2 prefetch hint (`PF` = 128:
/// `cp.async.cg.shared.global.L2::128B`, the L2 may fetch the aligned
/// 128 bytes around the chunk from DRAM at once; `PF` = 0: no hint). The
/// hint needs PTX ISA 7.4: the portable sm_80 build (ISA 7.1, no
/// `fa_ptx74`) issues the copy without it.
///
/// # Safety
/// As [`cp_async_cg_16`].
#[inline(always)]
pub unsafe fn cp_async_cg_16_pf<const PF: u32>(dst: u32, src: *const u8, src_size: u32) {
    const { assert!(PF == 0 || PF == 128) };
    // SAFETY: forwarded to the caller.
    unsafe {
        #[cfg(fa_ptx74)]
        if PF == 128 {
            return core::arch::asm!(
                "cp.async.cg.shared.global.L2::128B [{d}], [{s}], 16, {n};",
                d = in(reg32) dst, s = in(reg64) src, n = in(reg32) src_size,
                options(nostack)
            );
        }
        cp_async_cg_16(dst, src, src_size)
    }
}

/// `cp.async.commit_group;`
#[inline(always)]
pub fn cp_async_commit() {
    // SAFETY: groups bookkeeping only.
    unsafe { core::arch::asm!("cp.async.commit_group;", options(nostack)) }
}

/// `cp.async.wait_group N;`: waits until at most `N` of this thread's most
/// recently committed groups are pending.
#[inline(always)]
pub fn cp_async_wait<const N: u32>() {
    // SAFETY: waiting has no preconditions.
    unsafe { core::arch::asm!("cp.async.wait_group {n};", n = const N, options(nostack)) }
}

/// `cp.async.ca.shared.global [dst], [src], 4, src_size;` — copies
/// `src_size` (0 or 4) bytes and zero-fills the rest of the 4-byte word
/// (the backward's per-row LSE and `D_i`, whose rows start at any f32).
///
/// # Safety
/// `dst` is a 4-byte aligned shared-window address inside the block's
/// shared memory; when `src_size > 0`, `src` points to 4 readable, 4-byte
/// aligned bytes of global memory.
#[inline(always)]
pub unsafe fn cp_async_ca_4(dst: u32, src: *const u8, src_size: u32) {
    // SAFETY: forwarded to the caller.
    unsafe {
        core::arch::asm!(
            "cp.async.ca.shared.global [{d}], [{s}], 4, {n};",
            d = in(reg32) dst, s = in(reg64) src, n = in(reg32) src_size,
            options(nostack)
        )
    }
}
