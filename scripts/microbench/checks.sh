#!/usr/bin/env bash
# Every GPU test binary on a GPU machine, then compute-sanitizer: lib.sh
# all_checks (gpu_decode, gpu_decode_into, gpu_api, ndarray_kvcache with
# memcheck over every flash-decoding kernel and the append cases; then
# gpu_attention, gpu_features, gpu_half, gpu_hopper and racecheck over the
# small decode case). Summaries in $OUT/tests.txt, the GPU's name in
# $OUT/gpu.txt. Run from the repository root.
# Needs .stage-t/bins.tar.xz with those test binaries (see README.md).
set -u
. scripts/microbench/lib.sh
unpack_bins
all_checks
