//! The FA1 tiling plan and the HBM-traffic model of standard attention, the
//! FA1 loop order and the FA2 loop order.
//!
//! Everything here follows the seeds:
//!
//! * seed 002, Algorithm 1 line 1: `Bc = ceil(M / 4d)`, `Br = min(ceil(M / 4d), d)`,
//!   and line 3: `Tr = ceil(N / Br)`, `Tc = ceil(N / Bc)`. `M` is the on-chip
//!   SRAM size counted the way the paper counts it. The paper's GPT-2 / A100
//!   example plugs the A100's 192 KB = 196 608 straight into the formula
//!   (`Bc = ceil(196608 / 4 / 64) = 768`), i.e. it counts `M` in the unit of
//!   the formula, which we call *elements*; [`TilingPlan::new`] takes `M` that
//!   way and [`TilingPlan::from_sram_bytes`] converts bytes with an element size.
//! * seed 002, Algorithm 0 (standard attention) and Theorem 2 (FA1 touches HBM
//!   `Θ(N²d²/M)` times, standard attention `Ω(Nd + N²)`);
//! * seed 001 (FA2): Q outer, K/V inner, so `O`, `l`, `m` stay on chip and go
//!   to HBM once per Q block instead of once per (Q block, K/V block) pair.
//!
//! Byte counts are per (batch, head) pair: multiply by `batch * nheads` with
//! [`HbmTraffic::times`]. All arithmetic is checked: a count that does not fit
//! in `u64` is a [`PlanError::Overflow`], never a wrap or a panic.
//!
//! `#![no_std]`-clean (compiled for nvptx64 too): integer arithmetic only.

use core::fmt;

/// Why a plan or a traffic figure could not be computed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PlanError {
    /// A dimension (`"m_sram"`, `"n_q"`, `"n_k"`, `"d"`) is 0.
    ZeroDim { name: &'static str },
    /// `M < 4d`: not even one row each of `Q_i`, `O_i`, `K_j`, `V_j` (`4d`
    /// elements) fits on chip, so Algorithm 1's block sizes are meaningless.
    SramTooSmall { m_sram: u64, d: u64 },
    /// An element size (`"elem_bytes"`, `"stat_bytes"`) is 0.
    ZeroElemSize { name: &'static str },
    /// An explicit block size (`"br"`, `"bc"`) is 0.
    ZeroBlock { name: &'static str },
    /// A count does not fit in `u64`; `what` names the quantity.
    Overflow { what: &'static str },
}

impl fmt::Display for PlanError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            PlanError::ZeroDim { name } => write!(f, "tiling plan: `{name}` must be positive, got 0"),
            PlanError::SramTooSmall { m_sram, d } => write!(
                f,
                "tiling plan: SRAM size m_sram = {m_sram} elements is smaller than 4*d = {} (d = {d}): \
                 one row each of Q_i, O_i, K_j, V_j does not fit on chip",
                4 * d as u128
            ),
            PlanError::ZeroElemSize { name } => write!(f, "tiling plan: `{name}` must be at least 1 byte, got 0"),
            PlanError::ZeroBlock { name } => write!(f, "tiling plan: block size `{name}` must be positive, got 0"),
            PlanError::Overflow { what } => write!(f, "tiling plan: {what} does not fit in 64 bits"),
        }
    }
}

impl core::error::Error for PlanError {}

#[inline]
fn mul(a: u64, b: u64, what: &'static str) -> Result<u64, PlanError> {
    a.checked_mul(b).ok_or(PlanError::Overflow { what })
}

#[inline]
fn add(a: u64, b: u64, what: &'static str) -> Result<u64, PlanError> {
    a.checked_add(b).ok_or(PlanError::Overflow { what })
}

#[inline]
fn nonzero(x: u64, name: &'static str) -> Result<u64, PlanError> {
    if x == 0 { Err(PlanError::ZeroDim { name }) } else { Ok(x) }
}

