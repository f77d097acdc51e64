#!/usr/bin/env bash
# Decode step 14 (docs/perf-notes.md), the device call of session 6: the committed build (issue fast path)
# against the previous commit's decode-tune, GPU tests, memcheck, and the
# streaming floor with cold code. .stage1 = previous build, .stage4 = new.
set -u
mkdir -p /tmp/old /tmp/new
tar xJf .stage1/b.tar.xz -C /tmp/old && tar xJf .stage4/b.tar.xz -C /tmp/new || exit 1
export FA_REQUIRE_GPU=1
for t in /tmp/new/tests/*; do echo "=== $(basename $t)"; $t --test-threads 1 2>&1 | tail -2; done
echo "=== memcheck"; compute-sanitizer --tool memcheck /tmp/new/tests/gpu_decode* --test-threads 1 gpu_decode_small_for_sanitizers gpu_split_scratch_kinds 2>&1 | tail -2
echo "=== stream floor + cold code"; /tmp/new/bin/decode_stream 2>&1 | grep -E "per head w8 Bc128 S2|empty" | tee $OUT/stream.md
for v in old new; do
  echo "=== decode-tune $v"
  /tmp/$v/bin/decode-tune --no-event-tracking --cells 1:4096:8,1:32768:8,1:32768:32,1:131072:8,8:32768:8,64:4096:32,64:32768:8 --layouts 0,16,256 --kernels w8_bc128_s2,w4_bc64_s3 2>&1 | tee $OUT/tune-$v.md | grep '^| [0-9]' | sort -u
done
