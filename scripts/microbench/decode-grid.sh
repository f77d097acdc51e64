#!/usr/bin/env bash
# The whole decode grid (fa-bench-decode, PyTorch in the same run when it is
# installed): batch 1/8/64 × 4k/32k/131k × MHA/GQA × contiguous/paged 16/
# paged 256. ORDER places the paged cells' pages: random (default, as
# FlashAttention-2's tests draw block tables), inorder, or ordered (the random
# table sorted by `order_block_table`). Table, JSON and plot in $OUT/grid,
# the run's output in $OUT/grid.log; the batch-1 long-cache rows printed.
# Needs .stage-t/bins.tar.xz with fa-bench-decode (see README.md).
set -u
. scripts/microbench/lib.sh
unpack_bins
gpu_name
timeout 560 /tmp/h/fa-bench-decode $OUT/grid --no-event-tracking --page-order ${ORDER:-random} > $OUT/grid.log 2>&1; echo "grid rc $?"; tail -4 $OUT/grid.log
grep -E "\| 1 \| (32768|131072) " $OUT/grid/decode.md | cut -c1-200
