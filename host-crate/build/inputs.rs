//! What determines the PTX, hashed; and the manifest of the prebuilt PTX
//! (`host-crate/ptx/manifest.txt`) that records it.
//!
//! The inputs: every file under the kernel crate's and the shared crate's
//! `src/`, their `Cargo.toml` (the original one a package keeps as
//! `Cargo.toml.orig`) and `build.rs`, the kernel crate's
//! `rust-toolchain.toml` (the pinned nightly), and `host-crate/build/kernels.rs`
//! (targets, flags, profile, post-processing). Line endings are normalized
//! (CRLF = LF), so a Windows checkout hashes the same. The kernel crates have
//! no third-party dependency, so no lock file adds anything.
//!
//! Shared with `cargo xtask` (`#[path]`), which writes the manifest.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use super::sha256;

/// Where the inputs live: the repository's `kernel-crate/` and
/// `kernel-crate/common/`, or the registry copies of `flash-attn-kernels` and
/// `flash-attn-common`; and the host crate's `build/kernels.rs`.
pub struct Roots {
    pub kernels: PathBuf,
    pub common: PathBuf,
    pub kernels_rs: PathBuf,
}

/// One input: its name (`kernels/src/lib.rs`, `common/Cargo.toml`,
/// `host/build/kernels.rs`) and the SHA-256 of its normalized text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Input {
    pub name: String,
    pub sha256: String,
}

/// Every input, sorted by name.
pub fn list(roots: &Roots) -> Result<Vec<Input>, String> {
    let mut files: Vec<(String, PathBuf)> = Vec::new();
    for (prefix, root, extra) in [
        ("kernels", &roots.kernels, &["build.rs", "rust-toolchain.toml"][..]),
        ("common", &roots.common, &["build.rs"][..]),
    ] {
        let src = root.join("src");
        let mut under = Vec::new();
        walk(&src, &mut under)?;
        for p in under {
            let rel = p.strip_prefix(root).unwrap().to_string_lossy().replace('\\', "/");
            files.push((format!("{prefix}/{rel}"), p));
        }
        let orig = root.join("Cargo.toml.orig");
        files.push((format!("{prefix}/Cargo.toml"), if orig.is_file() { orig } else { root.join("Cargo.toml") }));
        for name in extra {
            files.push((format!("{prefix}/{name}"), root.join(name)));
        }
    }
    files.push(("host/build/kernels.rs".into(), roots.kernels_rs.clone()));
    let mut inputs = Vec::with_capacity(files.len());
    for (name, path) in files {
        let bytes = std::fs::read(&path).map_err(|e| format!("read {}: {e}", path.display()))?;
        inputs.push(Input { name, sha256: sha256::hex(&normalize(&bytes)) });
    }
    inputs.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(inputs)
}

/// The hash of all inputs: SHA-256 of their `"{sha256} {name}\n"` lines.
pub fn combined(inputs: &[Input]) -> String {
    let mut s = String::new();
    for i in inputs {
        let _ = writeln!(s, "{} {}", i.sha256, i.name);
    }
    sha256::hex(s.as_bytes())
}

/// CRLF to LF.
fn normalize(bytes: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(bytes.len());
    for (i, &b) in bytes.iter().enumerate() {
        if !(b == b'\r' && bytes.get(i + 1) == Some(&b'\n')) {
            out.push(b);
        }
    }
    out
}

/// The regular files under `dir`, recursively.
fn walk(dir: &Path, out: &mut Vec<PathBuf>) -> Result<(), String> {
    let entries = std::fs::read_dir(dir).map_err(|e| format!("read {}: {e}", dir.display()))?;
    for e in entries {
        let p = e.map_err(|e| format!("read {}: {e}", dir.display()))?.path();
        if p.is_dir() {
            walk(&p, out)?;
        } else if p.is_file() {
            out.push(p);
        }
    }
    Ok(())
}

/// One shipped PTX file: `flash_attn_{arch}.ptx.xz` holds `len` bytes whose
/// SHA-256 is `sha256`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShippedPtx {
    pub arch: String,
    pub sha256: String,
    pub len: usize,
}

impl ShippedPtx {
    pub fn file_name(&self) -> String {
        format!("flash_attn_{}.ptx.xz", self.arch)
    }
}

/// `host-crate/ptx/manifest.txt`: which sources the shipped PTX was built
/// from, and what the PTX is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Manifest {
    pub toolchain: String,
    /// [`combined`] of [`Manifest::files`].
    pub inputs: String,
    pub ptx: Vec<ShippedPtx>,
    pub files: Vec<Input>,
}

impl Manifest {
    pub fn render(&self) -> String {
        let mut s = String::from(
            "# The prebuilt PTX of flash-attn-kernels shipped in this folder (xz-compressed).\n\
             # Written by `cargo xtask ship-ptx`; host-crate/build.rs uses it when `inputs`\n\
             # equals the hash of the kernel sources at hand, and builds from source otherwise.\n",
        );
        let _ = writeln!(s, "toolchain {}", self.toolchain);
        let _ = writeln!(s, "inputs {}", self.inputs);
        for p in &self.ptx {
            let _ = writeln!(s, "ptx {} {} {}", p.arch, p.sha256, p.len);
        }
        for i in &self.files {
            let _ = writeln!(s, "input {} {}", i.sha256, i.name);
        }
        s
    }

    pub fn parse(text: &str) -> Result<Manifest, String> {
        let mut m = Manifest { toolchain: String::new(), inputs: String::new(), ptx: Vec::new(), files: Vec::new() };
        for (n, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let bad = || format!("manifest line {}: cannot read `{line}`", n + 1);
            let words: Vec<&str> = line.split_whitespace().collect();
            match words.as_slice() {
                ["toolchain", t] => m.toolchain = t.to_string(),
                ["inputs", h] => m.inputs = h.to_string(),
                ["ptx", arch, sha, len] => m.ptx.push(ShippedPtx {
                    arch: arch.to_string(),
                    sha256: sha.to_string(),
                    len: len.parse().map_err(|_| bad())?,
                }),
                ["input", sha, name] => m.files.push(Input { name: name.to_string(), sha256: sha.to_string() }),
                _ => return Err(bad()),
            }
        }
        if m.toolchain.is_empty() || m.inputs.is_empty() || m.ptx.is_empty() {
            return Err("manifest: `toolchain`, `inputs` or `ptx` lines missing".into());
        }
        Ok(m)
    }

    /// The inputs that differ between the manifest and `current` (changed,
    /// added or removed), for messages.
    pub fn changed(&self, current: &[Input]) -> Vec<String> {
        let mut out = Vec::new();
        for i in current {
            match self.files.iter().find(|f| f.name == i.name) {
                None => out.push(format!("{} (new)", i.name)),
                Some(f) if f.sha256 != i.sha256 => out.push(i.name.clone()),
                Some(_) => {}
            }
        }
        for f in &self.files {
            if !current.iter().any(|i| i.name == f.name) {
                out.push(format!("{} (removed)", f.name));
            }
        }
        out
    }
}
