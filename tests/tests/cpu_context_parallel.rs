//! Context parallelism on the CPU (`flash_attn::context_parallel`): `N`
//! simulated ranks (threads exchanging shards over channels, each computing
//! with the f64 reference) equal one-rank f64 attention within 1e-12:
//!
//! * the ring, contiguous and zigzag, causal and not, MHA and GQA (only the
//!   KV heads travel), dense and varlen (packed documents), N ∈ {1, 2, 3, 4,
//!   8}, forward `O`, `LSE` and backward `dQ`, `dK`, `dV`;
//! * Ulysses (all-to-all over heads), the same;
//! * the GPU ring's varlen decomposition (`varlen_segments`: one varlen
//!   call per step over the whole local shard, rows outside the block in
//!   segments with no keys or no queries) merged over every row equals
//!   one-rank attention;
//! * the schedule: every causally visible (query chunk, key chunk) pair is
//!   computed exactly once over the ring's steps, never a masked one, and
//!   zigzag gives every rank the same work at every step;
//! * the merge: `merge_lse` equals the direct logsumexp, in any order,
//!   with `−inf` sides;
//! * bad input is a typed error, never a panic.

mod cpu_support;

use cpu_support::{Rng, max_abs_diff};
use flash_attn::common::ring::merge_lse;
use flash_attn::context_parallel::{
    ContextParallel, Mask, ShardPlan, Sharding, Span, Strategy, cp_backward, cp_backward_varlen, cp_forward, cp_forward_varlen,
    kv_owner, merge_partial, ring_block, varlen_segments,
};
use flash_attn::reference::{attention, attention_backward, attention_varlen, varlen_attention_backward};
use flash_attn::{FlashAttnError, ForwardParams};
use ndarray::{Array, Array3, Array4, ArrayView, Axis, Dimension};

const TOL: f64 = 1e-12;

fn random4(rng: &mut Rng, shape: (usize, usize, usize, usize)) -> Array4<f64> {
    Array4::from_shape_simple_fn(shape, || rng.sym(1.5))
}

/// `max |got − want| ≤ TOL · (1 + max |want|)`, equal `−inf` counting as equal.
fn assert_close<D: Dimension>(what: &str, got: ArrayView<f64, D>, want: ArrayView<f64, D>) {
    assert_eq!(got.shape(), want.shape(), "{what}: shape");
    let scale = 1.0 + want.iter().filter(|x| x.is_finite()).fold(0.0f64, |a, &x| a.max(x.abs()));
    let err = max_abs_diff(got, want);
    assert!(err <= TOL * scale, "{what}: max |Δ| = {err:e} > {TOL:e} · {scale}");
}

/// Every configuration of the dense tests: (ranks, sharding, causal, nheads, nheads_k).
fn ring_cases() -> Vec<(usize, Sharding, bool, usize, usize)> {
    let mut cases = Vec::new();
    for ranks in [1, 2, 3, 4, 8] {
        for sharding in [Sharding::Contiguous, Sharding::Zigzag] {
            for causal in [true, false] {
                for (h, hk) in [(2, 2), (6, 2)] {
                    cases.push((ranks, sharding, causal, h, hk));
                }
            }
        }
    }
    cases
}

fn params(causal: bool) -> ForwardParams {
    ForwardParams { causal, softmax_scale: Some(0.37), ..Default::default() }
}

/// Dense inputs: 2 sequences of `16·ranks` tokens (a multiple of 2·ranks),
/// head dim 8.
fn dense_inputs(rng: &mut Rng, ranks: usize, h: usize, hk: usize) -> [Array4<f64>; 4] {
    let n = 16 * ranks;
    [random4(rng, (2, n, h, 8)), random4(rng, (2, n, hk, 8)), random4(rng, (2, n, hk, 8)), random4(rng, (2, n, h, 8))]
}

fn check_dense(cp: ContextParallel, causal: bool, h: usize, hk: usize, seed: u64) {
    let what = format!("{cp:?} causal {causal} heads {h}/{hk}");
    let mut rng = Rng::new(seed);
    let [q, k, v, dout] = dense_inputs(&mut rng, cp.ranks, h, hk);
    let p = params(causal);
    let one = attention(q.view(), k.view(), v.view(), &p, None).unwrap();
    let got = cp_forward(q.view(), k.view(), v.view(), &p, &cp).unwrap();
    assert_close(&format!("{what}: O"), got.o.view(), one.o.view());
    assert_close(&format!("{what}: LSE"), got.lse.view(), one.lse.view());
    let want = attention_backward(q.view(), k.view(), v.view(), dout.view(), &p, None).unwrap();
    let g = cp_backward(q.view(), k.view(), v.view(), got.o.view(), dout.view(), got.lse.view(), &p, &cp).unwrap();
    assert_close(&format!("{what}: dQ"), g.dq.view(), want.dq.view());
    assert_close(&format!("{what}: dK"), g.dk.view(), want.dk.view());
    assert_close(&format!("{what}: dV"), g.dv.view(), want.dv.view());
}

