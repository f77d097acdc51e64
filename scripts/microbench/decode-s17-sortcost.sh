#!/usr/bin/env bash
# Decode, session 17 call 3: what the device `order_block_table` costs —
# after the L2 flush and warm, 1024 threads (decode-tune) against 256
# (decode-tune-t256, a throw-away build), then ncu's duration, cycles and
# instructions of the 1024-thread kernel for 256- and 2048-entry rows.
# .stage-t/bins.tar.xz: decode-tune, decode-tune-t256.
set -u
. scripts/microbench/lib.sh
unpack_bins
gpu_name
for r in 1 2; do
  for b in decode-tune decode-tune-t256; do
    timeout 100 /tmp/h/$b --no-event-tracking --kernels s3_pg_c --layouts 16 --order-cost --cells 1:4096:8,1:32768:8,1:131072:8,8:32768:8 > /dev/null 2> /tmp/t.log
    echo "## $b round $r (rc $?)"; grep order_block_table /tmp/t.log | tee -a $OUT/sortcost.txt
  done
done
timeout 200 ncu --kernel-name order_block_table --launch-skip 2 --launch-count 4 \
  --metrics gpu__time_duration.sum,sm__cycles_elapsed.max,smsp__inst_executed.sum,smsp__cycles_active.max,l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum \
  /tmp/h/decode-tune --no-event-tracking --kernels s3_pg_c --layouts 16 --order-cost --cells 1:4096:8,1:32768:8 > $OUT/ncu.txt 2>&1
echo "ncu rc $?"; grep -E "order_block_table|duration|cycles|inst_executed|conflicts" $OUT/ncu.txt | head -60
