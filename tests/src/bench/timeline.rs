//! The flash-decoding kernel's per-block timeline
//! (`DecodeOptions::timeline`, `flash_attn::advanced::decode::timeline`) summed
//! up: where one decode call's time goes between the first block's start
//! and the last block's end (`decode-tune --timeline`).

use flash_attn::advanced::decode::timeline::WORDS;

/// One block's record: SM, split, whether it merged its tile, and both
/// clocks at each point (0 = not reached).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Block {
    pub sm: u32,
    pub split: u32,
    pub last: bool,
    pub ns: [u64; 6],
    pub clk: [u64; 6],
}

/// The blocks of a timeline buffer that ran (start stamp set).
pub fn blocks(words: &[u64]) -> Vec<Block> {
    words
        .chunks_exact(WORDS)
        .filter(|w| w[1] != 0)
        .map(|w| Block {
            sm: (w[0] & 0xffff) as u32,
            split: ((w[0] >> 16) & 0xffff) as u32,
            last: (w[0] >> 32) & 1 == 1,
            ns: [w[1], w[2], w[3], w[4], w[5], w[6]],
            clk: [w[8], w[9], w[10], w[11], w[12], w[13]],
        })
        .collect()
}

fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// The summary of one call, µs: `(name, value)` pairs in order.
///
/// Cross-block times use `%globaltimer` from the earliest start; durations
/// inside a block use the SM's `%clock64`, converted with the clock rate
/// measured over the blocks' main loops (the global timer may tick coarsely).
pub fn summary(b: &[Block]) -> Vec<(&'static str, f64)> {
    if b.is_empty() {
        return vec![];
    }
    let t0 = b.iter().map(|x| x.ns[0]).min().unwrap_or(0);
    let at = |x: &Block, k: usize| (x.ns[k].saturating_sub(t0)) as f64 * 1e-3;
    // Cycles per µs from the loop (start → loop end), the longest span each block has.
    let rate = median(b.iter().filter(|x| x.ns[2] > x.ns[0]).map(|x| (x.clk[2] - x.clk[0]) as f64 / ((x.ns[2] - x.ns[0]) as f64 * 1e-3)).collect());
    let dur = |x: &Block, a: usize, z: usize| if x.clk[z] >= x.clk[a] && x.clk[a] != 0 { (x.clk[z] - x.clk[a]) as f64 / rate } else { f64::NAN };
    let ok = |v: f64| v.is_finite();
    let end = |x: &Block| (0..6).rev().find(|&k| x.ns[k] != 0).map_or(0.0, |k| at(x, k));
    let loop_end: Vec<f64> = b.iter().map(|x| at(x, 2)).collect();
    let lasts: Vec<&Block> = b.iter().filter(|x| x.last).collect();
    let latest_loop = loop_end.iter().cloned().fold(0.0, f64::max);
    let span = b.iter().map(end).fold(0.0, f64::max);
    vec![
        ("blocks", b.len() as f64),
        ("SM clock GHz", rate * 1e-3),
        ("start skew", b.iter().map(|x| at(x, 0)).fold(0.0, f64::max)),
        ("prologue (median)", median(b.iter().map(|x| dur(x, 0, 1)).filter(|v| ok(*v)).collect())),
        ("loop end min", loop_end.iter().cloned().fold(f64::INFINITY, f64::min)),
        ("loop end median", median(loop_end.clone())),
        ("loop end max", latest_loop),
        ("merge + store (median)", median(b.iter().map(|x| dur(x, 2, 3)).filter(|v| ok(*v)).collect())),
        ("count (median)", median(b.iter().map(|x| dur(x, 3, 4)).filter(|v| ok(*v)).collect())),
        ("combine of the last (median)", median(lasts.iter().map(|x| dur(x, 4, 5)).filter(|v| ok(*v)).collect())),
        ("last: loop end → end (max)", lasts.iter().map(|x| dur(x, 2, 5)).filter(|v| ok(*v)).fold(0.0, f64::max)),
        ("span (first start → last end)", span),
        ("after the latest loop end", span - latest_loop),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summary_reads_the_points() {
        // Two blocks of one tile: 1 cycle per ns (1 GHz); block 1 merges.
        let mut w = vec![0u64; 3 * WORDS];
        for (i, (start, loop_end, last)) in [(1000u64, 11_000u64, false), (1500, 12_000, true)].into_iter().enumerate() {
            let r = &mut w[i * WORDS..(i + 1) * WORDS];
            r[0] = 7 | (i as u64) << 16 | (last as u64) << 32;
            let ns = [start, start + 500, loop_end, loop_end + 400, loop_end + 900, if last { loop_end + 2900 } else { 0 }];
            for k in 0..6 {
                r[1 + k] = ns[k];
                r[8 + k] = if ns[k] == 0 { 0 } else { ns[k] * 2 };
            }
        }
        let b = blocks(&w);
        assert_eq!(b.len(), 2, "the third record never started");
        assert!(b[1].last && !b[0].last && b[1].split == 1 && b[0].sm == 7);
        let s: std::collections::HashMap<_, _> = summary(&b).into_iter().collect();
        let near = |k: &str, v: f64| assert!((s[k] - v).abs() < 1e-9, "{k}: {} vs {v}", s[k]);
        near("SM clock GHz", 2.0);
        near("start skew", 0.5);
        near("prologue (median)", 0.5);
        near("loop end max", 11.0);
        near("combine of the last (median)", 2.0);
        near("last: loop end → end (max)", 2.9);
        near("span (first start → last end)", 13.9);
        near("after the latest loop end", 2.9);
    }
}
