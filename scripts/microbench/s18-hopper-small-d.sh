#!/usr/bin/env bash
# Session 18 call 4: head dims 8..32 on the Hopper d = 64 kernel (X: a
# build whose `hopper_head_dim` takes every multiple of 8) against the
# mma.sync d = 32 tile they run now (P). gpu_hopper of X (8, 16, 32 added to
# every test), then fa-bench-infer's head-dim rows (now with d = 32): P
# without peers, X with PyTorch 2.11 flash in the same run.
# .stage-t/bins.tar.xz: gpu_hopper (X), fa-bench-infer-{P,X}.
set -u
. scripts/microbench/lib.sh
unpack_bins
gpu_name
run_tests gpu_hopper
grep -E "^(ok|FAIL) .*d(8|16|32)[^0-9]" /tmp/t.txt | head -4
headdim_rows X 'd=(32|40)' P X
