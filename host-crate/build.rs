//! Provides the kernels' PTX (one module per target family, [`kernels::ARCHS`])
//! in `OUT_DIR` for `include_str!` (`src/ptx.rs`), from one of two places:
//!
//! * **the prebuilt PTX shipped in the package** (`ptx/flash_attn_*.ptx.xz`,
//!   decompressed here in about a second with the pure-Rust `lzma-rs`), when
//!   `ptx/manifest.txt` records the very sources at hand: the hash of every
//!   input of the kernel build ([`inputs`]: the kernel and shared crates'
//!   sources and manifests, the pinned nightly, `build/kernels.rs`) equals
//!   the manifest's `inputs`. No nightly, no rustup needed: any toolchain
//!   (stable 1.87+) builds the crate in seconds.
//! * **a build from source** otherwise (a developer changed a kernel): the
//!   kernel crate compiled by rustc's `nvptx64-nvidia-cuda` target
//!   ([`kernels::build`]) with the pinned nightly of the kernel crate's
//!   `rust-toolchain.toml`, run through rustup whatever toolchain runs this
//!   build ([`toolchain::find`]; a missing nightly or `rust-src` names the
//!   command that installs it). No nvcc, no CUDA toolkit.
//!
//! `FLASH_ATTN_BUILD_PTX=1` forces the build from source; `=0` forbids it
//! (an error when the shipped PTX does not match the sources).
//!
//! After changing a kernel, `cargo xtask ship-ptx` rebuilds the PTX from
//! source and rewrites `ptx/` (the compressed files and the manifest);
//! `cargo xtask test` fails while the shipped PTX is not exactly what the
//! sources build.
//!
//! The kernel sources come from the `flash-attn-kernels` and
//! `flash-attn-common` dependencies, whose build scripts export their folders
//! (`links` metadata: `DEP_FLASH_ATTN_KERNELS_ROOT`, `…_TOOLCHAIN`,
//! `DEP_FLASH_ATTN_COMMON_ROOT`): `kernel-crate/` in the repository, or the
//! registry copies of the published crates.

// `Manifest::render` is for `cargo xtask ship-ptx`, which shares the file.
#[allow(dead_code)]
#[path = "build/inputs.rs"]
mod inputs;
#[path = "build/kernels.rs"]
mod kernels;
#[path = "build/sha256.rs"]
mod sha256;
// `channel_of` is for `cargo xtask`, which shares the file.
#[allow(dead_code)]
#[path = "build/toolchain.rs"]
mod toolchain;

use std::env;
use std::path::{Path, PathBuf};

use inputs::{Manifest, Roots};

fn main() {
    if let Err(e) = run() {
        eprintln!("\nerror: {e}");
        std::process::exit(1);
    }
}

/// `FLASH_ATTN_BUILD_PTX`.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Policy {
    /// Unset: the shipped PTX when it matches the sources, else from source.
    Auto,
    /// `1`: always from source.
    Source,
    /// `0`: only the shipped PTX.
    Shipped,
}

fn run() -> Result<(), String> {
    let manifest_dir = PathBuf::from(env::var("CARGO_MANIFEST_DIR").unwrap());
    let out_dir = PathBuf::from(env::var("OUT_DIR").unwrap());
    let dep = |key: &str| {
        env::var(format!("DEP_{key}"))
            .map_err(|_| format!("DEP_{key} is not set: the flash-attn-kernels/flash-attn-common build scripts did not run"))
    };
    let roots = Roots {
        kernels: PathBuf::from(dep("FLASH_ATTN_KERNELS_ROOT")?),
        common: PathBuf::from(dep("FLASH_ATTN_COMMON_ROOT")?),
        kernels_rs: manifest_dir.join("build/kernels.rs"),
    };
    let channel = dep("FLASH_ATTN_KERNELS_TOOLCHAIN")?;
    let ship_dir = manifest_dir.join("ptx");

    for p in [
        roots.kernels.join("src"),
        roots.kernels.join("Cargo.toml"),
        roots.kernels.join("build.rs"),
        roots.kernels.join("rust-toolchain.toml"),
        roots.common.join("src"),
        roots.common.join("Cargo.toml"),
        roots.common.join("build.rs"),
        ship_dir.clone(),
    ] {
        println!("cargo:rerun-if-changed={}", p.display());
    }
    println!("cargo:rerun-if-env-changed=FLASH_ATTN_BUILD_PTX");
    let policy = match env::var("FLASH_ATTN_BUILD_PTX").as_deref() {
        Err(_) | Ok("") => Policy::Auto,
        Ok("1") => Policy::Source,
        Ok("0") => Policy::Shipped,
        Ok(v) => return Err(format!("FLASH_ATTN_BUILD_PTX={v}: use 1 (build the PTX from source) or 0 (only the shipped PTX)")),
    };

    let current = inputs::list(&roots)?;
    let hash = inputs::combined(&current);
    let shipped = std::fs::read_to_string(ship_dir.join("manifest.txt")).ok().map(|t| Manifest::parse(&t)).transpose()?;
    let fresh = shipped.as_ref().is_some_and(|m| m.inputs == hash);

    if policy != Policy::Source && fresh {
        return unpack_shipped(&ship_dir, shipped.as_ref().unwrap(), &out_dir);
    }
    let why = match &shipped {
        None => "there is no shipped PTX (ptx/manifest.txt)".to_string(),
        Some(m) if !fresh => format!("the shipped PTX was built from other sources ({})", m.changed(&current).join(", ")),
        Some(_) => "FLASH_ATTN_BUILD_PTX=1".to_string(),
    };
    if policy == Policy::Shipped {
        return Err(format!(
            "FLASH_ATTN_BUILD_PTX=0 forbids building the kernels from source, but {why}.\n\
             Run `cargo xtask ship-ptx` in the repository to rebuild the shipped PTX, or unset FLASH_ATTN_BUILD_PTX."
        ));
    }
    if policy == Policy::Auto {
        println!(
            "cargo:warning=building the GPU kernels from source with {channel}: {why}. \
             `cargo xtask ship-ptx` updates the shipped PTX (host-crate/ptx/)."
        );
    }
    let tc = toolchain::find(&channel)?;
    let kernel_dir = source_tree(&roots, &out_dir)?;
    for (arch, ptx) in kernels::build(&kernel_dir, &tc, &out_dir)? {
        write_if_changed(&out_dir.join(format!("flash_attn_{arch}.ptx")), ptx.as_bytes())?;
    }
    Ok(())
}

