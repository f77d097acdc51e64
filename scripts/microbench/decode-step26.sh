#!/usr/bin/env bash
# Decode step 26 (docs/perf-notes.md): R = the fused combine's counter reset
# after the acquire fence; P = R + the split's block-table sectors prefetched
# into the L1 (PAGE_BATCH kernels). GPU tests and sanitizers on P, then
# decode-tune with the committed build (A), R and P alternating, two rounds,
# and one timeline pass of A and R at GQA 32k.
# .stage-t/bins.tar.xz: decode-tune-{A,R,P}, gpu_decode, gpu_api, ndarray_kvcache.
set -u
. scripts/microbench/lib.sh
unpack_bins
run_tests gpu_decode gpu_api ndarray_kvcache
sanitize_decode memcheck gpu_every_decode_kernel gpu_decode_small_for_sanitizers
sanitize_decode racecheck gpu_decode_small_for_sanitizers
CELLS=1:4096:8,1:32768:8,1:32768:32,1:131072:8,1:131072:32,8:32768:8
for r in 1 2; do
  for b in A R P; do
    echo "## round $r $b" >> $OUT/tune.txt
    /tmp/h/decode-tune-$b --no-event-tracking --cells $CELLS --layouts 0,16,256 --kernels w8_bc128_s3_c,w8_bc128_s3_pg_c >> $OUT/tune.txt 2>&1
  done
done
for b in A R; do
  echo "## timeline $b" >> $OUT/timeline.txt
  /tmp/h/decode-tune-$b --no-event-tracking --timeline --cells 1:32768:8,1:4096:8 --layouts 0 --kernels w8_bc128_s3_c >> $OUT/timeline.txt 2>&1
done
grep -E "^(## |\| [0-9])" $OUT/tune.txt | sed 's/flash_fwd_tc_dec_bf16_d128_//g'
