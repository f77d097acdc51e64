//! Host-side checks of the inference-feature arguments the host can see:
//! varlen prefix sums (`cu_seqlens_q/k`, `seqused_k`), ALiBi slope shapes and
//! GQA head counts. Shared by the CPU reference and the ndarray/device APIs,
//! so every path refuses the same inputs with the same typed error
//! ([`FlashAttnError::InvalidArgument`], naming the argument and the value).
//!
//! Varlen layout (FlashAttention-2's `flash_attn_varlen_func`): sequence `b`
//! owns q rows `cu_seqlens_q[b]..cu_seqlens_q[b+1]` and k/v rows
//! `cu_seqlens_k[b]..cu_seqlens_k[b+1]`, of which it uses the first
//! `seqused_k[b]` when `seqused_k` is given. `max_seqlen_q/k` only size the
//! kernels' grid, and the kernels clamp each length to them, so a length
//! beyond them is refused here:
//!
//! * every q segment must be ≤ `max_seqlen_q`;
//! * the keys a sequence uses (`seqused_k[b]`, else its k segment) must be
//!   ≤ `max_seqlen_k`. With `seqused_k` the k segment itself may be longer
//!   (FA2 reads only the used keys; the kernels' clamp of the segment to
//!   `max_seqlen_k` before `seqused_k` then changes nothing).
//!
//! The buffers may hold rows past `cu_seqlens[batch]` (they belong to no
//! sequence: the reference leaves their output 0 and their LSE `-inf`).

use crate::error::{FlashAttnError, Result};
use crate::params::AlibiShape;

/// One sequence of a varlen batch, after [`check_varlen`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SeqSpan {
    /// First q/o row and number of query rows.
    pub q_start: usize,
    /// Query rows of the sequence.
    pub seqlen_q: usize,
    /// First k/v row and number of keys used (`seqused_k[b]` or the segment).
    pub k_start: usize,
    /// Keys of the sequence.
    pub seqlen_k: usize,
}

fn invalid(argument: &'static str, value: String, reason: &'static str) -> FlashAttnError {
    FlashAttnError::InvalidArgument { argument, value, reason }
}

