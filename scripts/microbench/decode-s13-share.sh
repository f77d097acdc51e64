#!/usr/bin/env bash
# Decode, session 13 call 8: `fa2::split_share` serving both key_blocks and
# the flash-decoding kernel's contiguous split share (the same three lines
# twice before; ptxas then gives `_pg_c` 255 registers instead of 248, no
# spills) — decode tests and memcheck on N, then decode-tune B (3d8b7f6)
# and N alternating, two rounds, the `_pg_c` default (the contiguous share
# runs over 16-token pages) and `_pg` / 4-warp beside it.
# .stage-t/bins.tar.xz: decode-tune-{B,N}, gpu_decode, gpu_api, ndarray_kvcache (N).
set -u
. scripts/microbench/lib.sh
unpack_bins
decode_checks
ab_tune --cells 1:4096:8,1:32768:8,1:131072:8,1:32768:32,8:32768:8 --layouts 0,16,256 --kernels s3_pg_c
