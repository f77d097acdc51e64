//! `cargo xtask bench-cp [--stage DIR] [ARGS]`: context-parallel (ring)
//! attention over NCCL on the GPUs of one machine — for 128k and 256k
//! tokens (bf16, d 128, 32 query / 8 KV heads, causal, zigzag) on 1, 2, 4
//! (and 8) GPUs of those present: time, TFLOP/s per GPU, strong-scaling
//! efficiency against one GPU's attention over the whole sequence, and the
//! ring's error against that one-GPU result. The work is done by the
//! `context_parallel` example of `flash-attn` (feature `nccl`), built with
//! the `test` profile like xtask's other binaries; `ARGS` go to it after
//! `--bench` (`--help` lists them).
//!
//! Without `--stage` it runs here (needs the GPUs and libnccl.so.2 on the
//! loader's path). With `--stage DIR` it copies the example and a
//! `run-cp.sh` into `DIR` for a multi-GPU machine without Rust; the script
//! sets `NCCL_NVLS_ENABLE=0` (NVLink multicast off, as shared machines
//! require) and finds libnccl in PyTorch's wheel when the system has none.

use crate::cargo;

const RUN_CP: &str = r#"#!/bin/sh
# Context-parallel benchmark (cargo xtask bench-cp --stage): ./run-cp.sh [ARGS]
set -e
cd "$(dirname "$0")"
export NCCL_NVLS_ENABLE=0
if ! ldconfig -p 2>/dev/null | grep -q 'libnccl.so.2'; then
    dir=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))' 2>/dev/null || true)
    [ -n "$dir" ] && export LD_LIBRARY_PATH="$dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
exec ./context_parallel --bench "$@"
"#;

pub fn main(args: &[String]) -> Result<(), String> {
    let (stage, args) = match args {
        [flag, dir, rest @ ..] if flag == "--stage" => (Some(dir.clone()), rest),
        _ => (None, args),
    };
    cargo::ensure_rust_src()?;
    // flash-attn-tests beside flash-attn: the same features as `cargo test`
    // with `--features flash-attn/nccl`, so the two share one kernel build.
    let mut cmd = cargo::cargo();
    cmd.args(["build", "--profile", cargo::PROFILE, "-p", "flash-attn", "-p", "flash-attn-tests"])
        .args(["--features", "flash-attn/nccl", "--example", "context_parallel"]);
    cargo::status(cmd)?;
    let bin = cargo::root().join("target/debug/examples/context_parallel");
    match stage {
        Some(dir) => {
            let dir = cargo::root().join(dir);
            std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
            std::fs::copy(&bin, dir.join("context_parallel")).map_err(|e| format!("{}: {e}", bin.display()))?;
            let script = dir.join("run-cp.sh");
            std::fs::write(&script, RUN_CP).map_err(|e| format!("{}: {e}", script.display()))?;
            #[cfg(unix)]
            {
                use std::os::unix::fs::PermissionsExt;
                std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).map_err(|e| e.to_string())?;
            }
            println!("staged {} (run ./run-cp.sh [ARGS] on the GPU machine)", dir.display());
            Ok(())
        }
        None => {
            let mut run = std::process::Command::new(&bin);
            run.env("NCCL_NVLS_ENABLE", "0").arg("--bench").args(args);
            cargo::status(run)
        }
    }
}
