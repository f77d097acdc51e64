#!/usr/bin/env bash
# Builds here (release, without the embedded cubins: the binaries stay
# small) and packs what scripts/microbench/hopper-backward.sh runs into
# .stage-hb/bins.tar.xz (ignored by git; carry it with the device call):
# the gpu_backward test binary and fa-bench-bwd.
set -euo pipefail
cd "$(dirname "$0")/../.."
export FLASH_ATTN_CUBINS=0
t=$(cargo test --release -p flash-attn-tests --test gpu_backward --no-run --message-format=json 2>/dev/null | python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == "gpu_backward":
        print(m["executable"])
')
cargo build --release -p flash-attn-tests --bin fa-bench-bwd 2>&1 | tail -1
rm -rf .stage-hb && mkdir -p .stage-hb/bins
cp "$t" .stage-hb/bins/gpu_backward && cp target/release/fa-bench-bwd .stage-hb/bins/
strip .stage-hb/bins/*
tar cJf .stage-hb/bins.tar.xz -C .stage-hb/bins . && rm -rf .stage-hb/bins
du -h .stage-hb/bins.tar.xz
