//! The HBM-traffic model of forward + backward (seed 002's GPT-2 table:
//! standard attention 40.3 GB against FlashAttention's 4.4 GB), on top of
//! `flash_attn::plan` (the forward models, [`HbmTraffic::standard_backward`]
//! and [`HbmTraffic::fa2_backward`]): FA1's backward (the FA1 paper's
//! Algorithm 4, which `flash_attn::plan` lacks) and the forward + backward
//! sums `fa-run` prints.

use flash_attn::plan::{HbmTraffic, PlanError, TilingPlan};

fn mul(a: u64, b: u64) -> Result<u64, PlanError> {
    a.checked_mul(b).ok_or(PlanError::Overflow { what: "backward bytes" })
}

fn add(a: u64, b: u64) -> Result<u64, PlanError> {
    a.checked_add(b).ok_or(PlanError::Overflow { what: "backward bytes" })
}

/// FA1's backward (the FA1 paper's Algorithm 4, seed 000 §3.2), one head,
/// `Tc = ceil(N_k / Bc)` K/V blocks outer, Q blocks inner, counting every
/// load and store of the algorithm as written:
///
/// * line 5, initialize `dQ`, `dK`, `dV = 0` in HBM: write `N_q d + 2 N_k d`;
/// * line 6, load `K_j`, `V_j` once per outer step: read `2 N_k d` in all;
/// * line 8, load `Q_i`, `O_i`, `dO_i`, `dQ_i` and `l_i`, `m_i` at every
///   `(j, i)`: read `Tc · N_q · 4d` elements and `Tc · 2 N_q` statistics
///   (`D_i = rowsum(dO_i ∘ O_i)` is recomputed on chip at each step);
/// * line 21, write `dQ_i` back at every `(j, i)`: `Tc · N_q d`;
/// * line 24, write `dK_j`, `dV_j` once: `2 N_k d`.
///
/// The `Tc · N_q · 4d` term is Theorem 5's `Θ(N² d² / M)` (`Tc = Θ(N d / M)`),
/// against standard attention's `Θ(N d + N²)` ([`HbmTraffic::standard_backward`]).
/// `elem_bytes`: Q, K, V, O, dO and the gradients; `stat_bytes`: `l`, `m`.
/// Dense figure (an upper bound for causal).
pub fn fa1_backward(n_q: u64, n_k: u64, d: u64, bc: u64, elem_bytes: u64, stat_bytes: u64) -> Result<HbmTraffic, PlanError> {
    for (x, name) in [(n_q, "n_q"), (n_k, "n_k"), (d, "d"), (bc, "bc")] {
        if x == 0 {
            return Err(PlanError::ZeroDim { name });
        }
    }
    for (x, name) in [(elem_bytes, "elem_bytes"), (stat_bytes, "stat_bytes")] {
        if x == 0 {
            return Err(PlanError::ZeroElemSize { name });
        }
    }
    let tc = n_k.div_ceil(bc);
    let (qd, kd) = (mul(mul(n_q, d)?, elem_bytes)?, mul(mul(n_k, d)?, elem_bytes)?);
    let per_block_read = add(mul(4, qd)?, mul(mul(2, n_q)?, stat_bytes)?)?;
    let read = add(mul(2, kd)?, mul(tc, per_block_read)?)?;
    let write = add(add(add(qd, mul(2, kd)?)?, mul(tc, qd)?)?, mul(2, kd)?)?;
    Ok(HbmTraffic { read_bytes: read, write_bytes: write })
}

/// The traffic of one forward and one backward pass.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FwdBwd {
    pub forward: HbmTraffic,
    pub backward: HbmTraffic,
}

impl FwdBwd {
    /// Forward + backward bytes, read and written (saturating: display only).
    pub fn total(&self) -> u64 {
        self.forward.total().saturating_add(self.backward.total())
    }

    /// `k` independent problems (e.g. `batch · nheads`).
    pub fn times(self, k: u64) -> Result<Self, PlanError> {
        Ok(Self { forward: self.forward.times(k)?, backward: self.backward.times(k)? })
    }
}

/// The forward + backward rows of seed 002's table on `plan`'s shape, one
/// head: standard attention (`S`, `P` written by the forward, `dP`, `dS` by
/// the backward, every `N_q × N_k` matrix in the element type), FA1
/// (Algorithm 1 + Algorithm 4, with the plan's `Bc`) and FA2 (Q blocks outer
/// forward + FlashAttention-2's backward with its dQ accumulator, the plan's
/// `Br` and `Bc`).
pub fn fwd_bwd_rows(plan: &TilingPlan, elem_bytes: u64, stat_bytes: u64) -> Result<[(&'static str, FwdBwd); 3], PlanError> {
    let (n_q, n_k, d) = (plan.n_q, plan.n_k, plan.d);
    Ok([
        (
            "standard (S, P, dP, dS in HBM)",
            FwdBwd { forward: plan.standard_traffic(elem_bytes)?, backward: HbmTraffic::standard_backward(n_q, n_k, d, elem_bytes)? },
        ),
        (
            "FA1 (Alg. 1 + Alg. 4)",
            FwdBwd {
                forward: plan.fa1_traffic(elem_bytes, stat_bytes)?,
                backward: fa1_backward(n_q, n_k, d, plan.bc, elem_bytes, stat_bytes)?,
            },
        ),
        (
            "FA2 (Q outer + FA2 backward)",
            FwdBwd {
                forward: plan.fa2_traffic(elem_bytes, stat_bytes)?,
                backward: HbmTraffic::fa2_backward(n_q, n_k, d, plan.bc, elem_bytes, stat_bytes)?,
            },
        ),
    ])
}
