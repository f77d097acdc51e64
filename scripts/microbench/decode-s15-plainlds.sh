#!/usr/bin/env bash
# Decode, session 15 call 11 (decode step 42, the guess of call 10): does the
# v3 list path stream slower because its shared-memory load is volatile?
# N = v3 (decode-address-order-v3.patch); N3 = v3 with the list entry read
# by a plain `ld.shared` (no `volatile`). Each binary with the `default` (list path)
# and `logical` (block-table lookups) schedules as columns, pages in order
# and at random, N and N3 alternating, two rounds (tables
# $OUT/tune-{N,N3}-{1,2}.md). .stage-t/bins.tar.xz: decode-tune-{N,N3}.
set -u
. scripts/microbench/lib.sh
unpack_bins
gpu_name
AB_BUILDS="N N3" ab_tune --layouts 16 --kernels s3_pg_c --schedules default,logical --page-order inorder,random --cells 1:131072:32,1:131072:8,1:32768:8
