//! Naive attention computed in a 16-bit element type on the CPU: the
//! yardstick of the project's accuracy rule for f16/bf16 ("error against the
//! f64 reference no worse than twice that of naive attention computed in the
//! same dtype", GPU-NOTES.md "Method").
//!
//! # Definition
//! What a framework does when it runs `softmax(Q Kᵀ · scale) V` as separate
//! operations on 16-bit tensors: every matrix product accumulates in f32 and
//! rounds its result to the element type `T`, the softmax computes in f32 and
//! hands its probabilities back rounded to `T`. Per `(batch, head)` and query
//! row `i`, over the keys `j` the row sees (all of them, or
//! `j <= i + N_k − N_q` when causal, as the kernels mask):
//!
//! ```text
//! S_ij = round_T( Σ_c q_ic · k_jc )          f32 accumulation in c order, rounded to T
//! s_ij = scale · S_ij                        f32 (scale: softmax_scale, default 1/√d)
//! m_i  = max_j s_ij                          f32
//! P_ij = round_T( exp(s_ij − m_i) )          f32 exp, rounded to T
//! l_i  = Σ_j P_ij                            f32 sum of the rounded P
//! O_ic = round_T( (Σ_j P_ij · v_jc) / l_i )  f32 accumulation in j order, f32 divide, rounded to T
//! ```
//!
//! A row that sees no key has `O = 0`. The inputs are the 16-bit values
//! themselves (products of two f16 or two bf16 values are exact in f32), so
//! the error of this computation against the f64 reference on the same
//! inputs is pure arithmetic error of the 16-bit pipeline.

use flash_attn::AttnElem;
use ndarray::{Array4, ArrayView4};

/// `x` rounded to `T` (round to nearest even) and back to f32.
#[inline]
pub fn round_to<T: AttnElem>(x: f32) -> f32 {
    T::from_f32(x).to_f32()
}

/// One head of a `(batch, seqlen, nheads, headdim)` array as a contiguous
/// `seqlen × headdim` f32 matrix (exact: f16/bf16 values are f32 values).
fn head<T: AttnElem>(a: &ArrayView4<'_, T>, b: usize, h: usize) -> Vec<f32> {
    let (_, n, _, d) = a.dim();
    let mut out = Vec::with_capacity(n * d);
    for i in 0..n {
        for c in 0..d {
            out.push(a[[b, i, h, c]].to_f32());
        }
    }
    out
}

