//! The inference features written out directly from their definitions
//! (../shared/INFERENCE.md), independently of the library's code: an f64
//! reference and the naive same-dtype attention of the accuracy rule
//! ([`crate::naive`]'s definition, plus GQA, window, softcap and ALiBi).
//! Rows are computed in parallel threads (the GPU sweeps use long
//! sequences).

use flash_attn::{AlibiShape, AttnElem, ForwardParams};
use ndarray::{Array3, Array4, ArrayView4};

use crate::naive::round_to;

/// The options of one call, as the tests state them.
#[derive(Clone, Debug, Default)]
pub struct Spec {
    pub params: ForwardParams,
    /// `(slopes, shape)`.
    pub alibi: Option<(Vec<f32>, AlibiShape)>,
    /// The `seqlen_k` that window sides are normalized against (a side
    /// `≥` it is unbounded): the call's `max_seqlen_k` for varlen, else
    /// (`None`) the sequence's own.
    pub norm_seqlen_k: Option<usize>,
}

impl Spec {
    fn slope(&self, b: usize, h: usize, nheads: usize) -> f64 {
        match &self.alibi {
            None => 0.0,
            Some((s, AlibiShape::PerHead)) => s[h] as f64,
            Some((s, AlibiShape::PerBatchHead)) => s[b * nheads + h] as f64,
        }
    }

    /// `(lo, hi)`: key `j` visible to row `i` iff `lo ≤ j ≤ hi` (as i64,
    /// before clamping to `0..sk`), FlashAttention-2's rules written out.
    fn bounds(&self, i: usize, sq: usize, sk: usize) -> (i64, i64) {
        let p = &self.params;
        let norm = self.norm_seqlen_k.unwrap_or(sk);
        let unb = |w: Option<usize>| w.filter(|&w| w < norm);
        let right = if p.causal { Some(0) } else { unb(p.window_right) };
        let left = unb(p.window_left);
        let c = i as i64 + sk as i64 - sq as i64;
        (left.map_or(i64::MIN, |l| c - l as i64), right.map_or(i64::MAX, |r| c + r as i64))
    }

    /// The score of `dot = q_i·k_j` (natural domain), or `None` when masked.
    #[allow(clippy::too_many_arguments)] // the scalars of the score formula, named as in the math
    fn score(&self, dot: f64, i: usize, j: usize, sq: usize, sk: usize, slope: f64, scale: f64) -> Option<f64> {
        let (lo, hi) = self.bounds(i, sq, sk);
        let jj = j as i64;
        if jj < lo || jj > hi {
            return None;
        }
        let mut s = scale * dot;
        let cap = self.params.softcap.unwrap_or(0.0) as f64;
        if cap > 0.0 {
            s = cap * (s / cap).tanh();
        }
        let pos = i as i64 + sk as i64 - sq as i64;
        Some(s - slope * (pos - jj).abs() as f64)
    }
}

/// Output of the explicit computations: O `(batch, sq, nheads, d)` and the
/// logsumexp `(batch, nheads, sq)` (−inf for rows that see no key).
pub struct Explicit<T> {
    pub o: Array4<T>,
    pub lse: Array3<f64>,
}

/// One head of a `(batch, seqlen, heads, d)` array as a contiguous
/// `seqlen × d` f32 matrix (exact for the 16-bit types).
fn head<T: AttnElem>(a: &ArrayView4<'_, T>, b: usize, h: usize) -> Vec<f32> {
    let (_, n, _, d) = a.dim();
    let mut out = Vec::with_capacity(n * d);
    for i in 0..n {
        out.extend((0..d).map(|c| a[[b, i, h, c]].to_f32()));
    }
    out
}

