//! `cargo xtask stage [DIR]`: one folder that runs on a machine with only
//! the NVIDIA driver (no Rust, no CUDA toolkit): the release test binaries,
//! the `fa-run`, `fa-bench`, `fa-bench-infer` and `fa-bench-decode`
//! binaries, and a `run.sh` that runs the GPU tests with `FA_REQUIRE_GPU=1`
//! (a missing GPU fails), then the main job, then (with `--bench`) the
//! prefill benchmarks, or (with `--bench-infer` / `--bench-decode`) issue 8's
//! rows or the decode grid alone; it exits non-zero if anything fails and
//! ends with a one-line summary. Default `DIR`: `bundle/`.
//!
//! The binaries load `libcuda` at run time (cudarc's dynamic loading) and
//! embed their PTX, so the folder is self-contained; copy it anywhere.

use std::path::PathBuf;
use std::process::Stdio;

use crate::cargo;

const HELP: &str = "usage: cargo xtask stage [DIR]   (default DIR: bundle/)

Builds in release and copies into DIR:
  tests/<name>   every test binary of the workspace (cargo test --release --no-run)
  fa-run         the main job (cargo xtask run)
  fa-bench       the benchmark (cargo xtask bench)
  fa-bench-infer GQA / varlen / head-dim rows (cargo xtask bench-infer)
  fa-bench-decode  the decode grid (fa-bench-decode [OUT] [--quick] ...)
  run.sh         runs every test binary with FA_REQUIRE_GPU=1, then fa-run;
                 `./run.sh --bench [fa-bench args]` also runs both prefill
                 benchmarks (fa-bench-infer with its defaults, into bench-infer-out/);
                 `./run.sh --bench-infer [fa-bench-infer args]` runs only it;
                 `./run.sh --bench-decode [OUT] [fa-bench-decode args]` the decode grid.
                 Exit status non-zero if anything failed; last line: a summary.";

