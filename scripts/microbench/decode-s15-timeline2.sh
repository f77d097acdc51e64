#!/usr/bin/env bash
# Decode, session 15 call 7 (decode step 42, second version: the sort's
# block-table loads issued before the prologue's copies): gpu_decode and
# memcheck over the small cases, the timeline of the full `_pg` entry with
# the `default` (address order) and `logical` schedules, and the compact
# default over the five paged cells, pages in order and at random, two
# rounds. .stage-t/bins.tar.xz: gpu_decode, decode-tune.
set -u
. scripts/microbench/lib.sh
unpack_bins
gpu_name
run_tests gpu_decode
sanitize_decode memcheck gpu_decode_small_for_sanitizers
/tmp/h/decode-tune --no-event-tracking --layouts 16 --kernels s3_pg --schedules default,logical --page-order inorder,random --cells 1:131072:32,1:131072:8,1:32768:8 --timeline > $OUT/tl.md 2>&1
echo "## timeline"; grep -E "^\| 1 .*_pg (auto|logical)" $OUT/tl.md | cut -c1-330
grep -E "^\| 1 .*bf16_d128_w8_bc128_s3_pg \|" $OUT/tl.md | cut -c1-330
grep -E "^\| 1 .*bf16_d128_w8_bc128_s3_pg logical \|" $OUT/tl.md | cut -c1-330
for r in 1 2; do
  /tmp/h/decode-tune --no-event-tracking --layouts 16 --kernels s3_pg_c --schedules default,logical --page-order random,inorder --cells 1:32768:8,1:131072:8,1:32768:32,1:131072:32,8:32768:8 > $OUT/order-$r.md 2>&1
  echo "## address | logical, round $r"; grep -E "^\| [0-9]+ " $OUT/order-$r.md | sort -u
done
