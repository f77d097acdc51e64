#!/usr/bin/env bash
# Session 18 call 3: a native d = 192 Hopper kernel (Bc = 64, overlap; and
# its _vw variant) instead of padding 136..192 to 256. gpu_hopper (the new
# kernels in every_kernel; 136, 160 padded to 192; 192 native), memcheck
# over the small cases, then fa-bench-infer's head-dim rows: P = call 2's
# build (160, 192 padded to 256) without peers, N = this build with
# PyTorch 2.11 flash in the same run, then P again.
# .stage-t/bins.tar.xz: gpu_hopper, fa-bench-infer-{P,N}.
set -u
. scripts/microbench/lib.sh
unpack_bins
gpu_name
run_tests gpu_hopper
grep -E "^(ok|FAIL) .*d192" /tmp/t.txt | head -6
sanitize gpu_hopper memcheck gpu_hopper_small gpu_hopper_varlen_small
headdim_rows N 'd=(160|192|224)' P N P
