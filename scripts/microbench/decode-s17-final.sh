#!/usr/bin/env bash
# Decode, session 17 call 2: every GPU test binary (lib.sh all_checks),
# memcheck and racecheck on the order tests, the device sort's cost (the
# warp-sliced bitonic sort), then the grid (fa-bench-decode, PyTorch in the
# same run) with the pages at random (the README's table). Outputs packed in
# $OUT/final.tar.xz.
# .stage-t/bins.tar.xz: the 8 GPU test binaries, fa-bench-decode, decode-tune.
set -u
. scripts/microbench/lib.sh
unpack_bins
run() {
  all_checks
  sanitize_order
  timeout 200 /tmp/h/decode-tune --no-event-tracking --kernels bf16_d128_w8_bc128_s3_pg_c --layouts 16 --order-cost \
    --cells 1:4096:8,1:32768:8,1:131072:8,8:32768:8,64:32768:8 --page-order random,ordered > $OUT/tune.md 2> $OUT/tune.log
  echo "rc $? (decode-tune)"; grep -E "^\| [0-9]" $OUT/tune.md; grep order_block_table $OUT/tune.log
  ${GRID:-true} && { timeout 300 /tmp/h/fa-bench-decode $OUT/grid --no-event-tracking > $OUT/grid.log 2>&1; echo "grid rc $?"; tail -3 $OUT/grid.log
  grep -E "\| 1 \| (32768|131072) " $OUT/grid/decode.md | cut -c1-200; }
}
packed final f run