#[test]
fn ring_equals_one_rank_forward_and_backward() {
    for (i, (ranks, sharding, causal, h, hk)) in ring_cases().into_iter().enumerate() {
        check_dense(ContextParallel { ranks, sharding, strategy: Strategy::Ring }, causal, h, hk, 100 + i as u64);
    }
}

#[test]
fn ulysses_equals_one_rank_forward_and_backward() {
    for (i, ranks) in [1, 2, 4, 8].into_iter().enumerate() {
        for sharding in [Sharding::Contiguous, Sharding::Zigzag] {
            for causal in [true, false] {
                // GQA: 2 query heads per KV head; every rank gets whole groups.
                let cp = ContextParallel { ranks, sharding, strategy: Strategy::Ulysses };
                check_dense(cp, causal, 2 * ranks, ranks, 200 + i as u64);
            }
        }
    }
}

/// Packed documents of `len · 2·ranks` tokens for each `len` (one empty).
fn cu_seqlens(ranks: usize) -> Vec<i32> {
    let mut cu = vec![0];
    for len in [3, 1, 0, 5] {
        cu.push(cu.last().unwrap() + (len * 2 * ranks) as i32);
    }
    cu
}

#[test]
fn varlen_equals_one_rank_forward_and_backward() {
    for ranks in [1, 2, 3, 4, 8] {
        for strategy in [Strategy::Ring, Strategy::Ulysses] {
            for sharding in [Sharding::Contiguous, Sharding::Zigzag] {
                for causal in [true, false] {
                    let cp = ContextParallel { ranks, sharding, strategy };
                    let what = format!("varlen {cp:?} causal {causal}");
                    let mut rng = Rng::new(300 + ranks as u64);
                    let cu = cu_seqlens(ranks);
                    let total = *cu.last().unwrap() as usize;
                    let max_len = cu.windows(2).map(|w| (w[1] - w[0]) as usize).max().unwrap();
                    let (h, hk) = (2 * ranks, ranks);
                    let x = |rng: &mut Rng, heads| Array3::from_shape_simple_fn((total, heads, 8), || rng.sym(1.5));
                    let (q, k, v, dout) = (x(&mut rng, h), x(&mut rng, hk), x(&mut rng, hk), x(&mut rng, h));
                    let p = params(causal);
                    let one = attention_varlen(q.view(), k.view(), v.view(), &cu, &cu, None, max_len, max_len, &p, None).unwrap();
                    let got = cp_forward_varlen(q.view(), k.view(), v.view(), &cu, &p, &cp).unwrap();
                    assert_close(&format!("{what}: O"), got.o.view(), one.o.view());
                    assert_close(&format!("{what}: LSE"), got.lse.view(), one.lse.view());
                    let want =
                        varlen_attention_backward(q.view(), k.view(), v.view(), dout.view(), &cu, &cu, None, max_len, max_len, &p, None)
                            .unwrap();
                    let g = cp_backward_varlen(q.view(), k.view(), v.view(), got.o.view(), dout.view(), got.lse.view(), &cu, &p, &cp)
                        .unwrap();
                    assert_close(&format!("{what}: dQ"), g.dq.view(), want.dq.view());
                    assert_close(&format!("{what}: dK"), g.dk.view(), want.dk.view());
                    assert_close(&format!("{what}: dV"), g.dv.view(), want.dv.view());
                }
            }
        }
    }
}

