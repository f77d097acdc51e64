#!/usr/bin/env bash
# Decode, session 17 call 8: the device sort with its buffer bound checked
# (`sort_len`): gpu_decode_into, memcheck and racecheck on the order tests,
# and the sort's cost once more.
# .stage-t/bins.tar.xz: gpu_decode_into, decode-tune.
set -u
. scripts/microbench/lib.sh
unpack_bins
gpu_name
run_tests gpu_decode_into
sanitize_order
timeout 150 /tmp/h/decode-tune --no-event-tracking --kernels s3_pg_c --layouts 16 --order-cost --cells 1:4096:8,1:32768:8,1:131072:8 > /dev/null 2> /tmp/t.log
echo "rc $?"; grep order_block_table /tmp/t.log | tee $OUT/sortcost.txt
