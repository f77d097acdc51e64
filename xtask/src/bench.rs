//! `cargo xtask bench [ARGS]`: our FA2, FA1 and standard attention against
//! PyTorch SDPA (flash, cuDNN, efficient, math) on the FlashAttention papers'
//! shapes, in one run. The work is done by the `fa-bench` binary of the
//! `flash-attn-tests` crate, built in release; `ARGS` go to it
//! (`cargo xtask bench --help`). Outputs: `bench-out/` (markdown table,
//! JSON, one SVG plot per configuration).

use crate::cargo;

pub fn main(args: &[String]) -> Result<(), String> {
    cargo::ensure_rust_src()?;
    let mut cmd = cargo::cargo();
    cmd.args([
        "run",
        "--release",
        "--package",
        "flash-attn-tests",
        "--bin",
        "fa-bench",
        "--",
    ])
    .args(args);
    cargo::status(cmd)
}
