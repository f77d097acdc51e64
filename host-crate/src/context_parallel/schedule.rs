//! The ring schedule: at step `s` rank `r` holds the K/V shard of rank
//! `(r − s) mod N` (shards travel to the next rank, `r + 1`, after each
//! step), and attends its local queries to it with one [`RingBlock`] per
//! document, or skips the step.
//!
//! Blocks by sharding, for `causal` (non-causal: every step is the whole
//! local Q against the whole held K/V, unmasked):
//!
//! | K/V owner | contiguous | zigzag (chunks `r`, `2N−1−r`) |
//! |---|---|---|
//! | `r` (step 0) | whole × whole, causal | whole × whole, causal |
//! | `< r` | whole × whole, full | whole Q × first half of K/V, full |
//! | `> r` | skipped | second half of Q × whole K/V, full |
//!
//! Zigzag's off-diagonal blocks are all half a shard squared: every rank
//! does the same work at every step. The diagonal block is causal over the
//! local concatenation of the two chunks, which is exact: the late chunk's
//! queries see all of the early chunk, the early chunk's queries none of the
//! late one.

use std::ops::Range;

use super::sharding::Sharding;

/// A part of one document's local shard (of `len` tokens: its one chunk, or
/// its two zigzag chunks).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Span {
    /// All `len` tokens (contiguous sharding).
    Whole,
    /// The first `len / 2` tokens (zigzag's early chunk).
    FirstHalf,
    /// The last `len / 2` tokens (zigzag's late chunk).
    SecondHalf,
}

impl Span {
    /// The local rows of a document's shard of `len` tokens.
    pub fn range(self, len: usize) -> Range<usize> {
        match self {
            Span::Whole => 0..len,
            Span::FirstHalf => 0..len / 2,
            Span::SecondHalf => len / 2..len,
        }
    }
}

/// The mask of a ring block.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Mask {
    /// Every key visible.
    Full,
    /// Causal over the block (square: `q` and `k` spans of equal length).
    Causal,
}

/// One attention call of a ring step, per document: queries `q` of the
/// local shard against keys `k` of the held shard, with `mask`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RingBlock {
    /// The part of the local shard whose queries attend.
    pub q: Span,
    /// The part of the held K/V shard they attend to.
    pub k: Span,
    /// Full, or causal on the diagonal.
    pub mask: Mask,
}

/// The rank whose K/V shard rank `rank` holds at step `step`.
pub fn kv_owner(ranks: usize, rank: usize, step: usize) -> usize {
    (rank + ranks - step % ranks) % ranks
}

/// The block rank `rank` computes at step `step` (see the module docs), or
/// `None` when the held shard is wholly masked.
pub fn ring_block(sharding: Sharding, causal: bool, ranks: usize, rank: usize, step: usize) -> Option<RingBlock> {
    let owner = kv_owner(ranks, rank, step);
    let full = |q, k| Some(RingBlock { q, k, mask: Mask::Full });
    if !causal {
        return full(Span::Whole, Span::Whole);
    }
    match (owner.cmp(&rank), sharding) {
        (std::cmp::Ordering::Equal, _) => Some(RingBlock { q: Span::Whole, k: Span::Whole, mask: Mask::Causal }),
        (std::cmp::Ordering::Less, Sharding::Contiguous) => full(Span::Whole, Span::Whole),
        (std::cmp::Ordering::Greater, Sharding::Contiguous) => None,
        (std::cmp::Ordering::Less, Sharding::Zigzag) => full(Span::Whole, Span::FirstHalf),
        (std::cmp::Ordering::Greater, Sharding::Zigzag) => full(Span::SecondHalf, Span::Whole),
    }
}

/// One ring block over a packed varlen shard as a single varlen call: the
/// prefix sums of its sequences over the local rows (queries and keys),
/// and their maxima.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BlockSegments {
    /// i32 prefix sums over the local query rows, from 0 to the shard's length.
    pub cu_seqlens_q: Vec<i32>,
    /// i32 prefix sums over the local key rows, from 0 to the shard's length.
    pub cu_seqlens_k: Vec<i32>,
    /// The longest query segment.
    pub max_seqlen_q: usize,
    /// The longest key segment.
    pub max_seqlen_k: usize,
}

/// The varlen sequences that compute `block` for every document of a local
/// shard (`local_docs`: `(offset, length)` of each document, as
/// [`super::ShardPlan::local_docs`]; the documents tile the shard in order):
/// per document, one sequence pairing the block's query rows with its key
/// rows, and around it sequences with queries and no keys, or keys and no
/// queries, so that every local row lies in exactly one query segment and
/// one key segment. A query with no key gets `O = 0` and `LSE = −∞` (the
/// merge's identity), a key with no query `dK = dV = 0`: one call computes
/// the block and writes every row of its partials.
pub fn varlen_segments(local_docs: &[(usize, usize)], block: &RingBlock) -> BlockSegments {
    let (mut cu_q, mut cu_k) = (vec![0i32], vec![0i32]);
    let (mut max_q, mut max_k) = (0, 0);
    let mut push = |q_end: usize, k_end: usize| {
        let (q0, k0) = (*cu_q.last().unwrap() as usize, *cu_k.last().unwrap() as usize);
        if q_end == q0 && k_end == k0 {
            return;
        }
        max_q = max_q.max(q_end - q0);
        max_k = max_k.max(k_end - k0);
        cu_q.push(q_end as i32);
        cu_k.push(k_end as i32);
    };
    for &(off, len) in local_docs {
        let (qr, kr) = (block.q.range(len), block.k.range(len));
        // Queries before the block's (no keys), keys before the block's (no queries),
        push(off + qr.start, off);
        push(off + qr.start, off + kr.start);
        // the block,
        push(off + qr.end, off + kr.end);
        // then the rest of the document's queries and keys the same way.
        push(off + len, off + kr.end);
        push(off + len, off + len);
    }
    BlockSegments { cu_seqlens_q: cu_q, cu_seqlens_k: cu_k, max_seqlen_q: max_q, max_seqlen_k: max_k }
}

