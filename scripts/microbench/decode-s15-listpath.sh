#!/usr/bin/env bash
# Decode, session 15 call 10 (decode step 42, a diagnostic): why is the v3
# address-order build slower over pages in order, where its sorted list is the
# logical order? N = v3 (decode-address-order-v3.patch); N2 = v3 with the
# sort replaced by a copy of the entries in logical order (the same list
# path, no sort). Each binary with the `default` (list path)
# and `logical` (block-table lookups) schedules as columns, pages in order
# and at random, N and N2 alternating, two rounds (tables
# $OUT/tune-{N,N2}-{1,2}.md). .stage-t/bins.tar.xz: decode-tune-{N,N2}.
set -u
. scripts/microbench/lib.sh
unpack_bins
gpu_name
AB_BUILDS="N N2" ab_tune --layouts 16 --kernels s3_pg_c --schedules default,logical --page-order inorder,random --cells 1:131072:32,1:131072:8,1:32768:8
