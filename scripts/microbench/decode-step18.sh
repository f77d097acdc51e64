#!/usr/bin/env bash
# (Calls 2 and 3 of decode step 18, on the builds before the final one.)
# Decode step 18 (docs/perf-notes.md): a tile's key blocks handed to its
# splits one ticket at a time. GPU tests and sanitizers on the new build,
# then decode-tune: the previous build (decode-tune-old) and the new one
# with both schedules (default = tickets, static = deterministic shares)
# alternating, two rounds, with the timeline of GQA 32k.
# .stage-t/bins.tar.xz: decode-tune, decode-tune-old, gpu_decode.
set -u
mkdir -p /tmp/h && tar xJf .stage-t/bins.tar.xz -C /tmp/h || exit 1
export FA_REQUIRE_GPU=1
/tmp/h/gpu_decode --test-threads 1 > $OUT/test-gpu_decode.txt 2>&1; echo "=== gpu_decode: $(grep -E 'test result' $OUT/test-gpu_decode.txt)"; grep -E "FAILED|panicked" $OUT/test-gpu_decode.txt | head -5
for tool in memcheck racecheck; do
  compute-sanitizer --tool $tool /tmp/h/gpu_decode --test-threads 1 gpu_decode_small_for_sanitizers gpu_split_tickets > $OUT/$tool.txt 2>&1
  echo "=== $tool: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' $OUT/$tool.txt | tail -1)"
done
CELLS=1:4096:8,1:32768:8,1:32768:32,1:131072:8,1:131072:32,8:32768:8,8:4096:32
for r in 1 2; do
  /tmp/h/decode-tune-old --no-event-tracking --cells $CELLS --layouts 0,16,256 --kernels w8_bc128_s2,w4_bc64_s3,w8_bc128_s3 > $OUT/old-$r.md 2>/dev/null
  /tmp/h/decode-tune --no-event-tracking --cells $CELLS --layouts 0,16,256 --kernels w8_bc128_s2,w4_bc64_s3,w8_bc128_s3 --schedules default,static > $OUT/new-$r.md 2>/dev/null
  echo "round $r done"
done
/tmp/h/decode-tune --no-event-tracking --cells 1:32768:8,1:131072:8,1:32768:32 --layouts 0,256 --kernels w8_bc128_s2 --schedules default,static --timeline > $OUT/timeline.md 2>/dev/null
sed -n "/## Timeline/,\$p" $OUT/timeline.md | cut -c1-400
