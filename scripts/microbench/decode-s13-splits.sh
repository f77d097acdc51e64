#!/usr/bin/env bash
# Decode, session 13 call 5: split counts around the heuristic where the
# goal beyond the bar is closest — MHA 32k at batch 1 (2.98 TB/s, the goal
# 3.0) and batch 8 GQA 32k over 16-token pages (0.98x PyTorch flash) —
# for the compact default builds (`_pg_c` static, `_c` with tickets), two
# rounds.
# .stage-t/bins.tar.xz: decode-tune (dd52bfb).
set -u
. scripts/microbench/lib.sh
unpack_bins
gpu_name
for r in 1 2; do
  /tmp/h/decode-tune --no-event-tracking --cells 1:32768:32 --layouts 0,16,256 --splits 0,2,3,4 --kernels s3_pg_c,w8_bc128_s3_c > $OUT/mha-$r.md 2>&1
  echo "## MHA 32k round $r"; grep -E "^\| (1|batch) " $OUT/mha-$r.md | sort -u
  /tmp/h/decode-tune --no-event-tracking --cells 8:32768:8 --layouts 16 --splits 0,1,2,3,4 --kernels s3_pg_c > $OUT/b8-$r.md 2>&1
  echo "## batch 8 GQA 32k page 16 round $r"; grep -E "^\| (8|batch) " $OUT/b8-$r.md | sort -u
done