/// The ring backward's travelling `dK`/`dV` sums live in two buffers per
/// rank: step `step` adds the held shard's gradients into this one (which
/// the step's transfers filled, from the previous rank's step `step − 1`),
/// while the other one, step `step − 1`'s, is sent on.
pub fn grad_sums_buffer(step: usize) -> usize {
    step % 2
}

/// The buffer holding a rank's own complete `dK`/`dV` sums after the ring
/// backward's last hop (on one rank: the only step's).
pub fn grad_sums_home(ranks: usize) -> usize {
    if ranks == 1 { grad_sums_buffer(0) } else { grad_sums_buffer(ranks) }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Per rank, its two sums buffers: `(owner of the shard whose sums it
    /// holds, ranks that added to them)`.
    type Bufs = Vec<[Option<(usize, Vec<usize>)>; 2]>;

    /// The GPU ring backward's buffer choreography, replayed with the same
    /// index functions: every shard's sums meet every rank exactly once, in
    /// the step at which that rank holds the shard, and end at their owner
    /// in [`grad_sums_home`]; a buffer is never sent and received in one step.
    #[test]
    fn travelling_sums_visit_every_rank_and_come_home() {
        for n in 1..=8 {
            let mut bufs: Bufs = vec![[None, None]; n];
            let hop = |bufs: &mut Bufs, from: usize, to: usize| {
                assert_ne!(from, to, "a buffer sent and received in one step");
                let sent: Vec<_> = (0..n).map(|r| bufs[r][from].take()).collect();
                for (r, msg) in sent.into_iter().enumerate() {
                    bufs[(r + 1) % n][to] = msg;
                }
            };
            for step in 0..n {
                if step >= 1 {
                    hop(&mut bufs, grad_sums_buffer(step - 1), grad_sums_buffer(step));
                }
                for (rank, b) in bufs.iter_mut().enumerate() {
                    let owner = kv_owner(n, rank, step);
                    let slot = &mut b[grad_sums_buffer(step)];
                    match slot {
                        None => {
                            assert_eq!(step, 0, "n {n}: rank {rank} has no sums at step {step}");
                            *slot = Some((owner, vec![rank]));
                        }
                        Some((o, adders)) => {
                            assert_eq!(*o, owner, "n {n}: rank {rank} step {step} holds another shard's sums");
                            adders.push(rank);
                        }
                    }
                }
            }
            if n > 1 {
                hop(&mut bufs, grad_sums_buffer(n - 1), grad_sums_home(n));
            }
            for (rank, b) in bufs.iter().enumerate() {
                let (owner, mut adders) = b[grad_sums_home(n)].clone().expect("sums at home");
                adders.sort_unstable();
                assert_eq!(owner, rank, "n {n}");
                assert_eq!(adders, (0..n).collect::<Vec<_>>(), "n {n}: rank {rank}'s sums");
            }
        }
    }

    /// Every block of every schedule as varlen segments: each local row in
    /// exactly one query and one key segment (monotone prefix sums over the
    /// whole shard), and the pairs with both queries and keys exactly the
    /// block's rows of each document.
    #[test]
    fn varlen_segments_cover_every_row_and_pair_only_the_block() {
        let docs_sets: [&[usize]; 4] = [&[8], &[4, 12, 0, 8], &[16, 4], &[0, 4, 4]];
        for docs in docs_sets {
            let mut off = 0;
            let local: Vec<(usize, usize)> = docs.iter().map(|&l| { off += l; (off - l, l) }).collect();
            let total = off;
            for q in [Span::Whole, Span::FirstHalf, Span::SecondHalf] {
                for k in [Span::Whole, Span::FirstHalf, Span::SecondHalf] {
                    let block = RingBlock { q, k, mask: Mask::Full };
                    let s = varlen_segments(&local, &block);
                    assert_eq!(s.cu_seqlens_q.len(), s.cu_seqlens_k.len());
                    for cu in [&s.cu_seqlens_q, &s.cu_seqlens_k] {
                        assert_eq!((cu[0], *cu.last().unwrap() as usize), (0, total), "{docs:?} {q:?} {k:?}");
                        assert!(cu.windows(2).all(|w| w[0] <= w[1]));
                    }
                    let mut pairs = Vec::new();
                    for i in 0..s.cu_seqlens_q.len() - 1 {
                        let (qa, qb) = (s.cu_seqlens_q[i] as usize, s.cu_seqlens_q[i + 1] as usize);
                        let (ka, kb) = (s.cu_seqlens_k[i] as usize, s.cu_seqlens_k[i + 1] as usize);
                        assert!(qb > qa || kb > ka, "an empty segment");
                        assert!(qb - qa <= s.max_seqlen_q && kb - ka <= s.max_seqlen_k);
                        if qb > qa && kb > ka {
                            pairs.push((qa..qb, ka..kb));
                        }
                    }
                    let want: Vec<_> = local
                        .iter()
                        .filter(|&&(_, len)| !q.range(len).is_empty() && !k.range(len).is_empty())
                        .map(|&(o, len)| {
                            let (qr, kr) = (q.range(len), k.range(len));
                            (o + qr.start..o + qr.end, o + kr.start..o + kr.end)
                        })
                        .collect();
                    assert_eq!(pairs, want, "{docs:?} {q:?} {k:?}");
                }
            }
        }
    }
}
