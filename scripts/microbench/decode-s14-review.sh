#!/usr/bin/env bash
# Decode, session 14 call 6 (review): `KvCopy::page` serving the two places
# that took a prefetched block-table entry or looked the page up (same
# registers; the SASS reorders the prologue's clamp branches). The decode
# test binaries and memcheck on the new build, then the previous build B and
# the new build N of decode-tune alternating, two rounds, `_pg_c` and `_c`.
# .stage-t/bins.tar.xz: gpu_decode, gpu_api, ndarray_kvcache,
# decode-tune-{B,N}.
set -u
. scripts/microbench/lib.sh
unpack_bins
decode_checks
ab_tune --cells 1:32768:8,1:131072:8,1:32768:32,1:4096:8,8:32768:8 --layouts 16,0,256 --kernels s3_pg_c,s3_c
