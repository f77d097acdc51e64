#!/usr/bin/env bash
# Decode, session 16 calls 1–5 and 12 (perf notes, decode step 43): the split-KV
# combine through a cluster's distributed shared memory against ours
# (global partials + an acq_rel count), on the streaming floor with our
# loop's reads and chain (decode_cluster_combine.cu, built here with nvcc).
# No binaries.
set -u
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv,noheader | tee $OUT/gpu.txt
if [ "${ICACHE:-0}" = 1 ]; then
  # Call 6 (ICACHE=1): cold instruction fetch (icache_cold.cu) only.
  nvcc -O3 -arch=sm_90a -o /tmp/ic scripts/microbench/icache_cold.cu || { echo "nvcc failed"; exit 1; }
  /tmp/ic | tee $OUT/icache.md
  exit 0
fi
nvcc -O3 -arch=sm_90a -o /tmp/dcc scripts/microbench/decode_cluster_combine.cu || { echo "nvcc failed"; exit 1; }
/tmp/dcc | tee $OUT/cluster.md
