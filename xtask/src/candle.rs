//! `cargo xtask candle`: the candle adapter (`candle-crate/`, its own
//! workspace, kept out of the main build because candle's CUDA backend
//! needs the CUDA toolkit to build).
//!
//! * `cargo xtask candle`: the CPU variant: `cargo test --locked` of
//!   flash-attn-candle over candle's CPU backend (every op through
//!   `cpu_fwd`, our CPU reference, against candle's attention). No toolkit,
//!   no GPU; CI runs this.
//! * `cargo xtask candle --cuda`: installs the CUDA 13.0 pieces from PyPI
//!   (`scripts/cuda-toolkit.sh`), builds with candle's CUDA backend
//!   (`candle-crate/target/cuda`), then on a GPU machine runs the tests with
//!   `FA_REQUIRE_GPU=1` and `llama-check --bench`; without a GPU it runs the
//!   tests on the CPU and `llama-check --device cpu`: candle-transformers'
//!   Llama through the `[patch.crates-io]` drop-in, on `cpu_fwd`.
//! * `cargo xtask candle --stage DIR`: the `--cuda` build's test binaries,
//!   `llama-check`, the training example `train_gpt` and a `run.sh` in DIR,
//!   for a GPU machine with a CUDA 13 driver and libraries (no Rust needed
//!   there). `run.sh` runs the tests and llama-check; `run.sh --train`
//!   runs `train_gpt --device cuda` after them.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::cargo;

const HELP: &str = "\
usage: cargo xtask candle [--cuda | --stage DIR]

  (none)        CPU: test flash-attn-candle on candle's CPU backend (no CUDA toolkit)
  --cuda        install the CUDA 13.0 toolkit pieces from PyPI (scripts/cuda-toolkit.sh),
                build with candle's CUDA backend, run the tests and llama-check
                (on the GPU with --bench if there is one, else on the CPU)
  --stage DIR   the --cuda build's tests, llama-check, train_gpt and run.sh in DIR for a GPU machine
                (run.sh --train also runs train_gpt --device cuda)";

/// The run script of a staged folder: CUDA libraries from the machine
/// (driver, `/usr/local/cuda`, or pip's nvidia-* wheels), the GPU tests,
/// then the Llama comparison and benchmark.
const RUN_SH: &str = r#"#!/usr/bin/env bash
# Runs the staged candle adapter on a GPU machine: the adapter's tests with
# FA_REQUIRE_GPU=1, then llama-check --bench (candle-transformers' Llama on
# candle's attention vs ours, logits compared; prefill/decode timings).
# `run.sh --train [ARGS]`: then train_gpt --device cuda [ARGS] (the training
# proof: our attention vs candle's from one initialization, loss curves).
set -uo pipefail
cd "$(dirname "$0")"
train=0
if [[ "${1:-}" == "--train" ]]; then train=1; shift; fi
libs=/usr/local/cuda/lib64
for d in $(python3 -c 'import nvidia, os; print(" ".join(os.path.join(p, "cu13", "lib") for p in nvidia.__path__))' 2>/dev/null); do
  libs="$libs:$d"
done
export LD_LIBRARY_PATH="$libs:${LD_LIBRARY_PATH:-}"
# Any library still missing: look for it under /usr and /opt.
for lib in $(ldd ./llama-check | awk '/not found/ {print $1}'); do
  d=$(find /usr /opt -name "$lib" 2>/dev/null | head -1)
  [[ -n "$d" ]] && export LD_LIBRARY_PATH="$(dirname "$d"):$LD_LIBRARY_PATH"
