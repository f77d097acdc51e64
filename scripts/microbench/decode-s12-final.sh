#!/usr/bin/env bash
# Decode, session 12 calls 5 and 9: the committed build — every GPU test binary
# (decode, API, ndarray, attention, features, half, hopper), memcheck and
# racecheck over the decode cases, then the grid (fa-bench-decode, PyTorch in
# the same run) and the batch-1 32k cells twice more (PyTorch beside, for
# the bar cells' spread). Outputs packed in $OUT/final.tar.xz (the run tool
# returns at most 8 files).
# .stage-t/bins.tar.xz: fa-bench-decode, decode-tune, the 7 GPU test binaries.
set -u
. scripts/microbench/lib.sh
unpack_bins
mkdir -p $OUT/f
OUT0=$OUT; OUT=$OUT/f
decode_checks
run_tests gpu_attention gpu_features gpu_half gpu_hopper
sanitize_decode racecheck gpu_decode_small_for_sanitizers
timeout 300 /tmp/h/fa-bench-decode $OUT/grid --no-event-tracking > $OUT/grid.log 2>&1; echo "grid rc $?"; tail -3 $OUT/grid.log
grep -E "\| 1 \| (4096|32768|131072) " $OUT/grid/decode.md | cut -c1-200
for r in 2 3; do
  timeout 120 /tmp/h/fa-bench-decode /tmp/b1-$r --no-event-tracking --batches 1 --caches 32768 > /tmp/b1.log 2>&1
  cp /tmp/b1-$r/decode.md $OUT/b1-32k-$r.md
  echo "## repeat $r"; grep -E "\| 1 \| 32768 " /tmp/b1-$r/decode.md | cut -c1-200
done
OUT=$OUT0
tar cJf $OUT/final.tar.xz -C $OUT f && rm -rf $OUT/f
