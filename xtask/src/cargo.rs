//! Nested cargo and toolchain plumbing shared by the commands.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// The profile xtask builds its binaries (`fa-run`) with: `test` (opt-level 2,
/// see the root `Cargo.toml`), the profile `cargo test` uses, so they share
/// most of the build of `cargo xtask test`.
pub const PROFILE: &str = "test";

/// The workspace root (the parent of `xtask/`).
pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("xtask lives in the workspace").to_path_buf()
}

/// A `cargo` command (the one that runs us, if any) in the workspace root.
pub fn cargo() -> Command {
    let mut cmd = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    cmd.current_dir(root());
    cmd
}

/// Runs `cmd`, failing with its rendering if it cannot start or exits non-zero.
pub fn status(mut cmd: Command) -> Result<(), String> {
    let shown = show(&cmd);
    let st = cmd.status().map_err(|e| format!("cannot run `{shown}`: {e}"))?;
    if st.success() { Ok(()) } else { Err(format!("`{shown}` failed ({st})")) }
}

/// `cmd` as a shell-like string, for messages.
pub fn show(cmd: &Command) -> String {
    let mut s = cmd.get_program().to_string_lossy().into_owned();
    for a in cmd.get_args() {
        s.push(' ');
        s.push_str(&a.to_string_lossy());
    }
    s
}

/// The profile arguments among `cargo test` arguments (`--release`,
/// `--profile P`, `--profile=P`), up to a `--`.
pub fn profile_args(args: &[String]) -> Vec<String> {
    let mut out = Vec::new();
    let mut it = args.iter().take_while(|a| *a != "--");
    while let Some(a) = it.next() {
        if a == "--release" || a == "-r" || a.starts_with("--profile=") {
            out.push(a.clone());
        } else if a == "--profile"
            && let Some(p) = it.next()
        {
            out.extend([a.clone(), p.clone()]);
        }
    }
    out
}

/// The `channel` of `rust-toolchain.toml` (e.g. `nightly-2026-05-20`).
pub fn pinned_toolchain() -> Option<String> {
    let text = std::fs::read_to_string(root().join("rust-toolchain.toml")).ok()?;
    text.lines().find_map(|l| {
        let (k, v) = l.split_once('=')?;
        (k.trim() == "channel").then(|| v.trim().trim_matches('"').to_string())
    })
}

/// The sysroot of the `rustc` cargo would use.
fn sysroot() -> Result<PathBuf, String> {
    let rustc = std::env::var_os("RUSTC").unwrap_or_else(|| "rustc".into());
    let out = Command::new(&rustc)
        .current_dir(root())
        .args(["--print", "sysroot"])
        .output()
        .map_err(|e| format!("cannot run `{} --print sysroot`: {e}", rustc.to_string_lossy()))?;
    if !out.status.success() {
        return Err(format!("`rustc --print sysroot` failed: {}", String::from_utf8_lossy(&out.stderr)));
    }
    Ok(PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()))
}

/// The kernels are built with `-Zbuild-std=core`, which needs the toolchain's
/// `rust-src`; install it with rustup when it is missing.
pub fn ensure_rust_src() -> Result<(), String> {
    let core = sysroot()?.join("lib/rustlib/src/rust/library/core");
    if core.is_dir() {
        return Ok(());
    }
    let toolchain = pinned_toolchain().ok_or("cannot read `channel` from rust-toolchain.toml")?;
    println!("xtask: rust-src missing ({} not found); installing it", core.display());
    let mut cmd = Command::new("rustup");
    cmd.args(["component", "add", "rust-src", "--toolchain", &toolchain]);
    status(cmd)
        .map_err(|e| format!("{e}; install it by hand: rustup component add rust-src --toolchain {toolchain}"))?;
    if core.is_dir() { Ok(()) } else { Err(format!("rust-src installed but {} still missing", core.display())) }
}

