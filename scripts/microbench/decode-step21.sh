#!/usr/bin/env bash
# Decode step 21 (docs/perf-notes.md): the k/v append fused into the
# flash-decoding kernel. GPU tests and sanitizers on the new build, then
# decode-tune --append (a step with new k/v and without) and the two default
# kernels' entries without new k/v (register growth check), the previous
# commit's build (decode-tune-old = 8be2db3) and the new one alternating.
# .stage-t/bins.tar.xz: decode-tune, decode-tune-old, gpu_decode, gpu_api, gpu_features, ndarray_kvcache.
set -u
mkdir -p /tmp/h && tar xJf .stage-t/bins.tar.xz -C /tmp/h || exit 1
export FA_REQUIRE_GPU=1
for t in gpu_decode gpu_api gpu_features ndarray_kvcache; do
  /tmp/h/$t --test-threads 1 > /tmp/t.txt 2>&1; echo "=== $t: $(grep -E 'test result' /tmp/t.txt)" | tee -a $OUT/tests.txt; grep -E "FAILED|panicked" /tmp/t.txt | head -5 | tee -a $OUT/tests.txt
done
for tool in memcheck racecheck; do
  compute-sanitizer --tool $tool /tmp/h/gpu_decode --test-threads 1 gpu_kvcache_append_strides gpu_decode_small_for_sanitizers > /tmp/s.txt 2>&1
  echo "=== $tool: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' /tmp/s.txt | tail -1)" | tee -a $OUT/tests.txt
done
CELLS=${CELLS:-1:4096:8,1:4096:32,1:32768:8,1:32768:32,1:131072:8,8:32768:8}
for r in 1 2; do
  for b in old new; do
    exe=/tmp/h/decode-tune; [ $b = old ] && exe=/tmp/h/decode-tune-old
    echo "## round $r $b" >> $OUT/tune.txt
    $exe --no-event-tracking --append --cells $CELLS --layouts 0,16,256 --kernels w8_bc128_s3_c,w4_bc64_s3 >> $OUT/tune.txt 2>&1
  done
done
grep -E "^(## |step )" $OUT/tune.txt
