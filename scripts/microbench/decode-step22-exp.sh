#!/usr/bin/env bash
# Decode step 22 (docs/perf-notes.md), an experiment build: full blocks over
# pages smaller than the block look their pages up first, then issue the
# copies. decode-tune, the previous build (8be2db3: the same page-16 and
# compact 3-stage kernels as 715b2a1) and the experiment alternating.
set -u
mkdir -p /tmp/h && tar xJf .stage-t/bins.tar.xz -C /tmp/h || exit 1
CELLS=1:32768:8,1:32768:32,1:131072:8,8:32768:8
for r in 1 2; do
  for b in old new; do
    exe=/tmp/h/decode-tune; [ $b = old ] && exe=/tmp/h/decode-tune-old
    echo "## round $r $b" >> $OUT/tune.md
    $exe --no-event-tracking --cells $CELLS --layouts 0,16,256 --kernels w8_bc128_s3_c,w4_bc64_s3 >> $OUT/tune.md 2>/dev/null
  done
done
grep -E "^## |^\| [0-9]" $OUT/tune.md | sed 's/flash_fwd_tc_dec_bf16_d128_//g' | cut -c1-150
