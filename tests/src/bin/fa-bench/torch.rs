//! The PyTorch side: `bench_torch.py` (embedded) runs SDPA's backends in a
//! subprocess after our side has freed the GPU, on the same configurations
//! with the same method (`flash_attn_tests::bench::torch_peer`).

use flash_attn_tests::bench::torch_peer;
use flash_attn_tests::bench::{Dtype, Meas};
use serde_json::json;

use crate::configs::{Cfg, IMPLS};
use crate::measure::Results;
use crate::opts::Opts;

const SCRIPT: &str = include_str!("bench_torch.py");

pub struct TorchInfo {
    pub available: bool,
    pub version: Option<String>,
    pub reason: String,
}

impl TorchInfo {
    pub fn not_run(reason: &str) -> Self {
        TorchInfo {
            available: false,
            version: None,
            reason: reason.into(),
        }
    }
}

pub fn run_torch(o: &Opts, cfgs: &[Cfg], results: &mut Results) -> TorchInfo {
    let torch_impls: Vec<&str> = o
        .impls
        .iter()
        .copied()
        .filter(|k| k.starts_with("torch-"))
        .collect();
    if torch_impls.is_empty() {
        return TorchInfo::not_run("no torch backend selected");
    }
    if !o.torch {
        return TorchInfo::not_run("--no-torch");
    }
    let cfg = json!({
        "tokens": o.tokens, "hidden": o.hidden, "sets": o.sets, "warmup": o.warmup, "reps": o.reps,
        "budget_s": o.budget_s, "mem_cap_bytes": o.mem_cap_gb * 1e9, "seed": o.seed, "impls": torch_impls,
        "configs": cfgs.iter().map(|c| json!({"dtype": c.dtype.name(), "d": c.d, "causal": c.causal, "seqlen": c.n})).collect::<Vec<_>>(),
    });
    eprintln!(
        "fa-bench: PyTorch SDPA backends: {}",
        torch_impls.join(", ")
    );
    let peer = torch_peer::run(&o.python, "fa-bench", ("bench_torch.py", SCRIPT), &cfg);
    for r in &peer.results {
        let c = Cfg {
            dtype: if r["dtype"] == "bf16" {
                Dtype::Bf16
            } else {
                Dtype::F16
            },
            d: r["d"].as_u64().unwrap_or(0) as usize,
            causal: r["causal"].as_bool().unwrap_or(false),
            n: r["seqlen"].as_u64().unwrap_or(0) as usize,
        };
        let Some(imp) = IMPLS.iter().find(|i| Some(i.key) == r["impl"].as_str()) else {
            continue;
        };
        results
            .entry(c)
            .or_default()
            .insert(imp.key, Meas::from_peer(r));
    }
    TorchInfo {
        available: peer.available,
        version: peer.version,
        reason: peer.reason,
    }
}
