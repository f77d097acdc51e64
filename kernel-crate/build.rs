//! Exports this crate's folder and pinned nightly to flash-attn's build
//! script, which compiles the kernels from these sources (`links` metadata:
//! `DEP_FLASH_ATTN_KERNELS_ROOT`, `DEP_FLASH_ATTN_KERNELS_TOOLCHAIN`). The
//! channel lives in this crate's own `rust-toolchain.toml`, so a registry
//! copy carries it too.

fn main() {
    let dir = std::path::PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap());
    let toml = dir.join("rust-toolchain.toml");
    println!("cargo:rerun-if-changed={}", toml.display());
    let text = std::fs::read_to_string(&toml).unwrap_or_else(|e| panic!("read {}: {e}", toml.display()));
    let channel = text
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once('=')?;
            (k.trim() == "channel").then(|| v.trim().trim_matches('"').to_string())
        })
        .unwrap_or_else(|| panic!("{}: no `channel = \"…\"` line", toml.display()));
    println!("cargo:root={}", dir.display());
    println!("cargo:toolchain={channel}");
}