/// The GPU ring's varlen forward, replayed with the f64 reference: per rank
/// and step, one `attention_varlen` over the whole local shard with the
/// block's [`varlen_segments`] (segments without keys give `O = 0`, `LSE =
/// −inf`), merged into the accumulator over every local row; the unsharded
/// result equals one-rank varlen attention.
#[test]
fn gpu_varlen_decomposition_equals_one_rank_forward() {
    for ranks in [1, 2, 3, 4] {
        for sharding in [Sharding::Contiguous, Sharding::Zigzag] {
            for causal in [true, false] {
                let what = format!("segments, {ranks} ranks {sharding:?} causal {causal}");
                let mut rng = Rng::new(500 + ranks as u64);
                let cu = cu_seqlens(ranks);
                let docs: Vec<usize> = cu.windows(2).map(|w| (w[1] - w[0]) as usize).collect();
                let total = *cu.last().unwrap() as usize;
                let max_len = docs.iter().copied().max().unwrap();
                let x = |rng: &mut Rng, heads| Array3::from_shape_simple_fn((total, heads, 8), || rng.sym(1.5));
                let (q, k, v) = (x(&mut rng, 4), x(&mut rng, 2), x(&mut rng, 2));
                let one = attention_varlen(q.view(), k.view(), v.view(), &cu, &cu, None, max_len, max_len, &params(causal), None).unwrap();
                let plan = ShardPlan::new(sharding, ranks, &docs).unwrap();
                let local = plan.local_docs();
                let (mut os, mut lses) = (Vec::new(), Vec::new());
                for rank in 0..ranks {
                    let ql = plan.shard(q.view(), Axis(0), rank);
                    let n = ql.dim().0;
                    let mut o = Array3::<f64>::zeros(ql.dim()).insert_axis(Axis(0));
                    let mut lse = Array3::from_elem((1, 4, n), f64::NEG_INFINITY);
                    for step in 0..ranks {
                        let Some(block) = ring_block(sharding, causal, ranks, rank, step) else { continue };
                        let owner = kv_owner(ranks, rank, step);
                        let (kh, vh) = (plan.shard(k.view(), Axis(0), owner), plan.shard(v.view(), Axis(0), owner));
                        let seg = varlen_segments(&local, &block);
                        let p = params(block.mask == Mask::Causal);
                        let part = attention_varlen(
                            ql.view(),
                            kh.view(),
                            vh.view(),
                            &seg.cu_seqlens_q,
                            &seg.cu_seqlens_k,
                            None,
                            seg.max_seqlen_q,
                            seg.max_seqlen_k,
                            &p,
                            None,
                        )
                        .unwrap();
                        let (po, pl) = (part.o.insert_axis(Axis(0)), part.lse.insert_axis(Axis(0)));
                        merge_partial(o.view_mut(), lse.view_mut(), po.view(), pl.view()).unwrap();
                    }
                    os.push(o.index_axis_move(Axis(0), 0));
                    lses.push(lse.index_axis_move(Axis(0), 0));
                }
                let ov: Vec<_> = os.iter().map(|o| o.view()).collect();
                let lv: Vec<_> = lses.iter().map(|l| l.view()).collect();
                assert_close(&format!("{what}: O"), plan.unshard(&ov, Axis(0)).unwrap().view(), one.o.view());
                assert_close(&format!("{what}: LSE"), plan.unshard(&lv, Axis(1)).unwrap().view(), one.lse.view());
            }
        }
    }
}

#[test]
fn schedule_covers_each_visible_chunk_pair_once() {
    for ranks in [1, 2, 3, 4, 8] {
        for sharding in [Sharding::Contiguous, Sharding::Zigzag] {
            for causal in [true, false] {
                // One document of one token per chunk: global rows are chunk indices.
                let chunks = sharding.num_chunks(ranks);
                let plan = ShardPlan::new(sharding, ranks, &[chunks]).unwrap();
                let mut seen = vec![vec![0usize; chunks]; chunks];
                // (step, rank) → visible pairs computed.
                let mut work = std::collections::BTreeMap::<(usize, usize), usize>::new();
                for rank in 0..ranks {
                    let q_rows: Vec<usize> = plan.rows_of(rank).into_iter().flatten().collect();
                    for step in 0..ranks {
                        let owner = flash_attn::context_parallel::kv_owner(ranks, rank, step);
                        let k_rows: Vec<usize> = plan.rows_of(owner).into_iter().flatten().collect();
                        let Some(block) = ring_block(sharding, causal, ranks, rank, step) else { continue };
                        let (qr, kr) = (block.q.range(q_rows.len()), block.k.range(k_rows.len()));
                        for (a, &i) in q_rows[qr.clone()].iter().enumerate() {
                            for (b, &j) in k_rows[kr.clone()].iter().enumerate() {
                                let visible = block.mask == Mask::Full || b <= a;
                                if visible {
                                    seen[i][j] += 1;
                                    *work.entry((step, rank)).or_default() += 1;
                                }
                            }
                        }
                    }
                }
                for (i, row) in seen.iter().enumerate() {
                    for (j, &n) in row.iter().enumerate() {
                        let want = usize::from(!causal || j <= i);
                        assert_eq!(n, want, "{sharding:?} ranks {ranks} causal {causal}: pair (q chunk {i}, k chunk {j}) computed {n} times");
                    }
                }
                if sharding == Sharding::Zigzag && causal {
                    // Step 0: the causal diagonal (3 chunk pairs); later steps 2 pairs each, on every rank.
                    for step in 0..ranks {
                        let w: Vec<usize> = (0..ranks).map(|rank| work.get(&(step, rank)).copied().unwrap_or(0)).collect();
                        assert!(w.iter().all(|&x| x == w[0] && x > 0), "zigzag ranks {ranks}, step {step}: unequal work {w:?}");
                    }
                }
            }
        }
    }
    assert_eq!(Span::SecondHalf.range(6), 3..6);
}

