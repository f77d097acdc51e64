//! The kernels' toolchain is named twice: in `rust-toolchain.toml` (what
//! the repository builds with) and in `host-crate/build.rs` (what a
//! dependent crate's build runs through rustup, whatever its own
//! toolchain). They must agree.

fn quoted_after(text: &str, key: &str) -> Option<String> {
    let rest = &text[text.find(key)? + key.len()..];
    let start = rest.find('"')? + 1;
    let end = start + rest[start..].find('"')?;
    Some(rest[start..end].to_string())
}

#[test]
fn build_script_builds_kernels_with_the_pinned_nightly() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let toml = std::fs::read_to_string(root.join("rust-toolchain.toml")).unwrap();
    let build = std::fs::read_to_string(root.join("host-crate/build.rs")).unwrap();
    let pinned = quoted_after(&toml, "channel").expect("rust-toolchain.toml: channel");
    let kernel = quoted_after(&build, "const KERNEL_TOOLCHAIN: &str =").expect("build.rs: KERNEL_TOOLCHAIN");
    assert!(pinned.starts_with("nightly-"), "{pinned}");
    assert_eq!(kernel, pinned, "host-crate/build.rs KERNEL_TOOLCHAIN vs rust-toolchain.toml channel");
}
