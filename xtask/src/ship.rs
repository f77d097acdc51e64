//! `cargo xtask ship-ptx`: rebuild the kernels' PTX from source and rewrite
//! the prebuilt PTX shipped in the package (`host-crate/ptx/`: one
//! `flash_attn_ARCH.ptx.xz` per target and `manifest.txt`, which records the
//! hash of the sources it was built from; see `host-crate/build.rs`), then
//! the cubins assembled from it ([`crate::cubin`]) when the pinned ptxas is
//! found (else it removes them).
//!
//! Run it after changing anything under `kernel-crate/` or
//! `host-crate/build/kernels.rs`; `cargo xtask test` fails until then.
//! Compresses with the `xz` command (xz-utils); the build script decompresses
//! with the pure-Rust `lzma-rs`.

use std::io::Write;
use std::process::{Command, Stdio};

use crate::cubin;
use crate::ptx_build::{self, inputs, sha256};

pub fn main(args: &[String]) -> Result<(), String> {
    if !args.is_empty() {
        println!(
            "usage: cargo xtask ship-ptx\n\nBuilds the kernels from source with the pinned nightly (target/kernels-ptx) and\nrewrites host-crate/ptx/ (the xz-compressed PTX and manifest.txt)."
        );
        return if args.iter().any(|a| a == "-h" || a == "--help") { Ok(()) } else { Err("no arguments expected".into()) };
    }
    let (files, built) = ptx_build::build_from_source()?;
    let dir = ptx_build::ship_dir();
    std::fs::create_dir_all(&dir).map_err(|e| format!("create {}: {e}", dir.display()))?;
    let mut ptx = Vec::new();
    for (arch, text) in &built {
        let entry = inputs::ShippedPtx { arch: arch.to_string(), sha256: sha256::hex(text.as_bytes()), len: text.len() };
        let xz = xz(&["-9e", "--threads=1", "--check=crc64", "-c"], text.as_bytes())?;
        if xz_decompress(&xz)? != text.as_bytes() {
            return Err(format!("xz round trip of the {arch} PTX differs"));
        }
        let path = dir.join(entry.file_name());
        std::fs::write(&path, &xz).map_err(|e| format!("write {}: {e}", path.display()))?;
        println!("xtask: {} ({} -> {} bytes)", path.display(), text.len(), xz.len());
        ptx.push(entry);
    }
    let channel = ptx_build::channel()?;
    let m = inputs::Manifest { toolchain: channel, inputs: inputs::combined(&files), ptx, files };
    let path = dir.join("manifest.txt");
    std::fs::write(&path, m.render()).map_err(|e| format!("write {}: {e}", path.display()))?;
    println!("xtask: {} (inputs {})", path.display(), m.inputs);
    // The cubins follow the PTX: reassembled with the pinned ptxas, or
    // removed (stale cubins are never embedded, but `cargo xtask test`
    // refuses them; without cubins the library JIT-compiles the PTX).
    match cubin::pinned_ptxas() {
        Some(ptxas) => cubin::ship(&ptxas, &cubin::shipped_ptx()?)?,
        None => {
            cubin::remove_shipped()?;
            println!(
                "xtask: cubins removed: ptxas {} not found (`python3 -m pip install --user nvidia-cuda-nvcc=={}`, then `cargo xtask ship-cubins`)",
                cubin::cubins::PINNED_PTXAS,
                cubin::cubins::PINNED_PTXAS
            );
        }
    }
    println!("xtask: commit host-crate/ptx/");
    Ok(())
}

/// Runs `xz ARGS` with `input` on stdin; its stdout.
pub fn xz(args: &[&str], input: &[u8]) -> Result<Vec<u8>, String> {
    let mut child = Command::new("xz")
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot run `xz` (install xz-utils): {e}"))?;
    let mut stdin = child.stdin.take().unwrap();
    let input = input.to_vec();
    let writer = std::thread::spawn(move || stdin.write_all(&input));
    let out = child.wait_with_output().map_err(|e| format!("xz: {e}"))?;
    writer.join().unwrap().map_err(|e| format!("xz stdin: {e}"))?;
    if !out.status.success() {
        return Err(format!("`xz {}` failed: {}", args.join(" "), String::from_utf8_lossy(&out.stderr)));
    }
    Ok(out.stdout)
}

pub fn xz_decompress(data: &[u8]) -> Result<Vec<u8>, String> {
    xz(&["-dc"], data)
}
