//! Flash-decoding on tensor cores: few query rows (one token, or the `g`
//! packed query heads of a KV head, or up to 16 speculative tokens) against
//! a long KV cache. The FA2 tile kernel gives every warp its own 16 query
//! rows; with one real row, three of four warps multiply zeros and the one
//! that matters does all the work of a K/V block alone. Here the block's
//! warps share one m-tile of 16 rows and split the **keys** of each K/V
//! block instead (FlashDecoding inside the thread block):
//!
//! 1. `Bc = NW · Bcw` keys per block; warp `w` takes keys `w·Bcw..(w+1)·Bcw`
//!    and keeps its own online-softmax state (`m_i`, `l_i`) and O
//!    accumulator for the 16 rows;
//! 2. K/V blocks stream through `S` shared-memory stages (`cp.async`, one
//!    commit group per block: K and V of a block land together), one barrier
//!    per block; the stages are unpadded and swizzled for d = 64 and 128
//!    (`tile::KvTile`: the padded rows cost the stream 4%, decode step 29);
//!    `QREG` kernels hold Q's fragments in registers (decode step 31);
//! 3. the copies are coalesced (each warp-wide copy covers whole rows),
//!    paged or not; paged rows look their page up as they are issued;
//! 4. at the end the warps' states merge through shared memory
//!    (`M = max m_w`, `L = Σ 2^(m_w − M)·l_w`, `O = Σ 2^(m_w − M)·O_w / L`),
//!    and the block stores O and the logsumexp, or (split-KV) the
//!    normalized partial and its LSE;
//! 5. split-KV with counters from the host (`split_counter_ptr`): the last
//!    split of a tile to finish (an atomic count per tile, release/acquire
//!    fences) merges the tile's partials itself with the combine kernel's
//!    row merge (`decode::combine_row`) — no second launch, whose launch
//!    and ramp cost 4–7 µs of a 20–70 µs decode step; without counters
//!    `combine_splits_*` runs after the launch;
//! 6. `TICKETS` kernels hand a tile's key blocks to its splits by ticket
//!    (`AttnParams::split_tickets`, decode step 18); `APPEND` kernels read a
//!    call's new keys and values from `k_new`/`v_new` and write them to the
//!    cache as they copy them (`AttnParams::knew_ptr`, decode step 21).
//!
//! Same parameters, grid and semantics as the `fa2d` kernels (KV cache
//! contiguous or paged, `cache_batch_idx`, varlen q, causal/window
//! bottom-right, softcap/ALiBi, GQA, zero-padded head dims, split-KV), for
//! `Br = 16` rows per (sequence, head).

use super::fa2::{BlockPos, Mods, key_blocks, mask, pv, qk, quad_sum, scale_sign, seq_of, softmax_step, split_of};
use super::tile::{FragTile, KvTile, SmemTile, dec_kv_tile_bytes, tile_bytes};
use super::{Elem16, pack};
use crate::arch::cp_async::{cp_async_cg_16_pf, cp_async_commit, cp_async_wait};
use crate::arch::global::{atom_add_acq_rel_u32_gpu, atom_add_u32_gpu, st_relaxed_u32_gpu};
use crate::arch::smem::{dynamic_smem, ld_volatile_shared_u32, smem_addr, st_shared_u32};
use crate::arch::opaque as arch_opaque;
use crate::arch::sreg;
use crate::arch::sync::sync_threads;
use flash_attn_common::{AttnParams, INTERLEAVE_PAGED, Real, RowState};

use flash_attn_common::tc::{DEC_BR as BR, dec_merge_stride as merge_stride, timeline};

/// The K/V copies of one thread: chunk `i = tid + k·nt` of a block's
/// `Bc · D/8` 16-byte chunks is row `i / (D/8)`, chunk `i % (D/8)` —
/// consecutive threads on consecutive chunks, so each warp-wide copy covers
/// whole rows (coalesced; a thread per row instead made each copy touch 16
/// rows and ran at 60–75% of the coalesced bandwidth). Paged caches look
/// the page of each chunk's row up as they issue it (the block-table
/// entries of a block are few and stay in L1), or once per block when the
/// block lies in one page.
struct KvCopy {
    k: *const u16,
    v: *const u16,
    k_rs: u64,
    v_rs: u64,
    k_ps: u64,
    v_ps: u64,
    paged: bool,
    b: u32,
    tid: usize,
    nt: usize,
    /// The append fused in (`AttnParams::knew_ptr`): rows from `cached` on
    /// come from `kn`/`vn` (this sequence's and KV head's new rows, row
    /// strides `kn_rs`/`vn_rs`), and with `writer` they are also stored to
    /// the cache rows they replace. Without: `cached` = usize::MAX.
    kn: *const u16,
    vn: *const u16,
    kn_rs: u64,
    vn_rs: u64,
    cached: usize,
    writer: bool,
}

