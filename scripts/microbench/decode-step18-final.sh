#!/usr/bin/env bash
# Decode step 18 (docs/perf-notes.md), the committed build: GPU tests and
# sanitizers, decode-tune (the previous build's default entry beside the new
# 3-stage and 2-stage compact entries, both schedules), the timeline of
# GQA 32k, then the grid (fa-bench-decode, PyTorch in the same run).
# .stage-t/bins.tar.xz: decode-tune, decode-tune-old, fa-bench-decode, gpu_* and ndarray_kvcache tests.
set -u
mkdir -p /tmp/h && tar xJf .stage-t/bins.tar.xz -C /tmp/h || exit 1
export FA_REQUIRE_GPU=1
for t in gpu_decode gpu_api gpu_features ndarray_kvcache; do
  /tmp/h/$t --test-threads 1 > /tmp/t.txt 2>&1; echo "=== $t: $(grep -E 'test result' /tmp/t.txt)" | tee -a $OUT/tests.txt; grep -E "FAILED|panicked" /tmp/t.txt | head -5 | tee -a $OUT/tests.txt
done
for tool in memcheck racecheck; do
  compute-sanitizer --tool $tool /tmp/h/gpu_decode --test-threads 1 gpu_decode_small_for_sanitizers gpu_split_tickets > /tmp/s.txt 2>&1
  echo "=== $tool: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' /tmp/s.txt | tail -1)" | tee -a $OUT/sanitizers.txt
done
CELLS=1:4096:8,1:4096:32,1:32768:8,1:32768:32,1:131072:8,1:131072:32,8:32768:8,8:4096:32
for r in 1 2; do
  echo "## round $r: previous build" >> $OUT/tune.md
  /tmp/h/decode-tune-old --no-event-tracking --cells $CELLS --layouts 0,256 --kernels w8_bc128_s2_c >> $OUT/tune.md 2>/dev/null
  echo "## round $r: this build" >> $OUT/tune.md
  /tmp/h/decode-tune --no-event-tracking --cells $CELLS --layouts 0,256 --kernels w8_bc128_s3_c,w8_bc128_s2_c --schedules default,static >> $OUT/tune.md 2>/dev/null
done
echo tune done
/tmp/h/decode-tune --no-event-tracking --cells 1:32768:8,1:131072:8 --layouts 0 --kernels w8_bc128_s3 --schedules default,static --timeline > $OUT/timeline.md 2>/dev/null
sed -n "/## Timeline/,\$p" $OUT/timeline.md | cut -c1-300
/tmp/h/fa-bench-decode $OUT/grid --no-event-tracking > $OUT/grid.log 2>&1; echo "grid rc $?"; tail -3 $OUT/grid.log
