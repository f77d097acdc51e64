#!/usr/bin/env bash
# Session 18 call 5: racecheck and synccheck over gpu_hopper_small and
# gpu_hopper_varlen_small on main's head (the padded head dims and the d =
# 192 kernels included; memcheck ran in calls 2 and 3).
# .stage-t/bins.tar.xz: gpu_hopper.
set -u
. scripts/microbench/lib.sh
unpack_bins
gpu_name
/tmp/h/gpu_hopper --test-threads 1 gpu_hopper_small > /tmp/w.txt 2>&1; echo "warm-up (JIT): $(grep "test result" /tmp/w.txt)"
for tool in racecheck synccheck; do
  sanitize gpu_hopper $tool gpu_hopper_small gpu_hopper_varlen_small
done