/// The block sizes and block counts of FA1's Algorithm 1 (seed 002) for one
/// attention head: `Q` is `n_q × d`, `K` and `V` are `n_k × d`. The paper has
/// `n_q = n_k = N`; with `n_q ≠ n_k` the rows are split by `Br` and the keys by
/// `Bc` exactly the same way.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TilingPlan {
    /// On-chip SRAM size `M`, in elements (the unit of `ceil(M / 4d)`).
    pub m_sram: u64,
    /// Head dimension `d`.
    pub d: u64,
    /// Query rows `N_q`.
    pub n_q: u64,
    /// Key/value rows `N_k`.
    pub n_k: u64,
    /// `Bc = ceil(M / 4d)`: rows of `K_j`, `V_j`. `K_j`, `V_j` (2·Bc·d elements)
    /// take about half of `M`, leaving the other half for `Q_i`, `O_i`.
    pub bc: u64,
    /// `Br = min(ceil(M / 4d), d)`: rows of `Q_i`, `O_i`. Capped at `d` so that
    /// the `Br × Bc` score block `S_ij` (≤ `d · Bc ≈ M/4` elements) also fits.
    pub br: u64,
    /// `Tr = ceil(N_q / Br)`: number of Q blocks.
    pub tr: u64,
    /// `Tc = ceil(N_k / Bc)`: number of K/V blocks.
    pub tc: u64,
}

impl TilingPlan {
    /// Algorithm 1, lines 1 and 3, from the SRAM size `m_sram` in elements.
    ///
    /// Errors: any argument 0 ([`PlanError::ZeroDim`]); `m_sram < 4 d`
    /// ([`PlanError::SramTooSmall`]); `4 d` overflowing.
    ///
    /// The seed's GPT-2 / A100 example: `new(196_608, 1024, 1024, 64)` gives
    /// `Bc = 768`, `Br = 64`, `Tc = 2`, `Tr = 16`.
    pub fn new(m_sram: u64, n_q: u64, n_k: u64, d: u64) -> Result<Self, PlanError> {
        nonzero(m_sram, "m_sram")?;
        nonzero(n_q, "n_q")?;
        nonzero(n_k, "n_k")?;
        nonzero(d, "d")?;
        let four_d = mul(4, d, "4*d")?;
        if m_sram < four_d {
            return Err(PlanError::SramTooSmall { m_sram, d });
        }
        let bc = m_sram.div_ceil(four_d);
        let br = if bc < d { bc } else { d };
        Ok(Self { m_sram, d, n_q, n_k, bc, br, tr: n_q.div_ceil(br), tc: n_k.div_ceil(bc) })
    }

    /// As [`TilingPlan::new`], with `M = sram_bytes / elem_bytes` elements
    /// (rounded down: a partial element does not hold anything).
    pub fn from_sram_bytes(sram_bytes: u64, elem_bytes: u64, n_q: u64, n_k: u64, d: u64) -> Result<Self, PlanError> {
        if elem_bytes == 0 {
            return Err(PlanError::ZeroElemSize { name: "elem_bytes" });
        }
        nonzero(sram_bytes, "m_sram")?;
        Self::new(sram_bytes / elem_bytes, n_q, n_k, d)
    }

    /// A plan with explicit block sizes (a kernel's own `Br`, `Bc`, which are
    /// chosen for tensor-core shapes, not by the formula). `m_sram` is set to
    /// the on-chip footprint of `Q_i`, `O_i`, `K_j`, `V_j`: `(2 Br + 2 Bc) d`.
    pub fn from_blocks(n_q: u64, n_k: u64, d: u64, br: u64, bc: u64) -> Result<Self, PlanError> {
        nonzero(n_q, "n_q")?;
        nonzero(n_k, "n_k")?;
        nonzero(d, "d")?;
        if br == 0 {
            return Err(PlanError::ZeroBlock { name: "br" });
        }
        if bc == 0 {
            return Err(PlanError::ZeroBlock { name: "bc" });
        }
        let rows = add(mul(2, br, "2*br")?, mul(2, bc, "2*bc")?, "2*br + 2*bc")?;
        let m_sram = mul(rows, d, "on-chip footprint")?;
        Ok(Self { m_sram, d, n_q, n_k, bc, br, tr: n_q.div_ceil(br), tc: n_k.div_ceil(bc) })
    }

