#!/usr/bin/env bash
# Decode step 24 (docs/perf-notes.md): calls with new keys and values over
# pages smaller than a key block run `_pga`, the append build of the `_pg`
# default (no append launch). GPU tests and sanitizers on the new build, then
# decode-tune --append (a whole step with new k/v and without), the committed
# build (A) and the new one (D) alternating, two rounds.
# .stage-t/bins.tar.xz: decode-tune-A, decode-tune-D, gpu_decode, gpu_api, ndarray_kvcache.
set -u
. scripts/microbench/lib.sh
unpack_bins
run_tests gpu_decode gpu_api ndarray_kvcache
sanitize_decode memcheck gpu_every_decode_kernel gpu_kvcache_append_strides gpu_decode_small_for_sanitizers
sanitize_decode racecheck gpu_kvcache_append_strides gpu_decode_small_for_sanitizers
CELLS=1:4096:8,1:32768:8,1:32768:32,1:131072:8,8:32768:8
for r in 1 2; do
  for b in A D; do
    echo "## round $r $b" >> $OUT/tune.txt
    /tmp/h/decode-tune-$b --no-event-tracking --append --cells $CELLS --layouts 16,256 --kernels w8_bc128_s3_pg_c >> $OUT/tune.txt 2>&1
  done
done
grep -E "^(## |step )" $OUT/tune.txt
