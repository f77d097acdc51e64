#!/usr/bin/env bash
# Decode, session 12 call 1 (perf notes, decode step 35): the streaming
# floor with and without the prologue's dependent key-count load, with a
# speculative start (L2 prefetch or copies before the count), and with
# blocks reading several KV heads of a token over random 16-token pages
# (decode_floor_prologue.cu, built here with nvcc); then our default
# kernels on GQA 32k (decode-tune, two rounds) and one timeline with every
# block's record.
# .stage-t/bins.tar.xz: decode-tune.
set -u
. scripts/microbench/lib.sh
unpack_bins
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv,noheader | tee $OUT/gpu.txt
nvcc -O3 -arch=sm_90a -o /tmp/dfp scripts/microbench/decode_floor_prologue.cu 2>/dev/null || { echo "nvcc failed"; exit 1; }
/tmp/dfp 1 | tee $OUT/floor.md
for r in 1 2; do
  /tmp/h/decode-tune --no-event-tracking --cells 1:32768:8 --layouts 0,16 --kernels s3_pg_c > $OUT/ours-$r.md 2>&1
  grep -E "^\| 1 " $OUT/ours-$r.md
done
/tmp/h/decode-tune --no-event-tracking --cells 1:32768:8 --layouts 0,16 --kernels w8_bc128_s3_pg --timeline --timeline-csv $OUT/tl.csv > $OUT/tl.md 2>&1
tail -20 $OUT/tl.md
