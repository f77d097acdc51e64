//! One attention problem of the GPU sweeps (`gpu_attention.rs` for f32,
//! `gpu_half.rs` for f16/bf16): its shapes and options ([`Case`]), random
//! inputs in the element type ([`Inputs`]), and one run through
//! `forward_into` with every output poisoned with NaN first ([`run_gpu`]).
//! What counts as a pass (tolerances, references) stays with each test file.

use std::fmt::Write as _;

use cudarc::driver::CudaSlice;
use flash_attn::{
    AttnElem, FlashAttnError, ForwardParams, LoopOrder, RowState, StatsMut, Tensor, TensorLayout, TensorMut,
};
use ndarray::{Array3, Array4};

use crate::{Gpu, Rng};

/// One problem: shapes, mask, scale, block, input amplitude, layouts.
#[derive(Clone, Debug)]
pub struct Case {
    pub batch: usize,
    pub nheads: usize,
    pub seqlen_q: usize,
    pub seqlen_k: usize,
    pub headdim: usize,
    pub causal: bool,
    pub softmax_scale: Option<f32>,
    pub block: Option<(usize, usize)>,
    /// Inputs uniform in `[-amp, amp]` (then rounded to the element type).
    pub amp: f32,
    /// q, k, v as slices of one packed `(batch, seqlen, 3, nheads, headdim)`
    /// buffer (only when seqlen_q == seqlen_k), and O in `(batch, nheads,
    /// seqlen, headdim)` memory order.
    pub strided: bool,
}

impl Case {
    pub fn new(batch: usize, nheads: usize, seqlen_q: usize, seqlen_k: usize, headdim: usize, causal: bool) -> Self {
        Self { batch, nheads, seqlen_q, seqlen_k, headdim, causal, softmax_scale: None, block: None, amp: 1.0, strided: false }
    }
    pub fn q_shape(&self) -> [usize; 4] {
        [self.batch, self.seqlen_q, self.nheads, self.headdim]
    }
    pub fn k_shape(&self) -> [usize; 4] {
        [self.batch, self.seqlen_k, self.nheads, self.headdim]
    }
    pub fn params(&self, loop_order: LoopOrder) -> ForwardParams {
        ForwardParams { causal: self.causal, softmax_scale: self.softmax_scale, loop_order, block: self.block, ..Default::default() }
    }
    /// A short description for the report lines.
    pub fn label(&self) -> String {
        let mut s = format!(
            "b{} h{} nq{} nk{} d{}{}",
            self.batch,
            self.nheads,
            self.seqlen_q,
            self.seqlen_k,
            self.headdim,
            if self.causal { " causal" } else { "" }
        );
        if let Some(sc) = self.softmax_scale {
            let _ = write!(s, " scale{sc}");
        }
        if let Some((br, bc)) = self.block {
            let _ = write!(s, " block{br}x{bc}");
        }
        if self.amp != 1.0 {
            let _ = write!(s, " amp{}", self.amp);
        }
        if self.strided {
            s += " strided";
        }
        s
    }
}

/// Inputs in the contiguous `(batch, seqlen, nheads, headdim)` layout, in
/// the element type `T`.
pub struct Inputs<T> {
    pub q: Array4<T>,
    pub k: Array4<T>,
    pub v: Array4<T>,
}

/// Values uniform in `[-amp, amp]`, drawn again until nonzero in `T`.
fn random_array<T: AttnElem>(s: [usize; 4], amp: f32, rng: &mut Rng) -> Array4<T> {
    Array4::from_shape_simple_fn((s[0], s[1], s[2], s[3]), || loop {
        let x = T::from_f32(rng.nonzero(amp));
        if x.to_f32() != 0.0 {
            return x;
        }
    })
}

impl<T: AttnElem> Inputs<T> {
    /// Fresh inputs for `c` (never zero in `T`).
    pub fn random(c: &Case, rng: &mut Rng) -> Self {
        Self {
            q: random_array(c.q_shape(), c.amp, rng),
            k: random_array(c.k_shape(), c.amp, rng),
            v: random_array(c.k_shape(), c.amp, rng),
        }
    }

    /// The largest `|q_i · k_j|` over every head, in f64 (the unscaled logits).
    pub fn max_abs_logit(&self) -> f64 {
        let (q, k) = (to64(&self.q), to64(&self.k));
        let mut max_logit = 0.0f64;
        for b in 0..q.dim().0 {
            for h in 0..q.dim().2 {
                for i in 0..q.dim().1 {
                    for j in 0..k.dim().1 {
                        let s: f64 = (0..q.dim().3).map(|c| q[[b, i, h, c]] * k[[b, j, h, c]]).sum();
                        max_logit = max_logit.max(s.abs());
                    }
                }
            }
        }
        max_logit
    }
}

