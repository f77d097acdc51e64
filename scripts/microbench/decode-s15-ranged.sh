#!/usr/bin/env bash
# Decode, session 15 call 2 (decode step 42): placements that emulate a
# kernel handing each split an address range of its sequence's pages
# (`ranged:SPLITS:FIRST`: the first FIRST pages of each split's share read
# in logical order, i.e. random, the rest in address order), beside the
# random permutation, pages in order and per-split sorting (`sorted:N`); the
# committed `_pg_c` kernel, two rounds. Split counts (the library's
# heuristic): GQA 32k and 131k 16, MHA 32k and 131k 4, batch 8 GQA 32k 2.
# .stage-t/bins.tar.xz: decode-tune.
set -u
. scripts/microbench/lib.sh
unpack_bins
gpu_name
t() { /tmp/h/decode-tune --no-event-tracking --layouts 16 --kernels s3_pg_c "$@"; }
for r in 1 2; do
  t --cells 1:32768:8 --page-order random,inorder,ranged:16:16,ranged:16:8,ranged:16:0 > $OUT/g32-$r.md 2>&1
  t --cells 1:131072:8 --page-order random,inorder,ranged:16:16 > $OUT/g131-$r.md 2>&1
  t --cells 1:32768:32,1:131072:32 --page-order random,inorder,ranged:4:16 > $OUT/m-$r.md 2>&1
  t --cells 8:32768:8 --page-order random,inorder,ranged:2:16,sorted:1024 > $OUT/b8-$r.md 2>&1
  echo "## round $r"; cat $OUT/g32-$r.md $OUT/g131-$r.md $OUT/m-$r.md $OUT/b8-$r.md | grep -E "^\| [0-9]+ " | sort -u
done
