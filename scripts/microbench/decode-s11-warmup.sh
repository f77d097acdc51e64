#!/usr/bin/env bash
# Decode, session 11 call 13: why the grid times GQA 32/8 at 32k ~1 µs above
# decode-tune (same kernel, split count and timing loop): the grid's cell
# with 3 and with 30 warm-up runs, and decode-tune's, alternating, two
# rounds. .stage-t/bins.tar.xz: fa-bench-decode, decode-tune.
set -u
. scripts/microbench/lib.sh
unpack_bins
gpu_name
for r in 1 2; do
  for w in 3 30; do
    /tmp/h/fa-bench-decode /tmp/g --no-torch --batches 1 --kv-heads 8 --caches 4096,32768 --warmup $w --no-event-tracking 2>&1 | grep -E "^\[ours" | sed "s/^/round $r warmup $w: /" | tee -a $OUT/warmup.txt
  done
  /tmp/h/decode-tune --no-event-tracking --cells 1:4096:8,1:32768:8 --layouts 0,16,256 --kernels w8_bc128_s3_pg_c 2>&1 | grep -E "^\| 1 " | awk '!seen[$0]++' | sed "s/^/round $r decode-tune: /" | tee -a $OUT/warmup.txt
done
