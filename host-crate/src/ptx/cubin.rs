//! The cubins assembled ahead of time from each embedded PTX build (by
//! `ptxas` at packaging time, `cargo xtask ship-cubins`), embedded by
//! `build.rs` one LZ4 block per kernel ([`super::pack`]): loading a
//! kernel's cubin costs the driver no JIT compilation, and the library
//! decompresses only the kernel it loads.
//!
//! A build's cubins are used when they run on the device (the CUDA binary
//! compatibility rule, [`cubin_runs_on`]) and `FLASH_ATTN_FORCE_PTX` is not
//! `1`; elsewhere (newer GPUs, builds without cubins) the kernels are
//! JIT-compiled from the PTX as before.

use std::sync::OnceLock;

use super::pack::{Codec, Pack, cubin_runs_on};
use super::PtxBuild;

/// Set to `1`, every kernel is JIT-compiled from its PTX even where a
/// prebuilt cubin would run (for comparing, or working around a driver).
pub const FORCE_PTX_ENV: &str = "FLASH_ATTN_FORCE_PTX";

/// `(arch, pack, SHA-256 of the PTX embedded for arch)` per build; a pack
/// is empty where `build.rs` embedded none.
const EMBEDDED: &[(&str, &[u8], &str)] = &[
    (
        "sm_80",
        include_bytes!(concat!(env!("OUT_DIR"), "/flash_attn_sm_80.cubins")),
        include_str!(concat!(env!("OUT_DIR"), "/flash_attn_sm_80.ptx.sha256")),
    ),
    (
        "sm_90",
        include_bytes!(concat!(env!("OUT_DIR"), "/flash_attn_sm_90.cubins")),
        include_str!(concat!(env!("OUT_DIR"), "/flash_attn_sm_90.ptx.sha256")),
    ),
    (
        "sm_90a",
        include_bytes!(concat!(env!("OUT_DIR"), "/flash_attn_sm_90a.cubins")),
        include_str!(concat!(env!("OUT_DIR"), "/flash_attn_sm_90a.ptx.sha256")),
    ),
];

/// The prebuilt cubins of one PTX build.
#[derive(Debug)]
pub(crate) struct Cubins {
    pack: Pack<'static>,
}

/// One build's embedded pack, parsed: `Ok(None)` where none is embedded.
type Parsed = (&'static str, Result<Option<Cubins>, String>);

/// Each embedded pack, parsed on first use (the index only: a few hundred
/// lines).
fn parsed() -> &'static [Parsed] {
    static PACKS: OnceLock<Vec<Parsed>> = OnceLock::new();
    PACKS.get_or_init(|| EMBEDDED.iter().map(|&(arch, bytes, ptx_sha)| (arch, parse(arch, bytes, ptx_sha))).collect())
}

fn parse(arch: &'static str, bytes: &'static [u8], ptx_sha256: &str) -> Result<Option<Cubins>, String> {
    if bytes.is_empty() {
        return Ok(None);
    }
    let pack = Pack::parse(bytes)?;
    // build.rs embeds only the cubins of the PTX it embeds; checked again
    // here, at no cost, so that no other path can pair them wrongly.
    if pack.arch != arch || pack.ptx_sha256 != ptx_sha256.trim() || pack.codec != Codec::Lz4 {
        return Err(format!("the embedded {arch} cubins belong to other PTX (arch {}, PTX sha256 {})", pack.arch, pack.ptx_sha256));
    }
    Ok(Some(Cubins { pack }))
}

impl Cubins {
    /// The cubins of `build` for a device of compute capability `cc`, or why
    /// its kernels are to be JIT-compiled from the PTX instead.
    pub(crate) fn for_device(build: PtxBuild, cc: (i32, i32)) -> Result<&'static Cubins, String> {
        if std::env::var(FORCE_PTX_ENV).is_ok_and(|v| v == "1") {
            return Err(format!("{FORCE_PTX_ENV}=1"));
        }
        let (_, found) = parsed()
            .iter()
            .find(|(arch, _)| *arch == build.arch)
            .ok_or_else(|| format!("no cubins for the {} build", build.arch))?;
        let cubins = found.as_ref().map_err(Clone::clone)?.as_ref().ok_or_else(|| {
            format!("no {} cubins embedded (built with FLASH_ATTN_CUBINS=0, or the PTX was built from changed sources)", build.arch)
        })?;
        if !cubin_runs_on(build.arch, cc.0, cc.1) {
            return Err(format!(
                "{} cubins do not run on compute capability {}.{} (a cubin runs on its own major revision, same or later minor)",
                build.arch, cc.0, cc.1
            ));
        }
        Ok(cubins)
    }

    /// The `ptxas` release that assembled them.
    pub(crate) fn ptxas(&self) -> &'static str {
        self.pack.ptxas
    }

    /// The cubin of kernel `name`, decompressed; `Ok(None)` if the pack
    /// has no such kernel.
    pub(crate) fn cubin(&self, name: &str) -> Result<Option<Vec<u8>>, String> {
        let Some(e) = self.pack.entry(name) else { return Ok(None) };
        let cubin = lz4_flex::block::decompress(e.stored, e.len).map_err(|err| format!("the cubin of {name} does not decompress: {err}"))?;
        if cubin.len() != e.len {
            return Err(format!("the cubin of {name} decompresses to {} bytes, not {}", cubin.len(), e.len));
        }
        Ok(Some(cubin))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every embedded pack reads, matches its PTX, holds exactly the PTX's
    /// entries, and each cubin decompresses to an ELF image.
    #[test]
    fn embedded_packs_match_their_ptx() {
        for build in super::super::ALL {
            let (_, found) = parsed().iter().find(|(a, _)| *a == build.arch).unwrap();
            let Some(c) = found.as_ref().unwrap() else {
                eprintln!("{}: no cubins embedded", build.arch);
                continue;
            };
            let names: Vec<&str> = c.pack.entries.iter().map(|e| e.name).collect();
            assert_eq!(names, build.split().unwrap().entries(), "{}", build.arch);
            for name in [names[0], names[names.len() / 2], names[names.len() - 1]] {
                let cubin = c.cubin(name).unwrap().unwrap();
                assert!(cubin.starts_with(b"\x7fELF"), "{name}");
            }
            assert!(c.cubin("no_such_kernel").unwrap().is_none());
        }
    }

    #[test]
    fn cubins_only_where_they_run() {
        use super::super::{SM80, SM90, SM90A};
        let has = |arch: &str| parsed().iter().any(|(a, r)| *a == arch && matches!(r, Ok(Some(_))));
        if has("sm_80") {
            assert!(Cubins::for_device(SM80, (8, 6)).is_ok());
        }
        if has("sm_90") {
            assert!(Cubins::for_device(SM90, (9, 0)).is_ok());
            assert!(Cubins::for_device(SM90, (10, 0)).unwrap_err().contains("do not run"));
        }
        if has("sm_90a") {
            assert!(Cubins::for_device(SM90A, (9, 0)).is_ok());
        }
    }
}
