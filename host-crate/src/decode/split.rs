//! The split-KV rules of decode, pure (no GPU): how many splits a call
//! takes ([`num_splits_heuristic`] for the `fa2d` tile,
//! [`decode_splits_heuristic`] for the flash-decoding kernels) and how the
//! splits share a tile's key blocks (the ticket schedule, interleaved
//! fixed shares over pages). Each rule names the measurement that chose it.

use flash_attn_common::MAX_TICKET_BLOCKS;

/// Largest `num_splits` (FlashAttention-2's bound).
pub const MAX_SPLITS: usize = 128;

/// FlashAttention-2's split heuristic: with `work` thread blocks for
/// `slots` resident slots (2 per SM) and `n_blocks` key blocks, the smallest
/// split count whose wave efficiency is within 85% of the best (no split
/// when the work already fills 80% of the slots; FA3: none for ≤ 4 key
/// blocks).
pub fn num_splits_heuristic(
    work: usize,
    slots: usize,
    n_blocks: usize,
    max_splits: usize,
) -> usize {
    if work as f64 >= 0.8 * slots as f64 || n_blocks <= 4 {
        return 1;
    }
    let max_splits = max_splits.min(slots).min(n_blocks).max(1);
    let eff = |s: usize| {
        let w = (work * s) as f64 / slots as f64;
        w / w.ceil()
    };
    let eligible = |s: usize| s == 1 || n_blocks.div_ceil(s) != n_blocks.div_ceil(s - 1);
    let best = (1..=max_splits)
        .filter(|&s| eligible(s))
        .map(eff)
        .fold(0.0, f64::max);
    (1..=max_splits)
        .find(|&s| eligible(s) && eff(s) >= 0.85 * best)
        .unwrap_or(1)
}

/// The flash-decoding kernels' split count. Their blocks are bound by HBM
/// bandwidth, so a call lasts as long as its busiest SM streams keys: with
/// `work` tiles cut in `s` splits on `sms` SMs, that SM holds
/// ⌈work·s / sms⌉ blocks of ⌈n_blocks / s⌉ key blocks each. Among the
/// split counts that keep every block resident at once
/// (`work·s ≤ sms·blocks_per_sm`: a second wave would pay each block's ramp
/// and partial again) and leave no split without keys, the one with the
/// least such load; among equals, more
/// resident blocks (more loads in flight), then fewer splits (fewer partials
/// to merge). No split when there are at most 4 key blocks, or when the work
/// alone fills the share `no_split_fill` of the resident slots
/// ([`decode_no_split_fill`]).
///
/// FlashAttention-2's wave efficiency ([`num_splits_heuristic`]) accepts
/// 85% of the best: for GQA 32/8 at batch 1 it gives 14 splits, 112 blocks
/// for 132 SMs, and 20 SMs stay idle (docs/perf-notes.md, decode step 9).
pub fn decode_splits_heuristic(
    work: usize,
    sms: usize,
    blocks_per_sm: usize,
    n_blocks: usize,
    max_splits: usize,
    no_split_fill: f64,
) -> usize {
    let (sms, slots) = (sms.max(1), sms.max(1) * blocks_per_sm.max(1));
    if work == 0 || work as f64 >= no_split_fill * slots as f64 || n_blocks <= 4 {
        return 1;
    }
    let rank = |s: usize| {
        let blocks = work * s;
        (blocks.div_ceil(sms) * n_blocks.div_ceil(s), std::cmp::Reverse(blocks), s)
    };
    (1..=max_splits.min(n_blocks).max(1))
        // One wave, and no split left without keys (⌈n_blocks / s⌉ key
        // blocks per split must need all s splits).
        .filter(|&s| s == 1 || (work * s <= slots && n_blocks.div_ceil(n_blocks.div_ceil(s)) == s))
        .min_by_key(|&s| rank(s))
        .unwrap_or(1)
}