    /// Elements of `Q_i`, `O_i`, `K_j`, `V_j` held on chip at once:
    /// `(2 Br + 2 Bc) d`. With the formula's block sizes this is at most
    /// `M + 4d` (the ceiling can round `Bc` up by less than one row); the paper
    /// does not count the `Br × Bc` block `S_ij`, which `Br ≤ d` keeps ≤ `M/4`.
    /// Saturates at `u64::MAX`.
    pub fn on_chip_elems(&self) -> u64 {
        self.br.saturating_add(self.bc).saturating_mul(2).saturating_mul(self.d)
    }

    /// Number of (Q block, K/V block) pairs, `Tr · Tc`: FA1's inner-loop
    /// iterations, each `O(Br Bc d)` FLOPs (Theorem 1: `O(N² d)` in all).
    /// Saturates at `u64::MAX`.
    pub fn block_pairs(&self) -> u64 {
        self.tr.saturating_mul(self.tc)
    }

    /// Standard attention on this plan's shape; see [`HbmTraffic::standard`].
    pub fn standard_traffic(&self, elem_bytes: u64) -> Result<HbmTraffic, PlanError> {
        HbmTraffic::standard(self.n_q, self.n_k, self.d, elem_bytes)
    }

    /// Bytes of `Q_i`, `O_i`, `l_i`, `m_i` that FA1 reads in Algorithm 1 line 8
    /// over the whole run: `Tc · N_q · (2 d · elem_bytes + 2 · stat_bytes)`.
    ///
    /// This is the term of Theorem 2: every outer step `j` re-reads all of
    /// `Q` and `O` (`Θ(N d)`), and there are `Tc = ceil(N / ceil(M/4d)) =
    /// Θ(N d / M)` outer steps, so `Θ(N² d² / M)`: doubling `M` halves it,
    /// doubling `N` quadruples it.
    pub fn fa1_reread_bytes(&self, elem_bytes: u64, stat_bytes: u64) -> Result<u64, PlanError> {
        check_sizes(elem_bytes, stat_bytes)?;
        let row =
            add(mul(mul(2, self.d, "2*d")?, elem_bytes, "row bytes")?, mul(2, stat_bytes, "row bytes")?, "row bytes")?;
        mul(mul(self.tc, self.n_q, "Tc*N_q")?, row, "FA1 re-read bytes")
    }

    /// HBM traffic of FA1's loop order (Algorithm 1, K/V blocks outer, Q blocks
    /// inner), counting every load and store of the algorithm as written:
    ///
    /// * line 2, initialize `O = 0`, `l = 0`, `m = -inf` in HBM:
    ///   write `N_q d` elements + `2 N_q` statistics;
    /// * line 6, load `K_j`, `V_j` once per outer step: read `2 N_k d` elements
    ///   in all (K and V are read exactly once);
    /// * line 8, load `Q_i`, `O_i`, `l_i`, `m_i` for every `(j, i)`: read
    ///   [`fa1_reread_bytes`](Self::fa1_reread_bytes) = `Tc · N_q · (2d + 2)`
    ///   (elements, statistics);
    /// * lines 12–13, write `O_i`, `l_i`, `m_i` for every `(j, i)`: write
    ///   `Tc · N_q · (d + 2)`.
    ///
    /// `elem_bytes` is the size of the `Q`, `K`, `V`, `O` elements, `stat_bytes`
    /// the size of one `l` or `m` entry (f32: 4).
    pub fn fa1_traffic(&self, elem_bytes: u64, stat_bytes: u64) -> Result<HbmTraffic, PlanError> {
        check_sizes(elem_bytes, stat_bytes)?;
        const W: &str = "FA1 bytes";
        let o_bytes = mul(mul(self.n_q, self.d, W)?, elem_bytes, W)?;
        let lm_bytes = mul(mul(2, self.n_q, W)?, stat_bytes, W)?;
        let init = add(o_bytes, lm_bytes, W)?;
        let kv = mul(mul(mul(2, self.n_k, W)?, self.d, W)?, elem_bytes, W)?;
        let reread = self.fa1_reread_bytes(elem_bytes, stat_bytes)?;
        let rewrite = mul(self.tc, init, W)?;
        Ok(HbmTraffic { read_bytes: add(kv, reread, W)?, write_bytes: add(init, rewrite, W)? })
    }

