#!/usr/bin/env bash
# Decode, session 13 call 7: with step 39's copies, does the 4-warp Bc 64
# build (two blocks per SM) with more splits beat the 8-warp `_pg_c` over
# 16-token pages? GQA 32k / 131k and MHA 32k, 16 and 32 splits beside the
# heuristic's, two rounds.
# .stage-t/bins.tar.xz: decode-tune (3d8b7f6).
set -u
. scripts/microbench/lib.sh
unpack_bins
gpu_name
for r in 1 2; do
  /tmp/h/decode-tune-N --no-event-tracking --cells 1:32768:8,1:131072:8,1:32768:32 --layouts 0,16 --splits 0,16,32 --kernels w4_bc64_s3_c,s3_pg_c > $OUT/w4-$r.md 2>&1
  echo "## round $r"; grep -E "^\| (1|batch) " $OUT/w4-$r.md | sort -u
done
