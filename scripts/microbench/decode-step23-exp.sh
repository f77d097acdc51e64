#!/usr/bin/env bash
# Decode step 23 (docs/perf-notes.md), experiment: the previous build (old),
# A = the kv-head division in 32 bits (no call into a far subroutine at
# kernel start), B = A + the epilogue run "dry" after the prologue (its code
# warmed in the SM's instruction caches). gpu_decode of B against the f64
# reference first, then decode-tune alternating, two rounds, with the
# per-block timeline.
set -u
. scripts/microbench/lib.sh
unpack_bins
run_tests gpu_decode-B
CELLS=1:32768:8,1:4096:8,1:131072:8,1:32768:32
for r in 1 2; do
  for b in old A B; do
    echo "## round $r $b" >> $OUT/tune.md
    /tmp/h/decode-tune-$b --no-event-tracking --cells $CELLS --layouts 0,16 --kernels w8_bc128_s3_c,w8_bc128_s3_pg_c >> $OUT/tune.md 2>/dev/null
  done
done
grep -E "^## |^\| [0-9]" $OUT/tune.md | sed 's/flash_fwd_tc_dec_bf16_d128_//g' | cut -c1-110
for b in old B; do
  /tmp/h/decode-tune-$b --no-event-tracking --cells 1:32768:8 --layouts 0 --kernels w8_bc128_s3_c --timeline > $OUT/timeline-$b.md 2>&1
done
grep -E "^\| 1 " $OUT/timeline-*.md | tail -4 | cut -c1-400