impl KvCopy {
    /// Issues this thread's copies of block `j` (`Bc` keys) into stage
    /// buffers `sk`, `sv`; rows at or past `nk` and columns at or past `d`
    /// zero-filled.
    ///
    /// # Safety
    /// Rows `< nk` exist (clamped lengths); tiles in the dynamic shared
    /// memory; for paged caches as [`AttnParams::page_of`].
    ///
    /// `pre`: the block-table entry [`KvCopy::lookup`] loaded for this
    /// block, or `None` (then the copies look their pages up themselves).
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    unsafe fn issue<const D: usize, const BC: usize, const NW: usize, const PF: u32, const PAGE_BATCH: bool>(&self, p: &AttnParams, sk: KvTile<D>, sv: KvTile<D>, j: usize, nk: usize, d: usize, pre: Option<i32>) {
        let cpr = D / 8;
        let j0 = j * BC;
        let one_page = self.one_page::<BC>(p, j0);
        let (kb, vb) = if one_page {
            // SAFETY: j0 < nk (the caller issues blocks with keys).
            let page = unsafe { self.page(p, j0 as u32, pre) } as u64;
            let r0 = p.page_row(j0 as u32) as u64;
            (self.k.wrapping_add((page * self.k_ps + r0 * self.k_rs) as usize), self.v.wrapping_add((page * self.v_ps + r0 * self.v_rs) as usize))
        } else if self.paged {
            (self.k, self.v)
        } else {
            (self.k.wrapping_add(j0 * self.k_rs as usize), self.v.wrapping_add(j0 * self.v_rs as usize))
        };
        let per_row = self.paged && !one_page;
        if (32 * NW) % (D / 8) == 0 && !per_row && j0 + BC <= nk.min(self.cached) {
            // A full block of strided rows (contiguous cache, or one page):
            // this thread copies the same 16-byte column of every
            // (32·NW / cpr)-th row, so its addresses advance by a constant —
            // a handful of instructions per copy instead of the general
            // loop's row/column arithmetic and bounds checks (ncu: ~30% of
            // the 8-warp kernel's warp samples sat in that loop; decode
            // step 14).
            // SAFETY: every row of the block is < nk; columns < d (or a
            // zero-size copy from the row's start).
            unsafe { self.issue_full::<D, BC, NW, PF>(sk, sv, kb, vb, d) };
            return;
        }
        if per_row && self.batched_full::<D, BC, NW, PAGE_BATCH>(j0, nk) {
            // SAFETY: every row of the block is < nk (cached keys).
            unsafe { self.issue_paged_full::<D, BC, NW, PF>(p, sk, sv, j0, d, pre) };
            return;
        }
        let mut i = self.tid;
        while i < BC * cpr {
            let (r, c) = (i / cpr, i % cpr);
            let t = j0 + r;
            let ok = t < nk && c * 8 < d;
            let (ks, vs) = if !ok {
                (self.k, self.v)
            } else if per_row {
                // SAFETY: t < nk ≤ the sequence's clamped length (caller).
                let page = unsafe { p.page_of(self.b, t as u32) } as u64;
                let pr = p.page_row(t as u32) as u64;
                (self.k.wrapping_add((page * self.k_ps + pr * self.k_rs) as usize + c * 8), self.v.wrapping_add((page * self.v_ps + pr * self.v_rs) as usize + c * 8))
            } else {
                (kb.wrapping_add(r * self.k_rs as usize + c * 8), vb.wrapping_add(r * self.v_rs as usize + c * 8))
            };
            // New rows (fused append): read from k_new/v_new; the writer tile
            // also stores them to the cache row (ks/vs) they replace.
            let (ks, vs) = if ok && t >= self.cached {
                let i = t - self.cached;
                let (nk_src, nv_src) = (self.kn.wrapping_add(i * self.kn_rs as usize + c * 8), self.vn.wrapping_add(i * self.vn_rs as usize + c * 8));
                if self.writer {
                    // SAFETY: row i < seqlen_new of the new tensors (t < nk ≤
                    // cached + seqlen_new), column chunk c·8 < d, 16-byte
                    // aligned (host-checked); the cache row t < capacity.
                    unsafe {
                        *(ks as *mut [u32; 4]) = *(nk_src as *const [u32; 4]);
                        *(vs as *mut [u32; 4]) = *(nv_src as *const [u32; 4]);
                    }
                }
                (nk_src, nv_src)
            } else {
                (ks, vs)
            };
            let n = if ok { 16 } else { 0 };
            // SAFETY: rows < nk lie in the sequence's (clamped) cache rows
            // (or the new rows), columns < d in the row; a size of 0 reads
            // nothing.
            unsafe {
                cp_async_cg_16_pf::<PF>(sk.addr(r, c * 8), ks as *const u8, n);
                cp_async_cg_16_pf::<PF>(sv.addr(r, c * 8), vs as *const u8, n);
            }
            i += self.nt;
        }
    }

    /// The page holding key `t`: `pre` (its block-table entry, loaded ahead
    /// by [`KvCopy::lookup`]) clamped, or looked up now.
    ///
    /// # Safety
    /// As [`AttnParams::page_of`].
    #[inline(always)]
    unsafe fn page(&self, p: &AttnParams, t: u32, pre: Option<i32>) -> u32 {
        match pre {
            Some(x) => p.clamp_page(x),
            // SAFETY: caller.
            None => unsafe { p.page_of(self.b, t) },
        }
    }

    /// Paged cache, and the `Bc` rows of the block from key `j0` lie in one
    /// page (page size ≥ Bc, aligned): one lookup for the block, then
    /// strided rows as in a contiguous cache.
    #[inline(always)]
    fn one_page<const BC: usize>(&self, p: &AttnParams, j0: usize) -> bool {
        self.paged && p.page_index(j0 as u32) == p.page_index((j0 + BC - 1) as u32)
    }

    /// A full block (every row cached, none new) that the page-batched
    /// copies ([`KvCopy::issue_paged_full`]) can take when its rows span
    /// several pages.
    #[inline(always)]
    fn batched_full<const D: usize, const BC: usize, const NW: usize, const PAGE_BATCH: bool>(&self, j0: usize, nk: usize) -> bool {
        let cpr = D / 8;
        PAGE_BATCH && (32 * NW) % cpr == 0 && BC * cpr / (32 * NW) <= 16 && j0 + BC <= nk.min(self.cached)
    }

