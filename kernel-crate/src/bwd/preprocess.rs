//! The small kernels around the backward main kernels, for every element
//! type (f32, f16, bf16): before, `bwd_preprocess_*` computes
//! `D_i = rowsum(dO_i ∘ O_i)` in f32 and zeroes the f32 dQ accumulator and
//! the semaphores; after, `bwd_dq_convert_*` writes the accumulated dQ
//! (already scaled by `softmax_scale`) in the caller's dtype and strides.
//!
//! Both are one warp per query row `(b, h, i)`, grid-stride over the
//! `batch · nheads · seqlen_q` rows (`seqlen_q` the maximum for varlen;
//! rows past a varlen sequence are skipped), `F32_THREADS` threads per block.

use crate::arch::{cvt, sreg};
use crate::tile::rows::warp_sum;
use flash_attn_common::BwdParams;
use flash_attn_common::bwd_params::semaphore_count;
use flash_attn_common::smem_layout::{F32_THREADS, F32_WARPS};

/// An element type of q, k, v, o, dO and the gradients, read and written as f32.
pub trait Elem {
    /// Element `idx` of the buffer at device address `ptr`, as f32.
    ///
    /// # Safety
    /// `ptr` + `idx` elements inside a device allocation.
    unsafe fn load(ptr: u64, idx: usize) -> f32;
    /// Writes `x` (rounded to nearest even) to element `idx`.
    ///
    /// # Safety
    /// As [`Elem::load`], and no other thread accesses it concurrently.
    unsafe fn store(ptr: u64, idx: usize, x: f32);
}

/// f32 (`float`).
pub struct F32;
/// IEEE half (`half::f16`).
pub struct F16;
/// bfloat16 (`half::bf16`).
pub struct Bf16;

impl Elem for F32 {
    #[inline(always)]
    unsafe fn load(ptr: u64, idx: usize) -> f32 {
        // SAFETY: caller.
        unsafe { *(ptr as *const f32).add(idx) }
    }
    #[inline(always)]
    unsafe fn store(ptr: u64, idx: usize, x: f32) {
        // SAFETY: caller.
        unsafe { *(ptr as *mut f32).add(idx) = x }
    }
}

impl Elem for F16 {
    #[inline(always)]
    unsafe fn load(ptr: u64, idx: usize) -> f32 {
        // SAFETY: caller.
        cvt::f16_to_f32(unsafe { *(ptr as *const u16).add(idx) })
    }
    #[inline(always)]
    unsafe fn store(ptr: u64, idx: usize, x: f32) {
        // SAFETY: caller.
        unsafe { *(ptr as *mut u16).add(idx) = cvt::f32_to_f16(x) }
    }
}

impl Elem for Bf16 {
    #[inline(always)]
    unsafe fn load(ptr: u64, idx: usize) -> f32 {
        // SAFETY: caller.
        cvt::bf16_to_f32(unsafe { *(ptr as *const u16).add(idx) })
    }
    #[inline(always)]
    unsafe fn store(ptr: u64, idx: usize, x: f32) {
        // SAFETY: caller.
        unsafe { *(ptr as *mut u16).add(idx) = cvt::f32_to_bf16(x) }
    }
}

/// Calls `f(b, h, i, lse_index, q_row)` for every query row of the launch,
/// one warp per row (grid-stride); `q_row` is the row's element offset
/// along the sequence axis (`(q_row0 + i) · stride`), added by the caller.
///
/// # Safety
/// Varlen arrays as `AttnParams::seq` requires.
#[inline(always)]
unsafe fn for_each_row(p: &BwdParams, mut f: impl FnMut(usize, usize, u64, u64)) {
    let a = &p.fwd;
    let (nq, nh) = (a.seqlen_q as u64, a.nheads as u64);
    let rows = a.batch as u64 * nh * nq;
    let warps = sreg::grid_dim_x() as u64 * F32_WARPS as u64;
    let mut w = sreg::block_idx_x() as u64 * F32_WARPS as u64 + sreg::warp_id() as u64;
    while w < rows {
        let (bh, i) = (w / nq, w % nq);
        let (b, h) = ((bh / nh) as u32, (bh % nh) as u32);
        // SAFETY: caller (clamped varlen reads).
        let seq = unsafe { a.seq(b, h) };
        if i < seq.seqlen_q as u64 {
            f(b as usize, h as usize, seq.lse_base + i, seq.q_row0 + i);
        }
        w += warps;
    }
}

