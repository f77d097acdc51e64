#!/usr/bin/env bash
# Decode, session 11 call 1 (perf notes, decode step 29): the streaming floor
# kernel with one knob of our flash-decoding loop at a time
# (decode_floor_variants.cu, built here with nvcc), then our kernels on the
# same cells (decode-tune, full entries w8_bc128_s3*), two rounds.
# .stage-t/bins.tar.xz: decode-tune.
set -u
. scripts/microbench/lib.sh
unpack_bins
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv,noheader | tee $OUT/gpu.txt
nvcc -O3 -arch=sm_90a -o /tmp/dfv scripts/microbench/decode_floor_variants.cu 2>/dev/null || { echo "nvcc failed"; exit 1; }
/tmp/dfv | tee $OUT/floor.md
for r in 1 2; do
  /tmp/h/decode-tune --no-event-tracking --cells 1:32768:8,1:131072:8 --layouts 0,16,256 --kernels w8_bc128_s3 > $OUT/ours-$r.md 2>&1
  grep -E "^\| 1 " $OUT/ours-$r.md | head -12
done
