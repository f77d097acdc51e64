#!/usr/bin/env bash
# Builds here (release) and packs the binaries the device scripts run into
# .stage-t/bins.tar.xz (ignored by git; carry it with the device call):
# every GPU test binary of flash-attn-tests under its plain name, the
# benchmark binaries, and the host crate's examples.
# Usage: scripts/microbench/pack-bins.sh [EXTRA_FILE...]
set -euo pipefail
cd "$(dirname "$0")/../.."
rm -rf .stage-t/bins && mkdir -p .stage-t/bins
cargo test --release -p flash-attn-tests --no-run --message-format=json 2>/dev/null \
  | python3 -c '
import json, sys, shutil, os
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("profile", {}).get("test") and m.get("executable"):
        name = m["target"]["name"]
        if name.startswith("gpu_") or name.startswith("ndarray_"):
            shutil.copy(m["executable"], os.path.join(".stage-t/bins", name))
'
cargo build --release -p flash-attn-tests --bin fa-bench --bin fa-bench-bwd --bin fa-run --bin fa-first-call 2>&1 | tail -1
cargo build --release -p flash-attn --examples 2>&1 | tail -1
for b in fa-bench fa-bench-bwd fa-run fa-first-call; do cp target/release/$b .stage-t/bins/; done
for e in target/release/examples/*; do
  [[ -x "$e" && -f "$e" && "$e" != *-* && "$e" != *.d ]] && cp "$e" .stage-t/bins/
done
for f in "$@"; do cp "$f" .stage-t/bins/; done
strip .stage-t/bins/* 2>/dev/null || true
tar cJf .stage-t/bins.tar.xz -C .stage-t/bins .
ls -la .stage-t/bins; du -h .stage-t/bins.tar.xz