    /// HBM traffic of FA2's loop order (seed 001: Q blocks outer, K/V blocks
    /// inner). `O_i`, `l_i`, `m_i` live on chip for the whole inner loop, so:
    ///
    /// * `Q_i` is read once: `N_q d` elements;
    /// * `K`, `V` are read once per Q block: `Tr · 2 N_k d` elements;
    /// * `O_i` is written once, after the deferred `1/l` rescale, with its
    ///   logsumexp (one statistic per row, `m + log l`, instead of `l` and `m`):
    ///   `N_q d` elements + `N_q` statistics; nothing is initialized in HBM
    ///   and `O`, `l`, `m` are never read back.
    ///
    /// Fully masked causal K/V blocks (which FA2 skips) are still counted: this
    /// is the dense (non-causal) figure, an upper bound for causal.
    pub fn fa2_traffic(&self, elem_bytes: u64, stat_bytes: u64) -> Result<HbmTraffic, PlanError> {
        check_sizes(elem_bytes, stat_bytes)?;
        const W: &str = "FA2 bytes";
        let q = mul(mul(self.n_q, self.d, W)?, elem_bytes, W)?;
        let kv = mul(mul(mul(mul(2, self.tr, W)?, self.n_k, W)?, self.d, W)?, elem_bytes, W)?;
        let lse = mul(self.n_q, stat_bytes, W)?;
        Ok(HbmTraffic { read_bytes: add(q, kv, W)?, write_bytes: add(q, lse, W)? })
    }
}

fn check_sizes(elem_bytes: u64, stat_bytes: u64) -> Result<(), PlanError> {
    if elem_bytes == 0 {
        return Err(PlanError::ZeroElemSize { name: "elem_bytes" });
    }
    if stat_bytes == 0 {
        return Err(PlanError::ZeroElemSize { name: "stat_bytes" });
    }
    Ok(())
}

/// Bytes read from and written to HBM by one forward pass.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HbmTraffic {
    pub read_bytes: u64,
    pub write_bytes: u64,
}

impl HbmTraffic {
    /// `read_bytes + write_bytes` (saturating: only for display).
    pub fn total(&self) -> u64 {
        self.read_bytes.saturating_add(self.write_bytes)
    }

    /// The traffic of `k` independent problems (e.g. `batch * nheads`).
    pub fn times(self, k: u64) -> Result<Self, PlanError> {
        Ok(Self {
            read_bytes: mul(self.read_bytes, k, "read bytes")?,
            write_bytes: mul(self.write_bytes, k, "write bytes")?,
        })
    }

    /// Standard attention, Algorithm 0 of seed 002, with `S` and `P` (both
    /// `N_q × N_k`, stored in the element type) materialized in HBM:
    ///
    /// 1. read `Q`, `K` (`N_q d + N_k d`), compute `S = Q Kᵀ`, write `S` (`N_q N_k`);
    /// 2. read `S` (`N_q N_k`), compute `P = softmax(S)`, write `P` (`N_q N_k`);
    /// 3. read `P`, `V` (`N_q N_k + N_k d`), compute `O = P V`, write `O` (`N_q d`).
    ///
    /// Reads `N_q d + 2 N_k d + 2 N_q N_k`, writes `2 N_q N_k + N_q d` elements:
    /// `Θ(N d + N²)`, the lower bound of Theorem 2.
    pub fn standard(n_q: u64, n_k: u64, d: u64, elem_bytes: u64) -> Result<Self, PlanError> {
        nonzero(n_q, "n_q")?;
        nonzero(n_k, "n_k")?;
        nonzero(d, "d")?;
        if elem_bytes == 0 {
            return Err(PlanError::ZeroElemSize { name: "elem_bytes" });
        }
        const W: &str = "standard attention bytes";
        let qd = mul(n_q, d, W)?;
        let kd = mul(n_k, d, W)?;
        let s = mul(n_q, n_k, W)?;
        let two_s = mul(2, s, W)?;
        let read = add(add(qd, mul(2, kd, W)?, W)?, two_s, W)?;
        let write = add(two_s, qd, W)?;
        Ok(Self { read_bytes: mul(read, elem_bytes, W)?, write_bytes: mul(write, elem_bytes, W)? })
    }

