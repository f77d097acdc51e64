#!/usr/bin/env bash
# Decode over an FP8 (e4m3) KV cache on the GPU machine, from the repository
# root, with .stage-fd/bins.tar.xz carried (scripts/microbench/pack-some.sh
# .stage-fd --test gpu_fp8_decode --test ndarray_kvcache_fp8 --bin fa-bench-fp8-decode):
#  1. gpu_fp8_decode and ndarray_kvcache_fp8 (f64 reference of the dequantized
#     cache, FA2's rule; the quantized bytes of appended rows);
#  2. compute-sanitizer memcheck / racecheck / synccheck over two cases;
#  3. fa-bench-fp8-decode: the e4m3 cache beside its bf16 original, same run
#     (extra arguments go to it, e.g. --batches 1 --caches 32768,131072).
#  4. (mode ncu only) ncu --set full of the first kernel matching NCU_KERNEL
#     (default: the bf16-q e4m3 kernel) in one
#     cell (batch 1, 131k keys, MHA, contiguous).
# Usage: OUT=/tmp/out bash scripts/microbench/fp8-decode.sh [tests|bench|all|ncu] [BENCH ARGS...]
set -u
mkdir -p /tmp/fd && tar xJf .stage-fd/bins.tar.xz -C /tmp/fd || exit 1
export FA_REQUIRE_GPU=1
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee $OUT/gpu.txt
mode=${1:-all}; shift || true
if [ "$mode" = ncu ]; then
  timeout 400 ncu --set full -k regex:${NCU_KERNEL:-dec_bf16_e4m3} -c 1 -o $OUT/ncu-decode /tmp/fd/fa-bench-fp8-decode $OUT/ncu-bench --batches 1 --caches 131072 --kv-heads 32 --layouts 0 --warmup 0 --reps 1 > $OUT/ncu.log 2>&1
  echo "ncu rc=$?"; tail -3 $OUT/ncu.log
  ncu --import $OUT/ncu-decode.ncu-rep --page details > $OUT/ncu-decode.txt 2>&1
  grep -E "^  flash|Duration|Memory Throughput|DRAM Throughput|Issue Slots Busy|Executed Ipc A|Achieved Occupancy|Registers Per|No Eligible|Warp Cycles Per Issued" $OUT/ncu-decode.txt
  exit 0
fi
if [ "$mode" != bench ]; then
  for t in gpu_fp8_decode ndarray_kvcache_fp8; do
    timeout 240 /tmp/fd/$t --test-threads 1 --nocapture > $OUT/$t.txt 2>&1
    rc=$?
    echo "=== $t rc=$rc: $(grep -E 'test result' $OUT/$t.txt | tr '\n' ' ')"
    grep -E "FAILED|panicked|error" $OUT/$t.txt | head -8
    [ $rc = 124 ] && exit 1
  done
  for tool in memcheck racecheck synccheck; do
    timeout 200 compute-sanitizer --tool $tool /tmp/fd/gpu_fp8_decode --test-threads 1 gpu_fp8_decode_scale_any > $OUT/$tool.txt 2>&1
    echo "=== $tool rc=$?: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|test result' $OUT/$tool.txt | tr '\n' ' ')"
  done
fi
if [ "$mode" != tests ]; then
  timeout 450 /tmp/fd/fa-bench-fp8-decode $OUT "$@" 2> $OUT/bench.log
  echo "fa-bench-fp8-decode rc=$?"; cat $OUT/fp8_decode.md
fi
