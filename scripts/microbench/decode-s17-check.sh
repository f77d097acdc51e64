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
for tool in memcheck racecheck; do
  timeout 120 compute-sanitizer --tool $tool /tmp/h/gpu_decode_into --test-threads 1 gpu_order_block_table gpu_decode_ordered_table > /tmp/s.txt 2>&1
  echo "=== $tool gpu_decode_into order tests (rc $?): $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' /tmp/s.txt | tail -1) $(grep -E 'test result' /tmp/s.txt)" | tee -a $OUT/tests.txt
done
timeout 150 /tmp/h/decode-tune --no-event-tracking --kernels s3_pg_c --layouts 16 --order-cost --cells 1:4096:8,1:32768:8,1:131072:8 > /dev/null 2> /tmp/t.log
echo "rc $?"; grep order_block_table /tmp/t.log | tee $OUT/sortcost.txt
