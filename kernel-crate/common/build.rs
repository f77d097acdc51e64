//! Exports this crate's folder to flash-attn's build script
//! (`DEP_FLASH_ATTN_COMMON_ROOT`), which compiles the GPU kernels, and this
//! crate with them, from source when its prebuilt PTX does not match.

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:root={}", std::env::var("CARGO_MANIFEST_DIR").unwrap());
}
