#!/usr/bin/env bash
# Decode, session 15 call 13 and session 16 call 14: the bar cell's layouts (batch 1, GQA 32/8, 32k
# keys: contiguous, 16- and 256-token pages) with PyTorch 2.11 in the same
# run, pages placed at random and in order, on main's kernels.
# .stage-t/bins.tar.xz: fa-bench-decode.
set -u
. scripts/microbench/lib.sh
unpack_bins
gpu_name
for order in random inorder; do
  timeout 200 /tmp/h/fa-bench-decode /tmp/p-$order --no-event-tracking --batches 1 --caches 32768 --kv-heads 8 --page-order $order > /tmp/p.log 2>&1
  echo "rc $? ($order)"; cp /tmp/p-$order/decode.md $OUT/b1-gqa32k-$order.md
  echo "## $order"; grep -E "^\| 1 \| " /tmp/p-$order/decode.md | cut -c1-220
done
