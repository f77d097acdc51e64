#!/usr/bin/env bash
# A new application on stable Rust depends on this checkout by path, builds
# with plain `cargo build`, and runs: the ndarray example
# (host-crate/examples/ndarray_prefill.rs) as its main.rs, on the GPU when
# there is one and on the CPU reference otherwise. Two builds:
#   1. the prebuilt PTX shipped in host-crate/ptx/ (FLASH_ATTN_BUILD_PTX=0:
#      an error if it were stale): no nightly involved, timed;
#   2. the kernels from source (FLASH_ATTN_BUILD_PTX=1): the build script
#      runs the pinned nightly through rustup although cargo is stable.
# Usage: scripts/ci/stable-app.sh [--prebuilt-only]
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
rustup toolchain install stable --profile minimal --no-self-update
stable_rustc=$(rustup which --toolchain stable rustc)
echo "stable-app: $("$stable_rustc" -V)"

dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
mkdir -p "$dir/app/src"
cp "$root/host-crate/examples/ndarray_prefill.rs" "$dir/app/src/main.rs"
cat > "$dir/app/Cargo.toml" <<EOF
[package]
name = "stable-app"
version = "0.1.0"
edition = "2024"
publish = false

[dependencies]
flash-attn = { path = "$root/host-crate" }
half = "2.4"
ndarray = "0.16"
EOF
cd "$dir/app"
# Outside the checkout, so the repository's rust-toolchain.toml does not
# apply; `+stable` says it anyway.
unset RUSTUP_TOOLCHAIN RUSTC CARGO
t0=$(date +%s)
FLASH_ATTN_BUILD_PTX=0 cargo +stable build --release
echo "stable-app: built on stable with the prebuilt PTX in $(( $(date +%s) - t0 )) s (dependencies included)"
FLASH_ATTN_BUILD_PTX=0 cargo +stable run --release
if [[ "${1:-}" != --prebuilt-only ]]; then
  t0=$(date +%s)
  FLASH_ATTN_BUILD_PTX=1 cargo +stable build --release
  echo "stable-app: kernels built from source through rustup under stable cargo in $(( $(date +%s) - t0 )) s"
  FLASH_ATTN_BUILD_PTX=1 cargo +stable run --release
fi
