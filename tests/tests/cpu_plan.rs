//! The FA1 tiling plan and the HBM-traffic model (`flash_attn::plan`, the
//! `flash_attn_common::plan` module that the kernels compile too):
//!
//! * the seed's GPT-2 / A100 example, exactly (seed 002: M = 192 KB = 196 608,
//!   N = 1024, d = 64 → Bc = 768, Br = 64, Tc = 2, Tr = 16);
//! * Theorem 2: FA1's traffic is Θ(N²d²/M) — doubling M halves the Q/O/l/m
//!   re-read term, doubling N quadruples it, and over random (N, d, M) with
//!   4d ≤ M ≤ Nd the ratio to N²d²/M stays within fixed constants;
//! * FA2 writes O and its logsumexp once per Q block and never reads them, while
//!   FA1 reads and writes O, l, m once per (K/V block, Q block) pair;
//! * standard attention is Ω(Nd + N²);
//! * the backward: standard's and FA2's models counted by hand, FA1's
//!   Algorithm 4 (`flash_attn_tests::traffic`) by hand and block by block,
//!   and the forward + backward rows `fa-run` prints for the GPT-2 shape.

use flash_attn::plan::{HbmTraffic, PlanError, TilingPlan};
use flash_attn_tests::traffic;
use proptest::prelude::*;

#[test]
fn gpt2_on_a100_example_exactly() {
    // The seed plugs 192 KB = 196608 into ceil(M / 4d) directly.
    let p = TilingPlan::new(196_608, 1024, 1024, 64).unwrap();
    assert_eq!((p.bc, p.br, p.tc, p.tr), (768, 64, 2, 16));
    assert_eq!(p.m_sram, 196_608);
    assert_eq!(TilingPlan::from_sram_bytes(196_608, 1, 1024, 1024, 64).unwrap(), p);
    // Counting M in f32 elements instead: 49152 elements, Bc = 192.
    let p32 = TilingPlan::from_sram_bytes(196_608, 4, 1024, 1024, 64).unwrap();
    assert_eq!((p32.m_sram, p32.bc, p32.br, p32.tc, p32.tr), (49_152, 192, 64, 6, 16));
    // On chip: K_j, V_j (768 x 64 each) and Q_i, O_i (64 x 64 each) <= M.
    assert_eq!(p.on_chip_elems(), (2 * 768 + 2 * 64) * 64);
    assert!(p.on_chip_elems() <= p.m_sram);
    assert_eq!(p.block_pairs(), 32);
}

#[test]
fn gpt2_traffic_standard_vs_fa1_vs_fa2() {
    let p = TilingPlan::new(196_608, 1024, 1024, 64).unwrap();
    let (n, d) = (1024u64, 64u64);
    // Standard (Algorithm 0): read Q,K; write S; read S; write P; read P,V; write O.
    let std = p.standard_traffic(2).unwrap();
    assert_eq!(std.read_bytes, 2 * (n * d + 2 * n * d + 2 * n * n));
    assert_eq!(std.write_bytes, 2 * (2 * n * n + n * d));
    // FA1: K, V once; Q, O, l, m read Tc = 2 times; O, l, m written 1 + Tc times.
    let fa1 = p.fa1_traffic(2, 4).unwrap();
    assert_eq!(fa1.read_bytes, 2 * 2 * n * d + 2 * n * (2 * d * 2 + 2 * 4));
    assert_eq!(fa1.write_bytes, 3 * (n * d * 2 + 2 * n * 4));
    // FA2: Q once, K, V Tr = 16 times, O and lse written once.
    let fa2 = p.fa2_traffic(2, 4).unwrap();
    assert_eq!(fa2.read_bytes, n * d * 2 + 16 * 2 * n * d * 2);
    assert_eq!(fa2.write_bytes, n * d * 2 + n * 4);
    assert!(fa1.total() < std.total() / 4, "FA1 {} vs standard {}", fa1.total(), std.total());
    // Per (batch, head): GPT-2 has 12 heads; batch 8.
    let all = std.times(96).unwrap();
    assert_eq!(all.read_bytes, 96 * std.read_bytes);
}

