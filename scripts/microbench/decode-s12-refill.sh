#!/usr/bin/env bash
# Decode, session 12 call 2 (perf notes, decode step 35): the static loop
# refills the freed stage before waiting for the next block (S blocks in
# flight instead of S − 1). First the floor kernel with our reads and an
# FMA chain in both loop orders (decode_floor_prologue.cu), then the
# decode tests and sanitizers on the new build N, then decode-tune B
# (previous commit) and N alternating, two rounds, on the `_pg_c` kernel
# (the static loop: contiguous calls without tickets and every paged call).
# .stage-t/bins.tar.xz: decode-tune-{B,N}, fa-bench-decode-{B,N},
# gpu_decode, gpu_api, ndarray_kvcache (N).
set -u
. scripts/microbench/lib.sh
unpack_bins
nvcc -O3 -arch=sm_90a -o /tmp/dfp scripts/microbench/decode_floor_prologue.cu 2>/dev/null || { echo "nvcc failed"; exit 1; }
/tmp/dfp 2 | tee $OUT/floor.md
decode_checks
sanitize_decode racecheck gpu_decode_small_for_sanitizers
for r in 1 2; do
  for b in B N; do
    /tmp/h/decode-tune-$b --no-event-tracking --cells 1:4096:8,1:32768:8,1:32768:32,1:131072:8,8:32768:8 --layouts 0,16,256 --kernels s3_pg_c > $OUT/tune-$b-$r.md 2>&1
    echo "## $b round $r"; grep -E "^\| [18] " $OUT/tune-$b-$r.md
  done
done