/// Naive attention in `T` (see the module docs for the exact definition);
/// `q` `(batch, N_q, nheads, d)`, `k` and `v` `(batch, N_k, nheads, d)`.
/// Returns `O` `(batch, N_q, nheads, d)` in `T`.
///
/// # Panics
/// On shapes that disagree (a test helper: the callers build them).
pub fn naive_attention<T: AttnElem>(
    q: ArrayView4<'_, T>,
    k: ArrayView4<'_, T>,
    v: ArrayView4<'_, T>,
    causal: bool,
    softmax_scale: Option<f32>,
) -> Array4<T> {
    let (batch, nq, nheads, d) = q.dim();
    let nk = k.dim().1;
    assert_eq!(k.dim(), (batch, nk, nheads, d), "k shape");
    assert_eq!(v.dim(), (batch, nk, nheads, d), "v shape");
    let scale = softmax_scale.unwrap_or_else(|| flash_attn::default_softmax_scale(d));
    let mut o = Array4::from_elem((batch, nq, nheads, d), T::from_f32(0.0));
    let mut s = vec![0f32; nk];
    let mut acc = vec![0f32; d];
    for b in 0..batch {
        for h in 0..nheads {
            let (qh, kh, vh) = (head(&q, b, h), head(&k, b, h), head(&v, b, h));
            for i in 0..nq {
                // Keys 0..lim are visible (causal: bottom-right aligned).
                let lim = if causal { (i + nk + 1).saturating_sub(nq).min(nk) } else { nk };
                if lim == 0 {
                    continue; // O = 0
                }
                let q_i = &qh[i * d..][..d];
                let mut m = f32::NEG_INFINITY;
                for j in 0..lim {
                    let k_j = &kh[j * d..][..d];
                    let mut dot = 0f32;
                    for c in 0..d {
                        dot += q_i[c] * k_j[c];
                    }
                    s[j] = scale * round_to::<T>(dot);
                    m = m.max(s[j]);
                }
                let mut l = 0f32;
                acc.fill(0.0);
                for j in 0..lim {
                    let p = round_to::<T>((s[j] - m).exp());
                    l += p;
                    for (a, &x) in acc.iter_mut().zip(&vh[j * d..][..d]) {
                        *a += p * x;
                    }
                }
                for c in 0..d {
                    o[[b, i, h, c]] = T::from_f32(acc[c] / l);
                }
            }
        }
    }
    o
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Rng, rel_err};
    use flash_attn::reference::standard_attention;

    fn random<T: AttnElem>(rng: &mut Rng, s: (usize, usize, usize, usize)) -> Array4<T> {
        Array4::from_shape_fn(s, |_| T::from_f32(rng.nonzero(1.0)))
    }

    fn err<T: AttnElem>(rng: &mut Rng, nq: usize, nk: usize, d: usize, causal: bool) -> f64 {
        let (q, k, v) = (random::<T>(rng, (1, nq, 2, d)), random::<T>(rng, (1, nk, 2, d)), random::<T>(rng, (1, nk, 2, d)));
        let w = |a: &Array4<T>| a.mapv(|x| x.to_f32() as f64);
        let r = standard_attention::<f64>(w(&q).view(), w(&k).view(), w(&v).view(), causal, None).unwrap();
        let o = naive_attention(q.view(), k.view(), v.view(), causal, None);
        rel_err(o.iter().map(|x| x.to_f32() as f64), r.o.iter().copied())
    }

    /// The yardstick is in the expected range: f16 near its unit roundoff
    /// (2⁻¹¹ ≈ 4.9e-4), bf16 near its own (2⁻⁸ ≈ 3.9e-3), bf16 worse than f16.
    #[test]
    fn naive_error_is_that_of_the_dtype() {
        let mut rng = Rng::with_seed(7);
        for causal in [false, true] {
            let e16 = err::<half::f16>(&mut rng, 70, 90, 64, causal);
            let eb16 = err::<half::bf16>(&mut rng, 70, 90, 64, causal);
            assert!((5e-5..2e-3).contains(&e16), "f16 naive error {e16:.2e}");
            assert!((5e-4..1.5e-2).contains(&eb16), "bf16 naive error {eb16:.2e}");
            assert!(eb16 > 2.0 * e16, "bf16 {eb16:.2e} vs f16 {e16:.2e}");
        }
    }

    /// One visible key: P = 1, O = that key's value row exactly; a row with
    /// no visible key (causal, N_q > N_k) is 0.
    #[test]
    fn single_key_is_exact_and_empty_rows_are_zero() {
        let mut rng = Rng::with_seed(3);
        let (q, k, v) = (
            random::<half::bf16>(&mut rng, (1, 3, 1, 32)),
            random::<half::bf16>(&mut rng, (1, 1, 1, 32)),
            random::<half::bf16>(&mut rng, (1, 1, 1, 32)),
        );
        let o = naive_attention(q.view(), k.view(), v.view(), false, Some(0.3));
        for i in 0..3 {
            for c in 0..32 {
                assert_eq!(o[[0, i, 0, c]], v[[0, 0, 0, c]]);
            }
        }
        let o = naive_attention(q.view(), k.view(), v.view(), true, None);
        assert!(o.slice(ndarray::s![0, ..2, 0, ..]).iter().all(|x| x.to_f32() == 0.0));
        assert!(o.slice(ndarray::s![0, 2, 0, ..]).iter().zip(v.iter()).all(|(a, b)| a == b));
    }
}