    /// The block-table entry of the one page this thread's copies of block
    /// `j` read, loaded ahead of [`KvCopy::issue`] so that several blocks'
    /// lookups fly together (the prologue: decode step 39; unclamped, so
    /// that nothing waits for the load before `issue` uses it): a block
    /// inside one page, or (`PAGE_BATCH`) a full block over pages of a
    /// multiple of `steps` rows — the same conditions under which `issue`
    /// takes `pre`; `None` otherwise (contiguous caches, other page sizes,
    /// partial blocks: `issue` looks its pages up itself).
    ///
    /// # Safety
    /// As [`KvCopy::issue`] (block `j` has keys: `j·Bc < nk`).
    #[inline(always)]
    unsafe fn lookup<const D: usize, const BC: usize, const NW: usize, const PAGE_BATCH: bool>(&self, p: &AttnParams, j: usize, nk: usize) -> Option<i32> {
        if !self.paged {
            return None;
        }
        let cpr = D / 8;
        let steps = BC * cpr / (32 * NW);
        let j0 = j * BC;
        if self.one_page::<BC>(p, j0) {
            // SAFETY: j0 < nk (caller).
            Some(unsafe { p.page_entry(self.b, j0 as u32) })
        } else if self.batched_full::<D, BC, NW, PAGE_BATCH>(j0, nk) && p.page_size % steps as u32 == 0 {
            // SAFETY: the block's rows are < nk (checked above).
            Some(unsafe { p.page_entry(self.b, (j0 + self.tid / cpr * steps) as u32) })
        } else {
            None
        }
    }

    /// [`KvCopy::issue`] for a full block over pages smaller than it.
    ///
    /// Pages of a multiple of `steps = Bc·cpr / (32·NW)` rows (every
    /// power-of-two page from 8 rows for the d = 128 builds): this thread
    /// copies column chunk `tid % cpr` of the `steps` consecutive rows
    /// `(tid / cpr)·steps + k` — one page, one lookup, then constant address
    /// steps as in [`KvCopy::issue_full`] (decode step 39: before, every
    /// thread looked up `steps` pages per block).
    ///
    /// Other page sizes: this thread's rows are `tid / cpr + k·(32·NW /
    /// cpr)`; their pages are looked up first (independent loads, one L1
    /// round trip for all), then the copies go out (`PAGE_BATCH` kernels,
    /// decode step 22: before, each copy waited for its own lookup).
    ///
    /// # Safety
    /// Rows `j0..j0 + Bc` < the sequence's clamped length; as
    /// [`AttnParams::page_of`]; at most 16 copies per thread.
    #[inline(always)]
    unsafe fn issue_paged_full<const D: usize, const BC: usize, const NW: usize, const PF: u32>(&self, p: &AttnParams, sk: KvTile<D>, sv: KvTile<D>, j0: usize, d: usize, pre: Option<i32>) {
        let cpr = D / 8;
        let rstep = 32 * NW / cpr;
        let steps = BC * cpr / (32 * NW);
        let (n, c8) = if self.tid % cpr * 8 < d { (16, self.tid % cpr * 8) } else { (0, 0) };
        if p.page_size % steps as u32 == 0 {
            let c = self.tid % cpr;
            let r0 = self.tid / cpr * steps;
            let t0 = (j0 + r0) as u32;
            // SAFETY: caller (rows < the clamped length); rows r0..r0 + steps
            // share row t0's page (page_size a multiple of steps, r0 too).
            let pg = unsafe { self.page(p, t0, pre) } as u64;
            let pr = p.page_row(t0) as u64;
            let mut ks = self.k.wrapping_add((pg * self.k_ps + pr * self.k_rs) as usize + c8);
            let mut vs = self.v.wrapping_add((pg * self.v_ps + pr * self.v_rs) as usize + c8);
            for k in 0..steps {
                // SAFETY: rows of the block inside their page; a size of 0 reads nothing.
                unsafe {
                    cp_async_cg_16_pf::<PF>(sk.addr(r0 + k, c * 8), ks as *const u8, n);
                    cp_async_cg_16_pf::<PF>(sv.addr(r0 + k, c * 8), vs as *const u8, n);
                }
                ks = ks.wrapping_add(self.k_rs as usize);
                vs = vs.wrapping_add(self.v_rs as usize);
            }
            return;
        }
        let (r0, c) = (self.tid / cpr, self.tid % cpr);
        let mut pages = [0u32; 16];
        #[allow(clippy::needless_range_loop)] // constant indices once unrolled: registers, not a stack array
        for k in 0..16 {
            if k < steps {
                // SAFETY: caller (row < the clamped length).
                pages[k] = unsafe { p.page_of(self.b, (j0 + r0 + k * rstep) as u32) };
            }
        }
        #[allow(clippy::needless_range_loop)]
        for k in 0..16 {
            if k >= steps {
                break;
            }
            let r = r0 + k * rstep;
            let pg = pages[k];
            let pr = p.page_row((j0 + r0 + k * rstep) as u32) as u64;
            let ks = self.k.wrapping_add((pg as u64 * self.k_ps + pr * self.k_rs) as usize + c8);
            let vs = self.v.wrapping_add((pg as u64 * self.v_ps + pr * self.v_rs) as usize + c8);
            // SAFETY: rows of the block inside their pages; a size of 0 reads nothing.
            unsafe {
                cp_async_cg_16_pf::<PF>(sk.addr(r, c * 8), ks as *const u8, n);
                cp_async_cg_16_pf::<PF>(sv.addr(r, c * 8), vs as *const u8, n);
            }
        }
    }

