#!/usr/bin/env bash
# Decode, session 14 calls 1-2: the page-ordered build (`_pgo`, decode step 40;
# call 1: its first version, call 2: the second).
# The decode test binaries (gpu_decode with gpu_decode_page_order, gpu_api,
# ndarray_kvcache), memcheck over every flash-decoding kernel and the small
# cases (one of them page-ordered), racecheck over the small cases; then
# decode-tune with the `_pg_c` build and its page-ordered twin `_pgo_c` as
# columns of one run (two rounds), pages in the benchmark's random order and
# in order, and the per-block timeline of both full entries over 16-token
# pages. .stage-t/bins.tar.xz: gpu_decode, gpu_api, ndarray_kvcache,
# decode-tune.
set -u
. scripts/microbench/lib.sh
unpack_bins
decode_checks
grep -A2 panicked /tmp/t.txt | head -6 | tee -a $OUT/tests.txt
/tmp/h/gpu_decode --test-threads 1 gpu_decode_page_order > /tmp/po.txt 2>&1; grep -E "test result|panicked" -A1 /tmp/po.txt | head -6 | tee -a $OUT/tests.txt
sanitize_decode racecheck gpu_decode_small_for_sanitizers
cells=1:32768:8,1:131072:8,1:32768:32,1:131072:32,1:4096:8,8:32768:8
for r in 1 2; do
  /tmp/h/decode-tune --no-event-tracking --cells $cells --layouts 16,0,256 --kernels s3_pg_c,s3_pgo_c > $OUT/tune-$r.md 2>&1
  echo "## round $r"; grep -E "^\| [0-9]+ " $OUT/tune-$r.md | sort -u
done
/tmp/h/decode-tune --no-event-tracking --cells 1:32768:8,1:32768:32 --layouts 16 --page-order random,inorder --kernels s3_pg_c,s3_pgo_c > $OUT/order.md 2>&1
echo "## page order"; grep -E "^\| [0-9]+ " $OUT/order.md | sort -u
/tmp/h/decode-tune --no-event-tracking --cells 1:32768:8 --layouts 16 --kernels s3_pg,s3_pgo --timeline > $OUT/tl.md 2>&1
echo "## timeline"; grep -E "^\| 1 " $OUT/tl.md | cut -c1-400
