//! Tensor memory accelerator copies (PTX ISA §9.7.9.25.5
//! `cp.async.bulk.tensor`, sm_90). One thread issues a copy of a whole box
//! of a tensor described by a *tensor map* (128 bytes, encoded on the host
//! by `cuTensorMapEncodeTiled`, passed as a by-value kernel parameter); the
//! box lands in shared memory in the map's swizzle and completes by
//! `complete_tx` on an mbarrier. Out-of-range elements are zero-filled (and
//! still counted in the transaction bytes).

/// The generic address of a by-value kernel parameter (`mov.b64 r,
/// <param>; cvta.param.u64 r, r;`, what nvcc emits for `__grid_constant__`):
/// `$param` is the PTX parameter's symbol, `<kernel>_param_<i>`. Never take
/// `&param` in Rust for a tensor map: LLVM copies it to a local stack frame,
/// which TMA cannot read.
#[macro_export]
macro_rules! param_generic_addr {
    ($param:expr) => {{
        let a: u64;
        // SAFETY: address arithmetic on a parameter symbol; no access.
        unsafe {
            core::arch::asm!(
                concat!("mov.b64 {a}, ", $param, ";"),
                "cvta.param.u64 {a}, {a};",
                a = out(reg64) a,
                options(pure, nomem, nostack)
            )
        };
        a
    }};
}

/// `prefetch.tensormap [tmap];` — brings the tensor map into the cache.
///
/// # Safety
/// `tmap` is the generic address of a tensor map parameter.
#[inline(always)]
pub unsafe fn prefetch_tensormap(tmap: u64) {
    // SAFETY: forwarded to the caller.
    unsafe { core::arch::asm!("prefetch.tensormap [{t}];", t = in(reg64) tmap, options(nostack)) }
}

/// `cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes
/// [dst], [tmap, {c0, c1, c2, c3}], [bar];` — the box at element
/// coordinates `(c0, c1, c2, c3)` (innermost first) into `dst`.
///
/// # Safety
/// One thread calls it; `tmap` is the generic address of a valid tensor
/// map parameter; `dst` a shared-window address of this block aligned as the
/// map's swizzle needs (1024 bytes for 128B) with the box's bytes free until
/// `bar` completes; `bar` an initialized mbarrier of this block armed for
/// these bytes.
#[inline(always)]
pub unsafe fn tma_load_4d(dst: u32, tmap: u64, c: [i32; 4], bar: u32) {
    // SAFETY: forwarded to the caller.
    unsafe {
        core::arch::asm!(
            "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [{d}], [{t}, {{{c0}, {c1}, {c2}, {c3}}}], [{b}];",
            d = in(reg32) dst, t = in(reg64) tmap,
            c0 = in(reg32) c[0], c1 = in(reg32) c[1], c2 = in(reg32) c[2], c3 = in(reg32) c[3],
            b = in(reg32) bar,
            options(nostack)
        )
    }
}

/// `fence.proxy.async.shared::cta;` — orders this thread's ordinary
/// shared-memory accesses with later async-proxy (TMA, wgmma) accesses.
#[inline(always)]
pub fn fence_proxy_async_shared() {
    // SAFETY: a fence has no preconditions.
    unsafe { core::arch::asm!("fence.proxy.async.shared::cta;", options(nostack)) }
}

/// `cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [dst], [src], bytes;`
/// (PTX ISA §9.7.9.25.4.2, sm_90): adds `bytes / 4` f32 of shared memory at
/// `src` to global memory at `dst`, element by element and atomically with
/// respect to other reductions; completes asynchronously (bulk async-group).
///
/// # Safety
/// `dst` a global address of `bytes` writable f32, 16-byte aligned; `src`
/// a shared-window address of this block, 16-byte aligned, written before
/// (and made visible to the async proxy by [`fence_proxy_async_shared`]
/// and a barrier) and not rewritten until [`bulk_wait_group_read`]; `bytes`
/// a positive multiple of 16.
#[inline(always)]
pub unsafe fn bulk_reduce_add_f32(dst: u64, src: u32, bytes: u32) {
    // SAFETY: forwarded to the caller.
    unsafe {
        core::arch::asm!(
            "cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [{d}], [{s}], {n};",
            d = in(reg64) dst, s = in(reg32) src, n = in(reg32) bytes,
            options(nostack)
        )
    }
}

/// `cp.reduce.async.bulk.tensor.2d.global.shared::cta.add.tile.bulk_group
/// [tmap, {c0, c1}], [src];` (PTX ISA §9.7.9.25.5.2, sm_90): adds the box
/// at element coordinates `(c0, c1)` (innermost first) of shared memory at
/// `src`, laid out as the map's swizzle says, to the global tensor, element
/// by element and atomically with respect to other reductions; elements
/// outside the tensor are skipped. Completes asynchronously (bulk
/// async-group).
///
/// # Safety
/// One thread calls it; `tmap` is the generic address of a valid tensor
/// map of writable memory; `src` a shared-window address of this block
/// aligned as the swizzle needs (1024 bytes for 128B), written before (and
/// made visible to the async proxy by [`fence_proxy_async_shared`] and a
/// barrier or mbarrier) and not rewritten until [`bulk_wait_group_read`].
#[inline(always)]
pub unsafe fn tma_reduce_add_2d(tmap: u64, c: [i32; 2], src: u32) {
    // SAFETY: forwarded to the caller.
    unsafe {
        core::arch::asm!(
            "cp.reduce.async.bulk.tensor.2d.global.shared::cta.add.tile.bulk_group [{t}, {{{c0}, {c1}}}], [{s}];",
            t = in(reg64) tmap, c0 = in(reg32) c[0], c1 = in(reg32) c[1], s = in(reg32) src,
            options(nostack)
        )
    }
}

/// `fence.proxy.async.global;` — orders this thread's generic-proxy
/// accesses to global memory with its async-proxy ones (a semaphore's
/// acquire before a bulk reduction, a completed bulk reduction before the
/// release that publishes it).
#[inline(always)]
pub fn fence_proxy_async_global() {
    // SAFETY: a fence has no preconditions.
    unsafe { core::arch::asm!("fence.proxy.async.global;", options(nostack)) }
}

/// `cp.async.bulk.commit_group;` — closes this thread's bulk async-group.
#[inline(always)]
pub fn bulk_commit_group() {
    // SAFETY: no memory access of its own.
    unsafe { core::arch::asm!("cp.async.bulk.commit_group;", options(nostack)) }
}

/// `cp.async.bulk.wait_group.read 0;` — waits until this thread's bulk
/// operations have finished reading their shared-memory sources.
#[inline(always)]
pub fn bulk_wait_group_read() {
    // SAFETY: a wait has no preconditions.
    unsafe { core::arch::asm!("cp.async.bulk.wait_group.read 0;", options(nostack)) }
}

/// `cp.async.bulk.wait_group 0;` — waits until this thread's bulk
/// operations are complete (their global writes performed).
#[inline(always)]
pub fn bulk_wait_group() {
    // SAFETY: a wait has no preconditions.
    unsafe { core::arch::asm!("cp.async.bulk.wait_group 0;", options(nostack)) }
}