    /// The backward pass of standard attention (what an autograd framework
    /// runs after [`HbmTraffic::standard`], which kept `P` in HBM), every
    /// `N_q × N_k` matrix stored in the element type:
    ///
    /// 1. `dV = Pᵀ dO`: read `P`, `dO`; write `dV`;
    /// 2. `dP = dO Vᵀ`: read `dO`, `V`; write `dP`;
    /// 3. `dS = P ∘ (dP − rowsum(P ∘ dP))`: read `P`, `dP`; write `dS`;
    /// 4. `dQ = scale · dS K`: read `dS`, `K`; write `dQ`;
    /// 5. `dK = scale · dSᵀ Q`: read `dS`, `Q`; write `dK`.
    ///
    /// Reads `5 N_q N_k + 2 N_q d + N_q d + 2 N_k d` (P twice, dP, dS twice;
    /// dO twice, Q, K, V), writes `2 N_q N_k + N_q d + 2 N_k d` elements.
    pub fn standard_backward(n_q: u64, n_k: u64, d: u64, elem_bytes: u64) -> Result<Self, PlanError> {
        nonzero(n_q, "n_q")?;
        nonzero(n_k, "n_k")?;
        nonzero(d, "d")?;
        if elem_bytes == 0 {
            return Err(PlanError::ZeroElemSize { name: "elem_bytes" });
        }
        const W: &str = "standard backward bytes";
        let (qd, kd, s) = (mul(n_q, d, W)?, mul(n_k, d, W)?, mul(n_q, n_k, W)?);
        let read = add(add(mul(5, s, W)?, mul(3, qd, W)?, W)?, mul(2, kd, W)?, W)?;
        let write = add(add(mul(2, s, W)?, qd, W)?, mul(2, kd, W)?, W)?;
        Ok(Self { read_bytes: mul(read, elem_bytes, W)?, write_bytes: mul(write, elem_bytes, W)? })
    }

    /// FlashAttention-2's backward (Algorithm 2 with the preprocessing and
    /// dQ passes of the implementation), `Tc = ceil(N_k / Bc)` K/V blocks,
    /// counting every load and store:
    ///
    /// * preprocess: read `O`, `dO` (`2 N_q d` elements), write `D` (`N_q`
    ///   statistics) and zero the f32 dQ accumulator (`N_q d` statistics);
    /// * main loop, per K/V block: read `Q`, `dO` (`2 N_q d`), `LSE`, `D`
    ///   (`2 N_q`) and add into the dQ accumulator (read + write `N_q d` f32);
    ///   once in all: read `K`, `V`, write `dK`, `dV` (`2 N_k d` each way);
    /// * dQ pass: read the accumulator (`N_q d` f32), write `dQ` (`N_q d`).
    ///
    /// Dense figure (causal skips about half the per-block terms): an upper
    /// bound for causal. `stat_bytes` is the size of `D`, `LSE` and the
    /// accumulator's entries (f32: 4).
    pub fn fa2_backward(n_q: u64, n_k: u64, d: u64, bc: u64, elem_bytes: u64, stat_bytes: u64) -> Result<Self, PlanError> {
        nonzero(n_q, "n_q")?;
        nonzero(n_k, "n_k")?;
        nonzero(d, "d")?;
        nonzero(bc, "bc")?;
        check_sizes(elem_bytes, stat_bytes)?;
        const W: &str = "FA2 backward bytes";
        let tc = n_k.div_ceil(bc);
        let (qd, kd) = (mul(n_q, d, W)?, mul(n_k, d, W)?);
        let (qd_e, kd_e, qd_s) = (mul(qd, elem_bytes, W)?, mul(kd, elem_bytes, W)?, mul(qd, stat_bytes, W)?);
        let row_s = mul(n_q, stat_bytes, W)?;
        // Per K/V block: Q, dO, LSE, D and the accumulator's read.
        let per_block_read = add(add(mul(2, qd_e, W)?, mul(2, row_s, W)?, W)?, qd_s, W)?;
        let read = add(
            add(mul(2, qd_e, W)?, mul(tc, per_block_read, W)?, W)?,
            add(mul(2, kd_e, W)?, qd_s, W)?,
            W,
        )?;
        let write = add(
            add(add(row_s, qd_s, W)?, mul(tc, qd_s, W)?, W)?,
            add(mul(2, kd_e, W)?, qd_e, W)?,
            W,
        )?;
        Ok(Self { read_bytes: read, write_bytes: write })
    }
}
