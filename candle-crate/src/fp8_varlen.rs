//! Variable-length FP8 (e4m3) attention: [`crate::flash_attn_fp8`] with the
//! sequences packed along the first axis, as [`crate::flash_attn_varlen`]
//! takes them: `q` `(total_q, num_heads_q, head_size)`, `k`, `v`
//! `(total_kv, num_heads_kv, head_size)`, all F8E4M3, cumulative lengths
//! `seqlens_q`, `seqlens_k` (U32/I32, `batch + 1` entries from 0). A
//! `(batch, nheads_k)` descale factor indexes by sequence.
//!
//! CUDA: the core's `forward_fp8_varlen_into` on candle's stream (prefix
//! sums read in place). CPU: the inputs dequantized per sequence in f64 and
//! the reference's `attention_varlen`.

use candle_core::op::BackpropOp;
use candle_core::{CpuStorage, DType, Layout, Result, Storage, Tensor};
use flash_attn::reference;
use flash_attn::reference::fp8::e4m3_to_f32;
use ndarray::{Array3, Axis};

use crate::check::{self, Checked, core_err, err};
use crate::cpu;
use crate::fp8::{Descales, FlashAttnFp8, Fp8Descales, check_descales, check_dtypes, check_headdim, codes, host_f32, out_storages};
use crate::storage::Held;
use crate::varlen::{FlashAttnVarLen, VarlenIdx};

impl FlashAttnFp8 {
    /// The varlen form of [`FlashAttnFp8::forward_with_lse`] (module docs):
    /// O `(total_q, num_heads_q, head_size)` in [`FlashAttnFp8::out_dtype`]
    /// and the logsumexp, f32 `(num_heads_q, total_q)`.
    #[allow(clippy::too_many_arguments)]
    pub fn forward_varlen_with_lse(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        seqlens_q: &Tensor,
        seqlens_k: &Tensor,
        max_seqlen_q: usize,
        max_seqlen_k: usize,
    ) -> Result<(Tensor, Tensor)> {
        let descales = self.descales();
        let mut all = vec![("q", q), ("k", k), ("v", v), ("seqlens_q", seqlens_q), ("seqlens_k", seqlens_k)];
        all.extend(descales.named().into_iter().filter_map(|(n, t)| t.map(|t| (n, t))));
        crate::check_devices(&all)?;
        check_dtypes(q.dtype(), k.dtype(), v.dtype(), self.out_dtype)?;
        let opts = check::Options {
            softmax_scale: self.softmax_scale,
            window_size_left: self.window_size_left,
            window_size_right: self.window_size_right,
            softcap: None,
        };
        let op = FlashAttnVarLen::packed(opts, seqlens_q, seqlens_k, (max_seqlen_q, max_seqlen_k));
        let (c, idx) = op.check(q.layout(), k.layout(), v.layout())?;
        check_headdim("q", c.q.headdim())?;
        let d = check_descales(&descales, idx.batch, c.k.nheads())?;
        let held = [Held::new("q", q), Held::new("k", k), Held::new("v", v)];
        let (o, lse) = match q.device() {
            candle_core::Device::Cpu => {
                let (o, lse) = cpu_varlen(&c, &idx, &d, self.out_dtype, [held[0].cpu()?, held[1].cpu()?, held[2].cpu()?])?;
                (Storage::Cpu(o), Storage::Cpu(lse))
            }
            #[cfg(feature = "cuda")]
            candle_core::Device::Cuda(_) => {
                let (o, lse) = crate::cuda_fp8::forward_varlen(&c, &idx, &d, self.out_dtype, [held[0].cuda()?, held[1].cuda()?, held[2].cuda()?])?;
                (Storage::Cuda(o), Storage::Cuda(lse))
            }
            dev => return Err(err(format_args!("`q` is on {:?}: FP8 attention runs on the CPU and on CUDA (feature `cuda`)", dev.location()))),
        };
        let [_, t, h, dd] = c.q.shape;
        let o = Tensor::from_storage(o, (t, h, dd), BackpropOp::none(), false);
        let lse = Tensor::from_storage(lse, (h, t), BackpropOp::none(), false);
        Ok((o, lse))
    }
}

/// Variable-length [`crate::flash_attn_fp8`] (see the module docs): q
/// `(total_q, num_heads_q, head_size)`, k, v `(total_kv, num_heads_kv,
/// head_size)`, F8E4M3; `seqlens_q`, `seqlens_k` cumulative U32 `(batch +
/// 1)`; descale factors `()`/`(1)` or `(batch, num_heads_kv)`. Returns
/// `(total_q, num_heads_q, head_size)` in `out_dtype` (bf16 or f16).
#[allow(clippy::too_many_arguments)]
pub fn flash_attn_fp8_varlen(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    seqlens_q: &Tensor,
    seqlens_k: &Tensor,
    max_seqlen_q: usize,
    max_seqlen_k: usize,
    softmax_scale: f32,
    causal: bool,
    descales: Fp8Descales<'_>,
    out_dtype: DType,
) -> Result<Tensor> {
    let (l, r) = crate::causal_window(causal);
    flash_attn_fp8_varlen_windowed(q, k, v, seqlens_q, seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, l, r, descales, out_dtype)
}

