#!/usr/bin/env bash
# Decode, session 15 call 4 (decode step 42): the `_pg` kernel reading each
# split's pages in address order (ADDRESS_ORDER). Tests: gpu_decode (with
# gpu_decode_address_order), gpu_api, ndarray_kvcache; memcheck over every
# decode kernel and the small cases (one address-ordered), racecheck over the
# small cases. Then decode-tune of the new build with the `default` (address
# order) and `logical` (DecodeOptions::logical_page_order) schedules as
# columns of one run over 16-token pages placed at random and in order, two
# rounds; and the previous build (B) beside the new one (N) over
# contiguous / 16 / 256 caches. .stage-t/bins.tar.xz: gpu_decode, gpu_api,
# ndarray_kvcache, decode-tune-{B,N}.
set -u
. scripts/microbench/lib.sh
unpack_bins
decode_checks
/tmp/h/gpu_decode --test-threads 1 gpu_decode_address_order > /tmp/ao.txt 2>&1; grep -E "test result|panicked|passed" -A2 /tmp/ao.txt | head -8 | tee -a $OUT/tests.txt
sanitize_decode racecheck gpu_decode_small_for_sanitizers
cp /tmp/h/decode-tune-N /tmp/h/decode-tune
for r in 1 2; do
  /tmp/h/decode-tune --no-event-tracking --layouts 16 --kernels s3_pg_c --schedules default,logical --page-order random,inorder --cells 1:32768:8,1:131072:8,1:32768:32,1:131072:32,8:32768:8 > $OUT/order-$r.md 2>&1
  echo "## address | logical, round $r"; grep -E "^\| [0-9]+ " $OUT/order-$r.md | sort -u
done
ab_tune --cells 1:32768:8,1:131072:8,1:4096:8 --layouts 0,16,256
