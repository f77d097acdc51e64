#!/usr/bin/env bash
# Session 18 call 6: fa-bench's Hopper column over head dims without their
# own kernel (96, 160 run the kernel the library pads them onto), checked
# against f64 (--check), beside the mma.sync FA2 kernels.
# .stage-t/bins.tar.xz: fa-bench.
set -u
. scripts/microbench/lib.sh
unpack_bins
gpu_name
timeout 300 /tmp/h/fa-bench --impls hopper,fa2 --dims 96,160,192 --seqlens 4096 --dtypes bf16 --check --no-torch --out /tmp/fb > /tmp/fb.log 2>&1
echo "rc $?"; cp /tmp/fb/*.md $OUT/ 2>/dev/null; grep -E "^\| " /tmp/fb/*.md | cut -c1-200 | head -20; grep -iE "check|fail" /tmp/fb.log | tail -5
