#!/usr/bin/env bash
# Decode, session 12 call 6 (perf notes, decode step 37): is the 16-token
# page penalty the DRAM's row locality or the TLB's? The floor kernel with
# the pages in a random order over the whole cache, within 2 MB (a GPU
# large page: TLB-friendly, rows random), within 256 KB, and in order, with
# and without our stage reads and a dependent chain
# (decode_floor_prologue.cu set 4, built here with nvcc). No binaries.
set -u
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv,noheader | tee $OUT/gpu.txt
nvcc -O3 -arch=sm_90a -o /tmp/dfp scripts/microbench/decode_floor_prologue.cu 2>/dev/null || { echo "nvcc failed"; exit 1; }
/tmp/dfp 4 | tee $OUT/floor.md
