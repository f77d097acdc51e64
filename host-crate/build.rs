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
//! Beside each PTX it puts the **cubins** assembled from it ahead of time
//! (`ptx/flash_attn_*.cubins.xz`, [`embed_cubins`]): one per kernel, each
//! re-encoded on its own (LZ4) so that the library decompresses only the
//! kernel it loads. Only cubins assembled from the very PTX embedded (the
//! SHA-256 `ptx/cubins.txt` records) are used: PTX built from changed
//! sources runs without them (JIT-compiled, as on GPUs the cubins do not
//! serve). `FLASH_ATTN_CUBINS=0` leaves them out (binaries about 20 MB
//! smaller; every kernel JIT-compiled on first use).
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

// `CubinManifest::render` is for `cargo xtask ship-cubins`, which shares the file.
#[allow(dead_code)]
#[path = "build/cubins.rs"]
mod cubins;
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
// The cubin pack format (the library reads what this writes).
#[allow(dead_code)]
#[path = "src/ptx/pack.rs"]
mod pack;

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
    println!("cargo:rerun-if-env-changed=FLASH_ATTN_CUBINS");
    let with_cubins = match env::var("FLASH_ATTN_CUBINS").as_deref() {
        Err(_) | Ok("") | Ok("1") => true,
        Ok("0") => false,
        Ok(v) => return Err(format!("FLASH_ATTN_CUBINS={v}: use 0 (no prebuilt cubins) or 1 (the default)")),
    };
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
        let m = shipped.as_ref().unwrap();
        unpack_shipped(&ship_dir, m, &out_dir)?;
        let shas: Vec<(String, String)> = m.ptx.iter().map(|p| (p.arch.clone(), p.sha256.clone())).collect();
        return embed_cubins(&ship_dir, &out_dir, &shas, with_cubins);
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
    // The hash only matters where cubins may be embedded (hashing ~90 MB
    // in an unoptimized build script takes seconds).
    let hash_ptx = with_cubins && ship_dir.join("cubins.txt").is_file();
    let mut shas = Vec::new();
    for (arch, ptx) in kernels::build(&kernel_dir, &tc, &out_dir)? {
        write_if_changed(&out_dir.join(format!("flash_attn_{arch}.ptx")), ptx.as_bytes())?;
        shas.push((arch.to_string(), if hash_ptx { sha256::hex(ptx.as_bytes()) } else { String::new() }));
    }
    embed_cubins(&ship_dir, &out_dir, &shas, with_cubins)
}

/// Writes `flash_attn_{arch}.cubins` (and `flash_attn_{arch}.ptx.sha256`,
/// which the library checks the pack's header against) for every embedded
/// PTX `(arch, SHA-256)`: the shipped cubins of exactly that PTX, each
/// re-encoded with LZ4 on its own; an empty file (no cubins: the library
/// JIT-compiles the PTX) when none are shipped for it, when they were
/// assembled from other PTX (a build from changed sources), or with
/// `FLASH_ATTN_CUBINS=0`.
fn embed_cubins(ship_dir: &Path, out_dir: &Path, ptx: &[(String, String)], enabled: bool) -> Result<(), String> {
    let manifest = match std::fs::read_to_string(ship_dir.join("cubins.txt")) {
        Ok(text) => Some(cubins::CubinManifest::parse(&text)?),
        Err(_) => None,
    };
    for (arch, sha) in ptx {
        write_if_changed(&out_dir.join(format!("flash_attn_{arch}.ptx.sha256")), sha.as_bytes())?;
        let out = out_dir.join(format!("flash_attn_{arch}.cubins"));
        let shipped = manifest.as_ref().and_then(|m| m.pack(arch));
        let pack = match shipped {
            Some(p) if enabled && &p.ptx_sha256 == sha => reencode(ship_dir, p, sha)?,
            Some(_) if enabled => {
                println!(
                    "cargo:warning=the prebuilt {arch} cubins were assembled from other PTX than the one built here: \
                     every {arch} kernel will be JIT-compiled on first use (`cargo xtask ship-ptx` refreshes them)"
                );
                Vec::new()
            }
            _ => Vec::new(),
        };
        write_if_changed(&out, &pack)?;
    }
    Ok(())
}

/// The shipped raw pack `p` (of the PTX whose SHA-256 is `sha`),
/// decompressed, checked and re-encoded one cubin at a time with LZ4.
fn reencode(ship_dir: &Path, p: &cubins::ShippedCubins, sha: &str) -> Result<Vec<u8>, String> {
    let path = ship_dir.join(p.file_name());
    let file = std::fs::File::open(&path).map_err(|e| format!("open {}: {e}", path.display()))?;
    let mut raw = Vec::with_capacity(p.len);
    lzma_rs::xz_decompress(&mut std::io::BufReader::new(file), &mut raw)
        .map_err(|e| format!("decompress {}: {e:?}", path.display()))?;
    let pk = pack::Pack::parse(&raw).map_err(|e| format!("{}: {e}", path.display()))?;
    if raw.len() != p.len || pk.arch != p.arch || pk.ptx_sha256 != sha || pk.codec != pack::Codec::Raw {
        return Err(format!(
            "{} does not hold the {} cubins of the PTX ptx/cubins.txt names ({} bytes): run `cargo xtask ship-cubins`, \
             or build without them (FLASH_ATTN_CUBINS=0)",
            path.display(),
            p.arch,
            p.len
        ));
    }
    let stored: Vec<Vec<u8>> = pk.entries.iter().map(|e| lz4_flex::block::compress(e.stored)).collect();
    let entries: Vec<(&str, &[u8], usize)> = pk.entries.iter().zip(&stored).map(|(e, s)| (e.name, s.as_slice(), e.len)).collect();
    Ok(pack::render(pk.arch, pk.ptx_sha256, pk.ptxas, pack::Codec::Lz4, &entries))
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
