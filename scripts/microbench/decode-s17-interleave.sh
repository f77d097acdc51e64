#!/usr/bin/env bash
# Decode, session 17 call 5: fixed split shares interleaved over 16-token
# pages (N: a throw-away build whose host sets INTERLEAVE_PAGED for small
# pages too) against the contiguous shares of main (B), over random,
# ordered, scattered:4 and scattered-ordered:4 placements; two rounds after
# a warm-up run of each build.
# .stage-t/bins.tar.xz: decode-tune-{B,N}.
set -u
. scripts/microbench/lib.sh
unpack_bins
gpu_name
CELLS=1:32768:8,1:131072:8,1:131072:32,8:32768:8
for b in B N; do timeout 200 /tmp/h/decode-tune-$b --no-event-tracking --kernels s3_pg_c --layouts 16 --cells 1:4096:8 > /dev/null 2>&1; echo "warm $b rc $?"; done
ab_tune --kernels s3_pg_c --layouts 16 --cells $CELLS --page-order random,ordered,scattered:4,scattered-ordered:4
