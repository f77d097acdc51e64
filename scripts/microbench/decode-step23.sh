#!/usr/bin/env bash
# Decode step 23 (docs/perf-notes.md), the committed build: GPU tests,
# memcheck over every flash-decoding kernel, then the grid (fa-bench-decode,
# PyTorch in the same run).
# .stage-t/bins.tar.xz: fa-bench-decode, gpu_decode, gpu_api, ndarray_kvcache.
set -u
. scripts/microbench/lib.sh
unpack_bins
run_tests gpu_decode gpu_api ndarray_kvcache
sanitize_decode memcheck gpu_every_decode_kernel gpu_decode_small_for_sanitizers
/tmp/h/fa-bench-decode $OUT/grid --no-event-tracking > $OUT/grid.log 2>&1; echo "grid rc $?"; tail -3 $OUT/grid.log
grep -E "paged 16" $OUT/grid/decode.md | head -20 | cut -c1-200
