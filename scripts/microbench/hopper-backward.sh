#!/usr/bin/env bash
# The Hopper (wgmma) backward on the GPU machine, from the repository root,
# with .stage-hb/bins.tar.xz carried (scripts/microbench/pack-some.sh .stage-hb --test gpu_backward --bin fa-bench-bwd):
#  1. the gradient tests against the f64 reference (both backward kernels:
#     the Hopper one, then FLASH_ATTN_BACKWARD_KERNEL=tc);
#  2. compute-sanitizer memcheck over the varlen and deterministic tests;
#  3. fa-bench-bwd: Hopper backward (d 64, 128, 256) with PyTorch
#     flash/cuDNN in the same run, then the tensor-core (mma.sync) backward
#     alone (d 64, 128: it has no d 256).
#  4. (mode ncu only) ncu --set full on one d 128 N 16384 bf16 launch of the
#     Hopper backward: the details page and the warp stalls per SASS
#     instruction (ncu-sass.csv).
# Usage: OUT=/tmp/out bash scripts/microbench/hopper-backward.sh [quick|tests|bench|check|ncu|softcap]
# (softcap: fa-bench-bwd --softcap 30 on the Hopper kernels and on the tensor-core kernel)
# (check: the Hopper tests, memcheck and the quick benchmark with PyTorch,
# without the tensor-core rows; every mode but bench and ncu starts with the
# bf16 gradient test alone, 90 s at most, and stops if it fails)
set -u
mkdir -p /tmp/h && tar xJf .stage-hb/bins.tar.xz -C /tmp/h || exit 1
export FA_REQUIRE_GPU=1
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee $OUT/gpu.txt
mode=${1:-quick}
if [ "$mode" = softcap ]; then
  # softcap 30, bf16: the Hopper softcap/ALiBi kernels, then the tensor-core kernel, same run
  for k in hopper tc; do
    e=""; [ $k = tc ] && e="FLASH_ATTN_BACKWARD_KERNEL=tc"
    env $e timeout 120 /tmp/h/fa-bench-bwd --quick --no-torch --softcap 30 --sets 2 --dtypes bf16 --dims 64,128 --seqlens 4096,16384 --out $OUT/bwd-softcap-$k.md 2> $OUT/bwd-softcap-$k.log
    echo "softcap $k rc=$?"; grep -E "^\| bf16 \| (64|128) \| (no|yes) \| [0-9]+ \|" $OUT/bwd-softcap-$k.md
  done
  exit 0
fi
if [ "$mode" = ncu ]; then
  timeout 400 ncu --set full --import-source no -k regex:${NCU_KERNEL:-flash_bwd_hopper_bf16_d128} -s 2 -c 1 -o $OUT/ncu-bwd /tmp/h/fa-bench-bwd --no-torch --quick --sets 1 --dtypes bf16 --dims 128 --seqlens 16384 --out $OUT/ncu-bench.md > $OUT/ncu.log 2>&1
  echo "ncu rc=$?"; tail -3 $OUT/ncu.log
  ncu --import $OUT/ncu-bwd.ncu-rep --page details > $OUT/ncu-bwd.txt 2>&1
  ncu --import $OUT/ncu-bwd.ncu-rep --page source --print-source sass --csv > $OUT/ncu-sass.csv 2>&1
  rm -f $OUT/ncu-bwd.ncu-rep
  grep -E "Duration|Issue Slots Busy|Executed Ipc A|No Eligible|Warp Cycles Per Issued|Stall|Tensor" $OUT/ncu-bwd.txt | head -30
  exit 0
fi
if [ "$mode" != bench ]; then
  timeout 90 /tmp/h/gpu_backward --test-threads 1 --nocapture bf16_gradients > $OUT/tests-smoke.txt 2>&1
  rc=$?; echo "=== smoke (bf16 gradients) rc=$rc: $(grep -E 'test result|largest' $OUT/tests-smoke.txt | tr '\n' ' ')"
  [ $rc = 0 ] || { grep -E "FAILED|panicked" $OUT/tests-smoke.txt | head -5; exit 1; }
  timeout 240 /tmp/h/gpu_backward --test-threads 1 --nocapture > $OUT/tests-hopper.txt 2>&1
  echo "=== gpu_backward (Hopper) rc=$?: $(grep -E 'test result|largest' $OUT/tests-hopper.txt | tr '\n' ' ')"
  grep -E "FAILED|panicked" $OUT/tests-hopper.txt | head -5
fi
if [ "$mode" = tests ] || [ "$mode" = check ]; then
  if [ "$mode" = tests ]; then
    FLASH_ATTN_BACKWARD_KERNEL=tc timeout 200 /tmp/h/gpu_backward --test-threads 1 --nocapture > $OUT/tests-tc.txt 2>&1
    echo "=== gpu_backward (tc) rc=$?: $(grep -E 'test result|largest' $OUT/tests-tc.txt | tr '\n' ' ')"
  fi
  for t in varlen bf16_gradients; do
    timeout 150 compute-sanitizer --tool memcheck /tmp/h/gpu_backward --test-threads 1 $t > $OUT/memcheck-$t.txt 2>&1
    echo "=== memcheck $t rc=$?: $(grep -E 'ERROR SUMMARY|test result' $OUT/memcheck-$t.txt | tr '\n' ' ')"
  done
  for tool in racecheck synccheck; do
    timeout 150 compute-sanitizer --tool $tool /tmp/h/gpu_backward --test-threads 1 varlen > $OUT/$tool-varlen.txt 2>&1
    echo "=== $tool varlen rc=$?: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|test result' $OUT/$tool-varlen.txt | tr '\n' ' ')"
  done
fi
if [ "$mode" != tests ]; then
  q=""; [ "$mode" != bench ] && q="--quick"
  timeout 450 /tmp/h/fa-bench-bwd $q --sets 2 --dtypes bf16,f16 --dims 64,128,256 --seqlens 4096,16384 --out $OUT/bwd-hopper.md 2> $OUT/bwd-hopper.log
  echo "fa-bench-bwd (Hopper) rc=$?"; cat $OUT/bwd-hopper.md
  [ "$mode" = check ] && exit 0
  FLASH_ATTN_BACKWARD_KERNEL=tc timeout 120 /tmp/h/fa-bench-bwd $q --no-torch --sets 2 --dtypes bf16,f16 --dims 64,128 --seqlens 4096,16384 --out $OUT/bwd-tc.md 2> $OUT/bwd-tc.log
  echo "fa-bench-bwd (tc) rc=$?"; grep -E "^\[ours\]" $OUT/bwd-tc.log
fi
