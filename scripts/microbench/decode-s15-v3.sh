#!/usr/bin/env bash
# Decode, session 15 call 9 (decode step 42, v3: the sort moved into the
# first iteration, after block S − 1's copies — off the prologue — with its
# scratch past the stages; at most 1024 pages per split): gpu_decode (its
# gpu_decode_page_tables runs the `_pg` kernel over eligible page sizes and
# irregular tables), memcheck and racecheck over gpu_decode_page_tables;
# then the compact `_pg_c` with the `default` (address order) and `logical`
# schedules, pages at random and in order, two rounds.
# .stage-t/bins.tar.xz: gpu_decode, decode-tune.
set -u
. scripts/microbench/lib.sh
unpack_bins
gpu_name
run_tests gpu_decode
sanitize_decode memcheck gpu_decode_page_tables
sanitize_decode racecheck gpu_decode_page_tables
for r in 1 2; do
  /tmp/h/decode-tune --no-event-tracking --layouts 16 --kernels s3_pg_c --schedules default,logical --page-order random,inorder --cells 1:32768:8,1:131072:8,1:32768:32,1:131072:32,8:32768:8 > $OUT/order-$r.md 2>&1
  echo "## address | logical, round $r"; grep -E "^\| [0-9]+ " $OUT/order-$r.md | sort -u
done
