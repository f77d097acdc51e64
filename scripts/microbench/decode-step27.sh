#!/usr/bin/env bash
# Decode step 27 (docs/perf-notes.md): the split's block-table entries in
# shared memory (PAGE_BATCH kernels). GPU tests and sanitizers on the new
# build (T), then decode-tune with the committed build (B) and T alternating,
# two rounds, over 16- and 256-token pages; and a decode step with new k/v
# (`--append`, the `_pga` build) over 16-token pages, one round each.
# .stage-t/bins.tar.xz: decode-tune-{B,T}, gpu_decode, gpu_api, ndarray_kvcache.
set -u
. scripts/microbench/lib.sh
unpack_bins
decode_checks
sanitize_decode racecheck gpu_kvcache_append_strides gpu_decode_small_for_sanitizers
CELLS=1:4096:8,1:32768:8,1:32768:32,1:131072:8,1:131072:32,8:32768:8
for r in 1 2; do
  for b in B T; do
    echo "## round $r $b" >> $OUT/tune.txt
    /tmp/h/decode-tune-$b --no-event-tracking --cells $CELLS --layouts 16,256 --kernels w8_bc128_s3_pg_c,w4_bc64_s3_c >> $OUT/tune.txt 2>&1
  done
done
for b in B T; do
  echo "## append $b" >> $OUT/append.txt
  /tmp/h/decode-tune-$b --no-event-tracking --append --cells 1:4096:8,1:32768:8,1:32768:32 --layouts 16 --kernels w8_bc128_s3_pg_c >> $OUT/append.txt 2>&1
done
grep -E "^(## |step )" $OUT/append.txt | head -20
