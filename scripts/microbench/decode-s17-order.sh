#!/usr/bin/env bash
# Decode, session 17: address-ordered block tables (`order_block_table`).
# Tests (gpu_decode_into with the ordered-table decode loop and the device
# sort, gpu_decode), memcheck and racecheck on the two new tests; the batch-1
# bar cells with PyTorch 2.11 in the same run, pages placed at random and
# then ordered by the library; scattered pools and the device sort's cost.
# .stage-t/bins.tar.xz: gpu_decode, gpu_decode_into, fa-bench-decode, decode-tune.
set -u
. scripts/microbench/lib.sh
unpack_bins
gpu_name
run_tests gpu_decode_into gpu_decode
sanitize_order
bar_cells ${CACHES:-32768,131072} ${ORDERS:-random ordered}
timeout 240 /tmp/h/decode-tune --no-event-tracking --kernels bf16_d128_w8_bc128_s3_pg_c --layouts 16 --order-cost \
  --cells ${TUNE_CELLS:-1:32768:8,1:131072:8,1:131072:32,8:32768:8} \
  --page-order random,ordered,scattered:4,scattered-ordered:4 > $OUT/tune.md 2> $OUT/tune.log
echo "rc $? (decode-tune)"; cat $OUT/tune.md; grep order_block_table $OUT/tune.log