/// The share of the resident block slots from which
/// [`decode_splits_heuristic`] leaves the work unsplit (it was 0.8 for
/// every call). Since the K/V stages are swizzled (decode step 29) one block
/// streams fast enough alone that 64 of the H100's 132 SMs nearly saturate
/// its DRAM, and a split only adds its epilogue (~3.5 µs) or, static, its
/// imbalance (decode step 30, batch 8 GQA 32/8, 64 tiles): at 4k keys 51.0
/// µs unsplit against 54.1 with 2 splits (page 256: 51.4 against 54.5); over
/// 256-token pages at 32k 351.4 against 360.1, at 131k 1380.2 against
/// 1397.4. Two kinds of call keep splitting up to 80%: long contiguous
/// caches whose splits take tickets (`balanced`), which balance them (131k:
/// 1370.8 split against 1394.0 unsplit; 32k level, 347.5 against 350.6),
/// and caches of pages smaller than a key block, where a block looks each
/// row's page up and streams slower alone (4k: 56.3 split against 71.5).
pub const NO_SPLIT_FILL: f64 = 0.45;

/// Key blocks per tile up to which even a `balanced` call takes
/// [`NO_SPLIT_FILL`] (8k keys at Bc = 128; measured at 32 and 256).
pub const SHORT_KEY_BLOCKS: usize = 64;

/// The share of the resident block slots from which
/// [`decode_splits_heuristic`] leaves the work unsplit: [`NO_SPLIT_FILL`],
/// or 0.8 (the rule before decode step 30) for caches of pages smaller than
/// a key block (`small_pages`), for `balanced` calls (their splits would
/// take tickets) past [`SHORT_KEY_BLOCKS`] key blocks per tile, and on
/// devices where half the SMs do not saturate the DRAM (`few_sms_saturate`
/// false: peak bandwidth per SM over [`MAX_TICKET_BANDWIDTH_PER_SM`] — on an
/// H200, 36 GB/s per SM, batch 8 GQA 32/8 at 32k keys ran unsplit 276.8 µs
/// on 64 SMs, 0.89× PyTorch flash: session 11, call 8).
pub fn decode_no_split_fill(small_pages: bool, balanced: bool, n_blocks: usize, few_sms_saturate: bool) -> f64 {
    if !few_sms_saturate || small_pages || (balanced && n_blocks > SHORT_KEY_BLOCKS) { 0.8 } else { NO_SPLIT_FILL }
}

/// Key blocks per split from which the ticket schedule pays (H100,
/// decode step 18: 16 per split — GQA 32/8 at 32k keys — streamed 1–2%
/// slower with tickets, 64 per split 2–3% faster; 32 is between the two,
/// not measured).
pub const MIN_TICKET_BLOCKS_PER_SPLIT: usize = 32;

/// Peak DRAM bandwidth per SM (bytes/s) up to which the ticket schedule
/// pays (decode step 26): on an H100 SXM (3.35 TB/s, 132 SMs: 25 GB/s per
/// SM) tickets took 3–4% off long contiguous caches (MHA 32k 193.6 →
/// 185.5 µs, MHA 131k 735 → 712, GQA 131k 189 → 182.5); on an H200
/// (4.8 TB/s, 132 SMs: 36 GB/s per SM) they made the same cells 12–15%
/// slower (MHA 32k 139 → 158 µs, MHA 131k 531 → 610, GQA 131k 138 → 156).
/// 30 GB/s lies between the two; devices whose bandwidth the driver does
/// not report keep the H100's rule.
pub const MAX_TICKET_BANDWIDTH_PER_SM: f64 = 30e9;

/// Whether the ticket schedule pays on a device with `num_sms` SMs and
/// peak DRAM bandwidth `bandwidth` ([`MAX_TICKET_BANDWIDTH_PER_SM`]).
pub(super) fn tickets_pay_on(bandwidth: Option<f64>, num_sms: usize) -> bool {
    bandwidth.is_none_or(|b| b / num_sms.max(1) as f64 <= MAX_TICKET_BANDWIDTH_PER_SM)
}

