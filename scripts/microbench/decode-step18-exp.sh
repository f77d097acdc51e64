set -u
# Decode step 18, call 4 (docs/perf-notes.md): an experiment build (not committed) whose
# host read FA_TICKET_MODE (1: tickets two iterations ahead, 2: the same interleaved
# fixed blocks without tickets), to tell the atomic from the access order.
mkdir -p /tmp/h && tar xJf .stage-t/bins.tar.xz -C /tmp/h || exit 1
CELLS=1:4096:8,1:32768:8,1:32768:32,1:131072:8,1:131072:32
K=w8_bc128_s2,w8_bc128_s3
for r in 1 2; do
  /tmp/h/decode-tune-old --no-event-tracking --cells $CELLS --layouts 0 --kernels $K > $OUT/old-$r.md 2>/dev/null
  FA_TICKET_MODE=1 /tmp/h/decode-tune --no-event-tracking --cells $CELLS --layouts 0 --kernels $K --schedules default,static > $OUT/t2-$r.md 2>/dev/null
  FA_TICKET_MODE=2 /tmp/h/decode-tune --no-event-tracking --cells $CELLS --layouts 0 --kernels $K > $OUT/strided-$r.md 2>/dev/null
done
FA_TICKET_MODE=1 /tmp/h/decode-tune --no-event-tracking --cells 1:32768:8,1:131072:8 --layouts 0 --kernels w8_bc128_s2 --schedules default,static --timeline > $OUT/timeline.md 2>/dev/null
FA_TICKET_MODE=2 /tmp/h/decode-tune --no-event-tracking --cells 1:32768:8,1:131072:8 --layouts 0 --kernels w8_bc128_s2 --timeline > $OUT/timeline-strided.md 2>/dev/null
sed -n "/## Timeline/,\$p" $OUT/timeline.md $OUT/timeline-strided.md | cut -c1-300