/// Builds what `cargo test --workspace` builds (`--no-run`, with
/// `profile_args` such as `--release`; build output on stderr as usual) and
/// returns the `OUT_DIR` the build script of `package` ran with, from cargo's
/// JSON messages. The same unit graph as the test run, so after `cargo test`
/// nothing is rebuilt (a `cargo build -p` would resolve features differently
/// and rebuild dependencies).
pub fn build_script_out_dir(package: &str, profile_args: &[String]) -> Result<PathBuf, String> {
    let mut cmd = cargo();
    cmd.args(["test", "--workspace", "--no-run", "--message-format=json-render-diagnostics"])
        .args(profile_args)
        .stdout(Stdio::piped());
    let shown = show(&cmd);
    let mut child = cmd.spawn().map_err(|e| format!("cannot run `{shown}`: {e}"))?;
    let mut out_dir = None;
    for line in BufReader::new(child.stdout.take().unwrap()).lines() {
        let line = line.map_err(|e| format!("reading `{shown}`: {e}"))?;
        if line.contains(r#""reason":"build-script-executed""#)
            && json_str(&line, "package_id").is_some_and(|id| is_package(&id, package))
        {
            out_dir = json_str(&line, "out_dir").map(PathBuf::from);
        }
    }
    let st = child.wait().map_err(|e| format!("waiting for `{shown}`: {e}"))?;
    if !st.success() {
        return Err(format!("`{shown}` failed ({st})"));
    }
    out_dir.ok_or_else(|| format!("`{shown}` reported no build-script output directory for `{package}`"))
}

/// Whether a cargo package id names `package`: `path+file:///…#name@1.0.0`,
/// `path+file:///…/name#1.0.0` or the old `name 1.0.0 (…)`.
fn is_package(id: &str, package: &str) -> bool {
    id.contains(&format!("#{package}@"))
        || id.starts_with(&format!("{package} "))
        || id.split('#').next().is_some_and(|p| p.ends_with(&format!("/{package}")) && !id.contains('@'))
}

/// The string value of `"key":"…"` in one line of cargo's JSON (no full JSON
/// parser: xtask has no dependencies; cargo's messages are single-line).
fn json_str(line: &str, key: &str) -> Option<String> {
    let pat = format!("\"{key}\":\"");
    let start = line.find(&pat)? + pat.len();
    let mut out = String::new();
    let mut chars = line[start..].chars();
    while let Some(c) = chars.next() {
        match c {
            '"' => return Some(out),
            '\\' => match chars.next()? {
                'n' => out.push('\n'),
                't' => out.push('\t'),
                'u' => {
                    let hex: String = chars.by_ref().take(4).collect();
                    out.push(char::from_u32(u32::from_str_radix(&hex, 16).ok()?)?);
                }
                other => out.push(other),
            },
            c => out.push(c),
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_profile_args() {
        let a = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(profile_args(&a(&["--release", "cpu_plan", "--", "--release"])), a(&["--release"]));
        assert_eq!(profile_args(&a(&["--profile", "bench", "x"])), a(&["--profile", "bench"]));
        assert!(profile_args(&a(&["--", "--nocapture"])).is_empty());
    }

    #[test]
    fn reads_cargo_json() {
        let line = r#"{"reason":"build-script-executed","package_id":"path+file:///w/host-crate#flash-attn@0.1.0","out_dir":"/w/target/debug/build/flash-attn-1/out"}"#;
        assert_eq!(json_str(line, "out_dir").unwrap(), "/w/target/debug/build/flash-attn-1/out");
        assert!(is_package(&json_str(line, "package_id").unwrap(), "flash-attn"));
        assert!(!is_package("path+file:///w/tests#flash-attn-tests@0.1.0", "flash-attn"));
        assert!(!is_package("path+file:///w/kernel-crate/common#flash-attn-common@0.1.0", "flash-attn"));
        assert!(is_package("flash-attn 0.1.0 (path+file:///w/host-crate)", "flash-attn"));
        assert!(is_package("path+file:///w/flash-attn#0.1.0", "flash-attn"));
        assert_eq!(json_str(r#"{"a":"x\"y\\z"}"#, "a").unwrap(), "x\"y\\z");
    }
}
