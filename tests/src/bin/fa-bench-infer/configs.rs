//! The rows of issue 8's benchmark: what runs (shapes, dtypes, masks), who
//! runs it (ours, and which PyTorch peers), and the FLOPs each is credited
//! with (4·H·L²·d per sequence, halved when causal; over the real tokens for
//! the varlen group, padded or not).

use flash_attn_tests::Rng;

use crate::Opts;

pub use flash_attn_tests::bench::Dtype;

/// The three tables of the report.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Group {
    Gqa,
    Varlen,
    HeadDim,
}

impl Group {
    pub fn key(self) -> &'static str {
        match self {
            Group::Gqa => "gqa",
            Group::Varlen => "varlen",
            Group::HeadDim => "headdim",
        }
    }
}

/// A dense `(b, n, h, d)` problem; k/v have `hk` heads (GQA when `hk < h`).
#[derive(Clone, Copy, Debug)]
pub struct Dense {
    pub b: usize,
    pub n: usize,
    pub h: usize,
    pub hk: usize,
    pub d: usize,
}

/// A packed batch: sequence `i` has `lens[i]` query and key tokens.
#[derive(Clone, Debug)]
pub struct Packed {
    pub lens: Vec<usize>,
    pub h: usize,
    pub d: usize,
}

impl Packed {
    pub fn total(&self) -> usize {
        self.lens.iter().sum()
    }
    pub fn max(&self) -> usize {
        self.lens.iter().copied().max().unwrap_or(0)
    }
    /// `cu_seqlens`: batch + 1 prefix sums from 0.
    pub fn cu(&self) -> Vec<i32> {
        let mut cu = vec![0i32];
        for &l in &self.lens {
            cu.push(cu.last().unwrap() + l as i32);
        }
        cu
    }
}

#[derive(Clone, Debug)]
pub enum Shape {
    Dense(Dense),
    Varlen(Packed),
}

impl Shape {
    /// (q elements, k/v elements, lse floats).
    pub fn elems(&self) -> (usize, usize, usize) {
        match self {
            Shape::Dense(s) => (s.b * s.n * s.h * s.d, s.b * s.n * s.hk * s.d, s.b * s.h * s.n),
            Shape::Varlen(p) => (p.total() * p.h * p.d, p.total() * p.h * p.d, p.total() * p.h),
        }
    }
    pub fn describe(&self) -> String {
        match self {
            Shape::Dense(s) if s.hk != s.h => format!("B={} N={} H={}/{}kv d={}", s.b, s.n, s.h, s.hk, s.d),
            Shape::Dense(s) => format!("B={} N={} H={} d={}", s.b, s.n, s.h, s.d),
            Shape::Varlen(p) => format!("packed {} seqs, {} tokens, max {} H={} d={}", p.lens.len(), p.total(), p.max(), p.h, p.d),
        }
    }
}

/// One measured problem. `ours` says whether our library runs it; `torch`
/// lists the PyTorch peers that run the very same problem.
#[derive(Clone, Debug)]
pub struct Case {
    pub id: String,
    pub group: Group,
    /// What the row is, e.g. "GQA 32q/8kv", "padded to the longest".
    pub what: String,
    pub dtype: Dtype,
    pub causal: bool,
    pub shape: Shape,
    /// FLOPs credited: the real tokens' 4·H·ΣL²·d (halved when causal).
    pub flops: f64,
    pub ours: bool,
    pub torch: Vec<&'static str>,
    /// `ForwardParams::block` of our call (`None`: the library's default).
    pub block: Option<(usize, usize)>,
}

fn attn_flops(h: usize, d: usize, lens: impl IntoIterator<Item = usize>, causal: bool) -> f64 {
    let f: f64 = lens.into_iter().map(|l| 4.0 * h as f64 * (l as f64).powi(2) * d as f64).sum();
    if causal { f / 2.0 } else { f }
}

fn dense_flops(s: &Dense, causal: bool) -> f64 {
    attn_flops(s.h, s.d, std::iter::repeat_n(s.n, s.b), causal)
}

/// The varlen batch: 16 lengths uniform in 128..=8192 from a fixed seed.
pub fn varlen_lens(o: &Opts) -> Vec<usize> {
    let mut r = Rng::with_seed(o.varlen_seed);
    (0..o.varlen_batch).map(|_| 128 + r.below(8192 - 128 + 1)).collect()
}

/// (Br, Bc) of the bf16 varlen kernel the library picks on the H100 for
/// head dim `d`, where a dense kernel with that tile exists too.
fn varlen_tile(d: usize) -> Option<(usize, usize)> {
    use flash_attn::advanced::dispatch::Features;
    use flash_attn::advanced::tc::{TC_KERNELS, TcKernel, TcLoop};
    let v = TcKernel::default_for(TcLoop::Fa2, true, d, Features { varlen: true, ..Default::default() })?;
    let dense = TC_KERNELS.iter().any(|k| k.loop_order == TcLoop::Fa2 && k.bf16 && !k.varlen && !k.mods && !k.decode && k.d == d && k.br() == v.br() && k.bc == v.bc);
    dense.then_some((v.br(), v.bc))
}

