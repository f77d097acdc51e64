#!/usr/bin/env bash
# Decode, session 12 call 10: the grid (fa-bench-decode, PyTorch in the same
# run) with ours and no split timed in alternating halves; the library as in
# call 9 (05fedeb's kernels and host), only the benchmark changed. Outputs
# packed in $OUT/grid.tar.xz.
# .stage-t/bins.tar.xz: fa-bench-decode.
set -u
. scripts/microbench/lib.sh
unpack_bins
gpu_name
timeout 420 /tmp/h/fa-bench-decode $OUT/grid --no-event-tracking > $OUT/grid.log 2>&1; echo "grid rc $?"; tail -3 $OUT/grid.log
grep -E "\| (1|8) \| (4096|32768|131072) " $OUT/grid/decode.md | cut -c1-200
tar cJf $OUT/grid.tar.xz -C $OUT grid grid.log && rm -rf $OUT/grid $OUT/grid.log
