#!/usr/bin/env bash
# Decode, session 11 call 2 (perf notes, decode step 29): K/V stage tiles
# unpadded and swizzled (N) against the padded ones (B, the previous
# commit): GPU tests and memcheck on N, then B / N alternating, two rounds
# (decode-tune, the default kernels), then N's grid (fa-bench-decode,
# PyTorch in the same run).
# .stage-t/bins.tar.xz: fa-bench-decode, decode-tune-{B,N}, gpu_decode, gpu_api, ndarray_kvcache.
set -u
. scripts/microbench/lib.sh
unpack_bins
decode_checks
sanitize_decode racecheck gpu_decode_small_for_sanitizers
for b in B N B N; do
  echo "## $b" >> $OUT/tune.txt
  /tmp/h/decode-tune-$b --no-event-tracking --cells 1:4096:8,1:32768:8,1:32768:32,1:131072:8,1:131072:32,8:32768:8 --layouts 0,16,256 \
    --kernels w8_bc128_s3_c,w8_bc128_s3_pg_c,w4_bc64_s3_c >> $OUT/tune.txt 2>&1
done
grep -E "^(## |\| [18] )" $OUT/tune.txt | cut -c1-200
timeout 300 /tmp/h/fa-bench-decode $OUT/grid --no-event-tracking > $OUT/grid.log 2>&1; echo "grid rc $?"; tail -3 $OUT/grid.log
grep -E "\| 1 \| (4096|32768|131072) " $OUT/grid/decode.md | head -20 | cut -c1-220
