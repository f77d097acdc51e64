//! The PyTorch side: `torch_peer.py` (embedded) runs in a `python3`
//! subprocess after our side has freed the GPU, on the same problems, with
//! the same method (`flash_attn_tests::bench::torch_peer`: the subprocess,
//! and `torch_common.py`, the timing loop shared by every benchmark).

use std::collections::BTreeMap;

use flash_attn_tests::bench::torch_peer;
use serde_json::{Value, json};

use crate::Opts;
use crate::configs::{Case, Shape};
use crate::measure::Meas;

const SCRIPT: &str = include_str!("torch_peer.py");

#[derive(Debug, Default)]
pub struct TorchInfo {
    pub available: bool,
    pub version: Option<String>,
    pub reason: String,
    /// (case id, implementation) → measurement.
    pub results: BTreeMap<(String, String), Meas>,
}

fn case_json(c: &Case) -> Value {
    let mut v = json!({"id": c.id, "dtype": c.dtype.name(), "causal": c.causal, "impls": c.torch});
    match &c.shape {
        Shape::Dense(s) => {
            v["kind"] = json!("dense");
            for (k, x) in [("b", s.b), ("n", s.n), ("h", s.h), ("hk", s.hk), ("d", s.d)] {
                v[k] = json!(x);
            }
        }
        Shape::Varlen(p) => {
            v["kind"] = json!("varlen");
            v["lens"] = json!(p.lens);
            v["h"] = json!(p.h);
            v["d"] = json!(p.d);
        }
    }
    v
}

pub fn run(o: &Opts, cases: &[Case]) -> TorchInfo {
    let cases: Vec<&Case> = cases.iter().filter(|c| !c.torch.is_empty()).collect();
    if !o.torch || cases.is_empty() {
        let reason = if o.torch { "no PyTorch peer selected" } else { "--no-torch" };
        return TorchInfo { reason: reason.into(), ..Default::default() };
    }
    let cfg = json!({
        "sets": o.sets, "warmup": o.warmup, "reps": o.reps, "budget_s": o.budget_s, "seed": o.seed,
        "cases": cases.iter().map(|c| case_json(c)).collect::<Vec<_>>(),
    });
    let peer = torch_peer::run(&o.python, "fa-bench-infer", ("torch_peer.py", SCRIPT), &cfg);
    let mut results = BTreeMap::new();
    for r in &peer.results {
        let (Some(id), Some(imp)) = (r["id"].as_str(), r["impl"].as_str()) else { continue };
        results.insert((id.to_string(), imp.to_string()), Meas::from_peer(r));
    }
    TorchInfo { available: peer.available, version: peer.version, reason: peer.reason, results }
}
