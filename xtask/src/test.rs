//! `cargo xtask test [ARGS]`: the project's test command (README, `.ci/run`).
//!
//! 1. make sure `rust-src` is installed (the kernels need `-Zbuild-std=core`);
//! 2. `cargo test --workspace ARGS`, `ARGS` passed through
//!    (e.g. `cargo xtask test -- --nocapture`, `cargo xtask test cpu_plan`);
//! 3. the shipped PTX (`host-crate/ptx/`) against the sources: fail when it
//!    was built from other sources (run `cargo xtask ship-ptx`), else build
//!    the kernels from source (`target/kernels-ptx`) and fail unless every
//!    PTX is byte for byte the shipped one ([`shipped_ptx_check`]);
//! 4. the shipped cubins (`host-crate/ptx/*.cubins.xz`) against the shipped
//!    PTX: assembled from it (its hash), every kernel present, and with the
//!    pinned ptxas byte for byte what it assembles now ([`cubin::check`]);
//! 5. when `ptxas` is found, assemble every embedded PTX for its arch and fail
//!    on spills, stack frames or missing instructions ([`crate::ptx`]);
//!    otherwise say `skipped: ptxas not found`;
//! 6. one summary line.

use std::io::{BufRead, BufReader, Write};
use std::process::Stdio;
use std::time::Instant;

use crate::ptx_build::{self, inputs, sha256};
use crate::{cargo, cubin, ptx, ship};

/// Totals of the `test result:` lines of `cargo test`.
#[derive(Default, Debug, PartialEq)]
struct Tally {
    suites: u32,
    passed: u64,
    failed: u64,
    ignored: u64,
}

impl Tally {
    /// `test result: ok. 6 passed; 0 failed; 1 ignored; 0 measured; …`
    fn add_line(&mut self, line: &str) {
        let Some(rest) = line.trim().strip_prefix("test result: ") else { return };
        self.suites += 1;
        for part in rest.split(';') {
            let mut words = part.split_whitespace().rev();
            let (Some(what), Some(n)) = (words.next(), words.next()) else { continue };
            let Ok(n) = n.parse::<u64>() else { continue };
            match what {
                "passed" => self.passed += n,
                "failed" => self.failed += n,
                "ignored" => self.ignored += n,
                _ => {}
            }
        }
    }
}

pub fn main(args: &[String]) -> Result<(), String> {
    if args.iter().any(|a| a == "-h" || a == "--help") && !args.iter().any(|a| a == "--") {
        println!(
            "usage: cargo xtask test [ARGS]\n\nInstalls rust-src if missing, runs `cargo test --workspace ARGS`, then checks\nevery embedded PTX with `ptxas -v` (no spills, no stack frame, required\ninstructions present) when ptxas is found (PATH, $PTXAS, or the nvidia-cuda-nvcc\npip wheel); otherwise that step is skipped."
        );
        return Ok(());
    }
    let t0 = Instant::now();
    cargo::ensure_rust_src()?;

    // Workspace tests, streaming their output while counting the results.
    let mut cmd = cargo::cargo();
    cmd.args(["test", "--workspace"]).args(args).stdout(Stdio::piped());
    let shown = cargo::show(&cmd);
    println!("xtask: {shown}");
    let mut child = cmd.spawn().map_err(|e| format!("cannot run `{shown}`: {e}"))?;
    let mut tally = Tally::default();
    let stdout = std::io::stdout();
    for line in BufReader::new(child.stdout.take().unwrap()).lines() {
        let line = line.map_err(|e| e.to_string())?;
        tally.add_line(&line);
        let _ = writeln!(stdout.lock(), "{line}");
    }
    let st = child.wait().map_err(|e| e.to_string())?;
    let tests = format!(
        "{} passed, {} failed, {} ignored in {} suites",
        tally.passed, tally.failed, tally.ignored, tally.suites
    );
    if !st.success() {
        println!("\nxtask test: FAILED: cargo test ({tests}) [{:.0} s]", t0.elapsed().as_secs_f64());
        return Err(format!("`{shown}` failed ({st})"));
    }

    // The shipped PTX against a build from source.
    let shipped_line = match shipped_ptx_check() {
        Ok(line) => line,
        Err(e) => {
            println!("\nxtask test: FAILED: {e} (tests: {tests}) [{:.0} s]", t0.elapsed().as_secs_f64());
            return Err(e);
        }
    };

    // The shipped cubins against the shipped PTX (and, with the pinned
    // ptxas, against what it assembles).
    let cubin_line = match cubin::check() {
        Ok(line) => line,
        Err(e) => {
            println!("\nxtask test: FAILED: {e} (tests: {tests}) [{:.0} s]", t0.elapsed().as_secs_f64());
            return Err(e);
        }
    };

    // PTX checks.
    let ptx_line = match ptx::find_ptxas() {
        None => "PTX checks skipped: ptxas not found".to_string(),
        Some(ptxas) => {
            println!("\nxtask: checking the embedded PTX with {}", ptxas.display());
            let files = ptx::locate(&cargo::profile_args(args))?;
            let mut sum = ptx::check(&ptxas, &files, false)?;
            let t_split = std::time::Instant::now();
            let (split_n, split_problems) = ptx::check_split(&ptxas, &files)?;
            println!(
                "xtask: {split_n} per-kernel split modules assembled on their own in {:.0} s",
                t_split.elapsed().as_secs_f64()
            );
            sum.problems.extend(split_problems);
            if !sum.problems.is_empty() {
                println!("\nPTX problems:\n  {}", sum.problems.join("\n  "));
                println!(
                    "\nxtask test: FAILED: {} PTX problem(s) (tests: {tests}) [{:.0} s]",
                    sum.problems.len(),
                    t0.elapsed().as_secs_f64()
                );
                return Err(format!("{} PTX problem(s)", sum.problems.len()));
            }
            format!(
                "ptxas: {} kernels in {} PTX files ({}) assembled, no spills, no stack frames; {split_n} split modules assemble alone",
                sum.kernels,
                sum.files,
                sum.targets.join(", ")
            )
        }
    };
    println!("\nxtask test: OK: {tests}; {shipped_line}; {cubin_line}; {ptx_line} [{:.0} s]", t0.elapsed().as_secs_f64());
    Ok(())
}

