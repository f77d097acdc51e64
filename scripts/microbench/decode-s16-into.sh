#!/usr/bin/env bash
# Decode, session 16 calls 7–9, 13 and 15: the KV-cache call into caller buffers and under
# CUDA-graph capture (gpu_decode_into), the decode test binaries, memcheck
# and racecheck over gpu_decode_into, then back-to-back decode steps eager
# against graph replays (decode-tune --graph). Binaries staged in
# .stage-t/bins.tar.xz (gpu_decode_into and, calls 7–8, decode-tune; calls 7
# and 9 also gpu_decode, gpu_api, ndarray_kvcache: TESTS="..." names the
# binaries).
set -u
source scripts/microbench/lib.sh
unpack_bins
gpu_name
run_tests ${TESTS:-gpu_decode_into gpu_decode gpu_api ndarray_kvcache}
grep -A3 panicked /tmp/t.txt | head -8
for tool in memcheck racecheck; do
  timeout 200 compute-sanitizer --tool $tool /tmp/h/gpu_decode_into --test-threads 1 > /tmp/s.txt 2>&1
  echo "=== $tool gpu_decode_into (rc $?): $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' /tmp/s.txt | tail -1)" | tee -a $OUT/tests.txt
  grep -E "test result|FAILED|panicked" /tmp/s.txt | head -5 | tee -a $OUT/tests.txt
done
if [ -x /tmp/h/decode-tune ]; then
  /tmp/h/decode-tune --no-event-tracking --graph --cells ${CELLS:-1:4096:8,1:4096:32,1:32768:8,1:32768:32,8:32768:8} --layouts 0,16 > $OUT/graph.md 2> /tmp/dt.log || tail -5 /tmp/dt.log
  cat $OUT/graph.md
fi
