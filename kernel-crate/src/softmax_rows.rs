//! Row-wise online softmax: one pass over the row for the maximum and the sum
//! together (the online softmax of seeds 000/004), a second pass to write the
//! normalized values. One warp per row; each lane keeps a [`RowState`] over
//! its strided elements, then the 32 states are merged with butterfly
//! shuffles ([`RowState::merge`]): [`warp_row_state`].

use crate::arch::sreg;
use crate::tile::rows::warp_row_state;
use flash_attn_common::params::{SOFTMAX_ROWS_PER_BLOCK, SoftmaxParams};
use flash_attn_common::{Real, RowState};

/// `softmax_rows_f32(params)`: grid `ceil(rows / 4)`, block 128 threads.
///
/// # Safety
/// `params` must describe valid device buffers: `x` and `y` of `rows * cols`
/// f32, `lse` of `rows` f32 (or 0 to skip it).
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn softmax_rows_f32(p: SoftmaxParams) {
    let row = sreg::block_idx_x() * SOFTMAX_ROWS_PER_BLOCK + sreg::warp_id();
    if row >= p.rows {
        return; // whole warp leaves together: shuffles below stay convergent
    }
    let lane = sreg::lane_id();
    let cols = p.cols as usize;
    let x = (p.x_ptr as *const f32).wrapping_add(row as usize * cols);
    let y = (p.y_ptr as *mut f32).wrapping_add(row as usize * cols);

    // Pass 1: running max and sum together.
    // SAFETY: c < cols, inside row `row` of x.
    let st = warp_row_state(cols, lane as usize, |c| unsafe { *x.add(c) } * p.scale_log2);

    // Pass 2: normalize.
    let m_safe = RowState::<f32>::safe_max(st.m);
    let inv_l = st.inv_l();
    let mut c = lane as usize;
    while c < cols {
        // SAFETY: c < cols, inside row `row` of x and y.
        unsafe { *y.add(c) = (*x.add(c) * p.scale_log2 - m_safe).exp2() * inv_l };
        c += 32;
    }
    if lane == 0 && p.lse_ptr != 0 {
        // SAFETY: row < rows, lse holds rows floats.
        unsafe { *(p.lse_ptr as *mut f32).add(row as usize) = st.lse() };
    }
}