/// Decompresses the shipped PTX into `out_dir`, checking each file's length
/// and SHA-256 against the manifest.
fn unpack_shipped(ship_dir: &Path, m: &Manifest, out_dir: &Path) -> Result<(), String> {
    let archs: Vec<&str> = m.ptx.iter().map(|p| p.arch.as_str()).collect();
    let want: Vec<&str> = kernels::ARCHS.iter().map(|a| a.0).collect();
    if archs != want {
        return Err(format!("ptx/manifest.txt lists the targets {archs:?}, the build wants {want:?}"));
    }
    for p in &m.ptx {
        let path = ship_dir.join(p.file_name());
        let file = std::fs::File::open(&path).map_err(|e| format!("open {}: {e}", path.display()))?;
        let mut ptx = Vec::with_capacity(p.len);
        lzma_rs::xz_decompress(&mut std::io::BufReader::new(file), &mut ptx)
            .map_err(|e| format!("decompress {}: {e:?}", path.display()))?;
        if ptx.len() != p.len || sha256::hex(&ptx) != p.sha256 {
            return Err(format!(
                "{} does not decompress to the PTX ptx/manifest.txt records ({} bytes, sha256 {}); \
                 rebuild it with `cargo xtask ship-ptx`, or build from source with FLASH_ATTN_BUILD_PTX=1",
                path.display(),
                p.len,
                p.sha256
            ));
        }
        write_if_changed(&out_dir.join(format!("flash_attn_{}.ptx", p.arch)), &ptx)?;
    }
    Ok(())
}

/// The folder to build the kernel crate in: `kernel-crate/` itself in the
/// repository (or a git checkout); for registry copies (`Cargo.toml.orig`
/// present) the repository's layout rebuilt under `OUT_DIR/kernel-src`
/// (`flash-attn-common` at `common/`, the original manifests, a `[workspace]`
/// of its own), so that the same files build the same PTX.
fn source_tree(roots: &Roots, out_dir: &Path) -> Result<PathBuf, String> {
    if !roots.kernels.join("Cargo.toml.orig").is_file() {
        return Ok(roots.kernels.clone());
    }
    let dst = out_dir.join("kernel-src");
    for (root, to, extra) in [
        (&roots.kernels, dst.clone(), &["build.rs", "rust-toolchain.toml"][..]),
        (&roots.common, dst.join("common"), &["build.rs"][..]),
    ] {
        copy_tree(&root.join("src"), &to.join("src"))?;
        for name in extra {
            copy_file(&root.join(name), &to.join(name))?;
        }
        let mut toml = std::fs::read(root.join("Cargo.toml.orig")).map_err(|e| format!("read {}/Cargo.toml.orig: {e}", root.display()))?;
        if to == dst {
            toml.extend_from_slice(b"\n[workspace]\n");
        }
        write_if_changed(&to.join("Cargo.toml"), &toml)?;
    }
    Ok(dst)
}

fn copy_tree(from: &Path, to: &Path) -> Result<(), String> {
    let entries = std::fs::read_dir(from).map_err(|e| format!("read {}: {e}", from.display()))?;
    for e in entries {
        let p = e.map_err(|e| e.to_string())?.path();
        let dst = to.join(p.file_name().unwrap());
        if p.is_dir() { copy_tree(&p, &dst)? } else { copy_file(&p, &dst)? }
    }
    Ok(())
}

fn copy_file(from: &Path, to: &Path) -> Result<(), String> {
    let bytes = std::fs::read(from).map_err(|e| format!("read {}: {e}", from.display()))?;
    write_if_changed(to, &bytes)
}

/// Writes `bytes` unless the file already holds them: an unchanged file
/// keeps its mtime, so nothing that `include_str!`s it (or the nested
/// cargo's fingerprints) sees a change.
fn write_if_changed(path: &Path, bytes: &[u8]) -> Result<(), String> {
    if std::fs::read(path).is_ok_and(|old| old == bytes) {
        return Ok(());
    }
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(|e| format!("create {}: {e}", dir.display()))?;
    }
    std::fs::write(path, bytes).map_err(|e| format!("write {}: {e}", path.display()))
}
