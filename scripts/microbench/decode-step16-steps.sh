#!/usr/bin/env bash
# Decode step 16: the fused combine's loads per step — the previous commit
# (old), 16 splits per step (A, committed), 8 (B), 8 when num_splits <= 8
# else 16 (C); two rounds, alternating, timeline on.
# .stage-e.tar.xz: dt-old, dt-A, dt-B, dt-C (decode-tune builds).
set -u
mkdir -p /tmp/e && tar xJf .stage-e.tar.xz -C /tmp/e || exit 1
for r in 1 2; do for v in old A B C; do
  /tmp/e/dt-$v --no-event-tracking --timeline --cells 1:4096:8,1:32768:8,1:32768:32 --layouts 0,16 --kernels w8_bc128_s2,w4_bc64_s3 > $OUT/steps-$r-$v.md 2>&1
done; done
for f in $OUT/steps-*; do echo "== $(basename $f)"; grep '^| 1 ' $f | grep -v 'TB/s |' | sort -u | awk -F'|' '{print $3,$4,$5,$6,"event",$8,"loopmax",$15,"merge",$16,"comb",$18,"after",$21}'; done
