//! `host-crate/ptx/cubins.txt`: the cubins shipped beside the PTX
//! (`flash_attn_ARCH.cubins.xz`, each a raw cubin pack, `src/ptx/pack.rs`,
//! compressed whole), which `ptxas` release assembled them, and from which
//! PTX (its SHA-256): `build.rs` embeds a build's cubins only when that hash
//! is the hash of the PTX it embeds, so PTX rebuilt from changed sources
//! never runs with stale cubins.
//!
//! Written by `cargo xtask ship-cubins` (and `ship-ptx`); shared with xtask
//! (`#[path]`).

use std::fmt::Write as _;

/// The `ptxas` release the shipped cubins are assembled with (PyPI
/// `nvidia-cuda-nvcc==13.5.37`, CUDA 13.5): `cargo xtask test` compares the
/// shipped cubins byte for byte with what this release makes of the
/// shipped PTX. Cubins of CUDA 13 load on drivers of CUDA 13.0 (r580) and
/// later; an older driver refuses them and the library JIT-compiles the PTX.
pub const PINNED_PTXAS: &str = "13.5.37";

/// One shipped pack: `flash_attn_{arch}.cubins.xz` decompresses to `len`
/// bytes, assembled from the PTX whose SHA-256 is `ptx_sha256`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShippedCubins {
    pub arch: String,
    pub len: usize,
    pub ptx_sha256: String,
}

impl ShippedCubins {
    pub fn file_name(&self) -> String {
        file_name(&self.arch)
    }
}

/// `flash_attn_{arch}.cubins.xz`.
pub fn file_name(arch: &str) -> String {
    format!("flash_attn_{arch}.cubins.xz")
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CubinManifest {
    pub ptxas: String,
    pub packs: Vec<ShippedCubins>,
}

impl CubinManifest {
    pub fn render(&self) -> String {
        let mut s = String::from(
            "# Cubins assembled ahead of time by ptxas from the shipped PTX, one per kernel\n\
             # (flash_attn_ARCH.cubins.xz). Written by `cargo xtask ship-cubins`; host-crate/build.rs\n\
             # embeds a pack only when `ptx` is the SHA-256 of the PTX it embeds.\n",
        );
        let _ = writeln!(s, "ptxas {}", self.ptxas);
        for p in &self.packs {
            let _ = writeln!(s, "cubins {} {} {}", p.arch, p.len, p.ptx_sha256);
        }
        s
    }

    pub fn parse(text: &str) -> Result<Self, String> {
        let mut m = CubinManifest { ptxas: String::new(), packs: Vec::new() };
        for (n, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let bad = || format!("cubins.txt line {}: cannot read `{line}`", n + 1);
            match line.split_whitespace().collect::<Vec<_>>().as_slice() {
                ["ptxas", v] => m.ptxas = v.to_string(),
                ["cubins", arch, len, sha] => m.packs.push(ShippedCubins {
                    arch: arch.to_string(),
                    len: len.parse().map_err(|_| bad())?,
                    ptx_sha256: sha.to_string(),
                }),
                _ => return Err(bad()),
            }
        }
        if m.ptxas.is_empty() {
            return Err("cubins.txt: no `ptxas` line".into());
        }
        Ok(m)
    }

    /// The pack for `arch`, if one is shipped.
    pub fn pack(&self, arch: &str) -> Option<&ShippedCubins> {
        self.packs.iter().find(|p| p.arch == arch)
    }
}
