#!/usr/bin/env bash
# Decode, session 11 call 9 (perf notes, decode step 33), on an H200: the
# no-split share by device — B (75fe17f: 45% everywhere but small pages and
# ticket-balanced long caches) / N (80% where the peak DRAM bandwidth per SM
# is over 30 GB/s) alternating, two rounds, the batch-8 GQA cells without
# peers. .stage-t/bins.tar.xz: fa-bench-decode-{B,N}.
set -u
. scripts/microbench/lib.sh
unpack_bins
gpu_name
ab_grid --batches 8 --kv-heads 8
