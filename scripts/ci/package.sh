#!/usr/bin/env bash
# Packaging dry-run: every publishable crate packs, and each packed crate
# builds on its own from its .crate file (cargo's verification step):
# flash-attn-common, flash-attn-kernels and flash-attn together (cargo
# resolves their dependencies on each other through a local registry), then
# flash-attn-candle (its own workspace) against the flash-attn checkout.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
# Cargo unpacks the local registry's crates once per name and version: a
# copy left by an earlier run would hold earlier sources.
rm -rf "${CARGO_HOME:-$HOME/.cargo}"/registry/src/-*/flash-attn-{common,kernels}-*
# The packaged flash-attn must build from its shipped PTX (no nightly): a
# mismatch between the packaged kernel sources and the PTX's manifest fails.
FLASH_ATTN_BUILD_PTX=0 cargo package -p flash-attn-common -p flash-attn-kernels -p flash-attn
ls -l target/package/*.crate
# flash-attn is not on crates.io yet: its checkout stands in for the
# registry copy the packaged manifest names.
cd candle-crate
FLASH_ATTN_BUILD_PTX=0 cargo package -p flash-attn-candle --config 'patch.crates-io.flash-attn.path="../host-crate"'
ls -l target/package/*.crate
