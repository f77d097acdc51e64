//! One warpgroup, one tile, no softmax: the smallest program that exercises
//! everything the forward kernel relies on (tensor maps as parameters, TMA
//! with 128B swizzle completing on an mbarrier, `S = Q·Kᵀ` from two K-major
//! descriptors over two 64-column panels, `O = P·V` with P from registers
//! and V read MN-major). The host compares both products with f64.

use super::{acc_fence, desc_kmajor, desc_mnmajor, mma_rs, mma_ss};
use crate::arch::mbarrier::{fence_mbarrier_init, mbarrier_arrive_expect_tx, mbarrier_init, mbarrier_wait};
use crate::arch::smem::{dynamic_smem, smem_addr};
use crate::arch::sreg::thread_idx_x;
use crate::arch::sync::sync_threads;
use crate::arch::tma::tma_load_4d;
use crate::arch::wgmma::{wgmma_commit, wgmma_fence, wgmma_wait};
use crate::tc::{Elem16, pack};
use flash_attn_common::AttnParams;

const D: usize = 128;
const M: usize = 64;
const N: usize = 128;
const Q_BYTES: u32 = (M * D * 2) as u32;
const KV_BYTES: u32 = (N * D * 2) as u32;
/// Dynamic shared memory of the probe: Q, K, V, one mbarrier, 1 KB slack.
pub const PROBE_SMEM: usize = (Q_BYTES + 2 * KV_BYTES) as usize + 8 + 1024;

/// # Safety
/// See the entry points in `super`.
#[inline(always)]
pub unsafe fn probe<T: Elem16>(tq: u64, tk: u64, tv: u64, p: &AttnParams) {
    let base = (smem_addr(dynamic_smem::<u8>()) + 1023) & !1023;
    let (s_q, s_k, s_v) = (base, base + Q_BYTES, base + Q_BYTES + KV_BYTES);
    let bar = base + Q_BYTES + 2 * KV_BYTES;
    let tid = thread_idx_x() as usize;
    // SAFETY: all addresses inside the requested shared memory; one thread
    // inits and arms the barrier and issues the copies.
    unsafe {
        if tid == 0 {
            mbarrier_init(bar, 1);
            fence_mbarrier_init();
        }
        sync_threads();
        if tid == 0 {
            mbarrier_arrive_expect_tx(bar, Q_BYTES + 2 * KV_BYTES);
            for pn in 0..D / 64 {
                let c = (64 * pn) as i32;
                tma_load_4d(s_q + (pn * M * 128) as u32, tq, [c, 0, 0, 0], bar);
                tma_load_4d(s_k + (pn * N * 128) as u32, tk, [c, 0, 0, 0], bar);
                tma_load_4d(s_v + (pn * N * 128) as u32, tv, [c, 0, 0, 0], bar);
            }
        }
        mbarrier_wait(bar, 0);
    }

    let mut r_s = [[0f32; 4]; N / 8];
    wgmma_fence();
    for kk in 0..D / 16 {
        let da = desc_kmajor(s_q + ((kk / 4) * M * 128 + (kk % 4) * 32) as u32);
        let db = desc_kmajor(s_k + ((kk / 4) * N * 128 + (kk % 4) * 32) as u32);
        // SAFETY: the tiles landed (barrier above) and are never rewritten.
        unsafe { mma_ss::<T, { N / 8 }>(&mut r_s, da, db, (kk > 0) as u32) };
    }
    wgmma_commit();
    wgmma_wait::<0>();
    acc_fence(&mut r_s);

    let mut r_o = [[0f32; 4]; D / 8];
    wgmma_fence();
    for kk in 0..N / 16 {
        let (s0, s1) = (&r_s[2 * kk], &r_s[2 * kk + 1]);
        let a = [pack::<T>(s0[0], s0[1]), pack::<T>(s0[2], s0[3]), pack::<T>(s1[0], s1[1]), pack::<T>(s1[2], s1[3])];
        let db = desc_mnmajor(s_v + (kk * 16 * 128) as u32, (N * 128) as u32);
        // SAFETY: as above.
        unsafe { mma_rs::<T, { D / 8 }>(&mut r_o, a, db, (kk > 0) as u32) };
    }
    wgmma_commit();
    wgmma_wait::<0>();
    acc_fence(&mut r_o);

    let (warp, lane) = (tid / 32, tid % 32);
    let (g, t) = (lane / 4, lane % 4);
    let (g_s, g_o) = (p.scratch_ptr as *mut f32, p.o_ptr as *mut f32);
    for r in 0..2 {
        let row = warp * 16 + g + 8 * r;
        for j in 0..N / 8 {
            for e in 0..2 {
                // SAFETY: the host allocated 64 × 128 f32 for each output.
                unsafe { *g_s.add(row * N + 8 * j + 2 * t + e) = r_s[j][2 * r + e] };
            }
        }
        for j in 0..D / 8 {
            for e in 0..2 {
                // SAFETY: as above.
                unsafe { *g_o.add(row * D + 8 * j + 2 * t + e) = r_o[j][2 * r + e] };
            }
        }
    }
}
