#!/usr/bin/env bash
# Decode step 23, experiment C: the epilogue run dry while the last static
# block's copies are in flight (its code warmed from the L2), the real pass
# after it. gpu_decode of C against the f64 reference, then A (the committed
# build) and C alternating, two rounds, the contiguous default kernel.
# .stage-t/bins.tar.xz: decode-tune-A, decode-tune-C, gpu_decode-C.
set -u
. scripts/microbench/lib.sh
unpack_bins
run_tests gpu_decode-C
CELLS=1:32768:8,1:4096:8,1:131072:8,1:32768:32,1:4096:32
for r in 1 2 3; do
  for b in A C; do
    echo "## round $r $b" >> $OUT/tune.md
    /tmp/h/decode-tune-$b --no-event-tracking --cells $CELLS --layouts 0,256 --kernels w8_bc128_s3_c >> $OUT/tune.md 2>/dev/null
  done
done
grep -E "^## |^\| [0-9]" $OUT/tune.md | sed 's/flash_fwd_tc_dec_bf16_d128_//g' | cut -c1-90
