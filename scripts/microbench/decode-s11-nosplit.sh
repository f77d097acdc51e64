#!/usr/bin/env bash
# Decode, session 11 call 7 (perf notes, decode step 32): the split rule
# over whole-block pages — B (22881a4) / N (no split from 45% unless the
# splits take tickets or the pages are small) alternating, two rounds, the
# batch-8 GQA cells without peers; then the `_pg` default's per-block
# timeline at GQA 32k (the full entry).
# .stage-t/bins.tar.xz: fa-bench-decode-{B,N}, decode-tune.
set -u
. scripts/microbench/lib.sh
unpack_bins
gpu_name
ab_grid --batches 8 --kv-heads 8
/tmp/h/decode-tune --no-event-tracking --timeline --cells 1:32768:8 --layouts 0,16,256 --kernels w8_bc128_s3_pg > $OUT/timeline.md 2>&1
grep -E "^\| 1 " $OUT/timeline.md | cut -c1-420
