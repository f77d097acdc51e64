#!/usr/bin/env bash
# Decode step 25 (docs/perf-notes.md): PAGE_BATCH kernels look the pages of
# the block they issue next up an iteration ahead. GPU tests and memcheck on
# the new build (E), then decode-tune over 16-token pages (the 8-warp _pg
# default and the 4-warp fallback) and --append (a whole step with new k/v:
# _pga), the committed build (D) and E alternating, two rounds.
# .stage-t/bins.tar.xz: decode-tune-D, decode-tune-E, gpu_decode, gpu_api, ndarray_kvcache.
set -u
. scripts/microbench/lib.sh
unpack_bins
run_tests gpu_decode gpu_api ndarray_kvcache
sanitize_decode memcheck gpu_every_decode_kernel gpu_kvcache_append_strides gpu_decode_small_for_sanitizers
CELLS=1:4096:8,1:32768:8,1:32768:32,1:131072:8,1:131072:32,8:32768:8
for r in 1 2; do
  for b in D E; do
    echo "## round $r $b" >> $OUT/tune.md
    /tmp/h/decode-tune-$b --no-event-tracking --cells $CELLS --layouts 16 --kernels w8_bc128_s3_pg_c,w4_bc64_s3 >> $OUT/tune.md 2>/dev/null
    /tmp/h/decode-tune-$b --no-event-tracking --append --cells 1:4096:8,1:32768:8 --layouts 16 --kernels w8_bc128_s3_pg_c 2>&1 | grep "^step" >> $OUT/tune.md
  done
done
grep -E "^## |^\| [0-9]|^step" $OUT/tune.md | sed 's/flash_fwd_tc_dec_bf16_d128_//g' | cut -c1-110
