#!/usr/bin/env bash
# Decode step 16: A (c0c54cc, 16 splits per combine step) against C
# (9a54982, 8 up to 8 splits) on the 8-warp kernel's long-cache cells,
# three alternating rounds in one run. .stage-e.tar.xz as decode-step16-steps.sh.
set -u
mkdir -p /tmp/e && tar xJf .stage-e.tar.xz -C /tmp/e || exit 1
for r in 1 2 3; do for v in A C; do
  /tmp/e/dt-$v --no-event-tracking --cells 1:131072:32,1:32768:32,1:131072:8,1:32768:8 --layouts 0,256 --kernels w8_bc128_s2 > $OUT/ac-$r-$v.md 2>&1
done; done
for f in $OUT/ac-*; do echo "== $(basename $f)"; grep '^| 1 ' $f | sort -u | awk -F'|' '{print $3,$4,$5,$6}'; done