    /// [`KvCopy::issue`] for a block of `Bc` strided rows that all exist,
    /// starting at `kb`/`vb`: thread `tid` copies column chunk `tid % cpr`
    /// of rows `tid / cpr + k·(32·NW / cpr)`, `k < Bc·cpr / (32·NW)` (unrolled).
    ///
    /// # Safety
    /// Rows `0..Bc` at `kb`/`vb` (row strides `k_rs`/`v_rs`) readable for
    /// `d` elements; tiles in the dynamic shared memory; `32·NW` threads
    /// (a multiple of `cpr`, and `Bc·cpr` a multiple of it).
    #[inline(always)]
    unsafe fn issue_full<const D: usize, const BC: usize, const NW: usize, const PF: u32>(&self, sk: KvTile<D>, sv: KvTile<D>, kb: *const u16, vb: *const u16, d: usize) {
        let cpr = D / 8;
        let rstep = 32 * NW / cpr;
        let steps = BC * cpr / (32 * NW);
        let (r0, c) = (self.tid / cpr, self.tid % cpr);
        // Columns past the caller's head dim: zero-filled copies (size 0,
        // nothing read) from the row's start.
        let (n, c8) = if c * 8 < d { (16, c * 8) } else { (0, 0) };
        let mut ks = kb.wrapping_add(r0 * self.k_rs as usize + c8);
        let mut vs = vb.wrapping_add(r0 * self.v_rs as usize + c8);
        let (kstep, vstep) = (rstep * self.k_rs as usize, rstep * self.v_rs as usize);
        for k in 0..steps {
            // Row r0 + k·rstep: a constant step from row r0 when rstep is
            // a multiple of the swizzle's 8 rows (every 4- and 8-warp d = 64
            // and 128 build).
            let r = r0 + k * rstep;
            // SAFETY: caller (row r < Bc of the block).
            unsafe {
                cp_async_cg_16_pf::<PF>(sk.addr(r, c * 8), ks as *const u8, n);
                cp_async_cg_16_pf::<PF>(sv.addr(r, c * 8), vs as *const u8, n);
            }
            ks = ks.wrapping_add(kstep);
            vs = vs.wrapping_add(vstep);
        }
    }
}

/// The optional per-block timeline (`p.scratch_ptr`, see
/// [`flash_attn_common::tc::timeline`]): thread 0 stamps point `k`.
#[derive(Clone, Copy)]
struct Timeline {
    words: *mut u64,
}

impl Timeline {
    #[inline(always)]
    fn new(p: &AttnParams, tid: usize) -> Self {
        let on = p.scratch_ptr != 0 && tid == 0;
        let words = if on { (p.scratch_ptr as *mut u64).wrapping_add(sreg::block_idx_x() as usize * timeline::WORDS) } else { core::ptr::null_mut() };
        Self { words }
    }

    /// Stamps point `k` (both clocks).
    #[inline(always)]
    fn stamp(&self, k: usize) {
        if !self.words.is_null() {
            // SAFETY: the host sized the timeline to WORDS (16) per block;
            // k < 6 (timeline::POINTS).
            unsafe {
                *self.words.add(1 + k) = sreg::globaltimer();
                *self.words.add(8 + k) = sreg::clock64();
            }
        }
    }

    /// Word 0: the SM, the split, whether the block merged its tile.
    #[inline(always)]
    fn meta(&self, split: u32, last: bool) {
        if !self.words.is_null() {
            // SAFETY: as above.
            unsafe { *self.words = sreg::smid() as u64 | (split as u64) << 16 | (last as u64) << 32 };
        }
    }
}

/// The decode kernel body (see the module docs).
///
/// # Safety
/// As the `fa2d` entry points: `p` valid (host-checked), launched with
/// `32·NW` threads, `flash_attn_common::tc::dec_smem_bytes` of dynamic shared memory and
/// `ceil(seqlen_q / 16) · num_splits · batch · nheads` blocks.
#[inline(always)]
pub unsafe fn forward<
    T: Elem16,
    const D: usize,
    const DK: usize,
    const DN: usize,
    const NW: usize,
    const BC: usize,
    const BCW: usize,
    const BCWN: usize,
    const BCWK: usize,
    const S: usize,
    const QREG: bool,
    const PF: u32,
    const TICKETS: bool,
    const APPEND: bool,
    const PAGE_BATCH: bool,
