#!/usr/bin/env bash
# Decode, session 11 call 4 (perf notes, decode step 30): the committed
# build's GPU tests, split counts around the heuristic's on the batch-1
# cells (decode-tune --splits, the defaults `_c` and `_pg_c`, two rounds),
# then the grid (fa-bench-decode, PyTorch in the same run).
# .stage-t/bins.tar.xz: fa-bench-decode, decode-tune, gpu_decode, gpu_api, ndarray_kvcache.
set -u
. scripts/microbench/lib.sh
unpack_bins
decode_checks
for r in 1 2; do
  /tmp/h/decode-tune --no-event-tracking --cells 1:32768:8,1:131072:8 --layouts 0,256 --kernels w8_bc128_s3_c,w8_bc128_s3_pg_c --splits 0,8,10,12,14 > $OUT/splits-gqa-$r.md 2>&1
  /tmp/h/decode-tune --no-event-tracking --cells 1:32768:32 --layouts 0,256 --kernels w8_bc128_s3_c,w8_bc128_s3_pg_c --splits 0,2,3 > $OUT/splits-mha-$r.md 2>&1
done
grep -hE "^\| (batch|1) " $OUT/splits-*.md | cut -c1-400
timeout 300 /tmp/h/fa-bench-decode $OUT/grid --no-event-tracking > $OUT/grid.log 2>&1; echo "grid rc $?"; tail -3 $OUT/grid.log
grep -E "\| [18] \| (4096|32768|131072) " $OUT/grid/decode.md | cut -c1-200
