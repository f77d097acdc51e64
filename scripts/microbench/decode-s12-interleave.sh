#!/usr/bin/env bash
# Decode, session 12 calls 7 and 8 (perf notes, decode step 38): the static split
# schedule interleaved (split s takes the tile's blocks s, s + ns, …) instead
# of contiguous shares (call 7: every call; call 8: not over pages smaller than a key block). Decode tests, memcheck and racecheck on N, then
# decode-tune B (the previous commit) and N alternating, two rounds, `_pg_c`
# and `_c` with the library's schedule and the static one.
# .stage-t/bins.tar.xz: decode-tune-{B,N}, fa-bench-decode-{B,N},
# gpu_decode, gpu_api, ndarray_kvcache (N).
set -u
. scripts/microbench/lib.sh
unpack_bins
decode_checks
sanitize_decode racecheck gpu_decode_small_for_sanitizers
for r in 1 2; do
  for b in B N; do
    /tmp/h/decode-tune-$b --no-event-tracking --cells 1:4096:8,1:32768:8,1:32768:32,1:131072:8,1:131072:32,8:32768:8 --layouts 0,16,256 --kernels s3_pg_c,w8_bc128_s3_c --schedules default,static > $OUT/tune-$b-$r.md 2>&1
    echo "## $b round $r"; grep -E "^\| [18] " $OUT/tune-$b-$r.md | cut -c1-220
  done
done
# A third round on the GQA 32k cells alone (the bar's; call 8 on).
for b in B N; do
  /tmp/h/decode-tune-$b --no-event-tracking --cells 1:32768:8 --layouts 0,16,256 --kernels s3_pg_c,w8_bc128_s3_c --schedules default,static > $OUT/tune32k-$b-3.md 2>&1
  echo "## $b round 3"; grep -E "^\| 1 " $OUT/tune32k-$b-3.md | cut -c1-220
done
