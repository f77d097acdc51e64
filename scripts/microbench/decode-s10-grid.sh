#!/usr/bin/env bash
# Decode, session 10, the committed build (N): GPU tests, memcheck over every
# flash-decoding kernel and the append cases, a decode step with new k/v
# (`decode-tune --append`) beside the previous commit's kernels (B), then the
# grid (fa-bench-decode, PyTorch in the same run).
# .stage-t/bins.tar.xz: fa-bench-decode, decode-tune-{B,N}, gpu_decode, gpu_api, ndarray_kvcache.
set -u
. scripts/microbench/lib.sh
unpack_bins
decode_checks
for b in B N B N; do
  echo "## append $b" >> $OUT/append.txt
  /tmp/h/decode-tune-$b --no-event-tracking --append --cells 1:4096:8,1:32768:8,1:32768:32 --layouts 0,256 --kernels w8_bc128_s3_c >> $OUT/append.txt 2>&1
done
grep -E "^(## |step )" $OUT/append.txt
/tmp/h/fa-bench-decode $OUT/grid --no-event-tracking > $OUT/grid.log 2>&1; echo "grid rc $?"; tail -3 $OUT/grid.log
grep -E "\| 1 \| (32768|131072) " $OUT/grid/decode.md | head -20 | cut -c1-220
