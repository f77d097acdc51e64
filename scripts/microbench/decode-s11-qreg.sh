#!/usr/bin/env bash
# Decode, session 11 call 5 (perf notes, decode step 31): Q's fragments held
# in registers (`_pgq`, QREG) against the default `_pg` build that re-reads
# them from shared memory every block, with the other swizzled d = 128
# builds (8-warp 2-stage, 4-warp Bc 128) beside them, two rounds; the
# default's per-block timeline at GQA 32k; the launch cost by parameter size
# (decode_stream.cu, LAUNCH_ONLY).
# .stage-t/bins.tar.xz: decode-tune.
set -u
. scripts/microbench/lib.sh
unpack_bins
gpu_name
for r in 1 2; do
  /tmp/h/decode-tune --no-event-tracking --cells 1:4096:8,1:32768:8,1:32768:32,1:131072:8 --layouts 0,16,256 \
    --kernels w8_bc128_s3_pg_c,w8_bc128_s3_pgq_c,w8_bc128_s2_c,w4_bc128_s2 > $OUT/tune-$r.md 2>&1
done
grep -hE "^\| (batch|1) " $OUT/tune-*.md | cut -c1-330
/tmp/h/decode-tune --no-event-tracking --timeline --cells 1:32768:8 --layouts 0 --kernels w8_bc128_s3_pg_c > $OUT/timeline.md 2>&1
grep -A4 "^## Timeline" $OUT/timeline.md | cut -c1-400
nvcc -O3 -arch=sm_90a -o /tmp/ds scripts/microbench/decode_stream.cu 2>/dev/null && LAUNCH_ONLY=1 /tmp/ds > $OUT/launch.md 2>&1; cat $OUT/launch.md
