#!/usr/bin/env bash
# Decode, session 13 call 3: the committed build (step 39) — every GPU test binary
# (decode, API, ndarray, attention, features, half, hopper), memcheck and
# racecheck over the decode cases, then the grid (fa-bench-decode, PyTorch in
# the same run), the batch-1 32k cells once more (PyTorch beside, for the bar
# cells' spread), and decode-tune's page orders. Outputs packed in
# $OUT/final.tar.xz (the run tool returns at most 8 files).
# .stage-t/bins.tar.xz: fa-bench-decode, decode-tune, the 7 GPU test binaries.
set -u
. scripts/microbench/lib.sh
unpack_bins
run() {
  final_run 1
  # Placement on the committed kernel: pages in order and within 8-page groups.
  /tmp/h/decode-tune --no-event-tracking --cells 1:32768:8,1:131072:8 --layouts 0,16,256 --page-order random,inorder,group:8 --kernels s3_pg_c > $OUT/order.md 2>&1
  echo "## page order"; grep -E "^\| 1 " $OUT/order.md | sort -u
}
packed final f run
