#!/usr/bin/env bash
# Decode step 16 (docs/perf-notes.md), session 7: the live-rows warp merge
# and the lean fused combine ("new") against the previous commit ("old"),
# alternating, with the per-block timeline. Tests and memcheck on "new".
# .stage-b.tar.xz: decode-tune-old, decode-tune-new, t/<test binaries>.
set -u
mkdir -p /tmp/s && tar xJf .stage-b.tar.xz -C /tmp/s || exit 1
export FA_REQUIRE_GPU=1
CELLS=${CELLS:-1:4096:8,1:32768:8,1:32768:32,1:131072:8}
i=0
for v in ${ORDER:-old new old new}; do
  i=$((i + 1))
  /tmp/s/decode-tune-$v --no-event-tracking --timeline --cells $CELLS --layouts 0,16,256 --kernels w8_bc128_s2,w4_bc64_s3 > $OUT/tune-$i-$v.md 2>&1
done
for t in /tmp/s/t/*; do $t --test-threads 1 > $OUT/test-$(basename $t).txt 2>&1; echo "=== $(basename $t): $(grep -E 'test result' $OUT/test-$(basename $t).txt)"; grep -E "FAILED|panicked" $OUT/test-$(basename $t).txt | head -5; done
for tool in memcheck racecheck; do
  compute-sanitizer --tool $tool /tmp/s/t/gpu_decode --test-threads 1 gpu_decode_small_for_sanitizers > $OUT/$tool.txt 2>&1
  echo "=== $tool: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' $OUT/$tool.txt | tail -1)"
done
for f in $OUT/tune-*; do echo "== $(basename $f)"; grep '^| [0-9]' $f | grep -v 'TB/s |' | sort -u; done