/// Runs `row(b, h, q_i, k_head, v_head, i) -> (o_row, lse)` over every row:
/// heads copied to contiguous matrices once, (head, row chunk) work items
/// spread over the machine's threads.
#[allow(clippy::type_complexity)]
fn per_row<T: AttnElem, O: Clone + Send + Sync + Copy>(
    q: &ArrayView4<'_, T>,
    k: &ArrayView4<'_, T>,
    v: &ArrayView4<'_, T>,
    zero: O,
    row: impl Fn(usize, usize, &[f32], &[f32], &[f32], usize) -> (Vec<O>, f64) + Sync,
) -> Explicit<O> {
    let (batch, sq, nheads, d) = q.dim();
    let nheads_k = k.dim().2;
    let group = nheads / nheads_k;
    let kv: Vec<(Vec<f32>, Vec<f32>)> =
        (0..batch * nheads_k).map(|x| (head(k, x / nheads_k, x % nheads_k), head(v, x / nheads_k, x % nheads_k))).collect();
    let qs: Vec<Vec<f32>> = (0..batch * nheads).map(|x| head(q, x / nheads, x % nheads)).collect();
    const CHUNK: usize = 32;
    let items: Vec<(usize, usize, usize)> = (0..batch)
        .flat_map(|b| (0..nheads).flat_map(move |h| (0..sq.div_ceil(CHUNK)).map(move |c| (b, h, c * CHUNK))))
        .collect();
    let threads = std::thread::available_parallelism().map_or(4, |n| n.get());
    let next = std::sync::atomic::AtomicUsize::new(0);
    let results: Vec<Vec<(usize, Vec<(Vec<O>, f64)>)>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|_| {
                let (row, items, next, kv, qs) = (&row, &items, &next, &kv, &qs);
                s.spawn(move || {
                    let mut done = Vec::new();
                    loop {
                        let w = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        let Some(&(b, h, i0)) = items.get(w) else { break };
                        let (kh, vh) = &kv[b * nheads_k + h / group];
                        let qh = &qs[b * nheads + h];
                        let rows = (i0..(i0 + CHUNK).min(sq)).map(|i| row(b, h, &qh[i * d..][..d], kh, vh, i)).collect();
                        done.push((w, rows));
                    }
                    done
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let mut o = Array4::from_elem((batch, sq, nheads, d), zero);
    let mut lse = Array3::from_elem((batch, nheads, sq), f64::NEG_INFINITY);
    for (w, rows) in results.into_iter().flatten() {
        let (b, h, i0) = items[w];
        for (r, (orow, l)) in rows.into_iter().enumerate() {
            for (c, x) in orow.into_iter().enumerate() {
                o[[b, i0 + r, h, c]] = x;
            }
            lse[[b, h, i0 + r]] = l;
        }
    }
    Explicit { o, lse }
}

/// The f64 reference: softmax of the explicit score row, times V.
pub fn reference<T: AttnElem>(q: ArrayView4<'_, T>, k: ArrayView4<'_, T>, v: ArrayView4<'_, T>, spec: &Spec) -> Explicit<f64> {
    let (_, sq, nheads, d) = q.dim();
    let sk = k.dim().1;
    let scale = spec.params.softmax_scale.map_or(1.0 / (d as f64).sqrt(), |s| s as f64);
    per_row(&q, &k, &v, 0.0, |b, h, qi, kh, vh, i| {
        let slope = spec.slope(b, h, nheads);
        let s: Vec<Option<f64>> = (0..sk)
            .map(|j| {
                let dot: f64 = qi.iter().zip(&kh[j * d..][..d]).map(|(&x, &y)| x as f64 * y as f64).sum();
                spec.score(dot, i, j, sq, sk, slope, scale)
            })
            .collect();
        let m = s.iter().flatten().fold(f64::NEG_INFINITY, |a, &x| a.max(x));
        if m == f64::NEG_INFINITY {
            return (vec![0.0; d], f64::NEG_INFINITY);
        }
        let mut o = vec![0f64; d];
        let mut l = 0f64;
        for (j, x) in s.iter().enumerate() {
            if let Some(x) = x {
                let p = (x - m).exp();
                l += p;
                for (a, &y) in o.iter_mut().zip(&vh[j * d..][..d]) {
                    *a += p * y as f64;
                }
            }
        }
        (o.into_iter().map(|a| a / l).collect(), m + l.ln())
    })
}

/// Naive attention in `T` (f32 arithmetic, S and P rounded to `T`, as
/// [`crate::naive::naive_attention`] defines it), with the features: the
/// scale, softcap and ALiBi are applied in f32 to the rounded `S`. The
/// logsumexp is `m + ln l` of those f32 scores.
pub fn naive<T: AttnElem>(q: ArrayView4<'_, T>, k: ArrayView4<'_, T>, v: ArrayView4<'_, T>, spec: &Spec) -> Explicit<T> {
    let (_, sq, nheads, d) = q.dim();
    let sk = k.dim().1;
    let scale = spec.params.softmax_scale.unwrap_or_else(|| flash_attn::default_softmax_scale(d)) as f64;
    per_row(&q, &k, &v, T::from_f32(0.0), |b, h, qi, kh, vh, i| {
        let slope = spec.slope(b, h, nheads);
        let s: Vec<Option<f32>> = (0..sk)
            .map(|j| {
                let mut dot = 0f32;
                for (&x, &y) in qi.iter().zip(&kh[j * d..][..d]) {
                    dot += x * y;
                }
                spec.score(round_to::<T>(dot) as f64, i, j, sq, sk, slope, scale).map(|x| x as f32)
            })
            .collect();
        let m = s.iter().flatten().fold(f32::NEG_INFINITY, |a, &x| a.max(x));
        if m == f32::NEG_INFINITY {
            return (vec![T::from_f32(0.0); d], f64::NEG_INFINITY);
        }
        let p: Vec<f32> = s.iter().map(|x| x.map_or(0.0, |x| round_to::<T>((x - m).exp()))).collect();
        let l: f32 = p.iter().sum();
        let mut acc = vec![0f32; d];
        for (j, &pj) in p.iter().enumerate() {
            if pj != 0.0 {
                for (a, &y) in acc.iter_mut().zip(&vh[j * d..][..d]) {
                    *a += pj * y;
                }
            }
        }
        let lse = m as f64 + (s.iter().flatten().map(|&x| ((x - m) as f64).exp()).sum::<f64>()).ln();
        (acc.into_iter().map(|a| T::from_f32(a / l)).collect(), lse)
    })
}

/// Packs sequences of random lengths into a varlen tensor `(total, heads,
/// d)` (fresh nonzero random values) and their prefix sums from 0.
pub fn pack<T: AttnElem>(rng: &mut crate::Rng, lens: &[usize], h: usize, d: usize) -> (Array3<T>, Vec<i32>) {
    let total: usize = lens.iter().sum();
    let a = Array3::from_shape_simple_fn((total, h, d), || T::from_f32(rng.nonzero(1.0)));
    let mut cu = vec![0i32];
    for &l in lens {
        cu.push(cu.last().unwrap() + l as i32);
    }
    (a, cu)
}

/// Random nonzero values of `shape` (the decode tests' inputs).
pub fn random<T: AttnElem>(rng: &mut crate::Rng, shape: (usize, usize, usize, usize)) -> Array4<T> {
    Array4::from_shape_simple_fn(shape, || T::from_f32(rng.nonzero(1.0)))
}

/// The largest |a − b| (a NaN in `a` counts as infinite: it never passes).
pub fn max_abs_diff(a: impl IntoIterator<Item = f64>, b: impl IntoIterator<Item = f64>) -> f64 {
    a.into_iter().zip(b).map(|(x, y)| if x.is_nan() { f64::INFINITY } else { (x - y).abs() }).fold(0.0, f64::max)
}

/// One sequence's output `o` and logsumexp `lse` (heads, then query rows)
/// against the f64 reference over `q`, `k`, `v` (batch 1): O within
/// `factor` × the naive same-dtype error + 1e-5, the logsumexp within
/// 1e-4·max(1, |ref|) (−inf exactly for a row without keys).
#[allow(clippy::too_many_arguments)]
pub fn assert_matches_reference<T: AttnElem>(label: &str, q: &Array4<T>, k: &Array4<T>, v: &Array4<T>, o: ArrayView4<'_, T>, lse: impl IntoIterator<Item = f32>, spec: &Spec, factor: f64) {
    let r = reference(q.view(), k.view(), v.view(), spec);
    let n = naive(q.view(), k.view(), v.view(), spec);
    let err = max_abs_diff(o.iter().map(|x| x.to_f32() as f64), r.o.iter().copied());
    let naive_err = max_abs_diff(n.o.iter().map(|x| x.to_f32() as f64), r.o.iter().copied());
    assert!(err <= factor * naive_err + 1e-5, "{label}: max error {err:.3e} > {factor} × naive {naive_err:.3e}");
    for (x, w) in lse.into_iter().zip(r.lse.iter()) {
        let x = x as f64;
        if *w == f64::NEG_INFINITY {
            assert_eq!(x, *w, "{label}: lse of a row without keys");
        } else {
            assert!((x - w).abs() <= 1e-4 * w.abs().max(1.0), "{label}: lse {x} vs {w}");
        }
    }
}
