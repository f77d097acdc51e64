//! `cargo xtask <command>`: the project's tasks, run through the
//! `.cargo/config.toml` alias (`cargo run --package xtask --`).
//!
//! * `cargo xtask test [ARGS]`: make sure `rust-src` is installed, run
//!   `cargo test --workspace [ARGS]`, then assemble every embedded PTX with
//!   `ptxas -v` and fail on spills, stack frames or missing instructions
//!   ([`ptx`]); ends with a one-line summary.
//! * `cargo xtask ptx`: build the library, print the PTX paths and the `ptxas
//!   -v` report of every kernel.
//! * `cargo xtask ship-ptx`: rebuild the PTX from source and rewrite the
//!   prebuilt PTX the package ships (`host-crate/ptx/`, [`ship`]); run it
//!   after changing a kernel (`cargo xtask test` fails until then); it
//!   also reassembles the cubins when the pinned ptxas is found.
//! * `cargo xtask ship-cubins`: assemble the shipped PTX into cubins, one
//!   per kernel, with the pinned ptxas and rewrite `host-crate/ptx/*.cubins.xz`
//!   ([`cubin`]).
//! * `cargo xtask stage [DIR]`: a self-contained folder for a GPU machine
//!   (test binaries, `fa-run`, the `fa-bench*` benchmarks, `run.sh`) ([`stage`]).
//! * `cargo xtask bench [ARGS]`, `bench-decode [OUT] [ARGS]`: the prefill
//!   benchmark and the decode grid vs PyTorch ([`bench`]).
//! * `cargo xtask bench-infer [ARGS]`: GQA, varlen and head-dim rows vs
//!   PyTorch ([`bench_infer`]).
//! * `cargo xtask run [ARGS]`: the main job: standard, FA1 and FA2 on the GPU
//!   (f32 and bf16 tensor cores) against the CPU reference, or without a GPU the CPU reference on the
//!   GPT-2 shape with the tiling plan and the HBM-traffic model ([`run`]).
//! * `cargo xtask bench-cp [--stage DIR] [ARGS]`: context-parallel attention
//!   over NCCL on 1, 2, 4 GPUs ([`bench_cp`]).
//! * `cargo xtask candle [--cuda | --stage DIR]`: the candle adapter in
//!   `candle-crate/` (its own workspace): CPU tests, or the CUDA build with
//!   the toolkit from PyPI and the Llama check ([`candle`]).
//!
//! xtask itself has **no dependencies**, on purpose: it must be able to run
//! (and install `rust-src`) before anything compiles the kernels. Commands that
//! need the library run a binary of the `flash-attn-tests` crate (`fa-run`,
//! `fa-bench`) through a nested cargo ([`cargo`]); `fa-run` is built with the
//! `test` profile (opt-level 2), and `ptx` reads the PTX of the very build
//! `cargo test --workspace` made, so `test`, `ptx` and `run` share most of one
//! build. A new command is a module with a `pub fn main(args: &[String]) ->
//! Result<(), String>` and one line in [`COMMANDS`].

mod bench;
mod bench_cp;
mod bench_infer;
mod candle;
mod cargo;
mod cubin;
mod ptx;
mod ptx_build;
mod run;
mod ship;
mod stage;
mod test;

use std::process::ExitCode;

type Command = fn(&[String]) -> Result<(), String>;

/// (name, one-line help, entry point).
const COMMANDS: &[(&str, &str, Command)] = &[
    ("test", "rust-src check, `cargo test --workspace [ARGS]`, then ptxas checks of every PTX", test::main),
    ("ptx", "build the library; print each PTX path and the `ptxas -v` report per kernel", ptx::main),
    (
        "ship-ptx",
        "rebuild the PTX from source (pinned nightly) and rewrite the prebuilt PTX shipped in host-crate/ptx/",
        ship::main,
    ),
    (
        "ship-cubins",
        "assemble the shipped PTX into cubins (pinned ptxas from PyPI) and rewrite host-crate/ptx/*.cubins.xz",
        cubin::main,
    ),
    ("run", "the main job: standard, FA1, FA2 on the GPU (GPT-2 shape, N=8192) vs the CPU reference; plan + HBM model", run::main),
    ("stage", "release test binaries, fa-run, the fa-bench* benchmarks and a run.sh in one folder for a GPU box (default bundle/)", stage::main),
    (
        "bench",
        "FA2/FA1/standard vs PyTorch SDPA on the paper shapes: table, JSON, SVG plots (release build)",
        bench::main,
    ),
    (
        "bench-infer",
        "issue 8's rows: GQA prefill, varlen packed/padded/dense, head dims 80..224, vs PyTorch (release build)",
        bench_infer::main,
    ),
    (
        "bench-decode",
        "issue 9's decode grid (batch, cache length, MHA/GQA, contiguous/paged) vs PyTorch: table, JSON, GB/s plot",
        bench::decode,
    ),
    (
        "bench-cp",
        "issue 33's context-parallel ring over NCCL: 128k/256k tokens on 1/2/4 GPUs, time, TFLOP/s per GPU, scaling (--stage DIR)",
        bench_cp::main,
    ),
    ("candle", "candle adapter: CPU tests (no CUDA toolkit); --cuda: PyPI toolkit, GPU build, Llama check; --stage DIR", candle::main),
];

fn usage() -> String {
    let mut s = String::from("usage: cargo xtask <command> [args]\n\ncommands:\n");
    for (name, help, _) in COMMANDS {
        s += &format!("  {name:<8} {help}\n");
    }
    s + "\n`cargo xtask <command> --help` for a command's options.\n"
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(name) = args.first() else {
        eprint!("{}", usage());
        return ExitCode::FAILURE;
    };
    if matches!(name.as_str(), "-h" | "--help" | "help") {
        print!("{}", usage());
        return ExitCode::SUCCESS;
    }
    let Some((_, _, cmd)) = COMMANDS.iter().find(|(n, _, _)| n == name) else {
        eprint!("xtask: unknown command `{name}`\n\n{}", usage());
        return ExitCode::FAILURE;
    };
    match cmd(&args[1..]) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask {name}: error: {e}");
            ExitCode::FAILURE
        }
    }
}
