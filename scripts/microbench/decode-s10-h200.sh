#!/usr/bin/env bash
# Decode, session 10: the ticket rule by device on an H200 — the build before
# the rule (B: tickets on long contiguous caches) and the committed one (N:
# no tickets where DRAM bandwidth per SM exceeds 30 GB/s), the default
# kernel's library schedule and the static one, alternating, two rounds.
# .stage-t/bins.tar.xz: decode-tune-{B,N}.
set -u
. scripts/microbench/lib.sh
unpack_bins
gpu_name
for r in 1 2; do
  for b in B N; do
    echo "## round $r $b" >> $OUT/tune.txt
    /tmp/h/decode-tune-$b --no-event-tracking --cells 1:32768:8,1:32768:32,1:131072:8,1:131072:32,8:32768:8 --layouts 0 --kernels w8_bc128_s3_c --schedules default,static >> $OUT/tune.txt 2>&1
  done
done
grep -E "^(## |\| [0-9])" $OUT/tune.txt | sed 's/flash_fwd_tc_dec_bf16_d128_//g'
