//! Context parallelism: one sequence's attention spread over several
//! ranks (GPUs), each holding a shard of the tokens (the repository's
//! `docs/context-parallel.md` has the overview and the GPU figures).
//!
//! * [`sharding`]: which tokens a rank holds: [`Sharding::Contiguous`], or
//!   [`Sharding::Zigzag`] (chunks `r` and `2N − 1 − r`: equal causal work);
//!   varlen batches are sharded document by document ([`ShardPlan`]).
//! * [`schedule`]: the ring: at step `s` rank `r` holds rank `(r − s) mod N`'s
//!   K/V shard and computes one [`RingBlock`] (full, causal-diagonal) or
//!   skips ([`ring_block`]).
//! * [`merge`]: the exact log-sum-exp merge of partial `(O, LSE)`
//!   ([`merge_partial`]; the formula is
//!   [`flash_attn_common::ring::merge_lse`], shared with the GPU kernel).
//! * [`sim`]: `N` ranks as threads exchanging shards over channels in the
//!   ring's order (or Ulysses' all-to-all) over the CPU reference: forward
//!   ([`cp_forward`], [`cp_forward_varlen`]) and backward ([`cp_backward`],
//!   [`cp_backward_varlen`]). Exact against one-rank attention; runs in CI.
//! * [`gpu_merge`]: the merge on the GPU (`ring_merge_*`, also the f32 sums
//!   of the backward's gradients), and, with the cargo feature `nccl`,
//!   `nccl`: the ring forward and backward and Ulysses across GPUs over
//!   NCCL (one process driving every GPU, or one process per GPU).
//!
//! ```
//! use flash_attn::ForwardParams;
//! use flash_attn::context_parallel::{ContextParallel, cp_forward};
//! use ndarray::Array4;
//!
//! let x = |h| Array4::from_shape_fn((1, 64, h, 16), |(_, i, h, c)| ((i * 7 + h * 3 + c) as f64 * 0.1).sin());
//! let (q, k, v) = (x(4), x(2), x(2));                       // GQA: 4 query heads, 2 KV heads
//! let params = ForwardParams { causal: true, ..Default::default() };
//! let out = cp_forward(q.view(), k.view(), v.view(), &params, &ContextParallel::ring(4))?;
//! let one = flash_attn::reference::attention(q.view(), k.view(), v.view(), &params, None)?;
//! assert!((&out.o - &one.o).iter().all(|e| e.abs() < 1e-12));
//! # Ok::<(), flash_attn::FlashAttnError>(())
//! ```

pub mod merge;
pub mod schedule;
pub mod sharding;
pub mod sim;

pub use merge::merge_partial;
pub use schedule::{BlockSegments, Mask, RingBlock, Span, kv_owner, ring_block, varlen_segments};
pub use sharding::{ShardPlan, Sharding};
pub use sim::{ContextParallel, Strategy, cp_backward, cp_backward_varlen, cp_forward, cp_forward_varlen};
pub mod gpu_merge;
#[cfg(feature = "nccl")]
pub mod nccl;