/// Whether a flash-decoding call with `ns` splits of `n_blocks` key blocks
/// takes the ticket schedule ([`DecodeOptions::deterministic`](super::DecodeOptions::deterministic),
/// [`AttnParams::split_tickets`](flash_attn_common::AttnParams::split_tickets)): split, not deterministic, a kernel built
/// with it, a device where it pays ([`tickets_pay_on`]), a contiguous cache
/// (over pages, every ticket's block starts with a dependent block-table
/// load: with 256-token pages the 8-warp kernel ran 8–11% slower with
/// tickets, decode step 18), at least [`MIN_TICKET_BLOCKS_PER_SPLIT`] key
/// blocks per split, and tickets that fit their 16 bits. (The fused
/// combine's counters, which hold the tickets, are checked at launch.)
pub(super) fn split_tickets(ns: usize, kernel_has_tickets: bool, device_pays: bool, paged: bool, n_blocks: usize, deterministic: bool) -> bool {
    ns > 1 && !deterministic && kernel_has_tickets && device_pays && !paged && n_blocks >= MIN_TICKET_BLOCKS_PER_SPLIT * ns && n_blocks + 2 * ns <= MAX_TICKET_BLOCKS as usize
}

/// Whether the flash-decoding kernels interleave their fixed split shares
/// over a paged cache ([`INTERLEAVE_PAGED`](flash_attn_common::INTERLEAVE_PAGED); contiguous caches always do):
/// over pages of at least a key block, on devices where the ticket rule
/// holds (≤ 30 GB/s of DRAM bandwidth per SM). Decode step 38: H100 GQA
/// 131k over 256-token pages 183.3 → 181.2 µs interleaved; H200 129.0 →
/// 135.6–136.7 (each block then waits for its own page lookup, and its
/// blocks stream faster); over 16-token pages 0.5–2% slower on the H100.
pub(super) fn interleave_paged(paged: bool, small_pages: bool, device_pays: bool) -> bool {
    paged && !small_pages && device_pays
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticket_schedule_eligibility() {
        // MHA 32k at batch 1 (4 splits of 256 key blocks), GQA 131k (16 of 1024): tickets.
        assert!(split_tickets(4, true, true, false, 256, false));
        assert!(split_tickets(16, true, true, false, 1024, false));
        // GQA 32k (16 splits of 256 blocks: 16 each): not.
        assert!(!split_tickets(16, true, true, false, 256, false));
        assert!(split_tickets(16, true, true, false, 16 * MIN_TICKET_BLOCKS_PER_SPLIT, false));
        assert!(!split_tickets(16, true, true, false, 16 * MIN_TICKET_BLOCKS_PER_SPLIT - 1, false));
        // Paged caches, kernels built without tickets: not.
        assert!(!split_tickets(4, true, true, true, 256, false));
        assert!(!split_tickets(4, false, true, false, 256, false));
        // No split, or the caller asks for reproducible bits: not.
        assert!(!split_tickets(1, true, true, false, 256, false));
        assert!(!split_tickets(4, true, true, false, 256, true));
        // Interleaved fixed shares over pages: whole-block pages on a device
        // where few SMs saturate the DRAM (the H100), not small pages, not
        // the H200; contiguous caches interleave in the kernel regardless.
        assert!(interleave_paged(true, false, true));
        assert!(!interleave_paged(true, true, true));
        assert!(!interleave_paged(true, false, false));
        assert!(!interleave_paged(false, false, true));
        // The tickets' 16 bits: blocks + two draws past the end per split.
        let max = MAX_TICKET_BLOCKS as usize;
        assert!(split_tickets(16, true, true, false, max - 32, false));
        assert!(!split_tickets(16, true, true, false, max - 31, false));
        // A device where tickets do not pay (decode step 26): not.
        assert!(!split_tickets(4, true, false, false, 256, false));
    }

    #[test]
    fn tickets_pay_by_bandwidth_per_sm() {
        // H100 SXM (3.35 TB/s, 132 SMs): yes; H200 (4.8 TB/s, 132 SMs): no.
        assert!(tickets_pay_on(Some(2.0 * 2_619_000e3 * 5120.0 / 8.0), 132));
        assert!(!tickets_pay_on(Some(4.8e12), 132));
        // Bandwidth not reported: the H100's rule.
        assert!(tickets_pay_on(None, 132));
    }
}