const RUN_SH: &str = r#"#!/usr/bin/env bash
# Staged by `cargo xtask stage`: runs on a machine with only the NVIDIA driver.
# ./run.sh [--bench [fa-bench args...] | --bench-infer [fa-bench-infer args...] | --bench-decode [OUT] [fa-bench-decode args...]]
set -u
cd "$(dirname "$0")"
export FA_REQUIRE_GPU=1
pass=0; fail=0; failed=()
step() { # name, command...
  local name=$1; shift
  echo "=== $name"
  if "$@"; then pass=$((pass + 1)); else fail=$((fail + 1)); failed+=("$name"); fi
}
for t in tests/*; do
  step "test $(basename "$t")" "$t" --test-threads 1
done
step "fa-run (main job)" ./fa-run
if [ "${1:-}" = "--bench" ]; then
  shift
  step "fa-bench" ./fa-bench "$@"
  step "fa-bench-infer" ./fa-bench-infer
elif [ "${1:-}" = "--bench-infer" ]; then
  shift
  step "fa-bench-infer" ./fa-bench-infer "$@"
elif [ "${1:-}" = "--bench-decode" ]; then
  shift
  step "fa-bench-decode" ./fa-bench-decode "$@"
fi
if [ "$fail" -eq 0 ]; then
  echo "stage: $pass passed, 0 failed"
else
  echo "stage: failed steps: ${failed[*]}"
  echo "stage: $pass passed, $fail failed"
  exit 1
fi
"#;

pub fn main(args: &[String]) -> Result<(), String> {
    if args.iter().any(|a| a == "-h" || a == "--help") {
        println!("{HELP}");
        return Ok(());
    }
    if args.len() > 1 {
        return Err(format!("expected at most one argument (DIR), got {args:?}\n\n{HELP}"));
    }
    let dir = args.first().map(PathBuf::from).unwrap_or_else(|| cargo::root().join("bundle"));
    cargo::ensure_rust_src()?;

    // Test binaries: their paths are the `"executable"` of the JSON messages.
    let mut cmd = cargo::cargo();
    cmd.args(["test", "--release", "--workspace", "--no-run", "--message-format=json"]).stderr(Stdio::inherit());
    let shown = cargo::show(&cmd);
    let out = cmd.output().map_err(|e| format!("cannot run `{shown}`: {e}"))?;
    if !out.status.success() {
        return Err(format!("`{shown}` failed ({})", out.status));
    }
    let tests: Vec<PathBuf> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| is_test_harness(l))
        .filter_map(|l| json_string(l, "executable"))
        .map(PathBuf::from)
        .collect();
    if tests.is_empty() {
        return Err("cargo built no test binary".into());
    }

    // The run and bench binaries.
    let mut cmd = cargo::cargo();
    cmd.args(["build", "--release", "--package", "flash-attn-tests", "--bin", "fa-run", "--bin", "fa-bench", "--bin", "fa-bench-infer", "--bin", "fa-bench-decode"]);
    cargo::status(cmd)?;
    let release = target_dir()?.join("release");

    let tests_dir = dir.join("tests");
    std::fs::create_dir_all(&tests_dir).map_err(|e| format!("create {}: {e}", tests_dir.display()))?;
    for t in &tests {
        // `name-<hash>` → `name`
        let file = t.file_name().and_then(|f| f.to_str()).unwrap_or("test");
        let name = file.rsplit_once('-').map(|(n, _)| n).unwrap_or(file);
        copy(t, &tests_dir.join(name))?;
    }
    for b in ["fa-run", "fa-bench", "fa-bench-infer", "fa-bench-decode"] {
        copy(&release.join(b), &dir.join(b))?;
    }
    let run_sh = dir.join("run.sh");
    std::fs::write(&run_sh, RUN_SH).map_err(|e| format!("write {}: {e}", run_sh.display()))?;
    set_executable(&run_sh)?;
    println!("stage: {} test binaries, fa-run, fa-bench, fa-bench-infer, fa-bench-decode and run.sh in {}", tests.len(), dir.display());
    Ok(())
}

/// Whether a compiler-artifact line is a test harness: its `"profile"`
/// object says `"test":true` (the `"target"` object has a `"test"` field too,
/// true for bins, which are not harnesses).
fn is_test_harness(line: &str) -> bool {
    let Some(start) = line.find("\"profile\":{") else { return false };
    let profile = &line[start..];
    let end = profile.find('}').unwrap_or(profile.len());
    profile[..end].contains("\"test\":true")
}

/// The value of `"key":"..."` in one line of cargo's JSON output (cargo
/// escapes only `"` and `\` in paths, which we do not expect).
fn json_string(line: &str, key: &str) -> Option<String> {
    let pat = format!("\"{key}\":\"");
    let start = line.find(&pat)? + pat.len();
    let end = line[start..].find('"')? + start;
    Some(line[start..end].replace("\\\\", "\\"))
}

/// The workspace's target directory (honours `CARGO_TARGET_DIR`).
fn target_dir() -> Result<PathBuf, String> {
    let mut cmd = cargo::cargo();
    cmd.args(["metadata", "--format-version", "1", "--no-deps"]);
    let out = cmd.output().map_err(|e| format!("cannot run cargo metadata: {e}"))?;
    let text = String::from_utf8_lossy(&out.stdout);
    json_string(&text, "target_directory").map(PathBuf::from).ok_or_else(|| "cargo metadata: no target_directory".into())
}

fn copy(from: &std::path::Path, to: &std::path::Path) -> Result<(), String> {
    std::fs::copy(from, to).map(|_| ()).map_err(|e| format!("copy {} -> {}: {e}", from.display(), to.display()))?;
    set_executable(to)
}

fn set_executable(p: &std::path::Path) -> Result<(), String> {
    use std::os::unix::fs::PermissionsExt;
    let mut perm = std::fs::metadata(p).map_err(|e| format!("{}: {e}", p.display()))?.permissions();
    perm.set_mode(0o755);
    std::fs::set_permissions(p, perm).map_err(|e| format!("{}: {e}", p.display()))
}
