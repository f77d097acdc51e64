#!/usr/bin/env bash
# Decode step 17 (docs/perf-notes.md), session 7: the compact parameter
# block. GPU tests and sanitizers on the new build, then decode-tune with
# each default kernel's full entry (AttnParams, 336 bytes) beside its
# compact entry (DecodeParams, 184 bytes, `…_c`) in the same run, two
# rounds, then the grid (fa-bench-decode: the default path = compact).
# .stage-h.tar.xz: fa-bench-decode, decode-tune, gpu_* test binaries.
set -u
mkdir -p /tmp/h && tar xJf .stage-h.tar.xz -C /tmp/h || exit 1
export FA_REQUIRE_GPU=1
for t in /tmp/h/gpu_*; do $t --test-threads 1 > $OUT/test-$(basename $t).txt 2>&1; echo "=== $(basename $t): $(grep -E 'test result' $OUT/test-$(basename $t).txt)"; grep -E "FAILED|panicked" $OUT/test-$(basename $t).txt | head -3; done
for tool in memcheck racecheck; do
  compute-sanitizer --tool $tool /tmp/h/gpu_decode --test-threads 1 gpu_decode_small_for_sanitizers gpu_decode_compact_entry > $OUT/$tool.txt 2>&1
  echo "=== $tool: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' $OUT/$tool.txt | tail -1)"
done
for r in 1 2; do
  /tmp/h/decode-tune --no-event-tracking --cells 1:4096:8,1:4096:32,1:32768:8,1:32768:32,1:131072:8,8:32768:8 --layouts 0,16,256 --kernels w8_bc128_s2,w4_bc64_s3 > $OUT/tune-$r.md 2>&1
  grep '^| ' $OUT/tune-$r.md | head -22
done
/tmp/h/fa-bench-decode $OUT/grid --no-event-tracking > $OUT/grid.log 2>&1; echo "grid rc $?"; tail -3 $OUT/grid.log
