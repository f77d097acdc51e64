#!/usr/bin/env bash
# Decode step 20 (docs/perf-notes.md): K and V appended in one launch.
# GPU tests and memcheck on the new build, then decode-tune --append (one
# append_kv; a whole step with new k/v and without) with the previous
# commit's library (decode-tune-old: edb6400 built with this decode-tune
# source) and the new one alternating, two rounds.
# .stage-t/bins.tar.xz: decode-tune, decode-tune-old, gpu_decode, gpu_api, ndarray_kvcache.
set -u
mkdir -p /tmp/h && tar xJf .stage-t/bins.tar.xz -C /tmp/h || exit 1
export FA_REQUIRE_GPU=1
for t in gpu_decode gpu_api ndarray_kvcache; do
  /tmp/h/$t --test-threads 1 > /tmp/t.txt 2>&1; echo "=== $t: $(grep -E 'test result' /tmp/t.txt)" | tee -a $OUT/tests.txt; grep -E "FAILED|panicked" /tmp/t.txt | head -5 | tee -a $OUT/tests.txt
done
compute-sanitizer --tool memcheck /tmp/h/gpu_decode --test-threads 1 gpu_kvcache_append_strides gpu_decode_small_for_sanitizers > /tmp/s.txt 2>&1
echo "=== memcheck: $(grep -E 'ERROR SUMMARY' /tmp/s.txt | tail -1)" | tee -a $OUT/tests.txt
CELLS=1:4096:8,1:4096:32,1:32768:8,1:32768:32,8:32768:8
for r in 1 2; do
  for b in old new; do
    exe=/tmp/h/decode-tune; [ $b = old ] && exe=/tmp/h/decode-tune-old
    echo "## round $r $b" >> $OUT/append.txt
    $exe --no-event-tracking --append --cells $CELLS --layouts 0,16 --kernels w8_bc128_s3_c 2>&1 | grep -E "^(append|step) " >> $OUT/append.txt
  done
done
cat $OUT/append.txt