/// `ln Σ exp` directly, in f64.
fn logsumexp(xs: &[f64]) -> f64 {
    let m = xs.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    if m == f64::NEG_INFINITY { m } else { m + xs.iter().map(|x| (x - m).exp()).sum::<f64>().ln() }
}

#[test]
fn merge_is_exact_in_any_order() {
    let mut rng = Rng::new(7);
    for _ in 0..200 {
        // Partials of 4 disjoint key sets, some empty (−inf), some far apart.
        let lses: Vec<f64> = (0..4).map(|_| if rng.unit() < 0.2 { f64::NEG_INFINITY } else { rng.sym(300.0) }).collect();
        let os: Vec<f64> = (0..4).map(|_| rng.sym(2.0)).collect();
        let want_lse = logsumexp(&lses);
        let want_o: f64 = if want_lse == f64::NEG_INFINITY {
            0.0
        } else {
            lses.iter().zip(&os).map(|(l, o)| (l - want_lse).exp() * o).sum()
        };
        for order in [[0, 1, 2, 3], [3, 1, 0, 2], [2, 3, 1, 0]] {
            let (mut lse, mut o) = (f64::NEG_INFINITY, 0.0);
            for i in order {
                let (l, wa, wb) = merge_lse(lse, lses[i]);
                o = wa * o + wb * os[i];
                lse = l;
            }
            assert!(lse == want_lse || (lse - want_lse).abs() <= 1e-12 * want_lse.abs().max(1.0), "lse {lse} vs {want_lse}");
            assert!((o - want_o).abs() <= 1e-12, "o {o} vs {want_o}");
        }
    }
    assert_eq!(merge_lse(f64::NEG_INFINITY, f64::NEG_INFINITY), (f64::NEG_INFINITY, 0.0, 0.0));
}

#[test]
fn merge_partial_checks_shapes_and_keeps_empty_rows_zero() {
    let mut acc_o = Array4::<f64>::zeros((1, 3, 2, 4));
    let mut acc_l = Array3::from_elem((1, 2, 3), f64::NEG_INFINITY);
    let o = Array4::from_elem((1, 3, 2, 4), f64::NAN); // rows no key reached: never read
    let l = Array3::from_elem((1, 2, 3), f64::NEG_INFINITY);
    merge_partial(acc_o.view_mut(), acc_l.view_mut(), o.view(), l.view()).unwrap();
    assert!(acc_o.iter().all(|&x| x == 0.0) && acc_l.iter().all(|&x| x == f64::NEG_INFINITY));
    let bad = Array4::<f64>::zeros((1, 2, 2, 4));
    let err = merge_partial(acc_o.view_mut(), acc_l.view_mut(), bad.view(), l.view()).unwrap_err();
    assert!(matches!(err, FlashAttnError::ShapeMismatch { argument: "o", axis: "rows", .. }), "{err}");
}

#[test]
fn shard_then_unshard_is_the_identity() {
    let x = Array::from_shape_fn((2, 48, 3), |(a, b, c)| (a * 1000 + b * 10 + c) as f64);
    for sharding in [Sharding::Contiguous, Sharding::Zigzag] {
        let plan = ShardPlan::new(sharding, 3, &[12, 0, 36]).unwrap();
        let parts: Vec<_> = (0..3).map(|r| plan.shard(x.view(), Axis(1), r)).collect();
        assert!(parts.iter().all(|p| p.dim() == (2, 16, 3)));
        let views: Vec<_> = parts.iter().map(|p| p.view()).collect();
        assert_eq!(plan.unshard(&views, Axis(1)).unwrap(), x);
    }
    // Zigzag, 2 ranks, one document of 8: rank 0 holds chunks 0 and 3.
    let plan = ShardPlan::new(Sharding::Zigzag, 2, &[8]).unwrap();
    assert_eq!(plan.rows_of(0), vec![0..2, 6..8]);
    assert_eq!(plan.rows_of(1), vec![2..4, 4..6]);
}

