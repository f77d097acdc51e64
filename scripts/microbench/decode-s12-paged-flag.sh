#!/usr/bin/env bash
# Decode, session 12 calls 14 (H100) and 15 (H200), perf notes decode step
# 38: fixed split shares interleaved over whole-block pages only where the
# host sets INTERLEAVE_PAGED (devices with <= 30 GB/s of DRAM bandwidth per
# SM: the H100), N, against B = 7ec7435 (interleaved over 256-token pages
# everywhere). Decode tests and memcheck on N, then fa-bench-decode B / N
# alternating, two rounds, batch-1 GQA cells at 32k and 131k, no peers.
# .stage-t/bins.tar.xz: fa-bench-decode-{B,N}, gpu_decode, gpu_api,
# ndarray_kvcache (N).
set -u
. scripts/microbench/lib.sh
unpack_bins
decode_checks
ab_grid --batches 1 --caches 32768,131072 --kv-heads 8
