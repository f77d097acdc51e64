//! The build script's PTX plumbing (`host-crate/build/`), compiled into
//! xtask by path so that `ship-ptx` and `test` build, hash and describe the
//! PTX exactly as `host-crate/build.rs` does.

use std::path::PathBuf;

#[path = "../../host-crate/build/inputs.rs"]
pub mod inputs;
#[path = "../../host-crate/build/kernels.rs"]
pub mod kernels;
#[path = "../../host-crate/build/sha256.rs"]
pub mod sha256;
#[path = "../../host-crate/build/toolchain.rs"]
pub mod toolchain;

use crate::cargo;

/// The repository's kernel sources.
pub fn roots() -> inputs::Roots {
    let root = cargo::root();
    inputs::Roots {
        kernels: root.join("kernel-crate"),
        common: root.join("kernel-crate/common"),
        kernels_rs: root.join("host-crate/build/kernels.rs"),
    }
}

/// `host-crate/ptx/`: the shipped PTX and its manifest.
pub fn ship_dir() -> PathBuf {
    cargo::root().join("host-crate/ptx")
}

/// The pinned nightly of `kernel-crate/rust-toolchain.toml`, checked equal to
/// the repository's `rust-toolchain.toml` (the one rustup uses in the tree).
pub fn channel() -> Result<String, String> {
    let kernels = toolchain::channel_of(&cargo::root().join("kernel-crate/rust-toolchain.toml"))?;
    let repo = toolchain::channel_of(&cargo::root().join("rust-toolchain.toml"))?;
    if kernels != repo {
        return Err(format!(
            "rust-toolchain.toml pins {repo} but kernel-crate/rust-toolchain.toml (the kernels' own, published with them) pins {kernels}: keep them equal"
        ));
    }
    Ok(kernels)
}

/// The inputs a PTX build read and its `(arch, PTX)` per target.
pub type Built = (Vec<inputs::Input>, Vec<(&'static str, String)>);

/// Builds the PTX from source as `host-crate/build.rs` does (same flags and
/// profile), in `target/kernels-ptx` (kept between runs: the nested cargo
/// rebuilds only what changed). Returns the inputs it was built from and
/// `(arch, PTX)` per target.
pub fn build_from_source() -> Result<Built, String> {
    let roots = roots();
    let channel = channel()?;
    let tc = toolchain::find(&channel)?;
    let before = inputs::list(&roots)?;
    println!("xtask: building the kernels from source with {channel} ({} targets) in target/kernels-ptx", kernels::ARCHS.len());
    let t0 = std::time::Instant::now();
    let ptx = kernels::build(&roots.kernels, &tc, &cargo::root().join("target/kernels-ptx"))?;
    if inputs::list(&roots)? != before {
        return Err("the kernel sources changed during the build; run again".into());
    }
    println!("xtask: kernels built in {:.0} s", t0.elapsed().as_secs_f64());
    Ok((before, ptx))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sha256_known_answers() {
        assert_eq!(sha256::hex(b""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
        assert_eq!(sha256::hex(b"abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
        // Two blocks (56 bytes: the padding spills into a second block).
        assert_eq!(
            sha256::hex(b"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"
        );
        assert_eq!(
            sha256::hex(&vec![b'a'; 1_000_000]),
            "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0"
        );
    }

    #[test]
    fn manifest_round_trips() {
        let m = inputs::Manifest {
            toolchain: "nightly-2026-05-20".into(),
            inputs: "ab".repeat(32),
            ptx: vec![inputs::ShippedPtx { arch: "sm_80".into(), sha256: "cd".repeat(32), len: 12 }],
            files: vec![inputs::Input { name: "kernels/src/lib.rs".into(), sha256: "ef".repeat(32) }],
        };
        assert_eq!(inputs::Manifest::parse(&m.render()).unwrap(), m);
        let changed = vec![
            inputs::Input { name: "kernels/src/lib.rs".into(), sha256: "00".repeat(32) },
            inputs::Input { name: "kernels/src/new.rs".into(), sha256: "00".repeat(32) },
        ];
        assert_eq!(m.changed(&changed), ["kernels/src/lib.rs", "kernels/src/new.rs (new)"]);
        assert!(inputs::Manifest::parse("toolchain x\n").is_err());
    }

    #[test]
    fn inputs_cover_the_kernel_sources() {
        let list = inputs::list(&roots()).unwrap();
        for name in ["kernels/src/lib.rs", "kernels/Cargo.toml", "kernels/rust-toolchain.toml", "common/src/lib.rs", "host/build/kernels.rs"] {
            assert!(list.iter().any(|i| i.name == name), "{name} missing from the PTX inputs");
        }
        assert!(list.windows(2).all(|w| w[0].name < w[1].name));
    }

    #[test]
    fn toolchain_files_agree() {
        channel().unwrap();
    }
}