fn invalid_argument(err: FlashAttnError) -> &'static str {
    match err {
        FlashAttnError::InvalidArgument { argument, .. } => argument,
        e => panic!("expected InvalidArgument, got {e}"),
    }
}

#[test]
fn bad_input_is_a_typed_error() {
    let mut rng = Rng::new(9);
    let [q, k, v, dout] = dense_inputs(&mut rng, 1, 2, 2); // seqlen 16
    let p = params(true);
    let run = |cp: ContextParallel, p: &ForwardParams| cp_forward(q.view(), k.view(), v.view(), p, &cp).map(|_| ());
    // 16 tokens: not a multiple of 2·3 (zigzag) nor of 3 (contiguous).
    assert_eq!(invalid_argument(run(ContextParallel::ring(3), &p).unwrap_err()), "seqlen");
    let contiguous = ContextParallel { ranks: 3, sharding: Sharding::Contiguous, strategy: Strategy::Ring };
    assert_eq!(invalid_argument(run(contiguous, &p).unwrap_err()), "seqlen");
    // 16 tokens over 16 ranks: 2 ranks · 16 = 32 chunks > 16 for zigzag.
    assert_eq!(invalid_argument(run(ContextParallel::ring(16), &p).unwrap_err()), "seqlen");
    assert_eq!(invalid_argument(run(ContextParallel::ring(0), &p).unwrap_err()), "ranks");
    // Ulysses: 2 heads over 4 ranks.
    let ulysses = ContextParallel { ranks: 4, sharding: Sharding::Zigzag, strategy: Strategy::Ulysses };
    assert_eq!(invalid_argument(run(ulysses, &p).unwrap_err()), "q");
    // Windows and softcap are not context-parallel features.
    let windowed = ForwardParams { window_left: Some(3), ..p };
    assert_eq!(invalid_argument(run(ContextParallel::ring(2), &windowed).unwrap_err()), "params");
    // Keys of another length than the queries.
    let short = k.slice(ndarray::s![.., ..8, .., ..]).to_owned();
    let err = cp_forward(q.view(), short.view(), short.view(), &p, &ContextParallel::ring(2)).unwrap_err();
    assert!(matches!(err, FlashAttnError::ShapeMismatch { argument: "k", axis: "seqlen", .. }), "{err}");
    // Backward: an lse of the wrong shape, a dout of the wrong shape.
    let lse = Array3::<f64>::zeros((2, 2, 15));
    let o = q.clone();
    let err = cp_backward(q.view(), k.view(), v.view(), o.view(), dout.view(), lse.view(), &p, &ContextParallel::ring(2)).unwrap_err();
    assert_eq!(invalid_argument(err), "lse");
    let short_do = dout.slice(ndarray::s![.., .., ..1, ..]).to_owned();
    let lse = Array3::<f64>::zeros((2, 2, 16));
    let err =
        cp_backward(q.view(), k.view(), v.view(), o.view(), short_do.view(), lse.view(), &p, &ContextParallel::ring(2)).unwrap_err();
    assert!(matches!(err, FlashAttnError::ShapeMismatch { argument: "dout", .. }), "{err}");
    // Varlen: cu_seqlens that do not end at total, a document not a multiple of 2·ranks.
    let q3 = q.index_axis(Axis(0), 0);
    let k3 = k.index_axis(Axis(0), 0);
    let err = cp_forward_varlen(q3, k3, k3, &[0, 8], &p, &ContextParallel::ring(2)).unwrap_err();
    assert_eq!(invalid_argument(err), "cu_seqlens");
    let err = cp_forward_varlen(q3, k3, k3, &[0, 6, 16], &p, &ContextParallel::ring(2)).unwrap_err();
    assert_eq!(invalid_argument(err), "seqlen");
}

#[test]
fn strategy_rule() {
    assert_eq!(Strategy::choose(32, 8, 4), Strategy::Ulysses);
    assert_eq!(Strategy::choose(32, 8, 16), Strategy::Ring);
    assert_eq!(Strategy::choose(32, 8, 1), Strategy::Ring);
}
