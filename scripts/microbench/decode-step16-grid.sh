#!/usr/bin/env bash
# Decode step 16, the closing device call of session 7: the decode grid on
# the committed build (fa-bench-decode, PyTorch in the same run), memcheck
# and racecheck of gpu_decode's sanitizer case, the GPU tests (gpu_* in the
# tarball), and the launch-cost rows of the streaming floor tool.
# .stage-c.tar.xz: fa-bench-decode, gpu_decode [, gpu_features, gpu_api],
# decode_stream (nvcc -O3 -arch=sm_90a scripts/microbench/decode_stream.cu).
set -u
mkdir -p /tmp/c && tar xJf .stage-c.tar.xz -C /tmp/c || exit 1
export FA_REQUIRE_GPU=1
LAUNCH_ONLY=1 /tmp/c/decode_stream > $OUT/launch.md 2>&1; cat $OUT/launch.md
/tmp/c/fa-bench-decode $OUT/grid --no-event-tracking > $OUT/grid.log 2>&1; echo "grid rc $?"; tail -3 $OUT/grid.log
for t in /tmp/c/gpu_*; do $t --test-threads 1 > $OUT/test-$(basename $t).txt 2>&1; echo "=== $(basename $t): $(grep -E 'test result' $OUT/test-$(basename $t).txt)"; done
for tool in memcheck racecheck; do
  compute-sanitizer --tool $tool /tmp/c/gpu_decode --test-threads 1 gpu_decode_small_for_sanitizers > $OUT/$tool.txt 2>&1
  echo "=== $tool: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' $OUT/$tool.txt | tail -1)"
done
grep -E "^\| 1 \| (32768|131072)" $OUT/grid/decode.md 2>/dev/null | head -20
