#!/usr/bin/env bash
# Decode, session 17 call 6: the whole grid (fa-bench-decode, PyTorch 2.11
# in the same run) with every paged cell's block table ordered by
# `order_block_table` (`--page-order ordered`). Outputs in $OUT/grid.
# .stage-t/bins.tar.xz: fa-bench-decode.
set -u
. scripts/microbench/lib.sh
unpack_bins
gpu_name
timeout 560 /tmp/h/fa-bench-decode $OUT/grid --no-event-tracking --page-order ${ORDER:-ordered} > $OUT/grid.log 2>&1; echo "grid rc $?"; tail -4 $OUT/grid.log
grep -E "\| 1 \| (32768|131072) " $OUT/grid/decode.md | cut -c1-200
