#!/usr/bin/env bash
# Decode, session 17 call 4: the device sort with its warps' runs in
# registers (N) against call 2's warp-sliced shared-memory version (B,
# 1024 threads): the order tests with memcheck and racecheck on N, the
# sort's cost alternating B/N over two rounds, then the batch-1 32k bar
# cells with PyTorch in the same run, pages random and ordered.
# .stage-t/bins.tar.xz: gpu_decode_into, decode-tune-{B,N}, fa-bench-decode.
set -u
. scripts/microbench/lib.sh
unpack_bins
gpu_name
run_tests gpu_decode_into
sanitize_order
for r in 0 1 2; do
  for b in B N; do
    timeout 250 /tmp/h/decode-tune-$b --no-event-tracking --kernels s3_pg_c --layouts 16 --order-cost --cells 1:4096:8,1:32768:8,1:131072:8,8:32768:8,64:32768:8 > /dev/null 2> /tmp/t.log
    echo "## $b round $r (rc $?)" | tee -a $OUT/sortcost.txt; grep order_block_table /tmp/t.log | tee -a $OUT/sortcost.txt
  done
done
bar_cells 32768 random ordered
