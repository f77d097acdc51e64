#!/usr/bin/env bash
# Decode, session 15 call 3 (decode step 42): the same placements repeated
# inside one decode-tune run (every row allocates its own caches), to see how
# much a row's time depends on its allocation rather than its placement;
# `ranged:S:0` builds the same block table as `inorder` at batch 1.
# .stage-t/bins.tar.xz: decode-tune.
set -u
. scripts/microbench/lib.sh
unpack_bins
gpu_name
t() { /tmp/h/decode-tune --no-event-tracking --layouts 16 --kernels s3_pg_c "$@"; }
t --cells 1:32768:32 --page-order inorder,random,ranged:4:16,ranged:4:0,inorder,random,ranged:4:16,sorted:512,ranged:4:16 > $OUT/m32.md 2>&1
t --cells 1:32768:8 --page-order inorder,random,ranged:16:16,ranged:16:0,inorder,random,ranged:16:16,sorted:128,ranged:16:16 > $OUT/g32.md 2>&1
echo "## MHA 32k"; grep -E "^\| [0-9]+ " $OUT/m32.md | head -9
echo "## GQA 32k"; grep -E "^\| [0-9]+ " $OUT/g32.md | head -9