/// [`flash_attn_fp8_varlen`] with a sliding window (as [`crate::flash_attn_fp8_windowed`]).
#[allow(clippy::too_many_arguments)]
pub fn flash_attn_fp8_varlen_windowed(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    seqlens_q: &Tensor,
    seqlens_k: &Tensor,
    max_seqlen_q: usize,
    max_seqlen_k: usize,
    softmax_scale: f32,
    window_size_left: Option<usize>,
    window_size_right: Option<usize>,
    descales: Fp8Descales<'_>,
    out_dtype: DType,
) -> Result<Tensor> {
    let op = FlashAttnFp8 {
        softmax_scale,
        window_size_left,
        window_size_right,
        q_descale: descales.q_descale.cloned(),
        k_descale: descales.k_descale.cloned(),
        v_descale: descales.v_descale.cloned(),
        out_dtype,
    };
    Ok(op.forward_varlen_with_lse(q, k, v, seqlens_q, seqlens_k, max_seqlen_q, max_seqlen_k)?.0)
}

/// Packed codes `(total, nheads, d)` dequantized in f64: token `t` of
/// sequence `b` (`cu[b] ≤ t < cu[b + 1]`) and head `h` times
/// `scales[b · nheads_k + h / group]` (or the one scale); tokens outside
/// every sequence (never read) times 1.
fn dequant_packed(codes: &Array3<u8>, scales: Option<&[f32]>, cu: &[i32], nheads_k: usize, group: usize) -> Array3<f64> {
    let mut out = codes.mapv(|c| e4m3_to_f32(c) as f64);
    let Some(s) = scales else { return out };
    let total = out.dim().0;
    for b in 0..cu.len().saturating_sub(1) {
        let (lo, hi) = ((cu[b].max(0) as usize).min(total), (cu[b + 1].max(0) as usize).min(total));
        for t in lo..hi.max(lo) {
            for (h, mut row) in out.index_axis_mut(Axis(0), t).outer_iter_mut().enumerate() {
                let sc = if s.len() == 1 { s[0] } else { s[b * nheads_k + h / group] };
                row.mapv_inplace(|x| x * sc as f64);
            }
        }
    }
    out
}

fn cpu_varlen(c: &Checked, idx: &VarlenIdx<'_>, d: &Descales<'_>, out: DType, qkv: [(&CpuStorage, &Layout); 3]) -> Result<(CpuStorage, CpuStorage)> {
    let [(q, q_l), (k, k_l), (v, v_l)] = qkv;
    let (cu_q, cu_k) = (cpu::host_i32("seqlens_q", idx.seqlens_q)?, cpu::host_i32("seqlens_k", idx.seqlens_k)?);
    let [qs, ks, vs] = d.given.map(|(n, t)| t.map(|t| host_f32(n, t)).transpose());
    let (qs, ks, vs) = (qs?, ks?, vs?);
    for (argument, s) in [("q_descale", &qs), ("k_descale", &ks), ("v_descale", &vs)] {
        if let Some(x) = s.iter().flatten().find(|x| !(x.is_finite() && **x > 0.0)) {
            return Err(err(format_args!("`{argument}`: {x} is not a finite positive scale")));
        }
    }
    let packed = |name: &str, s: &CpuStorage, l: &Layout, tl| -> Result<Array3<u8>> { Ok(codes(name, s, l, tl)?.index_axis_move(Axis(0), 0)) };
    let (q8, k8, v8) = (packed("q", q, q_l, &c.q)?, packed("k", k, k_l, &c.k)?, packed("v", v, v_l, &c.v)?);
    let hk = c.k.nheads();
    let group = c.q.nheads() / hk;
    let qd = dequant_packed(&q8, qs.as_deref(), &cu_q, hk, group);
    let kd = dequant_packed(&k8, ks.as_deref(), &cu_k, hk, 1);
    let vd = dequant_packed(&v8, vs.as_deref(), &cu_k, hk, 1);
    let (max_q, max_k) = idx.max_seqlen;
    let r = reference::attention_varlen::<f64>(qd.view(), kd.view(), vd.view(), &cu_q, &cu_k, None, max_q, max_k, &c.params, None).map_err(core_err)?;
    out_storages(&r.o, &r.lse, out)
}
