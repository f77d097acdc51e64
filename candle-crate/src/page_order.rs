//! Address-ordered block tables on candle tensors: the core's
//! `order_block_table` (CPU) and `FlashAttention::order_block_table` (GPU,
//! on candle's stream) over a block-table tensor, in place.
//!
//! A paged call sums over keys: where no mask and no bias depends on a
//! key's position, the order in which a row of the block table lists its
//! pages does not change the result, but the DRAM streams pages read in
//! address order faster (16-token pages placed at random: 2–4%; the core's
//! `page_order` module and docs/perf-notes.md, decode steps 37–44). Each
//! row's *full, position-free* pages (all keys cached, seen by every query
//! row; no ALiBi, no left window) are sorted by page index; the partial
//! last page and every later slot stay, so appends land where they did and
//! the ordered table stays valid while sequences grow.

use candle_core::backend::BackendStorage;
use candle_core::{CpuStorage, InplaceOp2, Layout, Result, Tensor};
use flash_attn::{ForwardParams, KvCacheCall};

use crate::FlashAttnKvCache;
use crate::check::{self, core_err, err};
use crate::cpu::index_i32;

impl FlashAttnKvCache {
    /// Orders `block_table` (U32/I32 `(batch, max_blocks_per_seq)`,
    /// contiguous; written in place) for calls of this op with `seqlen_q`
    /// query rows and `seqlen_new` appended keys per sequence over pages of
    /// `page_block_size` keys: in each row, the slots of the full pages
    /// whose keys are position-free for such a call (the module docs) are
    /// sorted by page index; every other slot is left as it was. Such a
    /// call then computes the same attention (to rounding) and reads its
    /// pages in address order. Order once, before the decode loop; again
    /// after anything that shortens a sequence below its ordered pages.
    ///
    /// `cache_seqlens` (U32/I32 `(batch)`, on the table's device): keys
    /// cached per sequence before the call. On the CPU every check of the
    /// core runs (lengths past the capacity are errors); on the GPU the
    /// lengths, which the host cannot see, are clamped to the capacity and
    /// nothing synchronizes the host (one launch on candle's stream; rows
    /// of at most `flash_attn::MAX_DEVICE_ORDER_BLOCKS` slots).
    ///
    /// Errors (nothing written): ALiBi slopes or a left window on this op
    /// (position-dependent: no order), `seqlen_q` 0, `page_block_size` 0,
    /// shapes, dtypes, devices, a table sharing storage with
    /// `cache_seqlens`, a U32 entry ≥ 2³¹ (CPU).
    pub fn order_block_table(
        &self,
        block_table: &Tensor,
        cache_seqlens: &Tensor,
        page_block_size: usize,
        seqlen_q: usize,
        seqlen_new: usize,
    ) -> Result<()> {
        crate::check_devices(&[("block_table", block_table), ("cache_seqlens", cache_seqlens)])?;
        let (batch, max_blocks) = match check::index_tensor("block_table", block_table, "(batch, max_blocks_per_seq)", 2)? {
            &[b, m] if m >= 1 => (b, m),
            dims => return Err(err(format_args!("shape mismatch: `block_table` is {dims:?}, expected (batch, max_blocks_per_seq ≥ 1)"))),
        };
        match check::index_tensor("cache_seqlens", cache_seqlens, "(batch)", 1)? {
            &[n] if n == batch => {}
            dims => return Err(err(format_args!("shape mismatch: `cache_seqlens` is {dims:?}, expected ({batch}) (block_table's batch)"))),
        }
        check::check_no_sharing(&[("block_table", block_table)], &[("cache_seqlens", Some(cache_seqlens))])?;
        // Only the mask's shape matters here (the window is normalized with
        // the capacity by the core, as the paged calls do).
        let params = ForwardParams { window_left: self.window_size_left, window_right: self.window_size_right, ..Default::default() };
        let call = KvCacheCall::from_shape(&params, self.alibi_slopes.is_some(), seqlen_q, seqlen_new);
        let order = Order { call, page: page_block_size, max_blocks };
        block_table.inplace_op2(cache_seqlens, &order)
    }
}

/// The in-place op on the block table (`cache_seqlens` read).
struct Order {
    /// The calls the table is ordered for (this op's mask and ALiBi, the
    /// step's shape).
    call: KvCacheCall,
    page: usize,
    max_blocks: usize,
}

impl InplaceOp2 for Order {
    fn name(&self) -> &'static str {
        "flash-attn-order-block-table"
    }

    fn cpu_fwd(&self, table: &mut CpuStorage, table_l: &Layout, lens: &CpuStorage, lens_l: &Layout) -> Result<()> {
        let lens = index_i32("cache_seqlens", lens, lens_l)?;
        let mut rows = index_i32("block_table", table, table_l)?;
        flash_attn::order_block_table(&mut rows, self.max_blocks, self.page, &lens, &self.call).map_err(core_err)?;
        // Every entry came from (and fits) the tensor's dtype.
        let at = table_l.start_offset();
        match table {
            CpuStorage::I32(v) => v[at..at + rows.len()].copy_from_slice(&rows),
            CpuStorage::U32(v) => v[at..at + rows.len()].iter_mut().zip(&rows).for_each(|(d, &x)| *d = x as u32),
            other => return Err(err(format_args!("dtype mismatch: `block_table` is {:?}, expected U32 or I32", other.dtype()))),
        }
        Ok(())
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        table: &mut candle_core::CudaStorage,
        table_l: &Layout,
        lens: &candle_core::CudaStorage,
        lens_l: &Layout,
    ) -> Result<()> {
        crate::cuda::order_block_table((table, table_l), (lens, lens_l), self.max_blocks, self.page, &self.call)
    }
}
