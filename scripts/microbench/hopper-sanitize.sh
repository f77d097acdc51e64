#!/usr/bin/env bash
# compute-sanitizer over the Hopper (sm_90a) kernels' small cases
# (gpu_hopper_small, gpu_hopper_varlen_small: every tile, padded head dims,
# d = 192): memcheck, racecheck and synccheck (TOOLS to choose). One
# unsanitized run first, so that the driver's JIT is not timed by the
# sanitizer. Summaries in $OUT/tests.txt.
# Needs .stage-t/bins.tar.xz with gpu_hopper (see README.md).
set -u
. scripts/microbench/lib.sh
unpack_bins
gpu_name
/tmp/h/gpu_hopper --test-threads 1 gpu_hopper_small > /tmp/w.txt 2>&1; echo "warm-up (JIT): $(grep "test result" /tmp/w.txt)"
for tool in ${TOOLS:-memcheck racecheck synccheck}; do
  sanitize gpu_hopper $tool gpu_hopper_small gpu_hopper_varlen_small
done