>(
    p: &AttnParams,
) {
    const { assert!(BCW * NW == BC && BCWN * 8 == BCW && BCWK * 16 == BCW && DK * 16 == D && DN * 8 == D && DN % 2 == 0 && BCWN % 2 == 0) };
    const { assert!(S == 2 || S == 3) };
    let nt = 32 * NW;
    let num_m = (p.seqlen_q as usize).div_ceil(BR);
    let (idx, split) = split_of::<true>(p, num_m, sreg::block_idx_x());
    // With Br = 16 a "warp" of BlockPos is meaningless (all warps share the
    // rows); only b, h, mb and the lane split are used.
    let BlockPos { b, h, mb, tid, lane, g, t, .. } = BlockPos::new(p, num_m, idx, sreg::thread_idx_x());
    let warp = tid / 32;
    let tl = Timeline::new(p, tid);
    tl.stamp(0);
    // SAFETY: host-checked KV-cache/varlen arrays (values clamped inside).
    let seq = unsafe { seq_of::<true, true>(p, b, h) };
    let (nq, nk) = (seq.seqlen_q as usize, seq.seqlen_k as usize);
    let q0 = mb * BR;
    if q0 >= nq {
        return; // past this sequence's queries (block-uniform)
    }
    let d = p.headdim as usize;

    // Keys some row sees, keys every row sees, and the tile's blocks (this
    // split takes some of them, see `fixed`; with the ticket schedule more
    // by ticket). Kernels built without `TICKETS` keep the static loop
    // alone (the ticket loop beside it cost the 4-warp page-16 kernel
    // 2–4%: decode step 18).
    let tickets = TICKETS && p.split_tickets & 1 != 0 && p.num_splits > 1 && p.split_counter_ptr != 0;
    let win = p.key_window(seq.seqlen_q, seq.seqlen_k);
    let (j_first, j_end, full_start, full_end) = key_blocks::<BC>(p, &win, q0, (q0 + BR).min(nq), nk, None);
    let (full_start, full_end) = (full_start as usize, full_end as usize);

    // ---- addresses ----------------------------------------------------------
    // `p.kv_head(h)` in 32-bit division: from the compact block's 16-bit
    // head counts LLVM narrowed it to a 16-bit division, which ptxas calls
    // as a subroutine at the far end of the code — a cold instruction fetch
    // before the first copy (ncu: ~0.4 µs per SM; decode step 23).
    // The query heads per KV head; the fused append's writer below is the
    // first head of each group.
    let group = arch_opaque::u32(p.nheads) / arch_opaque::u32(p.kv_heads());
    let kvh = (h as u32 / group) as u64;
    let [qs0, qs1, qs2] = p.q_stride;
    let g_q = (p.q_ptr as *const u16).wrapping_add((b as u64 * qs0 + (seq.q_row0 + q0 as u64) * qs1 + h as u64 * qs2) as usize);
    let paged = p.block_table_ptr != 0;
    let rc = {
        let k_head = (p.k_ptr as *const u16).wrapping_add((kvh * p.k_stride[2]) as usize);
        let v_head = (p.v_ptr as *const u16).wrapping_add((kvh * p.v_stride[2]) as usize);
        let (k, v) = if paged {
            (k_head, v_head)
        } else {
            // SAFETY: host-sized cache_batch_idx (clamped).
            let kb = unsafe { p.kv_batch(b as u32) } as u64;
            (k_head.wrapping_add((kb * p.k_stride[0] + seq.k_row0 * p.k_stride[1]) as usize), v_head.wrapping_add((kb * p.v_stride[0] + seq.k_row0 * p.v_stride[1]) as usize))
        };
        // The fused append: this sequence's new rows of this KV head; the
        // first tile of the KV head (query block 0, first query head of the
        // group) writes them to the cache.
        // (Kernels built without `APPEND` never take it: the path's registers
        // cost the 4-warp page-16 kernel 2.5–3.5%, decode step 21.)
        let (kn, vn, cached, writer) = if APPEND && p.knew_ptr != 0 {
            let [k0, _, k2] = p.knew_stride;
            let [v0, _, v2] = p.vnew_stride;
            // SAFETY: host-sized cache_seqlens (b < batch); clamped to the capacity.
            let c = unsafe { *(p.cache_seqlens_ptr as *const i32).add(b) }.clamp(0, p.seqlen_k as i32) as usize;
            let kn = (p.knew_ptr as *const u16).wrapping_add((b as u64 * k0 + kvh * k2) as usize);
            let vn = (p.vnew_ptr as *const u16).wrapping_add((b as u64 * v0 + kvh * v2) as usize);
            (kn, vn, c, mb == 0 && h as u32 == kvh as u32 * group)
        } else {
            (core::ptr::null(), core::ptr::null(), usize::MAX, false)
        };
        KvCopy {
            k,
            v,
            k_rs: p.k_stride[1],
            v_rs: p.v_stride[1],
            k_ps: p.k_stride[0],
            v_ps: p.v_stride[0],
            paged,
            b: b as u32,
            tid,
            nt,
            kn,
            vn,
            kn_rs: p.knew_stride[1],
            vn_rs: p.vnew_stride[1],
            cached,
            writer,
        }
    };

    let base = smem_addr(dynamic_smem::<u8>());
    let s_q = SmemTile::<D> { base };
    let kv_base = base + tile_bytes(BR, D) as u32;
    let kv_bytes = dec_kv_tile_bytes(BC, D) as u32;
    let s_k = |s: usize| KvTile::<D> { base: kv_base + s as u32 * kv_bytes };
    let s_v = |s: usize| KvTile::<D> { base: kv_base + (S + s) as u32 * kv_bytes };
    // This warp's keys of a block: rows w·Bcw.. of the stage tiles (Bcw a
    // multiple of 16: the same swizzle from the moved base).
    let w_off = (warp * BCW) as u32 * KvTile::<D>::RB;
    // Block j into stage `stage`.
    let issue = |j: usize, stage: usize, pre: Option<i32>| {
        // SAFETY: j < j_end: rows < nk exist.
        unsafe { rc.issue::<D, BC, NW, PF, PAGE_BATCH>(p, s_k(stage), s_v(stage), j, nk, d, pre) }
    };
    // SAFETY: as `issue`.
    let lookup = |j: usize| unsafe { rc.lookup::<D, BC, NW, PAGE_BATCH>(p, j, nk) };

    // The ticket schedule (`TICKETS` kernels, `p.split_tickets`): split `s`
    // of `ns` takes blocks `j_first + s + i·ns` (i ≤ S), then block
    // `j_first + (S + 1)·ns + t` for each ticket `t` it draws from the high
    // 16 bits of the tile's counter, until a ticket falls past `j_end`.
    // Thread 0 draws a ticket right after issuing an iteration's copies and
    // stores it in shared memory at the end of the next iteration (two
    // words by iteration parity, in the Q tile's row padding, which nothing
    // reads), for the iteration after: the atomic's round trip, slow while
    // every SM streams, has more than a block's time (one iteration ahead
    // instead of two: 2–7% slower on long caches, decode step 18). Each
    // split draws at most two tickets past the end.
    const NONE: usize = usize::MAX;
    let ns = p.num_splits as usize;
    let counter = (p.split_counter_ptr as *mut u32).wrapping_add(idx as usize);
    let ticket_base = j_first + (S + 1) * ns;
    let ticket_slot = |k: usize| base + (2 * D + 4 * (k & 1)) as u32;
    let draw = || {
        // SAFETY: the tile's counter (host: one u32 per tile, split counts
        // in the low 16 bits); fewer than 2¹⁶ tickets (host: MAX_TICKET_BLOCKS).
        unsafe { atom_add_u32_gpu(counter, 1 << 16) >> 16 }
    };
    // This split's i-th block of the static schedule (the ticket
    // schedule's first S + 1), or NONE past its blocks: over a contiguous
    // cache the tile's blocks `s, s + ns, s + 2·ns, …` (interleaved: a
    // tile's splits read neighbouring blocks at the same time; decode step
    // 38), over pages only where the host asks (`INTERLEAVE_PAGED`: pages
    // of at least a block on the H100, 1–1.5% faster); else a contiguous
    // share (interleaved, each block waits for its own page lookup:
    // 0.5–2% slower over 16-token pages on the H100, 6–7% over 256-token
    // pages on the H200).
    let (s_first, s_step, s_end) = if tickets || !paged || p.split_tickets & INTERLEAVE_PAGED != 0 {
        (j_first + split as usize, ns, j_end)
    } else {
        // `fa2::key_blocks`' share, written out: one helper for both gave
        // this build 255 registers instead of 248 and ran slower over
        // 16-token pages (decode step 39, review).
        let per = (j_end - j_first).div_ceil(ns);
        let first = (j_first + split as usize * per).min(j_end);
        (first, 1, (first + per).min(j_end))
    };
    let fixed = |i: usize| {
        let j = s_first + i * s_step;
        if j < s_end { j } else { NONE }
    };

    // ---- prologue: Q and the first S − 1 blocks -------------------------------
    // SAFETY: rows q0..min(q0 + 16, nq) of Q exist.
    unsafe { s_q.load_async(g_q, qs1, BR, (nq - q0).min(BR), d, tid, nt) };
    // Over pages the first S − 1 blocks' lookups go out together, then
    // their copies: one block-table round trip before the stream instead
    // of S − 1 (the paged prologue took ~5.2 µs against 1.8 over a
    // contiguous cache, decode step 39). (The ticket schedule runs over
    // contiguous caches alone.)
    // (Both loads before either is used: no loop, no clamp in between.)
    let pre = [
        if !tickets && fixed(0) != NONE { lookup(fixed(0)) } else { None },
        if S == 3 && !tickets && fixed(1) != NONE { lookup(fixed(1)) } else { None },
    ];
    let mut queue = [NONE; 2]; // tickets: blocks in flight, oldest first (S − 1)
    for s in 0..S - 1 {
        if tickets {
            queue[s] = fixed(s);
            if queue[s] != NONE {
                issue(queue[s], s, None);
            }
        } else if fixed(s) != NONE {
            issue(fixed(s), s, pre[s]);
        }
        cp_async_commit();
    }

    tl.stamp(1);
    let mut r_o = [[[0f32; 4]; DN]; 1];
    let mut st = [[RowState::<f32>::new(); 2]; 1];
    let mut r_q = [[[0u32; 4]; DK]; 1];
    let (q_sign, scale_log2) = scale_sign(p.softmax_scale_log2);
    // SAFETY: host-checked ALiBi slopes.
    let mods = unsafe { Mods::new(p, b, h, scale_log2) };
    let soft_scale = if mods.active() { 1.0 } else { scale_log2 };
    let row0 = (q0 + g) as i64; // sequence row of this thread's first accumulator row

    // ---- main loop ----------------------------------------------------------------
    // Q into registers once (QREG), when it has landed.
    macro_rules! load_q {
        () => {
            if QREG {
                for kk in 0..DK {
                    // SAFETY: Q landed and a barrier passed.
                    r_q[0][kk] = super::fa2::sign(unsafe { s_q.a_frag(0, kk * 16, lane) }, q_sign);
                }
            }
        };
    }
    // Block `j` from stage `buf`: scores, mask, online softmax, P·V.
    macro_rules! attend_block {
        ($j:expr, $buf:expr) => {{
            let (j, buf) = ($j, $buf);
            let sk = KvTile::<D> { base: s_k(buf).base + w_off };
            let sv = KvTile::<D> { base: s_v(buf).base + w_off };
            // SAFETY: block j landed and a barrier passed.
            let mut r_s = unsafe { qk::<T, D, DK, BCWN, 1, QREG>(&r_q, s_q, 0, q_sign, sk, lane) };
            let k0 = j * BC + warp * BCW;
            if mods.active() {
                mods.apply(&mut r_s[0], k0, t, [row0 + win.shift, row0 + 8 + win.shift]);
            }
            if k0 < full_start || k0 + BCW > full_end {
                mask(&mut r_s[0], k0, t, [win.lo(row0), win.lo(row0 + 8)], [win.hi(row0), win.hi(row0 + 8)]);
                softmax_step::<BCWN, DN, 1, true>(&mut r_s, &mut r_o, &mut st, soft_scale);
            } else {
                softmax_step::<BCWN, DN, 1, false>(&mut r_s, &mut r_o, &mut st, soft_scale);
            }
            // SAFETY: as above.
            unsafe { pv::<T, D, DN, BCWN, BCWK, 1>(&mut r_o, &r_s, sv, lane) };
        }};
    }
    if tickets {
        let mut it = 0; // iteration: block queue[0] sits in stage it % S
        let mut drawn_out = false;
        let mut pending = 0u32; // thread 0: the ticket drawn last iteration
        loop {
            // The oldest block landed (this thread's copies; S − 2 later
            // groups may fly), then everyone's (barrier), which also frees
            // stage (it − 1) % S.
            if S == 2 {
                cp_async_wait::<0>();
            } else {
                cp_async_wait::<1>();
            }
            sync_threads();
            let j = queue[0];
            if j == NONE {
                break; // block-uniform: every thread holds the same queue
            }
            if it == 0 {
                load_q!();
            }
            // The next block: the last two fixed ones, then the ticket
            // thread 0 drew two iterations ago and stored before the barrier.
            let next = if it < 2 {
                fixed(S - 1 + it)
            } else if drawn_out {
                NONE
            } else {
                // SAFETY: written by thread 0 before this iteration's barrier.
                let jn = ticket_base + unsafe { ld_volatile_shared_u32(ticket_slot(it)) } as usize;
                if jn < j_end { jn } else { NONE }
            };
            drawn_out |= next == NONE;
            if next != NONE {
                issue(next, (it + S - 1) % S, None);
            }
            cp_async_commit();
            // A ticket for two iterations on: drawn now, stored at the end
            // of the next iteration (a block and more for its round trip).
            let drawn = if !drawn_out && tid == 0 { draw() } else { 0 };
            if S == 3 {
                queue[0] = queue[1];
                queue[1] = next;
            } else {
                queue[0] = next;
            }
            attend_block!(j, it % S);
            if !drawn_out && tid == 0 && it >= 1 {
                // SAFETY: the other parity's word, read after the next barrier.
                unsafe { st_shared_u32(ticket_slot(it + 1), pending) };
            }
            pending = drawn;
            it += 1;
        }
    } else {
        // The static schedule (`fixed`): the split's i-th block in stage
        // i % S.
        let mut i = 0;
        loop {
            let j = fixed(i);
            if j == NONE {
                break; // block-uniform
            }
            // Block j landed (this thread's copies; S − 2 later groups may fly),
            // then everyone's (barrier), which also frees stage (i − 1) % S.
            if S == 2 {
                cp_async_wait::<0>();
            } else {
                cp_async_wait::<1>();
            }
            sync_threads();
            if i == 0 {
                load_q!();
            }
            let jn = fixed(i + S - 1);
            if jn != NONE {
                issue(jn, (i + S - 1) % S, None);
            }
            cp_async_commit();
            attend_block!(j, i % S);
            i += 1;
        }
    }
    cp_async_wait::<0>();
    sync_threads(); // every warp done with the stages: the merge reuses them
    tl.stamp(2);

    // ---- merge the warps' states ------------------------------------------------------
    // Only the tile's live rows (`rows` of 16: one for a token of MHA, the
    // g packed query heads for GQA) go through shared memory, and the
    // merge spreads the block's threads over them (decode step 16: a
    // quarter of the stores and 4× fewer column pairs per thread for
    // GQA 32/8 than merging all 16 rows).
    let rows = (nq - q0).min(BR);
    let ms = merge_stride(D);
    let o_w = dynamic_smem::<u8>().wrapping_add(tile_bytes(BR, D)) as *mut f32;
    let ml = o_w.wrapping_add(NW * BR * ms);
    for r in 0..2 {
        let row = g + 8 * r;
        let l = quad_sum(st[0][r].l);
        if row >= rows {
            continue; // dead rows: nothing to merge (the shuffle above is done)
        }
        let dst = o_w.wrapping_add((warp * BR + row) * ms);
        for n in 0..DN {
            let col = n * 8 + 2 * t;
            // SAFETY: inside this warp's partial tile (row < 16, col + 1 < D + 8).
            unsafe { *(dst.add(col) as *mut [f32; 2]) = [r_o[0][n][2 * r], r_o[0][n][2 * r + 1]] };
        }
        if t == 0 {
            // SAFETY: NW·16 (m, l) pairs after the tiles.
            unsafe { *(ml.add(2 * (warp * BR + row)) as *mut [f32; 2]) = [st[0][r].m, l] };
        }
    }
    sync_threads();

    // Thread tid merges row tid / tpr, column pairs (tid % tpr) + k·tpr,
    // with tpr = nt / (rows rounded up to a power of two). Rows past the
    // sequence's queries store nothing (no early return: the fused combine
    // below has barriers).
    let tpr = nt >> rows.next_power_of_two().trailing_zeros();
    let row = tid / tpr;
    let live = row < rows;
    let mut m_all = f32::NEG_INFINITY;
    for w in 0..NW {
        // SAFETY: written above, a barrier passed.
        m_all = m_all.max(unsafe { *ml.add(2 * (w * BR + row)) });
    }
    let mut wgt = [0f32; NW];
    let mut l_all = 0f32;
    for w in 0..NW {
        // SAFETY: as above.
        let [m_w, l_w] = unsafe { *(ml.add(2 * (w * BR + row)) as *const [f32; 2]) };
        wgt[w] = if m_w == f32::NEG_INFINITY { 0.0 } else { (m_w - m_all).exp2() };
        l_all += wgt[w] * l_w;
    }
    let state = RowState { m: m_all, l: l_all };
    let inv_l = state.inv_l();
    let merged = |col: usize| -> [f32; 2] {
        let mut acc = [0f32; 2];
        for w in 0..NW {
            // SAFETY: as above; col + 1 < D.
            let x = unsafe { *(o_w.add((w * BR + row) * ms + col) as *const [f32; 2]) };
            acc[0] += wgt[w] * x[0];
            acc[1] += wgt[w] * x[1];
        }
        [acc[0] * inv_l, acc[1] * inv_l]
    };
    let lane_r = tid % tpr;
    let [os0, os1, os2] = p.o_stride;
    let o_row_of = |r: usize| (p.o_ptr as *mut u16).wrapping_add((b as u64 * os0 + (seq.q_row0 + (q0 + r) as u64) * os1 + h as u64 * os2) as usize);
    let lse_of = |r: usize| if p.lse_ptr != 0 { (p.lse_ptr as *mut f32).wrapping_add(seq.lse_base as usize + q0 + r) } else { core::ptr::null_mut() };
    if p.num_splits > 1 {
        // Split-KV partial: normalized O and LSE in f32 for the combine.
        let lse_len = crate::decode::lse_len(p);
        if live {
            let idx = split as usize * lse_len + seq.lse_base as usize + q0 + row;
            let o_row = (p.o_accum_ptr as *mut f32).wrapping_add(idx * d);
            let mut col = 2 * lane_r;
            while col < d {
                // SAFETY: (split, row) inside the host's accumulator of
                // splits·lse_len rows of d f32; col + 1 < d (d even).
                unsafe { *(o_row.add(col) as *mut [f32; 2]) = merged(col) };
                col += 2 * tpr;
            }
            if lane_r == 0 {
                // SAFETY: splits·lse_len f32.
                unsafe { *(p.lse_accum_ptr as *mut f32).add(idx) = state.lse() };
            }
        }
        tl.stamp(3);
        if p.split_counter_ptr == 0 {
            tl.meta(split, false);
            return;
        }
        // Fused combine: the last split of this tile to finish merges the
        // tile's rows (one warp per row), no combine launch.
        // SAFETY: the host's counters hold one u32 per tile (idx < grid /
        // num_splits); the Q tile's first word is free (Q is not read again).
        let last = unsafe { last_split(p, idx as usize, base, tid) };
        tl.stamp(4);
        tl.meta(split, last);
        if last {
            let mut r = warp;
            while r < rows {
                // SAFETY: every split of the tile wrote its partial rows and
                // released them (last_split); O's row r and its LSE exist.
                unsafe { crate::decode::combine_row::<T, { crate::decode::FUSED_STEP }>(p, lse_len, seq.lse_base as usize + q0 + r, lane, o_row_of(r), lse_of(r)) };
                r += NW;
            }
            if p.scratch_ptr != 0 {
                sync_threads(); // the block's end: every warp's rows stored
            }
            tl.stamp(5);
        }
        return;
    }
    if !live {
        return;
    }
    let o_row = o_row_of(row);
    let mut col = 2 * lane_r;
    while col < d {
        let [x, y] = merged(col);
        // SAFETY: row < nq, col + 1 < d; 4-byte aligned (even col, host-checked strides).
        unsafe { *(o_row.add(col) as *mut u32) = pack::<T>(x, y) };
        col += 2 * tpr;
    }
    if lane_r == 0 && p.lse_ptr != 0 {
        // SAFETY: lse holds the rows of the lse space (dense or varlen).
        unsafe { *lse_of(row) = state.lse() };
    }
    tl.stamp(3);
    tl.meta(0, false);
}

