#!/usr/bin/env bash
# Decode, session 14 call 5: the batch-1 bar cells (MHA and GQA, 32k and
# 131k keys, contiguous / 16- / 256-token pages) with PyTorch 2.11 in the same
# run, twice per page placement: the grid's random permutation of the pool
# (FlashAttention-2's tests) and pages in order (FlashInfer's decode
# benchmark), alternating. .stage-t/bins.tar.xz: fa-bench-decode.
set -u
. scripts/microbench/lib.sh
unpack_bins
gpu_name
for r in 1 2; do
  for order in random inorder; do
    timeout 280 /tmp/h/fa-bench-decode /tmp/p-$order-$r --no-event-tracking --batches 1 --caches 32768,131072 --page-order $order > /tmp/p.log 2>&1
    echo "rc $? ($order, round $r)"
    cp /tmp/p-$order-$r/decode.md $OUT/b1-$order-$r.md
    echo "## $order round $r"; grep -E "^\| 1 \| " /tmp/p-$order-$r/decode.md | cut -c1-220
  done
done
