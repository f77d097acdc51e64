//! The pinned nightly that compiles the kernels, found through rustup
//! whatever toolchain runs the outer build (stable, another nightly).
//!
//! The channel comes from the kernel package's own `rust-toolchain.toml`
//! (`kernel-crate/rust-toolchain.toml`, published inside
//! `flash-attn-kernels`), so a registry copy knows it too.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The pinned nightly's own `cargo` and `rustc` (not rustup's proxies).
pub struct Toolchain {
    /// e.g. `nightly-2026-05-20`.
    pub channel: String,
    pub cargo: PathBuf,
    pub rustc: PathBuf,
}

/// The `channel = "…"` of a `rust-toolchain.toml`.
pub fn channel_of(toolchain_toml: &Path) -> Result<String, String> {
    let text = std::fs::read_to_string(toolchain_toml).map_err(|e| format!("read {}: {e}", toolchain_toml.display()))?;
    text.lines()
        .find_map(|l| {
            let (k, v) = l.split_once('=')?;
            (k.trim() == "channel").then(|| v.trim().trim_matches('"').to_string())
        })
        .ok_or_else(|| format!("{}: no `channel = \"…\"` line", toolchain_toml.display()))
}

/// The command that installs everything the kernel build needs.
pub fn install_hint(channel: &str) -> String {
    format!("rustup toolchain install {channel} --component rust-src")
}

/// Finds `channel`'s cargo and rustc with `rustup which --toolchain` and
/// checks its `rust-src` (`-Zbuild-std=core` compiles core from it). Each
/// failure names the one command that fixes it.
pub fn find(channel: &str) -> Result<Toolchain, String> {
    let install = install_hint(channel);
    let rustup = rustup_binary();
    let which = |tool: &str| -> Result<PathBuf, String> {
        let mut cmd = Command::new(&rustup);
        cmd.args(["which", "--toolchain", channel, tool]).env_remove("RUSTUP_TOOLCHAIN");
        let out = cmd.output().map_err(|e| {
            format!(
                "flash-attn compiles its GPU kernels with the pinned nightly `{channel}`, run through rustup, \
                 and `{}` cannot be run ({e}).\nInstall rustup (https://rustup.rs), then run:\n\n    {install}\n",
                rustup.display()
            )
        })?;
        if !out.status.success() {
            return Err(format!(
                "flash-attn compiles its GPU kernels with the pinned nightly `{channel}` (whatever toolchain builds \
                 the rest), and rustup does not have it:\n{}\nRun:\n\n    {install}\n",
                String::from_utf8_lossy(&out.stderr).lines().next().unwrap_or("").trim()
            ));
        }
        Ok(PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()))
    };
    let cargo = which("cargo")?;
    let rustc = which("rustc")?;
    let out = Command::new(&rustc)
        .args(["--print", "sysroot"])
        .env_remove("RUSTUP_TOOLCHAIN")
        .output()
        .map_err(|e| format!("cannot run `{} --print sysroot`: {e}", rustc.display()))?;
    if !out.status.success() {
        return Err(format!("`{} --print sysroot` failed: {}", rustc.display(), String::from_utf8_lossy(&out.stderr)));
    }
    let core = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()).join("lib/rustlib/src/rust/library/core/Cargo.toml");
    if !core.exists() {
        return Err(format!(
            "flash-attn compiles its GPU kernels with `-Zbuild-std=core`, which needs the `rust-src` component of \
             the pinned nightly `{channel}`, and it is missing ({} not found).\nRun:\n\n    {install}\n",
            core.display()
        ));
    }
    Ok(Toolchain { channel: channel.to_string(), cargo, rustc })
}

/// `rustup` on the PATH, else in `$CARGO_HOME/bin` or `~/.cargo/bin` (a
/// build started by an IDE may lack rustup's PATH entry).
fn rustup_binary() -> PathBuf {
    let exe = format!("rustup{}", std::env::consts::EXE_SUFFIX);
    let on_path = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).map(|d| d.join(&exe)).any(|f| f.is_file()))
        .unwrap_or(false);
    if !on_path {
        let homes = [
            std::env::var_os("CARGO_HOME").map(PathBuf::from),
            std::env::var_os("HOME").or_else(|| std::env::var_os("USERPROFILE")).map(|h| PathBuf::from(h).join(".cargo")),
        ];
        if let Some(f) = homes.into_iter().flatten().map(|h| h.join("bin").join(&exe)).find(|f| f.is_file()) {
            return f;
        }
    }
    PathBuf::from(exe)
}