/// Validates one prefix-sum array of `batch + 1` entries against a buffer of
/// `total` rows (`None`: no buffer bound, e.g. keys in a paged cache) and
/// returns `(start, len)` per sequence. `max_len`, if given, bounds each
/// segment (`max_arg` names it in the error).
pub fn check_cu_seqlens(
    argument: &'static str,
    cu: &[i32],
    total: Option<usize>,
    max_len: Option<(&'static str, usize)>,
) -> Result<Vec<(usize, usize)>> {
    match cu.len() {
        0 => return Err(invalid(argument, "[] (0 entries)".into(), "must hold batch + 1 ≥ 2 prefix sums, starting at 0")),
        1 => return Err(invalid(argument, format!("{cu:?}"), "batch is 0: a varlen call needs at least one sequence (batch + 1 ≥ 2 entries)")),
        _ => {}
    }
    if cu[0] != 0 {
        return Err(invalid(argument, format!("{argument}[0] = {}", cu[0]), "prefix sums must start at 0"));
    }
    let mut spans = Vec::with_capacity(cu.len() - 1);
    for b in 0..cu.len() - 1 {
        let (c0, c1) = (cu[b], cu[b + 1]);
        if c1 < c0 {
            return Err(invalid(
                argument,
                format!("{argument}[{}] = {c1} < {argument}[{b}] = {c0}", b + 1),
                "prefix sums must be non-decreasing",
            ));
        }
        let (start, len) = (c0 as usize, (c1 - c0) as usize);
        if let Some(total) = total
            && c1 as usize > total
        {
            return Err(invalid(
                argument,
                format!("{argument}[{}] = {c1}, buffer rows = {total}", b + 1),
                "a sequence ends past the rows of its buffer (total_q / total_k)",
            ));
        }
        if let Some((max_arg, max)) = max_len
            && len > max
        {
            return Err(invalid(
                argument,
                format!("sequence {b} has {len} rows ({argument}[{}] − {argument}[{b}]), {max_arg} = {max}", b + 1),
                "a segment is longer than its max_seqlen (which sizes the kernels' grid)",
            ));
        }
        spans.push((start, len));
    }
    Ok(spans)
}

/// The keys each sequence uses: `seqused_k[b]` (checked to be within
/// `0..=segment`) or the whole segment; each ≤ `max_seqlen_k`.
pub fn check_seqused_k(seqused_k: Option<&[i32]>, k_segments: &[usize], max_seqlen_k: usize) -> Result<Vec<usize>> {
    let used: Vec<usize> = match seqused_k {
        None => k_segments.to_vec(),
        Some(u) => {
            if u.len() != k_segments.len() {
                return Err(invalid(
                    "seqused_k",
                    format!("{} entries, batch = {}", u.len(), k_segments.len()),
                    "must hold one entry per sequence (batch)",
                ));
            }
            let mut out = Vec::with_capacity(u.len());
            for (b, (&x, &seg)) in u.iter().zip(k_segments).enumerate() {
                if x < 0 || x as usize > seg {
                    return Err(invalid(
                        "seqused_k",
                        format!("seqused_k[{b}] = {x}, k segment of sequence {b} = {seg}"),
                        "must be within 0..=the sequence's k segment (cu_seqlens_k[b+1] − cu_seqlens_k[b])",
                    ));
                }
                out.push(x as usize);
            }
            out
        }
    };
    if let Some((b, &n)) = used.iter().enumerate().find(|&(_, &n)| n > max_seqlen_k) {
        return Err(invalid(
            if seqused_k.is_some() { "seqused_k" } else { "cu_seqlens_k" },
            format!("sequence {b} uses {n} keys, max_seqlen_k = {max_seqlen_k}"),
            "a sequence uses more keys than max_seqlen_k (which sizes the kernels' grid)",
        ));
    }
    Ok(used)
}

/// Validates a varlen call's prefix sums and returns its sequences.
///
/// Errors ([`FlashAttnError::InvalidArgument`], naming the argument and the
/// offending entries): a `cu_seqlens_*` of fewer than 2 entries (batch 0),
/// lengths that differ, a first entry ≠ 0, a decreasing entry, an end past
/// `total_q`/`total_k`, a q segment longer than `max_seqlen_q`; `seqused_k`
/// of a length ≠ batch, negative or beyond its segment; keys used beyond
/// `max_seqlen_k`; max_seqlen above `u32::MAX`.
pub fn check_varlen(
    cu_seqlens_q: &[i32],
    cu_seqlens_k: &[i32],
    seqused_k: Option<&[i32]>,
    total_q: usize,
    total_k: usize,
    max_seqlen_q: usize,
    max_seqlen_k: usize,
) -> Result<Vec<SeqSpan>> {
    check_varlen_keys(cu_seqlens_q, cu_seqlens_k, seqused_k, total_q, Some(total_k), max_seqlen_q, max_seqlen_k)
}

/// [`check_varlen`] where the keys may live outside one buffer of rows
/// (`total_k = None`, e.g. a paged cache: the block table bounds them).
pub fn check_varlen_keys(
    cu_seqlens_q: &[i32],
    cu_seqlens_k: &[i32],
    seqused_k: Option<&[i32]>,
    total_q: usize,
    total_k: Option<usize>,
    max_seqlen_q: usize,
    max_seqlen_k: usize,
) -> Result<Vec<SeqSpan>> {
    for (argument, m) in [("max_seqlen_q", max_seqlen_q), ("max_seqlen_k", max_seqlen_k)] {
        if u32::try_from(m).is_err() {
            return Err(FlashAttnError::DimTooLarge { argument, axis: "seqlen", value: m, max: u32::MAX as usize });
        }
    }
    let q = check_cu_seqlens("cu_seqlens_q", cu_seqlens_q, Some(total_q), Some(("max_seqlen_q", max_seqlen_q)))?;
    if cu_seqlens_k.len() != cu_seqlens_q.len() {
        return Err(invalid(
            "cu_seqlens_k",
            format!("{} entries, cu_seqlens_q has {}", cu_seqlens_k.len(), cu_seqlens_q.len()),
            "cu_seqlens_q and cu_seqlens_k must both hold batch + 1 entries",
        ));
    }
    // With seqused_k the segment may exceed max_seqlen_k (only the used keys count).
    let k_max = if seqused_k.is_some() { None } else { Some(("max_seqlen_k", max_seqlen_k)) };
    let k = check_cu_seqlens("cu_seqlens_k", cu_seqlens_k, total_k, k_max)?;
    let segments: Vec<usize> = k.iter().map(|&(_, n)| n).collect();
    let used = check_seqused_k(seqused_k, &segments, max_seqlen_k)?;
    Ok(q.iter()
        .zip(&k)
        .zip(used)
        .map(|((&(q_start, seqlen_q), &(k_start, _)), seqlen_k)| SeqSpan { q_start, seqlen_q, k_start, seqlen_k })
        .collect())
}

/// ALiBi slopes: `len` f32 must be exactly `shape`'s `(nheads)` or
/// `(batch, nheads)`.
pub fn check_alibi(shape: AlibiShape, len: usize, batch: usize, nheads: usize) -> Result<()> {
    let want = shape.len(batch, nheads);
    if len == want {
        return Ok(());
    }
    Err(invalid(
        "alibi_slopes",
        format!("{len} slopes for shape {shape:?} with batch = {batch}, nheads = {nheads} (needs {want})"),
        "ALiBi slopes must be f32 of shape (nheads) or (batch, nheads)",
    ))
}

/// GQA/MQA head counts: `nheads_k ≥ 1` dividing `nheads`. Returns the group
/// size `nheads / nheads_k` (query head `h` reads KV head `h / group`).
pub fn check_gqa(nheads: usize, nheads_k: usize) -> Result<usize> {
    if nheads_k == 0 || !nheads.is_multiple_of(nheads_k) {
        return Err(invalid(
            "nheads_k",
            format!("nheads_k = {nheads_k}, nheads = {nheads}"),
            "the query heads must be a whole multiple of the key/value heads (GQA/MQA: nheads % nheads_k == 0)",
        ));
    }
    Ok(nheads / nheads_k)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn arg(e: FlashAttnError) -> (&'static str, String) {
        match e {
            FlashAttnError::InvalidArgument { argument, value, .. } => (argument, value),
            e => panic!("not InvalidArgument: {e}"),
        }
    }

    #[test]
    fn spans_of_a_valid_batch() {
        let s = check_varlen(&[0, 3, 3, 7], &[0, 5, 6, 6], Some(&[4, 0, 0]), 8, 6, 4, 5).unwrap();
        assert_eq!(s[0], SeqSpan { q_start: 0, seqlen_q: 3, k_start: 0, seqlen_k: 4 });
        assert_eq!(s[1], SeqSpan { q_start: 3, seqlen_q: 0, k_start: 5, seqlen_k: 0 });
        assert_eq!(s[2], SeqSpan { q_start: 3, seqlen_q: 4, k_start: 6, seqlen_k: 0 });
    }

    #[test]
    fn each_error_names_argument_and_value() {
        let e = arg(check_varlen(&[0, 2], &[0, 2, 4], None, 2, 4, 2, 2).unwrap_err());
        assert_eq!(e.0, "cu_seqlens_k");
        let e = arg(check_varlen(&[1, 2], &[0, 2], None, 2, 4, 2, 2).unwrap_err());
        assert_eq!(e, ("cu_seqlens_q", "cu_seqlens_q[0] = 1".into()));
        let e = arg(check_varlen(&[0, 2], &[0, 3], None, 2, 2, 2, 3).unwrap_err());
        assert_eq!(e.0, "cu_seqlens_k");
        assert!(e.1.contains("= 3") && e.1.contains("buffer rows = 2"), "{}", e.1);
        let e = arg(check_varlen(&[0], &[0], None, 2, 2, 2, 2).unwrap_err());
        assert_eq!(e.0, "cu_seqlens_q");
        let e = arg(check_alibi(AlibiShape::PerBatchHead, 4, 2, 4).unwrap_err());
        assert!(e.0 == "alibi_slopes" && e.1.contains("needs 8"), "{}", e.1);
        assert_eq!(check_gqa(6, 2).unwrap(), 3);
        assert_eq!(arg(check_gqa(6, 4).unwrap_err()).0, "nheads_k");
        assert_eq!(arg(check_gqa(6, 0).unwrap_err()).0, "nheads_k");
    }
}
