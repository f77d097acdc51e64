#!/usr/bin/env bash
# Decode, session 11 call 3 (perf notes, decode step 30): the host's kernel
# and split choices (D: calls without tickets run the build without the
# ticket loop; no split from 45% of the slots outside small pages) against
# the previous commit's (B, same kernels): GPU tests on D, then the grid's
# batch 1 and 8 cells without peers, B / D alternating, two rounds, then
# D's full grid with PyTorch in the same run.
# .stage-t/bins.tar.xz: fa-bench-decode-{B,D}, gpu_decode, gpu_api, ndarray_kvcache.
set -u
. scripts/microbench/lib.sh
unpack_bins
decode_checks
for b in B D B D; do
  /tmp/h/fa-bench-decode-$b $OUT/ab-$b --no-torch --batches 1,8 --no-event-tracking > $OUT/ab-$b.log 2>&1
  echo "## $b" >> $OUT/ab.txt; grep -E "^\[ours" $OUT/ab-$b.log >> $OUT/ab.txt
done
grep -E "^## |batch  [18] cache +(4096|32768) heads 32/8 " $OUT/ab.txt
timeout 300 /tmp/h/fa-bench-decode-D $OUT/grid --no-event-tracking > $OUT/grid.log 2>&1; echo "grid rc $?"; tail -3 $OUT/grid.log
grep -E "\| [18] \| (4096|32768|131072) " $OUT/grid/decode.md | cut -c1-200