/// `D_i = rowsum(dO_i ∘ O_i)`, dQ accumulator rows zeroed, semaphores zeroed.
///
/// # Safety
/// `o_ptr`, `do_ptr` valid `T` tensors of q's shape at their strides;
/// `delta_ptr` f32 of the LSE's length; `dq_accum_ptr` f32 of that × headdim;
/// `dq_semaphore_ptr` (if set) `semaphore_count(p)` u32.
#[inline(always)]
unsafe fn preprocess<T: Elem>(p: &BwdParams) {
    let a = &p.fwd;
    let d = a.headdim as usize;
    let lane = sreg::lane_id() as usize;
    // SAFETY: caller.
    unsafe {
        for_each_row(p, |b, h, lse_i, row| {
            let o0 = (b as u64 * a.o_stride[0] + row * a.o_stride[1] + h as u64 * a.o_stride[2]) as usize;
            let do0 = (b as u64 * p.do_stride[0] + row * p.do_stride[1] + h as u64 * p.do_stride[2]) as usize;
            let acc0 = lse_i as usize * d;
            let mut sum = 0.0f32;
            let mut c = lane;
            while c < d {
                // SAFETY: (b, row, h, c) inside O and dO (host-checked);
                // accumulator row lse_i inside its buffer.
                unsafe {
                    sum += T::load(a.o_ptr, o0 + c) * T::load(p.do_ptr, do0 + c);
                    *(p.dq_accum_ptr as *mut f32).add(acc0 + c) = 0.0;
                }
                c += 32;
            }
            let sum = warp_sum(sum);
            if lane == 0 {
                // SAFETY: lse_i < the LSE's length.
                unsafe { *(p.delta_ptr as *mut f32).add(lse_i as usize) = sum };
            }
        })
    };
    if p.dq_semaphore_ptr != 0 {
        let n = semaphore_count(p);
        let threads = sreg::grid_dim_x() as usize * F32_THREADS as usize;
        let mut idx = sreg::block_idx_x() as usize * F32_THREADS as usize + sreg::thread_idx_x() as usize;
        while idx < n {
            // SAFETY: idx < semaphore_count(p), the buffer's length.
            unsafe { *(p.dq_semaphore_ptr as *mut u32).add(idx) = 0 };
            idx += threads;
        }
    }
}

/// dQ (caller's dtype and strides) = the f32 accumulator.
///
/// # Safety
/// `dq_ptr` a `T` tensor of q's shape at `dq_stride`, no two elements at
/// one address; `dq_accum_ptr` as [`preprocess`], fully accumulated.
#[inline(always)]
unsafe fn dq_convert<T: Elem>(p: &BwdParams) {
    let d = p.fwd.headdim as usize;
    let lane = sreg::lane_id() as usize;
    // SAFETY: caller.
    unsafe {
        for_each_row(p, |b, h, lse_i, row| {
            let q0 = (b as u64 * p.dq_stride[0] + row * p.dq_stride[1] + h as u64 * p.dq_stride[2]) as usize;
            let acc0 = lse_i as usize * d;
            let mut c = lane;
            while c < d {
                // SAFETY: inside dQ and the accumulator; this warp owns the row.
                unsafe { T::store(p.dq_ptr, q0 + c, *(p.dq_accum_ptr as *const f32).add(acc0 + c)) };
                c += 32;
            }
        })
    };
}

macro_rules! small_kernels {
    ($($pre:ident, $conv:ident: $t:ty;)*) => {$(
        /// `D = rowsum(dO ∘ O)`, dQ accumulator and semaphores zeroed.
        ///
        /// # Safety
        /// As the generic `preprocess`: the host's validated backward launch.
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $pre(p: BwdParams) {
            // SAFETY: forwarded.
            unsafe { preprocess::<$t>(&p) }
        }

        /// dQ = the f32 accumulator, in the caller's dtype and strides.
        ///
        /// # Safety
        /// As the generic `dq_convert`: the host's validated backward launch.
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $conv(p: BwdParams) {
            // SAFETY: forwarded.
            unsafe { dq_convert::<$t>(&p) }
        }
    )*};
}

small_kernels! {
    bwd_preprocess_f32, bwd_dq_convert_f32: F32;
    bwd_preprocess_f16, bwd_dq_convert_f16: F16;
    bwd_preprocess_bf16, bwd_dq_convert_bf16: Bf16;
}
