#!/usr/bin/env bash
# Decode, session 11 call 12 (for the next session): split counts at GQA
# 32/8, 32k, batch 1 with the committed kernels — the heuristic's 16 against
# 8, 10, 12 — three rounds, `_pg_c` (the default there) and `_c`.
# .stage-t/bins.tar.xz: decode-tune (and the test binaries, unused here).
set -u
. scripts/microbench/lib.sh
unpack_bins
gpu_name
for r in 1 2 3; do
  /tmp/h/decode-tune --no-event-tracking --cells 1:32768:8,1:131072:8 --layouts 0,16,256 --kernels w8_bc128_s3_pg_c --splits 0,8,10,12 > $OUT/splits-$r.md 2>&1
done
grep -hE "^\| (batch|1) " $OUT/splits-*.md | cut -c1-300 | awk '!seen[$0]++'
