#!/usr/bin/env bash
# Decode, session 16 call 11: every GPU test binary of the committed state
# (lib.sh all_checks: the decode binaries with gpu_decode_into, memcheck
# over every flash-decoding kernel, gpu_attention, gpu_features, gpu_half,
# gpu_hopper, racecheck over the small decode case). Binaries staged in
# .stage-t/bins.tar.xz.
set -u
source scripts/microbench/lib.sh
unpack_bins
all_checks
