//! Dynamic shared memory (PTX `.extern .shared .align 16 .b8 []`), sized at
//! launch time by the host.

/// Base of the block's dynamic shared memory, as a pointer to `T`.
///
/// The host sets the size at launch (and raises
/// `CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES` above 48 KB); kernels
/// must stay inside the size their dispatch entry requests.
#[inline(always)]
pub fn dynamic_smem<T>() -> *mut T {
    core::intrinsics::gpu::gpu_launch_sized_workgroup_mem::<T>()
}

/// Converts a generic pointer into shared memory to a 32-bit shared-window
/// address (`cvta.to.shared.u32`), as `ldmatrix`/`cp.async` operands take.
#[inline(always)]
pub fn smem_addr<T>(p: *const T) -> u32 {
    let a: u32;
    // SAFETY: address arithmetic only; no memory is accessed.
    unsafe {
        core::arch::asm!(
            "{{ .reg .u64 t; cvta.to.shared.u64 t, {p}; cvt.u32.u64 {a}, t; }}",
            a = out(reg32) a, p = in(reg64) p,
            options(pure, nomem, nostack)
        )
    };
    a
}

/// `st.shared.u32 [addr], v` (a 32-bit shared-window address).
///
/// # Safety
/// `addr` 4-byte aligned inside the block's shared memory.
#[inline(always)]
pub unsafe fn st_shared_u32(addr: u32, v: u32) {
    // SAFETY: caller.
    unsafe { core::arch::asm!("st.shared.u32 [{a}], {v};", a = in(reg32) addr, v = in(reg32) v, options(nostack)) };
}

/// `ld.shared.u32` (a 32-bit shared-window address).
///
/// # Safety
/// `addr` 4-byte aligned inside the block's shared memory, its content
/// written before a barrier (or fence) that orders it for this thread.
#[inline(always)]
pub unsafe fn ld_shared_u32(addr: u32) -> u32 {
    let v: u32;
    // SAFETY: caller.
    unsafe { core::arch::asm!("ld.shared.u32 {v}, [{a}];", v = out(reg32) v, a = in(reg32) addr, options(nostack, readonly, preserves_flags)) };
    v
}

/// `ld.volatile.shared.u32`: a block-uniform value kept in shared memory
/// and read where it is used, so it holds no register across a loop (the
/// compiler may not hoist a volatile load).
///
/// # Safety
/// `addr` 4-byte aligned inside the block's shared memory, written before
/// a barrier that this thread passed.
#[inline(always)]
pub unsafe fn ld_volatile_shared_u32(addr: u32) -> u32 {
    let v: u32;
    // SAFETY: caller.
    unsafe { core::arch::asm!("ld.volatile.shared.u32 {v}, [{a}];", v = out(reg32) v, a = in(reg32) addr, options(nostack, readonly)) };
    v
}

/// `st.shared.u64 [addr], v`.
///
/// # Safety
/// `addr` 8-byte aligned inside the block's shared memory.
#[inline(always)]
pub unsafe fn st_shared_u64(addr: u32, v: u64) {
    // SAFETY: caller.
    unsafe { core::arch::asm!("st.shared.u64 [{a}], {v};", a = in(reg32) addr, v = in(reg64) v, options(nostack)) };
}

/// [`ld_volatile_shared_u32`] for 64-bit values (addresses, strides).
///
/// # Safety
/// `addr` 8-byte aligned inside the block's shared memory, written before
/// a barrier that this thread passed.
#[inline(always)]
pub unsafe fn ld_volatile_shared_u64(addr: u32) -> u64 {
    let v: u64;
    // SAFETY: caller.
    unsafe { core::arch::asm!("ld.volatile.shared.u64 {v}, [{a}];", v = out(reg64) v, a = in(reg32) addr, options(nostack, readonly)) };
    v
}

/// `ld.shared.v2.u32`: 8 bytes from a 32-bit shared-window address.
///
/// # Safety
/// `addr` 8-byte aligned inside the block's shared memory; what it reads
/// was written before a barrier this thread passed (or by this thread's own
/// completed copies).
#[inline(always)]
pub unsafe fn ld_shared_v2(addr: u32) -> [u32; 2] {
    let (a, b): (u32, u32);
    // SAFETY: caller.
    unsafe { core::arch::asm!("ld.shared.v2.u32 {{{a}, {b}}}, [{p}];", a = out(reg32) a, b = out(reg32) b, p = in(reg32) addr, options(nostack, readonly)) };
    [a, b]
}

/// `ld.shared.v4.u32`: 16 bytes from a 32-bit shared-window address.
///
/// # Safety
/// `addr` 16-byte aligned inside the block's shared memory; what it reads
/// was written before a barrier this thread passed (or by this thread's own
/// completed copies).
#[inline(always)]
pub unsafe fn ld_shared_v4(addr: u32) -> [u32; 4] {
    let (a, b, c, d): (u32, u32, u32, u32);
    // SAFETY: caller.
    unsafe {
        core::arch::asm!(
            "ld.shared.v4.u32 {{{a}, {b}, {c}, {d}}}, [{p}];",
            a = out(reg32) a, b = out(reg32) b, c = out(reg32) c, d = out(reg32) d, p = in(reg32) addr,
            options(nostack, readonly)
        )
    };
    [a, b, c, d]
}

/// `st.shared.v4.u32`: 16 bytes to a 32-bit shared-window address.
///
/// # Safety
/// `addr` 16-byte aligned inside the block's shared memory, not read by
/// another thread until a barrier.
#[inline(always)]
pub unsafe fn st_shared_v4(addr: u32, v: [u32; 4]) {
    // SAFETY: caller.
    unsafe {
        core::arch::asm!(
            "st.shared.v4.u32 [{p}], {{{a}, {b}, {c}, {d}}};",
            p = in(reg32) addr, a = in(reg32) v[0], b = in(reg32) v[1], c = in(reg32) v[2], d = in(reg32) v[3],
            options(nostack)
        )
    };
}
