#!/usr/bin/env bash
# Decode, session 12 call 4 (perf notes, decode step 36): the fused
# combine's path for at most 32 splits (one LSE per lane, no per-split
# branches). Decode tests and memcheck on N, then decode-tune B (previous
# commit) and N alternating, two rounds, on the default kernels (`_pg_c`,
# `_c`), and one timeline each (the full `_pg` entry) for the combine's
# duration.
# .stage-t/bins.tar.xz: decode-tune-{B,N}, fa-bench-decode-{B,N},
# gpu_decode, gpu_api, ndarray_kvcache (N).
set -u
. scripts/microbench/lib.sh
unpack_bins
decode_checks
for r in 1 2; do
  for b in B N; do
    /tmp/h/decode-tune-$b --no-event-tracking --cells 1:4096:8,1:4096:32,1:32768:8,1:32768:32,1:131072:8,8:32768:8 --layouts 0,16,256 --kernels s3_pg_c,w8_bc128_s3_c > $OUT/tune-$b-$r.md 2>&1
    echo "## $b round $r"; grep -E "^\| [18] " $OUT/tune-$b-$r.md
  done
done
for b in B N; do
  /tmp/h/decode-tune-$b --no-event-tracking --cells 1:4096:8,1:32768:8 --layouts 0,16 --kernels w8_bc128_s3_pg --timeline > $OUT/tl-$b.md 2>&1
  echo "## timeline $b"; grep -E "^\| 1 " $OUT/tl-$b.md | tail -4
done
