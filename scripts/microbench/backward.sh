#!/usr/bin/env bash
# The backward pass and first-use cost on the GPU machine, from the
# repository root, with .stage-t/bins.tar.xz carried (pack-bins.sh):
#  1. first call per kernel family in fresh processes with an empty JIT cache;
#  2. gpu_load and the examples;
#  3. fa-bench-bwd: gradient checks against the f64 reference, then the
#     backward table vs PyTorch flash/cuDNN (same run);
#  4. the forward test binaries (nothing moved).
# Usage: OUT=/tmp/out bash scripts/microbench/backward.sh [quick]
set -u
source scripts/microbench/lib.sh
unpack_bins
gpu_name
for f in f32 tc hopper decode; do
  CUDA_CACHE_DISABLE=1 timeout 120 /tmp/h/fa-first-call $f 2>&1 | tee -a $OUT/first-call.txt
done
run_tests gpu_load
for e in ndarray_prefill device_api varlen; do
  timeout 120 /tmp/h/$e > /tmp/e.txt 2>&1; echo "=== example $e rc=$? $(tail -1 /tmp/e.txt)" | tee -a $OUT/tests.txt
done
if [ "${1:-}" = quick ]; then
  timeout 400 /tmp/h/fa-bench-bwd --quick --sets 2 --dtypes bf16,f16 --dims 64,128 --seqlens 4096,16384 --out $OUT/bwd.md 2> $OUT/bwd.log
else
  timeout 500 /tmp/h/fa-bench-bwd --out $OUT/bwd.md 2> $OUT/bwd.log
fi
echo "fa-bench-bwd rc=$?"; cat $OUT/bwd.md
