#!/usr/bin/env bash
# Decode step 17b: the append kernel's compact entry (kv_append_u16_c).
# GPU tests on the new build, then `decode-tune --append` of the previous
# commit (old, the same decode-tune source built against it) and of the new
# build, alternating, two rounds. .stage-j.tar.xz: dt-old, dt-new, t/*.
set -u
mkdir -p /tmp/j && tar xJf .stage-j.tar.xz -C /tmp/j || exit 1
export FA_REQUIRE_GPU=1
for t in /tmp/j/t/*; do echo "=== $(basename $t): $($t --test-threads 1 2>&1 | grep -E 'test result|FAILED|panicked' | head -3)"; done
echo "=== memcheck: $(compute-sanitizer --tool memcheck /tmp/j/t/gpu_decode --test-threads 1 gpu_decode_small_for_sanitizers 2>&1 | grep 'ERROR SUMMARY')"
for r in 1 2; do for v in old new; do
  echo "== $v $r"
  /tmp/j/dt-$v --no-event-tracking --append --cells 1:4096:8,1:32768:8,8:32768:8 --layouts 0,16 --kernels w8_bc128_s2 2>&1 | grep -E "^append|^\| [0-9]"
done; done
