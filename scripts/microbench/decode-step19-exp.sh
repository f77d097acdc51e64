#!/usr/bin/env bash
# Decode step 19 (docs/perf-notes.md), an experiment build (not committed):
# its host reads FA_TICKET_TAIL (k > 1: only the last k key blocks per split
# go by ticket, the rest are fixed; 1: all but the first S + 1) and
# FA_TICKET_MIN (blocks per split from which tickets apply). The 3-stage
# 8-warp kernel, compact entry, both schedules, two rounds.
set -u
mkdir -p /tmp/h && tar xJf .stage-t/bins.tar.xz -C /tmp/h || exit 1
CELLS=1:4096:8,1:32768:8,1:32768:32,1:131072:8,1:131072:32,8:32768:8
for r in 1 2; do
  for tail in 1 2 4 8; do
    echo "## round $r tail $tail" >> $OUT/tail.md
    FA_TICKET_MIN=1 FA_TICKET_TAIL=$tail /tmp/h/decode-tune --no-event-tracking --cells $CELLS --layouts 0 --kernels w8_bc128_s3_c --schedules default,static >> $OUT/tail.md 2>/dev/null
  done
done
for tail in 1 4; do
  FA_TICKET_MIN=1 FA_TICKET_TAIL=$tail /tmp/h/decode-tune --no-event-tracking --cells 1:32768:8,1:131072:8 --layouts 0 --kernels w8_bc128_s3 --schedules default,static --timeline > /tmp/tl.md 2>/dev/null
  echo "## tail $tail" >> $OUT/timeline.md; sed -n "/## Timeline/,\$p" /tmp/tl.md >> $OUT/timeline.md
done
grep -E "^## |contiguous" $OUT/tail.md | sed 's/flash_fwd_tc_dec_bf16_d128_//g' | cut -c1-200
cut -c1-300 $OUT/timeline.md | grep -E "^## |contiguous"