#[test]
fn fa1_reread_term_is_theta_n2_d2_over_m() {
    let (e, s) = (2, 4);
    // Sizes where every ceil is exact, so the ratios are exact.
    let base = TilingPlan::new(16_384, 4096, 4096, 64).unwrap(); // Bc = 64, Tc = 64
    assert_eq!((base.bc, base.tc), (64, 64));
    let r = |p: &TilingPlan| p.fa1_reread_bytes(e, s).unwrap();
    // Doubling M halves it.
    let m2 = TilingPlan::new(32_768, 4096, 4096, 64).unwrap();
    assert_eq!(r(&base), 2 * r(&m2));
    // Doubling N (both N_q and N_k) quadruples it.
    let n2 = TilingPlan::new(16_384, 8192, 8192, 64).unwrap();
    assert_eq!(r(&n2), 4 * r(&base));
    // Doubling d quadruples the Q/O part (Tc doubles, each re-read doubles).
    let d2 = TilingPlan::new(16_384, 4096, 4096, 128).unwrap();
    assert_eq!(d2.tc, 2 * base.tc);
    let qo = |p: &TilingPlan| p.tc * p.n_q * 2 * p.d * e;
    assert_eq!(qo(&d2), 4 * qo(&base));
    // It is the difference between FA1's reads and reading K, V once.
    let fa1 = base.fa1_traffic(e, s).unwrap();
    assert_eq!(fa1.read_bytes - 2 * base.n_k * base.d * e, r(&base));
    // FA2's O/lse writes do not depend on M at all.
    assert_eq!(base.fa2_traffic(e, s).unwrap().write_bytes, m2.fa2_traffic(e, s).unwrap().write_bytes);
}

#[test]
fn invalid_plans_are_typed_errors() {
    assert_eq!(TilingPlan::new(0, 1, 1, 1), Err(PlanError::ZeroDim { name: "m_sram" }));
    assert_eq!(TilingPlan::new(1024, 0, 1, 1), Err(PlanError::ZeroDim { name: "n_q" }));
    assert_eq!(TilingPlan::new(1024, 1, 0, 1), Err(PlanError::ZeroDim { name: "n_k" }));
    assert_eq!(TilingPlan::new(1024, 1, 1, 0), Err(PlanError::ZeroDim { name: "d" }));
    assert_eq!(TilingPlan::new(255, 8, 8, 64), Err(PlanError::SramTooSmall { m_sram: 255, d: 64 }));
    assert!(TilingPlan::new(256, 8, 8, 64).is_ok(), "M = 4d is the smallest: Bc = Br = 1");
    assert_eq!(TilingPlan::new(1, 1, 1, u64::MAX), Err(PlanError::Overflow { what: "4*d" }));
    assert_eq!(TilingPlan::from_sram_bytes(1024, 0, 8, 8, 8), Err(PlanError::ZeroElemSize { name: "elem_bytes" }));
    assert_eq!(TilingPlan::from_blocks(8, 8, 8, 0, 4), Err(PlanError::ZeroBlock { name: "br" }));
    assert_eq!(TilingPlan::from_blocks(8, 8, 8, 4, 0), Err(PlanError::ZeroBlock { name: "bc" }));
    let p = TilingPlan::new(1024, 8, 8, 8).unwrap();
    assert_eq!(p.fa1_traffic(2, 0), Err(PlanError::ZeroElemSize { name: "stat_bytes" }));
    assert_eq!(HbmTraffic::standard(8, 8, 8, 0), Err(PlanError::ZeroElemSize { name: "elem_bytes" }));
    let huge = TilingPlan::new(1 << 20, 1 << 40, 1 << 40, 64).unwrap();
    assert!(matches!(huge.standard_traffic(4), Err(PlanError::Overflow { .. })));
    let msg = PlanError::SramTooSmall { m_sram: 255, d: 64 }.to_string();
    assert!(msg.contains("255") && msg.contains("256"), "{msg}");
    assert!(PlanError::ZeroDim { name: "d" }.to_string().contains("`d`"));
}