/// Whether `host-crate/ptx/` holds exactly what the sources build: its
/// manifest's input hash equals the sources' (else it is stale: no build
/// needed to say so), and a build from source gives PTX of the recorded
/// length and SHA-256, equal byte for byte to the decompressed shipped files.
pub fn shipped_ptx_check() -> Result<String, String> {
    let dir = ptx_build::ship_dir();
    let path = dir.join("manifest.txt");
    let text = std::fs::read_to_string(&path).map_err(|e| format!("read {}: {e} (run `cargo xtask ship-ptx`)", path.display()))?;
    let m = inputs::Manifest::parse(&text)?;
    let current = inputs::list(&ptx_build::roots())?;
    if m.inputs != inputs::combined(&current) {
        return Err(format!(
            "the shipped PTX (host-crate/ptx/) was built from other sources ({}): run `cargo xtask ship-ptx` and commit host-crate/ptx/",
            m.changed(&current).join(", ")
        ));
    }
    let (_, built) = ptx_build::build_from_source()?;
    let archs: Vec<&str> = built.iter().map(|b| b.0).collect();
    let shipped: Vec<&str> = m.ptx.iter().map(|p| p.arch.as_str()).collect();
    if archs != shipped {
        return Err(format!("the shipped PTX has the targets {shipped:?}, the build {archs:?}: run `cargo xtask ship-ptx`"));
    }
    let mut differ = Vec::new();
    for ((arch, text), p) in built.iter().zip(&m.ptx) {
        if text.len() != p.len || sha256::hex(text.as_bytes()) != p.sha256 {
            differ.push(format!("{arch}: built {} bytes, sha256 {}; shipped {} bytes, {}", text.len(), sha256::hex(text.as_bytes()), p.len, p.sha256));
            continue;
        }
        let xz = std::fs::read(dir.join(p.file_name())).map_err(|e| format!("read {}: {e}", p.file_name()))?;
        match ship::xz_decompress(&xz) {
            Ok(bytes) if bytes != text.as_bytes() => differ.push(format!("{arch}: {} does not decompress to the built PTX", p.file_name())),
            Ok(_) => {}
            // Without xz the build script's own check (length and SHA-256 of
            // what it decompresses) stands in.
            Err(e) => println!("xtask: {e}: comparing {arch} by SHA-256 only"),
        }
    }
    if !differ.is_empty() {
        return Err(format!(
            "the shipped PTX is not what its sources build (same inputs, other bytes: a different toolchain or a non-reproducible build?):\n  {}",
            differ.join("\n  ")
        ));
    }
    Ok(format!("shipped PTX ({}) identical to a build from source", archs.join(", ")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tallies_test_results() {
        let mut t = Tally::default();
        t.add_line("test result: ok. 6 passed; 0 failed; 1 ignored; 0 measured; 0 filtered out; finished in 12.54s");
        t.add_line("test result: FAILED. 2 passed; 3 failed; 0 ignored; 0 measured; 0 filtered out; finished in 0.1s");
        t.add_line("running 6 tests");
        assert_eq!(t, Tally { suites: 2, passed: 8, failed: 3, ignored: 1 });
    }
}
