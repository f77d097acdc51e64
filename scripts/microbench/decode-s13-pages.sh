#!/usr/bin/env bash
# Decode, session 13 call 1 (perf notes, decode step 39): how much of the
# paged cost is the page placement, and one lookup per thread over small
# pages. Decode tests and memcheck on N; then decode-tune B (previous
# commit's kernels) and N (one lookup per thread) alternating, two rounds,
# the `_pg_c` default over contiguous caches and 16/256-token pages placed
# at random (the benchmark's), in order, and shuffled within 8-page
# groups; page 16 at GQA 32k with 8 splits beside the heuristic's; the full
# `_pg` entry's timeline of each layout (N).
# .stage-t/bins.tar.xz: decode-tune-{B,N}, gpu_decode, gpu_api, ndarray_kvcache (N).
set -u
. scripts/microbench/lib.sh
unpack_bins
decode_checks
ab_tune --cells 1:32768:8,1:32768:32,1:131072:8,8:32768:8 --layouts 0,16,256 --page-order random,inorder,group:8 --kernels s3_pg_c
for b in B N; do
  /tmp/h/decode-tune-$b --no-event-tracking --cells 1:32768:8 --layouts 16 --splits 0,8 --kernels s3_pg_c > $OUT/splits-$b.md 2>&1
  echo "## splits $b"; grep -E "^\| 1 " $OUT/splits-$b.md | sort -u
done
/tmp/h/decode-tune-N --no-event-tracking --cells 1:32768:8 --layouts 0,16,256 --page-order random,inorder --kernels w8_bc128_s3_pg --timeline > $OUT/tl-N.md 2>&1
echo "## timeline N"; grep -E "^\| 1 .*_pg \|" $OUT/tl-N.md | tail -6