#[test]
fn explicit_blocks() {
    // A kernel's own blocks (FA2, d = 128, Br = 128, Bc = 64).
    let p = TilingPlan::from_blocks(4096, 4096, 128, 128, 64).unwrap();
    assert_eq!((p.tr, p.tc, p.m_sram), (32, 64, (2 * 128 + 2 * 64) * 128));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1024))]

    /// Theorem 2 over random shapes with 4d <= M <= N d: FA1's total traffic
    /// and its re-read term are within constant factors of N²d²/M.
    /// Bounds: Bc = ceil(M/4d) in [M/4d, M/2d] and Tc = ceil(N/Bc) in
    /// [2Nd/M, 8Nd/M] (using M >= 4d and M <= Nd), so with one byte per
    /// element and per statistic the re-read Tc·N·(2d + 2) lies in
    /// [4, 32]·N²d²/M, and the total (adding K, V once and O, l, m written
    /// 1 + Tc times, all O(Tc N d)) in [4, 64]·N²d²/M.
    #[test]
    fn fa1_traffic_theta_bounds(n in 1u64..=65_536, d in 1u64..=256, m_frac in 0.0f64..=1.0) {
        let (lo, hi) = (4 * d, n * d);
        prop_assume!(lo <= hi);
        let m = lo + ((hi - lo) as f64 * m_frac) as u64;
        let p = TilingPlan::new(m, n, n, d).unwrap();
        let x = (n * n) as f64 * (d * d) as f64 / m as f64;
        let reread = p.fa1_reread_bytes(1, 1).unwrap() as f64 / x;
        prop_assert!((4.0..=32.0).contains(&reread), "re-read / (N²d²/M) = {reread} (plan {p:?})");
        let total = p.fa1_traffic(1, 1).unwrap().total() as f64 / x;
        prop_assert!((4.0..=64.0).contains(&total), "total / (N²d²/M) = {total} (plan {p:?})");
        // Standard attention: Ω(Nd + N²).
        let std = p.standard_traffic(1).unwrap().total();
        prop_assert!(std >= n * d + n * n);
    }

    /// FA2 writes O_i and lse_i once per Q block (Tr blocks of Br rows: N_q rows
    /// in all) and reads neither; FA1 writes O_i, l_i, m_i 1 + Tc times and
    /// reads them Tc times. (Seed 001 counts "2·Tr" for FA2 because its sketch
    /// also loads the initial O_i from HBM; FA2 initializes O_i on chip.)
    #[test]
    fn fa2_touches_o_once_per_q_block(
        n_q in 1u64..=100_000, n_k in 1u64..=100_000, d in 1u64..=256,
        br in 1u64..=256, bc in 1u64..=256, e in 1u64..=8, s in 1u64..=8,
    ) {
        let p = TilingPlan::from_blocks(n_q, n_k, d, br, bc).unwrap();
        let fa2 = p.fa2_traffic(e, s).unwrap();
        let per_q_block = br * (d * e + s); // O_i and lse_i, written once
        let last_rows = n_q - (p.tr - 1) * br;
        prop_assert_eq!(fa2.write_bytes, (p.tr - 1) * per_q_block + last_rows * (d * e + s));
        prop_assert_eq!(fa2.read_bytes, n_q * d * e + p.tr * 2 * n_k * d * e);
        let fa1 = p.fa1_traffic(e, s).unwrap();
        let o_lm = n_q * (d * e + 2 * s);
        prop_assert_eq!(fa1.write_bytes, (1 + p.tc) * o_lm);
        prop_assert_eq!(fa1.read_bytes, 2 * n_k * d * e + p.tc * (o_lm + n_q * d * e));
    }
}

/// The backward models against the element counts of their docs, on a
/// shape small enough to count by hand.
#[test]
fn backward_traffic_counts() {
    // N_q = 4, N_k = 6, d = 2, 2-byte elements.
    let std = HbmTraffic::standard_backward(4, 6, 2, 2).unwrap();
    // reads 5·24 + 3·8 + 2·12 = 168, writes 2·24 + 8 + 2·12 = 80 elements.
    assert_eq!(std, HbmTraffic { read_bytes: 168 * 2, write_bytes: 80 * 2 });
    // Bc = 4 → Tc = 2. Reads: O, dO (2·8·2 = 32 B); per block Q, dO (32 B),
    // LSE, D (2·4·4 = 32 B), accumulator (8·4 = 32 B) → 2·96 = 192;
    // K, V (2·12·2 = 48); the dQ pass's accumulator (32): 304 B.
    // Writes: D (16), zeroed accumulator (32), per block 32 → 64, dK, dV (48), dQ (16): 176 B.
    let fa2 = HbmTraffic::fa2_backward(4, 6, 2, 4, 2, 4).unwrap();
    assert_eq!(fa2, HbmTraffic { read_bytes: 304, write_bytes: 176 });
    // Recomputation moves far fewer bytes than materializing the N² matrices
    // on the GPT-2-medium shape (seed 002): N = 1024, d = 64, Bc = 128.
    let s = HbmTraffic::standard_backward(1024, 1024, 64, 2).unwrap().total();
    let f = HbmTraffic::fa2_backward(1024, 1024, 64, 128, 2, 4).unwrap().total();
    assert!(f * 2 < s, "FA2 backward {f} B vs standard {s} B");
    assert_eq!(HbmTraffic::fa2_backward(4, 6, 2, 0, 2, 4), Err(PlanError::ZeroDim { name: "bc" }));
    assert_eq!(HbmTraffic::standard_backward(4, 6, 2, 0), Err(PlanError::ZeroElemSize { name: "elem_bytes" }));
}

