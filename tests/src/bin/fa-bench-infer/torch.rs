//! The PyTorch side: `torch_peer.py` (embedded) runs in a `python3`
//! subprocess after our side has freed the GPU, on the same problems, with
//! the same method; it reads a JSON config and writes a JSON result.

use std::collections::BTreeMap;
use std::process::{Command, Stdio};

use serde_json::{Value, json};

use crate::Opts;
use crate::configs::{Case, Shape};
use crate::measure::{Meas, Res};

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
    let mut info = TorchInfo::default();
    let cases: Vec<&Case> = cases.iter().filter(|c| !c.torch.is_empty()).collect();
    if !o.torch || cases.is_empty() {
        info.reason = if o.torch { "no PyTorch peer selected".into() } else { "--no-torch".into() };
        return info;
    }
    let dir = std::env::temp_dir().join(format!("fa-bench-infer-{}", std::process::id()));
    let go = || -> Res<Value> {
        std::fs::create_dir_all(&dir)?;
        let (script, cfg_path, res_path) = (dir.join("torch_peer.py"), dir.join("config.json"), dir.join("result.json"));
        std::fs::write(&script, SCRIPT)?;
        let cfg = json!({
            "sets": o.sets, "warmup": o.warmup, "reps": o.reps, "budget_s": o.budget_s, "seed": o.seed,
            "cases": cases.iter().map(|c| case_json(c)).collect::<Vec<_>>(),
        });
        std::fs::write(&cfg_path, serde_json::to_vec(&cfg)?)?;
        eprintln!("fa-bench-infer: running the PyTorch peers with {}", o.python);
        let status = Command::new(&o.python)
            .arg(&script)
            .arg(&cfg_path)
            .arg(&res_path)
            .env("PYTHONUNBUFFERED", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::from(std::io::stderr()))
            .status()
            .map_err(|e| format!("cannot run `{}`: {e}", o.python))?;
        let text = std::fs::read_to_string(&res_path)
            .map_err(|e| format!("`{}` exited with {status} and wrote no result ({e})", o.python))?;
        let mut v: Value = serde_json::from_str(&text)?;
        if !status.success() {
            v["reason"] = json!(format!("python exited with {status} (partial results kept)"));
        }
        Ok(v)
    };
    let v = go();
    let _ = std::fs::remove_dir_all(&dir);
    let v = match v {
        Ok(v) => v,
        Err(e) => {
            info.reason = e.to_string();
            return info;
        }
    };
    info.available = v["available"].as_bool().unwrap_or(false);
    info.version = v["torch"].as_str().map(str::to_string);
    info.reason = v["reason"].as_str().unwrap_or("").to_string();
    for r in v["results"].as_array().into_iter().flatten() {
        let (Some(id), Some(imp)) = (r["id"].as_str(), r["impl"].as_str()) else { continue };
        let m = Meas {
            ms: r["ms"].as_f64(),
            min_ms: r["min_ms"].as_f64().unwrap_or(0.0),
            max_ms: r["max_ms"].as_f64().unwrap_or(0.0),
            reps: r["reps"].as_u64().unwrap_or(0) as usize,
            note: r["note"].as_str().unwrap_or("").to_string(),
        };
        info.results.insert((id.to_string(), imp.to_string()), m);
    }
    info
}
