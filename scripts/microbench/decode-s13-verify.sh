#!/usr/bin/env bash
# Decode, session 13 call 6: the review commit (KvCopy::one_page /
# batched_full; SASS differs from dd52bfb only in the prologue's branch
# conditions) — decode tests and memcheck on N, then decode-tune B (dd52bfb)
# and N alternating, two rounds, the `_pg_c` default on GQA 32k / 131k and
# batch 8 GQA 32k in the three layouts.
# .stage-t/bins.tar.xz: decode-tune-{B,N}, gpu_decode, gpu_api, ndarray_kvcache (N).
set -u
. scripts/microbench/lib.sh
unpack_bins
decode_checks
ab_tune --cells 1:32768:8,1:131072:8,8:32768:8 --layouts 0,16,256 --kernels s3_pg_c
