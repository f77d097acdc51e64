#!/usr/bin/env bash
# Builds here (release, without the embedded cubins: the binaries stay
# small) and packs what scripts/microbench/fp8-prefill.sh runs into
# .stage-f8/bins.tar.xz (ignored by git; carry it with the device call):
# the gpu_fp8_prefill test binary and fa-bench-fp8.
set -euo pipefail
cd "$(dirname "$0")/../.."
export FLASH_ATTN_CUBINS=0
t=$(cargo test --release -p flash-attn-tests --test gpu_fp8_prefill --no-run --message-format=json 2>/dev/null | python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == "gpu_fp8_prefill":
        print(m["executable"])
')
cargo build --release -p flash-attn-tests --bin fa-bench-fp8 2>&1 | tail -1
rm -rf .stage-f8 && mkdir -p .stage-f8/bins
cp "$t" .stage-f8/bins/gpu_fp8_prefill && cp target/release/fa-bench-fp8 .stage-f8/bins/
strip .stage-f8/bins/*
tar cJf .stage-f8/bins.tar.xz -C .stage-f8/bins . && rm -rf .stage-f8/bins
du -h .stage-f8/bins.tar.xz
