#!/usr/bin/env bash
# Decode, session 12 calls 12 (H200) and 13 (H100), perf notes decode step
# 38: the static schedule interleaved over 256-token pages (B = 7ec7435) or
# contiguous shares over every paged cache (N), fa-bench-decode alternating,
# two rounds, batch-1 GQA cells at 32k and 131k, without peers.
# .stage-t/bins.tar.xz: fa-bench-decode-{B,N}.
set -u
. scripts/microbench/lib.sh
unpack_bins
gpu_name
ab_grid --batches 1 --caches 32768,131072 --kv-heads 8
