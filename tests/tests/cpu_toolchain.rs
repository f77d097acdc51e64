//! The kernels' toolchain is named twice: in the repository's
//! `rust-toolchain.toml` (what the workspace builds with) and in
//! `kernel-crate/rust-toolchain.toml` (what `host-crate/build.rs` runs through
//! rustup to compile the kernels, whatever the dependent crate's own
//! toolchain; it is packaged with `flash-attn-kernels`). They must agree.

fn channel(path: &std::path::Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    text.lines()
        .find_map(|l| {
            let (k, v) = l.split_once('=')?;
            (k.trim() == "channel").then(|| v.trim().trim_matches('"').to_string())
        })
        .unwrap_or_else(|| panic!("{}: no channel line", path.display()))
}

#[test]
fn kernels_build_with_the_pinned_nightly() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let pinned = channel(&root.join("rust-toolchain.toml"));
    let kernel = channel(&root.join("kernel-crate/rust-toolchain.toml"));
    assert!(pinned.starts_with("nightly-"), "{pinned}");
    assert_eq!(kernel, pinned, "kernel-crate/rust-toolchain.toml vs rust-toolchain.toml");
}
