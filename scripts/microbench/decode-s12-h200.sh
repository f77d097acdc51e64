#!/usr/bin/env bash
# Decode, session 12 call 11: the committed library on an H200 — the decode
# GPU tests and memcheck, then the grid (fa-bench-decode, PyTorch in the same
# run). Outputs packed in $OUT/h200.tar.xz.
# .stage-t/bins.tar.xz: fa-bench-decode, gpu_decode, gpu_api, ndarray_kvcache.
set -u
. scripts/microbench/lib.sh
unpack_bins
run() {
  decode_checks
  timeout 360 /tmp/h/fa-bench-decode $OUT/grid --no-event-tracking > $OUT/grid.log 2>&1; echo "grid rc $?"; tail -3 $OUT/grid.log
  grep -E "\| (1|8) \| (4096|32768|131072) " $OUT/grid/decode.md | cut -c1-200
}
packed h200 h run
