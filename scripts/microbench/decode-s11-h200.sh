#!/usr/bin/env bash
# Decode, session 11 call 8: the committed build on an H200 — the decode
# GPU tests and memcheck, the ticket and static schedules of the default
# kernels on long contiguous caches (the host takes no tickets where DRAM
# bandwidth per SM is over 30 GB/s: decode step 26), then the grid
# (fa-bench-decode, PyTorch in the same run). Outputs packed in
# $OUT/h200.tar.xz (the run tool returns at most 8 files).
# .stage-t/bins.tar.xz: fa-bench-decode, decode-tune, gpu_decode, gpu_api, ndarray_kvcache.
set -u
. scripts/microbench/lib.sh
unpack_bins
run() {
  decode_checks
  /tmp/h/decode-tune --no-event-tracking --cells 1:32768:8,1:32768:32,1:131072:8,1:131072:32 --layouts 0,256 --kernels w8_bc128_s3_c,w8_bc128_s3_pg_c --schedules default,static > $OUT/schedules.md 2>&1
  grep -E "^\| (batch|1) " $OUT/schedules.md | cut -c1-300 | sort -u
  timeout 330 /tmp/h/fa-bench-decode $OUT/grid --no-event-tracking > $OUT/grid.log 2>&1; echo "grid rc $?"; tail -3 $OUT/grid.log
  grep -E "\| 1 \| (4096|32768|131072) " $OUT/grid/decode.md | cut -c1-200
}
packed h200 h run
