#!/usr/bin/env bash
# Decode step 26 on an H100 (the first call got an H200): the committed
# build (A), R (counter reset after the acquire fence) and P (R + block-table
# prefetch) alternating, two rounds, each kernel with the library's schedule
# (tickets where eligible) and the static one — call 1 showed tickets 12–15%
# slower than static on the H200's long contiguous caches.
# .stage-t/bins.tar.xz: decode-tune-{A,R,P}.
set -u
. scripts/microbench/lib.sh
unpack_bins
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,clocks.max.mem --format=csv | tee $OUT/gpu.txt
CELLS=1:4096:8,1:32768:8,1:32768:32,1:131072:8,1:131072:32,8:32768:8
for r in 1 2; do
  for b in A R P; do
    echo "## round $r $b" >> $OUT/tune.txt
    /tmp/h/decode-tune-$b --no-event-tracking --cells $CELLS --layouts 0,16,256 --kernels w8_bc128_s3_c,w8_bc128_s3_pg_c --schedules default,static >> $OUT/tune.txt 2>&1
  done
done
grep -E "^(## |\| [0-9])" $OUT/tune.txt | sed 's/flash_fwd_tc_dec_bf16_d128_//g' | tail -20
