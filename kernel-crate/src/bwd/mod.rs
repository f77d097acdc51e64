//! The backward pass by recomputation (seed 000 §3.2, `../shared/BACKWARD.md`):
//! the forward kept only the row statistics (the LSE, or FA1's `l`, `m`);
//! every `P_ij` is recomputed block by block from Q, K and them.
//!
//! * [`preprocess`]: `D_i = rowsum(dO_i ∘ O_i)` and zeroed scratch (dQ
//!   accumulator, semaphores), then the final dQ cast — element-generic,
//!   shared with the tensor-core backward.
//! * [`step`]: one `(Q block i, K/V block j)` step of the f32 kernels
//!   (recompute `P_ij`, `dV_j`, `dP_ij`, `dS_ij`, `dK_j`, `dQ_i`).
//! * [`fa2`]: FA2 paper Algorithm 2 order (one block per K/V tile, dQ by f32
//!   atomics, optionally ordered by semaphores: deterministic).
//! * [`fa1`]: FA1 paper Algorithm 4 order (one block per (batch, KV head),
//!   K/V blocks outer, dQ read-modify-written in HBM).

pub mod fa1;
pub mod fa2;
pub mod preprocess;
pub mod step;
