//! `cargo xtask run [ARGS]`: the project's main job.
//!
//! Until the GPU path is wired in here, it runs the CPU reference on the GPT-2
//! shape (FA1 and FA2 loop orders against standard attention) and prints the
//! FA1 tiling plan and the HBM-traffic model of standard attention, FA1 and
//! FA2. The work is done by the `fa-run` binary of the `flash-attn-tests`
//! crate (xtask has no dependencies, see `main.rs`); `ARGS` go to it
//! (`cargo xtask run --help`).

use crate::cargo;

pub fn main(args: &[String]) -> Result<(), String> {
    cargo::ensure_rust_src()?;
    let mut cmd = cargo::cargo();
    cmd.args(["run", "--profile", cargo::PROFILE, "--package", "flash-attn-tests", "--bin", "fa-run", "--"]).args(args);
    cargo::status(cmd)
}
