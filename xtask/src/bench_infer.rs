//! `cargo xtask bench-infer [ARGS]`: issue 8's benchmark rows (GQA prefill,
//! varlen packed vs padded vs dense, head dims 80/160/192/224), ours against
//! PyTorch SDPA in one run, each of our rows checked against an f64 CPU
//! attention first. The work is done by the `fa-bench-infer` binary of the
//! `flash-attn-tests` crate, built in release; `ARGS` go to it
//! (`cargo xtask bench-infer --help`). Outputs: `bench-infer-out/`
//! (`bench-infer.md`, `bench-infer.json`).

pub fn main(args: &[String]) -> Result<(), String> {
    crate::bench::run_bin("fa-bench-infer", args)
}
