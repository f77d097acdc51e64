#!/usr/bin/env bash
# Decode step 22 (docs/perf-notes.md), the committed build: GPU tests,
# memcheck over every flash-decoding kernel (the new _pg builds included),
# then the grid (fa-bench-decode, PyTorch in the same run).
# .stage-t/bins.tar.xz: fa-bench-decode, gpu_decode, gpu_api, ndarray_kvcache.
set -u
mkdir -p /tmp/h && tar xJf .stage-t/bins.tar.xz -C /tmp/h || exit 1
export FA_REQUIRE_GPU=1
for t in gpu_decode gpu_api ndarray_kvcache; do
  /tmp/h/$t --test-threads 1 > /tmp/t.txt 2>&1; echo "=== $t: $(grep -E 'test result' /tmp/t.txt)" | tee -a $OUT/tests.txt; grep -E "FAILED|panicked" /tmp/t.txt | head -5 | tee -a $OUT/tests.txt
done
timeout 200 compute-sanitizer --tool memcheck /tmp/h/gpu_decode --test-threads 1 gpu_every_decode_kernel gpu_decode_small_for_sanitizers > /tmp/s.txt 2>&1
echo "=== memcheck (rc $?): $(grep -E 'ERROR SUMMARY' /tmp/s.txt | tail -1)" | tee -a $OUT/tests.txt
/tmp/h/fa-bench-decode $OUT/grid --no-event-tracking > $OUT/grid.log 2>&1; echo "grid rc $?"; tail -3 $OUT/grid.log
grep -E "paged 16" $OUT/grid/decode.md | head -20 | cut -c1-200
