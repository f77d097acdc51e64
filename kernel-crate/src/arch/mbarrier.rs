//! Shared-memory transaction barriers (PTX ISA §9.7.13.15 `mbarrier`, sm_90
//! forms). A barrier is a 64-bit word in shared memory (8-byte aligned)
//! holding a phase bit, a pending-arrival count and a pending-transaction
//! byte count; a phase completes when both reach zero, and the next phase
//! begins with the count given at init.
//!
//! Producer/consumer use (the Hopper kernels): a *full* barrier (count 1)
//! per buffer, armed by the producer with [`mbarrier_arrive_expect_tx`] for
//! the bytes its TMA copies will deliver (`complete_tx` on arrival); an
//! *empty* barrier per buffer that every consumer thread arrives on
//! ([`mbarrier_arrive`]) once it no longer reads the buffer. Waiters spin on
//! [`mbarrier_try_wait_parity`] with the parity of the phase they wait for.
//! Waiting for parity 1 on a freshly initialized barrier returns at once
//! (the phase "before" phase 0 counts as complete).

/// `mbarrier.init.shared::cta.b64 [bar], count;`
///
/// # Safety
/// `bar` is an 8-byte aligned shared-window address of this block, not in
/// use by any other thread until a barrier (`bar.sync`) after the init.
#[inline(always)]
pub unsafe fn mbarrier_init(bar: u32, count: u32) {
    // SAFETY: forwarded to the caller.
    unsafe { core::arch::asm!("mbarrier.init.shared::cta.b64 [{b}], {c};", b = in(reg32) bar, c = in(reg32) count, options(nostack)) }
}

/// `fence.mbarrier_init.release.cluster;` — makes the inits visible to the
/// async proxy (TMA's `complete_tx`) before the block barrier that follows.
#[inline(always)]
pub fn fence_mbarrier_init() {
    // SAFETY: a fence has no preconditions.
    unsafe { core::arch::asm!("fence.mbarrier_init.release.cluster;", options(nostack)) }
}

/// `mbarrier.arrive.expect_tx.shared::cta.b64 _, [bar], tx;` — one arrival,
/// and `tx` more bytes expected in the current phase.
///
/// # Safety
/// `bar` an initialized barrier of this block.
#[inline(always)]
pub unsafe fn mbarrier_arrive_expect_tx(bar: u32, tx: u32) {
    // SAFETY: forwarded to the caller.
    unsafe {
        core::arch::asm!(
            "{{ .reg .b64 st; mbarrier.arrive.expect_tx.shared::cta.b64 st, [{b}], {t}; }}",
            b = in(reg32) bar, t = in(reg32) tx,
            options(nostack)
        )
    }
}

/// `mbarrier.arrive.shared::cta.b64 _, [bar];` — one arrival (release
/// semantics: this thread's earlier shared-memory reads are ordered before
/// whoever waits on the completed phase).
///
/// # Safety
/// `bar` an initialized barrier of this block.
#[inline(always)]
pub unsafe fn mbarrier_arrive(bar: u32) {
    // SAFETY: forwarded to the caller.
    unsafe { core::arch::asm!("{{ .reg .b64 st; mbarrier.arrive.shared::cta.b64 st, [{b}]; }}", b = in(reg32) bar, options(nostack)) }
}

/// `mbarrier.try_wait.parity.shared::cta.b64 p, [bar], parity;` — whether
/// the phase of parity `parity` has completed (the hardware may suspend the
/// thread for a while before answering false).
///
/// # Safety
/// `bar` an initialized barrier of this block.
#[inline(always)]
pub unsafe fn mbarrier_try_wait_parity(bar: u32, parity: u32) -> bool {
    let done: u32;
    // SAFETY: forwarded to the caller.
    unsafe {
        core::arch::asm!(
            "{{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [{b}], {ph}; selp.u32 {d}, 1, 0, p; }}",
            b = in(reg32) bar, ph = in(reg32) parity, d = out(reg32) done,
            options(nostack)
        )
    };
    done != 0
}

/// Spins until the phase of parity `parity` of `bar` has completed (acquire:
/// what the completing arrivals and transactions wrote is visible after).
///
/// # Safety
/// As [`mbarrier_try_wait_parity`]; some thread must complete that phase.
#[inline(always)]
pub unsafe fn mbarrier_wait(bar: u32, parity: u32) {
    // SAFETY: forwarded to the caller.
    while !unsafe { mbarrier_try_wait_parity(bar, parity) } {}
}
