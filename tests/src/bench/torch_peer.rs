//! The PyTorch peers of the benchmarks: a Python script (embedded in the
//! binary) runs in a subprocess after our side has freed the GPU, on the same
//! problems with the same method. It reads a JSON config and writes a JSON
//! result, `{"available", "reason", "torch", "device", "results": [...]}`,
//! after every record (a crash keeps what was measured). Every script
//! imports `torch_common.py` (written beside it): the torch import and its
//! checks, the timing loop (`timed`) and the error notes, once for all.

use std::process::{Command, Stdio};

use serde_json::{Value, json};

/// `torch_common.py`: shared by every peer script.
pub const COMMON: &str = include_str!("torch_common.py");

/// What the peer reported.
#[derive(Debug, Default)]
pub struct Peer {
    pub available: bool,
    pub version: Option<String>,
    /// Why it is not available, or why its run ended early.
    pub reason: String,
    /// The records of `results`, in order.
    pub results: Vec<Value>,
}

/// Runs `script` (file name, text) with `python` on `config`; `tool` names
/// the temporary folder and the progress line. Never fails: a missing
/// Python or torch is a [`Peer`] that is not available, with the reason.
pub fn run(python: &str, tool: &str, script: (&str, &str), config: &Value) -> Peer {
    let dir = std::env::temp_dir().join(format!("{tool}-{}", std::process::id()));
    let go = || -> Result<Value, Box<dyn std::error::Error>> {
        std::fs::create_dir_all(&dir)?;
        let (path, cfg_path, res_path) = (
            dir.join(script.0),
            dir.join("config.json"),
            dir.join("result.json"),
        );
        std::fs::write(&path, script.1)?;
        std::fs::write(dir.join("torch_common.py"), COMMON)?;
        std::fs::write(&cfg_path, serde_json::to_vec(config)?)?;
        eprintln!("{tool}: running the PyTorch peers with {python}");
        let status = Command::new(python)
            .arg(&path)
            .arg(&cfg_path)
            .arg(&res_path)
            .env("PYTHONUNBUFFERED", "1")
            .env("PYTHONDONTWRITEBYTECODE", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::from(std::io::stderr()))
            .status()
            .map_err(|e| format!("cannot run `{python}`: {e}"))?;
        let text = std::fs::read_to_string(&res_path)
            .map_err(|e| format!("`{python}` exited with {status} and wrote no result ({e})"))?;
        let mut v: Value = serde_json::from_str(&text)?;
        if !status.success() {
            v["reason"] = json!(format!(
                "python exited with {status} (partial results kept)"
            ));
        }
        Ok(v)
    };
    let v = go();
    let _ = std::fs::remove_dir_all(&dir);
    match v {
        Ok(v) => Peer {
            available: v["available"].as_bool().unwrap_or(false),
            version: v["torch"].as_str().map(str::to_string),
            reason: v["reason"].as_str().unwrap_or("").to_string(),
            results: v["results"].as_array().cloned().unwrap_or_default(),
        },
        Err(e) => Peer {
            reason: e.to_string(),
            ..Default::default()
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_python_is_a_reason_not_an_error() {
        let p = run(
            "/nonexistent/python3",
            "torch-peer-test",
            ("x.py", ""),
            &json!({}),
        );
        assert!(!p.available && p.results.is_empty());
        assert!(p.reason.contains("cannot run"), "{}", p.reason);
    }

    #[test]
    fn results_of_a_script_are_read_back() {
        // Any python3 will do: the script needs no torch.
        if Command::new("python3")
            .args(["-c", "pass"])
            .status()
            .map_or(true, |s| !s.success())
        {
            println!("SKIPPED: no python3");
            return;
        }
        let script = "import json, sys\nimport torch_common\ncfg = json.load(open(sys.argv[1]))\n\
                      json.dump({'available': True, 'torch': 'x', 'reason': '', 'results': [{'ms': cfg['v']}]}, open(sys.argv[2], 'w'))\n";
        let p = run(
            "python3",
            "torch-peer-test",
            ("peer.py", script),
            &json!({"v": 1.5}),
        );
        assert!(p.available, "{}", p.reason);
        assert_eq!(p.results[0]["ms"].as_f64(), Some(1.5));
    }
}
