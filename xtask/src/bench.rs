//! The benchmark commands, each a release binary of the `flash-attn-tests`
//! crate run with the command's `ARGS` (`cargo xtask <command> --help`):
//!
//! * `cargo xtask bench [ARGS]` (`fa-bench`): our FA2, the Hopper kernel,
//!   FA1 and standard attention against PyTorch SDPA (flash, cuDNN,
//!   efficient, math) on the FlashAttention papers' shapes, in one run.
//!   Outputs: `bench-out/` (markdown table, JSON, one SVG plot per
//!   configuration).
//! * `cargo xtask bench-decode [OUT] [ARGS]` (`fa-bench-decode`): issue 9's
//!   decode grid (batch × cache length × heads × layout) against PyTorch
//!   SDPA. Outputs: `OUT` (default `bench-out/`): `decode.md`, `decode.json`,
//!   `decode_gbs.svg`.
//! * `cargo xtask bench-infer` runs `fa-bench-infer` the same way
//!   ([`crate::bench_infer`]).

use crate::cargo;

/// `cargo run --release -p flash-attn-tests --bin <bin> -- <args>`.
pub fn run_bin(bin: &str, args: &[String]) -> Result<(), String> {
    cargo::ensure_rust_src()?;
    let mut cmd = cargo::cargo();
    cmd.args(["run", "--release", "--package", "flash-attn-tests", "--bin", bin, "--"]).args(args);
    cargo::status(cmd)
}

pub fn main(args: &[String]) -> Result<(), String> {
    run_bin("fa-bench", args)
}

pub fn decode(args: &[String]) -> Result<(), String> {
    run_bin("fa-bench-decode", args)
}
