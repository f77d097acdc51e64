#!/usr/bin/env bash
# Decode, session 12 call 3 (perf notes, decode step 35): what our loop's
# reads and latency cost the streaming floor, and whether blocks that read
# every KV head of a token (H = 8: a warp per head) stream faster with
# that work, contiguous and over random 16-token pages
# (decode_floor_prologue.cu set 3, built here with nvcc). No binaries.
set -u
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv,noheader | tee $OUT/gpu.txt
nvcc -O3 -arch=sm_90a -o /tmp/dfp scripts/microbench/decode_floor_prologue.cu 2>/dev/null || { echo "nvcc failed"; exit 1; }
/tmp/dfp 3 | tee $OUT/floor.md
