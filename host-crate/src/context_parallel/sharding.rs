//! Which tokens each rank holds.
//!
//! A sequence (or each document of a packed varlen batch) is cut into equal
//! chunks: `ranks` of them for [`Sharding::Contiguous`] (rank `r` holds chunk
//! `r`), `2·ranks` for [`Sharding::Zigzag`] (rank `r` holds chunks `r` and
//! `2·ranks − 1 − r`, so that under a causal mask every rank has the same
//! work: its early chunk sees few keys, its late chunk many). A rank's local
//! shard is its chunks of every document, in document order, each
//! document's chunks in sequence order.

use std::ops::Range;

use ndarray::{Array, ArrayView, Axis, RemoveAxis, concatenate};

use crate::error::{FlashAttnError, Result};

/// How a sequence is cut among the ranks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Sharding {
    /// Rank `r` holds chunk `r` of `ranks` equal chunks. Under a causal mask
    /// the last rank does `2·ranks − 1` times the work of the first.
    Contiguous,
    /// Rank `r` holds chunks `r` and `2·ranks − 1 − r` of `2·ranks` (the
    /// "zigzag" or head-tail balance of ring-flash-attention): equal causal
    /// work on every rank.
    #[default]
    Zigzag,
}

impl Sharding {
    /// Equal chunks a document is cut into for `ranks` ranks.
    pub fn num_chunks(self, ranks: usize) -> usize {
        match self {
            Sharding::Contiguous => ranks,
            Sharding::Zigzag => 2 * ranks,
        }
    }

    /// The chunks rank `rank` holds, in sequence order.
    pub fn chunks_of(self, ranks: usize, rank: usize) -> Vec<usize> {
        match self {
            Sharding::Contiguous => vec![rank],
            Sharding::Zigzag => vec![rank, 2 * ranks - 1 - rank],
        }
    }
}

/// The sharding of one call: the documents' lengths (one document of
/// `seqlen` tokens for a dense call, the `cu_seqlens` differences for a
/// varlen one), validated against the rank count.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShardPlan {
    sharding: Sharding,
    ranks: usize,
    docs: Vec<usize>,
}

impl ShardPlan {
    /// Errors: `ranks == 0`, no document, or a document whose length is not
    /// a multiple of [`Sharding::num_chunks`] (`ranks`, or `2·ranks` for
    /// zigzag): every rank must hold equal chunks.
    pub fn new(sharding: Sharding, ranks: usize, docs: &[usize]) -> Result<Self> {
        if ranks == 0 {
            return Err(FlashAttnError::InvalidArgument { argument: "ranks", value: "0".into(), reason: "at least one rank is needed" });
        }
        if docs.is_empty() {
            return Err(FlashAttnError::InvalidArgument { argument: "seqlen", value: "no document".into(), reason: "there is no sequence to shard" });
        }
        let chunks = sharding.num_chunks(ranks);
        if let Some(&len) = docs.iter().find(|&&len| !len.is_multiple_of(chunks)) {
            return Err(FlashAttnError::InvalidArgument {
                argument: "seqlen",
                value: format!("{len} with {ranks} ranks, {sharding:?}"),
                reason: "every sequence (each document of a varlen batch) must be a multiple of the chunk count: ranks (contiguous) or 2·ranks (zigzag)",
            });
        }
        Ok(Self { sharding, ranks, docs: docs.to_vec() })
    }

    /// How the tokens are sharded.
    pub fn sharding(&self) -> Sharding {
        self.sharding
    }

    /// The number of ranks.
    pub fn ranks(&self) -> usize {
        self.ranks
    }

    /// The documents' global lengths.
    pub fn docs(&self) -> &[usize] {
        &self.docs
    }

    /// Tokens every rank holds.
    pub fn local_len(&self) -> usize {
        self.docs.iter().sum::<usize>() / self.ranks
    }

    /// `(offset, length)` of each document in a rank's local shard (the same
    /// on every rank).
    pub fn local_docs(&self) -> Vec<(usize, usize)> {
        let mut off = 0;
        self.docs
            .iter()
            .map(|&len| {
                let local = len / self.ranks;
                off += local;
                (off - local, local)
            })
            .collect()
    }

    /// The global rows rank `rank` holds, in local order.
    pub fn rows_of(&self, rank: usize) -> Vec<Range<usize>> {
        let chunks = self.sharding.num_chunks(self.ranks);
        let mut start = 0;
        let mut rows = Vec::new();
        for &len in &self.docs {
            let c = len / chunks;
            for chunk in self.sharding.chunks_of(self.ranks, rank) {
                rows.push(start + chunk * c..start + (chunk + 1) * c);
            }
            start += len;
        }
        rows
    }

    /// Rank `rank`'s shard of `x`, whose axis `axis` is the whole sequence
    /// (the sum of the documents' lengths; checked by the callers).
    pub fn shard<F: Clone, D: RemoveAxis>(&self, x: ArrayView<F, D>, axis: Axis, rank: usize) -> Array<F, D> {
        let idx: Vec<usize> = self.rows_of(rank).into_iter().flatten().collect();
        x.select(axis, &idx)
    }

    /// The whole sequence from every rank's shard (`parts[r]` is rank `r`'s,
    /// as [`ShardPlan::shard`] cuts it).
    pub fn unshard<F: Clone, D: RemoveAxis>(&self, parts: &[ArrayView<F, D>], axis: Axis) -> Result<Array<F, D>> {
        if parts.len() != self.ranks {
            return Err(FlashAttnError::ShapeMismatch {
                argument: "parts",
                axis: "ranks",
                actual: parts.len(),
                expected: self.ranks,
                rule: "one shard per rank",
            });
        }
        // Rank-major concatenation, then each global row picked from it.
        let cat = concatenate(axis, parts)?;
        let mut from = vec![0usize; self.docs.iter().sum()];
        let mut pos = 0;
        for rank in 0..self.ranks {
            for row in self.rows_of(rank).into_iter().flatten() {
                from[row] = pos;
                pos += 1;
            }
        }
        Ok(cat.select(axis, &from))
    }
}

/// The document lengths of a `cu_seqlens` prefix sum over `total` rows.
pub(crate) fn docs_of_cu_seqlens(cu_seqlens: &[i32], total: usize) -> Result<Vec<usize>> {
    let bad = |reason| FlashAttnError::InvalidArgument { argument: "cu_seqlens", value: format!("{cu_seqlens:?}"), reason };
    if cu_seqlens.len() < 2 || cu_seqlens[0] != 0 {
        return Err(bad("must start at 0 and delimit at least one sequence"));
    }
    let mut docs = Vec::with_capacity(cu_seqlens.len() - 1);
    for w in cu_seqlens.windows(2) {
        if w[1] < w[0] {
            return Err(bad("must be non-decreasing"));
        }
        docs.push((w[1] - w[0]) as usize);
    }
    if cu_seqlens[cu_seqlens.len() - 1] as usize != total {
        return Err(bad("must end at the number of rows of q, k and v"));
    }
    Ok(docs)
}

