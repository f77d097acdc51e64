#!/usr/bin/env bash
# The FP8 (e4m3) Hopper forward on the GPU machine, from the repository
# root, with .stage-f8/bins.tar.xz carried (scripts/microbench/pack-some.sh .stage-f8 --test gpu_fp8_prefill --bin fa-bench-fp8):
#  1. gpu_fp8_prefill (f64 reference of the dequantized inputs, FA2's rule
#     against plain FP8 attention);
#  2. compute-sanitizer memcheck / racecheck / synccheck over the varlen test;
#  3. fa-bench-fp8: e4m3 vs our bf16 Hopper kernel and PyTorch (flash and
#     cuDNN bf16, cuDNN e4m3 if it runs) in the same run.
#  4. (mode ncu only) ncu --set full with source counters on the d 128
#     e4m3 kernel (N 16384, non-causal): the details page, and the SASS
#     page of warp stalls per instruction (ncu-sass.csv).
# Usage: OUT=/tmp/out bash scripts/microbench/fp8-prefill.sh [tests|bench|all|ncu] [BENCH ARGS...]
set -u
mkdir -p /tmp/f8 && tar xJf .stage-f8/bins.tar.xz -C /tmp/f8 || exit 1
export FA_REQUIRE_GPU=1
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee $OUT/gpu.txt
mode=${1:-all}; shift || true
if [ "$mode" = ncu ]; then
  timeout 400 ncu --set full --import-source no -k regex:${NCU_KERNEL:-flash_fwd_hopper_e4m3_bf16_d128} -s 2 -c 1 -o $OUT/ncu-fp8 /tmp/f8/fa-bench-fp8 $OUT/ncu-bench --dims 128 --seqlens 16384 --no-torch --warmup 1 --reps 1 --sets 1 > $OUT/ncu.log 2>&1
  echo "ncu rc=$?"; tail -3 $OUT/ncu.log
  ncu --import $OUT/ncu-fp8.ncu-rep --page details > $OUT/ncu-fp8.txt 2>&1
  ncu --import $OUT/ncu-fp8.ncu-rep --page source --print-source sass --csv > $OUT/ncu-sass.csv 2>&1
  rm -f $OUT/ncu-fp8.ncu-rep
  grep -E "Duration|Issue Slots Busy|Executed Ipc A|No Eligible|Warp Cycles Per Issued|Stall" $OUT/ncu-fp8.txt | head -30
  exit 0
fi
if [ "$mode" != bench ]; then
  timeout 180 /tmp/f8/gpu_fp8_prefill --test-threads 1 --nocapture > $OUT/tests.txt 2>&1
  rc=$?
  echo "=== gpu_fp8_prefill rc=$rc: $(grep -E 'test result' $OUT/tests.txt | tr '\n' ' ')"
  grep -E "FAILED|panicked|error" $OUT/tests.txt | head -8
  # A hang (timeout) would hang the sanitizers and the benchmark too.
  [ $rc = 124 ] && exit 1
  for tool in memcheck racecheck synccheck; do
    timeout 200 compute-sanitizer --tool $tool /tmp/f8/gpu_fp8_prefill --test-threads 1 varlen > $OUT/$tool-varlen.txt 2>&1
    echo "=== $tool varlen rc=$?: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|test result' $OUT/$tool-varlen.txt | tr '\n' ' ')"
  done
fi
if [ "$mode" != tests ]; then
  timeout 400 /tmp/f8/fa-bench-fp8 $OUT "$@" 2> $OUT/bench.log
  echo "fa-bench-fp8 rc=$?"; cat $OUT/fp8_prefill.md

fi
