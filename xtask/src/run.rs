//! `cargo xtask run [ARGS]`: the project's main job.
//!
//! Prints the FA1 tiling plan and the HBM-traffic model of the GPT-2 shape;
//! on a GPU, runs standard attention, FA1 and FA2 (f32, and bf16 on tensor
//! cores) on the GPT-2 shape and on N = 8192, checks them against each other
//! and against the f64 CPU reference on sampled rows, and prints one table
//! (time, TFLOP/s, errors, HBM bytes modelled and, with `ncu`, measured),
//! then forward + backward on the GPT-2 shape (gradients against the f64
//! definition on sampled heads; the model's forward + backward bytes);
//! without a GPU, says why and runs the CPU reference on a small shape. The
//! work is done by the `fa-run` binary of the `flash-attn-tests` crate (xtask
//! has no dependencies, see `main.rs`); `ARGS` go to it
//! (`cargo xtask run --help`).

use crate::cargo;

pub fn main(args: &[String]) -> Result<(), String> {
    cargo::ensure_rust_src()?;
    let mut cmd = cargo::cargo();
    cmd.args(["run", "--profile", cargo::PROFILE, "--package", "flash-attn-tests", "--bin", "fa-run", "--"]).args(args);
    cargo::status(cmd)
}