/// FA1's backward (Algorithm 4, `flash_attn_tests::traffic`) on a shape
/// counted by hand, and against a block-by-block count of its loads and
/// stores for random shapes.
#[test]
fn fa1_backward_traffic_counts() {
    // N_q = 4, N_k = 6, d = 2, Bc = 4 → Tc = 2; 2-byte elements, 4-byte l, m.
    // Reads: K, V (2·12·2 = 48 B); per block Q, O, dO, dQ (4·8·2 = 64 B) and
    // l, m (2·4·4 = 32 B) → 2·96 = 192: 240 B. Writes: zeroed dQ, dK, dV
    // (16 + 48), dQ per block (2·16), dK, dV (48): 144 B.
    let t = traffic::fa1_backward(4, 6, 2, 4, 2, 4).unwrap();
    assert_eq!(t, HbmTraffic { read_bytes: 240, write_bytes: 144 });
    assert_eq!(traffic::fa1_backward(4, 6, 2, 0, 2, 4), Err(PlanError::ZeroDim { name: "bc" }));
    assert_eq!(traffic::fa1_backward(4, 6, 2, 4, 2, 0), Err(PlanError::ZeroElemSize { name: "stat_bytes" }));
    assert!(matches!(traffic::fa1_backward(u64::MAX, 6, 2, 4, 2, 4), Err(PlanError::Overflow { .. })));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Algorithm 4 walked block by block: the closed form counts the same.
    #[test]
    fn fa1_backward_traffic_is_algorithm_4(
        n_q in 1u64..=300, n_k in 1u64..=300, d in 1u64..=64, br in 1u64..=64, bc in 1u64..=64, e in 1u64..=4, s in 1u64..=4,
    ) {
        let (mut read, mut write) = (0, (n_q + 2 * n_k) * d * e); // line 5: zero dQ, dK, dV
        for j0 in (0..n_k).step_by(bc as usize) {
            let cols = bc.min(n_k - j0);
            read += 2 * cols * d * e; // K_j, V_j
            for i0 in (0..n_q).step_by(br as usize) {
                let rows = br.min(n_q - i0);
                read += rows * (4 * d * e + 2 * s); // Q_i, O_i, dO_i, dQ_i, l_i, m_i
                write += rows * d * e; // dQ_i
            }
            write += 2 * cols * d * e; // dK_j, dV_j
        }
        let t = traffic::fa1_backward(n_q, n_k, d, bc, e, s).unwrap();
        prop_assert_eq!(t, HbmTraffic { read_bytes: read, write_bytes: write });
    }
}

/// The forward + backward rows `fa-run` prints for the GPT-2 shape (N 1024,
/// d 64) with seed 002's plan (M = 196608: Bc 768, Br 64, Tc 2, Tr 16), 2-byte
/// elements, 4-byte statistics, per head (elements counted in the docs of
/// `HbmTraffic::{standard, standard_backward, fa2_backward}`,
/// `TilingPlan::{fa1_traffic, fa2_traffic}`, `traffic::fa1_backward`).
#[test]
fn gpt2_forward_backward_rows() {
    let plan = TilingPlan::new(196_608, 1024, 1024, 64).unwrap();
    let rows = traffic::fwd_bwd_rows(&plan, 2, 4).unwrap();
    let totals: Vec<(u64, u64)> = rows.iter().map(|(_, r)| (r.forward.total(), r.backward.total())).collect();
    // Standard: forward (3Nd + 2N²) + (2N² + Nd) = 4,456,448 elements;
    // backward (5N² + 5Nd) + (2N² + 3Nd) = 7,864,320 elements; × 2 B.
    assert_eq!(totals[0], (8_912_896, 15_728_640));
    // FA1: forward 802,816 + 417,792 B; backward reads 2·131,072 + 2·(4·131,072
    // + 8,192), writes 131,072 + 3·262,144.
    assert_eq!(totals[1], (1_220_608, 2_244_608));
    // FA2: forward 131,072 + 16·262,144 + 135,168 B (K/V re-read per Q block of
    // 64 rows); backward 1,851,392 + 1,183,744 B.
    assert_eq!(totals[2], (4_460_544, 3_035_136));
    // Recomputation: both backward passes move several times fewer bytes
    // than standard attention's; forward + backward, FA1 7.1x, FA2 3.3x
    // (seed 002's whole-model table: 40.3 / 4.4 = 9.2x).
    let total = |i: usize| rows[i].1.total() as f64;
    assert!((total(0) / total(1) - 7.11).abs() < 0.01 && (total(0) / total(2) - 3.29).abs() < 0.01);
    assert_eq!(rows[1].1.times(96).unwrap().total(), 96 * 3_465_216);
}