/// Split-KV with fused combine: counts this block's split as done for its
/// tile and tells every thread whether it was the tile's last (then the
/// other splits' partials are visible to it). Every thread of the block
/// calls it after writing its partial rows.
///
/// One acq_rel atomic per block, by the counting thread: the barrier orders
/// the block's partial rows before thread 0's release (cumulative), and
/// thread 0's acquire before the barrier that lets the block read the other
/// splits' rows — as cooperative groups' grid barrier does with fences
/// (decode step 14: one thread instead of every thread; step 34: the
/// atomic's own ordering instead of two fences).
///
/// # Safety
/// `p.split_counter_ptr` holds a u32 at `tile` (0 at launch); `flag` a
/// free shared-memory word.
#[inline(always)]
unsafe fn last_split(p: &AttnParams, tile: usize, flag: u32, tid: usize) -> bool {
    sync_threads(); // every thread's partial rows, in CTA order
    if tid == 0 {
        let counter = (p.split_counter_ptr as *mut u32).wrapping_add(tile);
        // The count releases the block's partial rows (the barrier above
        // makes them thread 0's by cumulativity) and acquires the other
        // splits' rows (their counts released them): one acq_rel atomic,
        // whose SASS is one MEMBAR before it and an L1 invalidate after —
        // a fence before and a fence after a relaxed atomic cost the last
        // split a second MEMBAR (decode step 34).
        // SAFETY: caller.
        // (Low 16 bits: splits done; high 16: tickets drawn, see `forward`.)
        let last = (unsafe { atom_add_acq_rel_u32_gpu(counter, 1) } + 1) & 0xffff == p.num_splits;
        if last {
            // Every split has counted: back to 0 for the next launch (the
            // launch's end orders it before the next launch).
            // SAFETY: as above.
            unsafe { st_relaxed_u32_gpu(counter, 0) };
        }
        // SAFETY: caller.
        unsafe { st_shared_u32(flag, last as u32) };
    }
    sync_threads();
    // SAFETY: written above, a barrier passed.
    unsafe { ld_volatile_shared_u32(flag) != 0 }
}

#[cfg(fa_ptx74)]
mod f8;
#[cfg(fa_ptx74)]
pub use f8::forward_f8;
