#!/usr/bin/env bash
# Decode, session 17 call 9: main's head after the review — gpu_decode_into
# with memcheck and racecheck on the order tests, then the batch-1 bar cells
# (32k and 131k, MHA and GQA) with PyTorch 2.11 in the same run, pages random
# and ordered by `order_block_table`.
# .stage-t/bins.tar.xz: gpu_decode_into, fa-bench-decode.
set -u
. scripts/microbench/lib.sh
unpack_bins
gpu_name
run_tests gpu_decode_into
sanitize_order
for order in random ordered; do
  timeout 200 /tmp/h/fa-bench-decode /tmp/p-$order --no-event-tracking --batches 1 --caches 32768,131072 --kv-heads 8,32 --page-order $order > /tmp/p.log 2>&1
  echo "rc $? ($order)"; cp /tmp/p-$order/decode.md $OUT/b1-$order.md
  echo "## $order"; grep -E "^\| 1 \| " /tmp/p-$order/decode.md | cut -c1-200
done
