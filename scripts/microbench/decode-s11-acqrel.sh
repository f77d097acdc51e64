#!/usr/bin/env bash
# Decode, session 11 call 10 (perf notes, decode step 34): the fused
# combine's count as one acq_rel atomic (N) against fence + relaxed atomic +
# fence (B = d236f45's kernels): gpu_decode and memcheck on N, then B / N
# alternating, three rounds, the default kernels on short and long caches.
# .stage-t/bins.tar.xz: decode-tune-{B,N}, gpu_decode.
set -u
. scripts/microbench/lib.sh
unpack_bins
gpu_name
run_tests gpu_decode
sanitize_decode memcheck gpu_every_decode_kernel gpu_decode_small_for_sanitizers
for b in B N B N B N; do
  echo "## $b" >> $OUT/tune.txt
  /tmp/h/decode-tune-$b --no-event-tracking --cells 1:4096:8,1:4096:32,1:32768:8,1:32768:32 --layouts 0,256 --kernels w8_bc128_s3_c,w8_bc128_s3_pg_c >> $OUT/tune.txt 2>&1
done
grep -E "^(## |\| 1 )" $OUT/tune.txt | cut -c1-200