/// `a` in f64 (exact).
pub fn to64<T: AttnElem>(a: &Array4<T>) -> Array4<f64> {
    a.mapv(|x| x.to_f32() as f64)
}

/// What the GPU produced, downloaded.
pub struct GpuOut<T> {
    pub o: Array4<T>,
    /// Natural-log logsumexp (for FA1 computed from l and m with `RowState::lse`).
    pub lse: Array3<f32>,
    /// FA1 only: l and m (m in base-2 units).
    pub l_m: Option<(Array3<f32>, Array3<f32>)>,
}

/// Packs q, k, v into one `(batch, seqlen, 3, nheads, headdim)` buffer
/// (the layout of a fused qkv projection); all three share one layout and
/// start at offsets 0, h·d and 2·h·d (16-byte aligned for the 16-bit types
/// when h·d is a multiple of 8).
fn pack_qkv<T: AttnElem>(x: &Inputs<T>) -> (Vec<T>, TensorLayout) {
    let (b, n, h, d) = x.q.dim();
    let mut buf = vec![T::from_f32(f32::NAN); b * n * 3 * h * d];
    for (t, a) in [&x.q, &x.k, &x.v].into_iter().enumerate() {
        for ((bi, i, hi, c), &val) in a.indexed_iter() {
            buf[(((bi * n + i) * 3 + t) * h + hi) * d + c] = val;
        }
    }
    (buf, TensorLayout::new([b, n, h, d], [n * 3 * h * d, 3 * h * d, d]))
}

/// Runs one loop order through `forward_into`, with every output poisoned
/// with NaN first.
pub fn run_gpu<T: AttnElem>(g: &Gpu, c: &Case, x: &Inputs<T>, loop_order: LoopOrder) -> Result<GpuOut<T>, FlashAttnError> {
    let s = &g.stream;
    let (b, nq, h, d) = (c.batch, c.seqlen_q, c.nheads, c.headdim);
    let nstats = b * h * nq;
    let params = c.params(loop_order);
    let mut o_dev: CudaSlice<T> = s.clone_htod(&vec![T::from_f32(f32::NAN); b * nq * h * d])?;
    // O in (batch, nheads, seqlen, headdim) memory order when strided.
    let o_layout = if c.strided {
        TensorLayout::new([b, nq, h, d], [h * nq * d, d, nq * d])
    } else {
        TensorLayout::contiguous([b, nq, h, d])
    };
    let mut l_dev = s.clone_htod(&vec![f32::NAN; nstats])?;
    let mut m_dev = s.clone_htod(&vec![f32::NAN; nstats])?;
    let stats = match loop_order {
        LoopOrder::Fa1 => StatsMut::Fa1 { l: l_dev.as_view_mut(), m: m_dev.as_view_mut() },
        _ => StatsMut::LogSumExp(l_dev.as_view_mut()),
    };
    if c.strided {
        let (buf, lay) = pack_qkv(x);
        let dev = s.clone_htod(&buf)?;
        let (hd, ntot) = (h * d, buf.len());
        let (qv, kv, vv) = (dev.slice(0..ntot), dev.slice(hd..ntot), dev.slice(2 * hd..ntot));
        g.fa.forward_into(
            s,
            Tensor::new(&qv, lay),
            Tensor::new(&kv, lay),
            Tensor::new(&vv, lay),
            TensorMut::new(&mut o_dev, o_layout),
            stats,
            &params,
        )?;
    } else {
        let q = s.clone_htod(x.q.as_slice().unwrap())?;
        let k = s.clone_htod(x.k.as_slice().unwrap())?;
        let v = s.clone_htod(x.v.as_slice().unwrap())?;
        g.fa.forward_into(
            s,
            Tensor::new(&q, TensorLayout::contiguous(c.q_shape())),
            Tensor::new(&k, TensorLayout::contiguous(c.k_shape())),
            Tensor::new(&v, TensorLayout::contiguous(c.k_shape())),
            TensorMut::new(&mut o_dev, o_layout),
            stats,
            &params,
        )?;
    }
    s.synchronize()?;
    let o_raw = s.clone_dtoh(&o_dev)?;
    let st = o_layout.strides;
    let o = Array4::from_shape_fn((b, nq, h, d), |(bi, i, hi, ci)| o_raw[bi * st[0] + i * st[1] + hi * st[2] + ci]);
    let l = Array3::from_shape_vec((b, h, nq), s.clone_dtoh(&l_dev)?).unwrap();
    let m = Array3::from_shape_vec((b, h, nq), s.clone_dtoh(&m_dev)?).unwrap();
    Ok(match loop_order {
        LoopOrder::Fa1 => {
            let lse = Array3::from_shape_fn((b, h, nq), |ix| RowState { m: m[ix], l: l[ix] }.lse());
            GpuOut { o, lse, l_m: Some((l, m)) }
        }
        _ => GpuOut { o, lse: l, l_m: None },
    })
}