pub const GQA_TORCH: &[&str] = &["torch-flash", "torch-cudnn", "torch-efficient"];
const MHA_TORCH: &[&str] = &["torch-flash", "torch-cudnn"];
const PAD_TORCH: &[&str] = &["torch-flash", "torch-cudnn"];
const PACKED_TORCH: &[&str] = &["torch-njt-flash", "torch-varlen-aten"];

pub fn cases(o: &Opts) -> Vec<Case> {
    let mut v = Vec::new();
    let tokens = o.tokens;
    if o.groups.contains(&Group::Gqa) {
        for &n in &[4096, 16384] {
            let (h, d) = (32, 128);
            for (hk, what, torch) in [(8, "GQA 32q/8kv", GQA_TORCH), (32, "MHA 32", MHA_TORCH)] {
                let s = Dense { b: tokens / n, n, h, hk, d };
                v.push(Case {
                    id: format!("gqa-n{n}-hk{hk}"),
                    group: Group::Gqa,
                    what: what.into(),
                    dtype: Dtype::Bf16,
                    causal: true,
                    flops: dense_flops(&s, true),
                    shape: Shape::Dense(s),
                    ours: true,
                    torch: torch.to_vec(),
                    block: None,
                });
            }
        }
    }
    if o.groups.contains(&Group::Varlen) {
        let lens = varlen_lens(o);
        let (h, d) = (32, 128);
        let p = Packed { lens: lens.clone(), h, d };
        let (b, total) = (lens.len(), p.total());
        let mean = (total as f64 / b as f64).round() as usize;
        // Same FLOPs as the packed batch: N = sqrt(ΣL² / B), to a multiple of 64.
        let rms = ((lens.iter().map(|&l| (l * l) as f64).sum::<f64>() / b as f64).sqrt() / 64.0).round() as usize * 64;
        for causal in [false, true] {
            let real = attn_flops(h, d, lens.iter().copied(), causal);
            let c = if causal { "causal" } else { "full" };
            let mut push = |id: &str, what: String, shape: Shape, flops: f64, torch: &[&'static str], block| {
                v.push(Case {
                    id: format!("varlen-{c}-{id}"),
                    group: Group::Varlen,
                    what,
                    dtype: Dtype::Bf16,
                    causal,
                    shape,
                    flops,
                    ours: true,
                    torch: torch.to_vec(),
                    block,
                });
            };
            push("packed", "packed (varlen)".into(), Shape::Varlen(p.clone()), real, PACKED_TORCH, None);
            let pad = Dense { b, n: p.max(), h, hk: h, d };
            push("padded", "padded to the longest".into(), Shape::Dense(pad), real, PAD_TORCH, None);
            let dm = Dense { b, n: mean, h, hk: h, d };
            push("dense-mean", format!("dense, mean length {mean} (same tokens)"), Shape::Dense(dm), dense_flops(&dm, causal), &[], None);
            let dr = Dense { b, n: rms, h, hk: h, d };
            push("dense-rms", format!("dense, RMS length {rms} (same FLOPs)"), Shape::Dense(dr), dense_flops(&dr, causal), &[], None);
            // Diagnostics of the gap to dense: the varlen kernel on equal
            // lengths (packing alone), and the dense kernel with the varlen
            // kernel's tile (the tile alone).
            let uni = Packed { lens: vec![mean; b], h, d };
            let uf = attn_flops(h, d, uni.lens.iter().copied(), causal);
            push("packed-uniform", format!("packed, {b} × mean length {mean} (diagnostic)"), Shape::Varlen(uni), uf, &[], None);
            if let Some(t) = varlen_tile(d) {
                let what = format!("dense, mean length, varlen tile Br×Bc = {}×{} (diagnostic)", t.0, t.1);
                push("dense-mean-vtile", what, Shape::Dense(dm), dense_flops(&dm, causal), &[], Some(t));
            }
        }
    }
    if o.groups.contains(&Group::HeadDim) {
        let n = 4096;
        for dtype in [Dtype::Bf16, Dtype::F16] {
            for &d in &[32, 40, 80, 96, 160, 192, 224] {
                let h = (o.hidden as f64 / d as f64).round() as usize;
                for causal in [false, true] {
                    let s = Dense { b: tokens / n, n, h, hk: h, d };
                    v.push(Case {
                        id: format!("hdim-{}-d{d}-{}", dtype.name(), if causal { "causal" } else { "full" }),
                        group: Group::HeadDim,
                        what: format!("d={d}"),
                        dtype,
                        causal,
                        flops: dense_flops(&s, causal),
                        shape: Shape::Dense(s),
                        ours: true,
                        torch: vec!["torch-flash"],
                        block: None,
                    });
                }
            }
        }
    }
    v
}