done
ldd ./llama-check | grep -E 'cuda|cublas|curand|nvrtc|not found'
fail=0
for t in tests/*; do
  echo "== $t"
  FA_REQUIRE_GPU=1 "$t" --test-threads=1 || fail=1
done
if [[ $train == 1 ]]; then
  echo "== llama-check --bench"
  ./llama-check --device cuda --bench || fail=1
  echo "== train_gpt --device cuda $*"
  ./train_gpt --device cuda "$@" || fail=1
else
  echo "== llama-check --bench"
  ./llama-check --device cuda --bench "$@" || fail=1
fi
exit $fail
"#;

pub fn main(args: &[String]) -> Result<(), String> {
    match args.iter().map(String::as_str).collect::<Vec<_>>().as_slice() {
        [] => cpu(),
        ["--cuda"] => cuda(),
        ["--stage", dir] => stage(Path::new(dir)),
        ["-h" | "--help"] => {
            println!("{HELP}");
            Ok(())
        }
        _ => Err(format!("unexpected arguments {args:?}\n\n{HELP}")),
    }
}

fn crate_dir() -> PathBuf {
    cargo::root().join("candle-crate")
}

/// A cargo command in `candle-crate/` (its own workspace and lock file).
fn candle_cargo() -> Command {
    let mut cmd = cargo::cargo();
    cmd.current_dir(crate_dir());
    cmd
}

fn cpu() -> Result<(), String> {
    cargo::ensure_rust_src()?;
    let mut cmd = candle_cargo();
    cmd.args(["test", "--locked", "--package", "flash-attn-candle"]);
    cargo::status(cmd)?;
    println!("xtask candle: CPU tests passed (for the GPU build: cargo xtask candle --cuda)");
    Ok(())
}

/// The toolkit folder and the build environment `scripts/cuda-toolkit.sh` gives.
fn toolkit() -> Result<(PathBuf, Vec<(String, String)>), String> {
    let dir = cargo::root().join(".cuda-toolkit");
    let script = cargo::root().join("scripts/cuda-toolkit.sh");
    let mut cmd = Command::new("bash");
    cmd.arg(&script).arg(&dir);
    cargo::status(cmd)?;
    let out = Command::new("bash")
        .arg(&script)
        .arg("--env-lines")
        .arg(&dir)
        .output()
        .map_err(|e| format!("cannot run {}: {e}", script.display()))?;
    let env = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_once('=').map(|(k, v)| (k.to_string(), v.to_string())))
        .collect();
    Ok((dir, env))
}

/// The `--cuda` build: test binaries (paths) and `llama-check`.
fn build_cuda() -> Result<(PathBuf, Vec<PathBuf>, PathBuf), String> {
    build_cuda_with(false).map(|(dir, tests, llama, _)| (dir, tests, llama))
}

/// [`build_cuda`], and with `train` the `train_gpt` example too (its path last).
fn build_cuda_with(train: bool) -> Result<(PathBuf, Vec<PathBuf>, PathBuf, Option<PathBuf>), String> {
    cargo::ensure_rust_src()?;
    let (dir, env) = toolkit()?;
    let target = crate_dir().join("target/cuda");
    let with_env = |cmd: &mut Command| {
        cmd.envs(env.iter().map(|(k, v)| (k, v))).env("CARGO_TARGET_DIR", &target);
    };
    // Without flash-attn's `cuda-version`: candle-core picks the version from nvcc.
    let features = ["--no-default-features", "--features", "cuda"];
    let mut cmd = candle_cargo();
    with_env(&mut cmd);
    cmd.args(["test", "--locked", "--release", "--package", "flash-attn-candle", "--no-run", "--message-format=json"])
        .args(features)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    let shown = cargo::show(&cmd);
    let out = cmd.output().map_err(|e| format!("cannot run `{shown}`: {e}"))?;
    if !out.status.success() {
        return Err(format!("`{shown}` failed ({})", out.status));
    }
    let tests = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| is_test_harness(l))
        .filter_map(|l| json_string(l, "executable"))
        .map(PathBuf::from)
        .collect();
    let mut cmd = candle_cargo();
    with_env(&mut cmd);
    cmd.args(["build", "--locked", "--release", "--package", "llama-check"]);
    cargo::status(cmd)?;
    let train_gpt = if train {
        let mut cmd = candle_cargo();
        with_env(&mut cmd);
        cmd.args(["build", "--locked", "--release", "--package", "flash-attn-candle", "--example", "train_gpt"]).args(features);
        cargo::status(cmd)?;
        Some(target.join("release/examples/train_gpt"))
    } else {
        None
    };
    Ok((dir, tests, target.join("release/llama-check"), train_gpt))
}

fn has_gpu() -> bool {
    Path::new("/proc/driver/nvidia/version").exists() || Path::new("/dev/nvidiactl").exists()
}

fn cuda() -> Result<(), String> {
    let (dir, tests, llama) = build_cuda()?;
    let gpu = has_gpu();
    // Without a GPU: the stub libcuda and PyPI's libraries satisfy the
    // loader; only candle's CPU device is used, so no CUDA call is made.
    let ld = format!("{}:{}", dir.join("lib").display(), dir.join("nvidia/cu13/lib").display());
    for t in &tests {
        let mut cmd = Command::new(t);
        if gpu {
            cmd.env("FA_REQUIRE_GPU", "1");
        } else {
            cmd.env("LD_LIBRARY_PATH", &ld).env_remove("FA_REQUIRE_GPU");
        }
        cargo::status(cmd)?;
    }
    let mut cmd = Command::new(&llama);
    if gpu {
        cmd.args(["--device", "cuda", "--bench"]);
    } else {
        cmd.args(["--device", "cpu"]).env("LD_LIBRARY_PATH", &ld);
    }
    cargo::status(cmd)?;
    println!("xtask candle --cuda: passed on the {}", if gpu { "GPU" } else { "CPU (no GPU here)" });
    Ok(())
}

fn stage(out: &Path) -> Result<(), String> {
    let (_, tests, llama, train_gpt) = build_cuda_with(true)?;
    let tests_dir = out.join("tests");
    std::fs::create_dir_all(&tests_dir).map_err(|e| format!("create {}: {e}", tests_dir.display()))?;
    for t in &tests {
        // `name-<hash>` → `name`; the lib's unit tests are CPU-only, skip them.
        let file = t.file_name().and_then(|f| f.to_str()).unwrap_or("test");
        let name = file.rsplit_once('-').map(|(n, _)| n).unwrap_or(file);
        if name != "flash_attn_candle" {
            copy(t, &tests_dir.join(name))?;
        }
    }
    copy(&llama, &out.join("llama-check"))?;
    if let Some(t) = &train_gpt {
        copy(t, &out.join("train_gpt"))?;
    }
    let run_sh = out.join("run.sh");
    std::fs::write(&run_sh, RUN_SH).map_err(|e| format!("write {}: {e}", run_sh.display()))?;
    set_executable(&run_sh)?;
    println!("xtask candle --stage: tests, llama-check, train_gpt and run.sh in {} (run.sh --train also trains)", out.display());
    Ok(())
}

/// Whether a compiler-artifact line is a test harness (`"profile"` says
/// `"test":true`; bins have a `"test"` field in `"target"` too).
fn is_test_harness(line: &str) -> bool {
    let Some(start) = line.find("\"profile\":{") else { return false };
    let profile = &line[start..];
    let end = profile.find('}').unwrap_or(profile.len());
    profile[..end].contains("\"test\":true")
}

/// The value of `"key":"..."` in one line of cargo's JSON output.
fn json_string(line: &str, key: &str) -> Option<String> {
    let pat = format!("\"{key}\":\"");
    let start = line.find(&pat)? + pat.len();
    let end = line[start..].find('"')? + start;
    Some(line[start..end].replace("\\\\", "\\"))
}

fn copy(from: &Path, to: &Path) -> Result<(), String> {
    std::fs::copy(from, to).map(|_| ()).map_err(|e| format!("copy {} -> {}: {e}", from.display(), to.display()))?;
    set_executable(to)
}

fn set_executable(p: &Path) -> Result<(), String> {
    use std::os::unix::fs::PermissionsExt;
    let mut perm = std::fs::metadata(p).map_err(|e| format!("{}: {e}", p.display()))?.permissions();
    perm.set_mode(0o755);
    std::fs::set_permissions(p, perm).map_err(|e| format!("{}: {e}", p.display()))
}
