//! Shared-memory layout and thread shape of the f32 attention kernels
//! (`fa1_forward_f32`, `fa2_forward_f32`, `standard_*_f32`), computed by the
//! same code on the host (which sizes the launch's dynamic shared memory and
//! rejects block sizes that do not fit) and on the GPU (which carves the
//! dynamic shared memory into tiles at these offsets).
//!
//! All offsets and sizes are in `f32` elements unless a name says bytes.
//! Arithmetic saturates, so absurd block sizes give a huge byte count that
//! the host rejects (never an overflow panic).

/// Threads per block of every f32 attention kernel: 8 warps.
pub const F32_THREADS: u32 = 256;
/// Warps per block of the f32 kernels.
pub const F32_WARPS: u32 = F32_THREADS / 32;

/// The block-wide product `C = A·B` of the f32 kernels runs on a 16 × 16
/// grid of threads; each thread owns a 4 × 4 micro-tile of C (rows
/// `ty + 16·t`, columns `tx + 16·u`), so one pass covers a 64 × 64 chunk of C.
pub const GEMM_THREADS_X: usize = 16;
/// See [`GEMM_THREADS_X`].
pub const GEMM_THREADS_Y: usize = 16;
/// Rows (and columns) of C one thread owns per 64 × 64 chunk.
pub const GEMM_MICRO: usize = 4;
/// Rows (and columns) of C one pass of the block covers.
pub const GEMM_CHUNK: usize = GEMM_THREADS_X * GEMM_MICRO;

/// Side of the square tiles of the standard-attention kernels (S tile of
/// `scores`, O tile of `pv`, and the reduction chunk of both).
pub const STD_TILE: usize = 64;

/// Row stride of a shared-memory tile with `cols` columns: the next odd
/// number. The block-wide product walks tiles down a column with 16 threads
/// at rows `r, r+1, …, r+15`; with an odd stride those 16 addresses fall in
/// 16 different banks (an even stride such as 64 would put them all in one).
#[inline(always)]
pub const fn padded_stride(cols: usize) -> usize {
    cols | 1
}

/// Bytes of `floats` f32 elements (saturating).
#[inline(always)]
pub const fn f32_bytes(floats: usize) -> usize {
    floats.saturating_mul(4)
}

/// Dynamic shared memory of `fa2_forward_f32` for blocks `Br × Bc` and head
/// dim `d`: `Q_i` (Br × d), `K_j`, `V_j` (Bc × d), `S_ij`/`P_ij` (Br × Bc),
/// the output accumulator `O_i` (Br × d, kept on chip across the whole K/V
/// loop) and the row state `m_i`, `l_i` and the rescale factor of the
/// current block, one each per query row.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fa2Smem {
    /// Row stride of the `d`-wide tiles (Q, K, V, O).
    pub d_stride: usize,
    /// Row stride of the `Bc`-wide tile S/P.
    pub s_stride: usize,
    pub q: usize,
    pub k: usize,
    pub v: usize,
    pub s: usize,
    pub o: usize,
    pub m: usize,
    pub l: usize,
    pub alpha: usize,
    /// Total f32 elements.
    pub floats: usize,
}

impl Fa2Smem {
    #[inline(always)]
    pub const fn new(br: usize, bc: usize, d: usize) -> Self {
        let d_stride = padded_stride(d);
        let s_stride = padded_stride(bc);
        let q = 0;
        let k = q + br.saturating_mul(d_stride);
        let v = k.saturating_add(bc.saturating_mul(d_stride));
        let s = v.saturating_add(bc.saturating_mul(d_stride));
        let o = s.saturating_add(br.saturating_mul(s_stride));
        let m = o.saturating_add(br.saturating_mul(d_stride));
        let l = m.saturating_add(br);
        let alpha = l.saturating_add(br);
        let floats = alpha.saturating_add(br);
        Self { d_stride, s_stride, q, k, v, s, o, m, l, alpha, floats }
    }

    #[inline(always)]
    pub const fn bytes(&self) -> usize {
        f32_bytes(self.floats)
    }
}

/// Dynamic shared memory of `fa1_forward_f32`: `K_j`, `V_j` (Bc × d, loaded
/// once per outer step), `Q_i` (Br × d), `S_ij`/`P~_ij` (Br × Bc) and two
/// per-row factors of the output update (Algorithm 1, line 12):
/// `scale_o = l_i e^{m_i - m_new} / l_new` and `scale_pv = e^{m~_ij - m_new} / l_new`.
/// `O_i`, `l_i`, `m_i` themselves live in HBM (lines 8 and 12–13).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fa1Smem {
    pub d_stride: usize,
    pub s_stride: usize,
    pub k: usize,
    pub v: usize,
    pub q: usize,
    pub s: usize,
    pub scale_o: usize,
    pub scale_pv: usize,
    pub floats: usize,
}

impl Fa1Smem {
    #[inline(always)]
    pub const fn new(br: usize, bc: usize, d: usize) -> Self {
        let d_stride = padded_stride(d);
        let s_stride = padded_stride(bc);
        let k = 0;
        let v = k + bc.saturating_mul(d_stride);
        let q = v.saturating_add(bc.saturating_mul(d_stride));
        let s = q.saturating_add(br.saturating_mul(d_stride));
        let scale_o = s.saturating_add(br.saturating_mul(s_stride));
        let scale_pv = scale_o.saturating_add(br);
        let floats = scale_pv.saturating_add(br);
        Self { d_stride, s_stride, k, v, q, s, scale_o, scale_pv, floats }
    }

    #[inline(always)]
    pub const fn bytes(&self) -> usize {
        f32_bytes(self.floats)
    }
}

/// Dynamic shared memory of `standard_scores_f32` and `standard_pv_f32`:
/// two input chunks A and B and the output tile C, each
/// `STD_TILE × STD_TILE` with a padded row stride.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StdSmem {
    pub stride: usize,
    pub a: usize,
    pub b: usize,
    pub c: usize,
    pub floats: usize,
}

impl StdSmem {
    #[inline(always)]
    pub const fn new() -> Self {
        let stride = padded_stride(STD_TILE);
        let tile = STD_TILE * stride;
        Self { stride, a: 0, b: tile, c: 2 * tile, floats: 3 * tile }
    }

    #[inline(always)]
    pub const fn bytes(&self) -> usize {
        f32_bytes(self.floats)
    }
}

impl Default for StdSmem {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strides_are_odd_and_wide_enough() {
        for d in 1..=256 {
            let s = padded_stride(d);
            assert!(s >= d && s % 2 == 1);
        }
    }

    #[test]
    fn fa2_regions_are_disjoint_and_ordered() {
        let l = Fa2Smem::new(64, 32, 128);
        assert_eq!(l.k, 64 * 129);
        assert_eq!(l.v, l.k + 32 * 129);
        assert_eq!(l.s, l.v + 32 * 129);
        assert_eq!(l.o, l.s + 64 * 33);
        assert_eq!(l.m, l.o + 64 * 129);
        assert_eq!(l.floats, l.m + 3 * 64);
    }

    #[test]
    fn huge_blocks_saturate() {
        assert_eq!(Fa2Smem::new(usize::MAX, usize::MAX, 256).bytes(), usize::MAX);
        assert_eq!(Fa1Smem::new(usize::MAX, 1, 256).bytes(), usize::MAX);
    }
}
