#!/usr/bin/env bash
# Decode, session 10: (1) the launch shapes of PyTorch's cuDNN and flash SDPA
# kernels for GQA 32/8 batch 1 at 32k (ncu over peers_ncu.py: every kernel
# but the flush's reduction); (2) our default kernel's per-block timeline on
# this lease (full entry `w8_bc128_s3`, every block's record as CSV).
# .stage-t/bins.tar.xz: decode-tune.
set -u
. scripts/microbench/lib.sh
unpack_bins
gpu_name
timeout 240 ncu --clock-control none --cache-control all -k 'regex:^(?!.*(reduce|Reduce|fill|distribution|elementwise)).*' \
  --section LaunchStats --section SpeedOfLight --section Occupancy python3 scripts/microbench/peers_ncu.py > $OUT/peers_ncu.txt 2>&1
echo "ncu rc $?"
grep -E "^  [a-zA-Z_].*\(|Duration|Grid Size|Block Size|Registers Per|Dynamic Shared|Static Shared|Waves Per SM|DRAM Throughput" $OUT/peers_ncu.txt | head -80
/tmp/h/decode-tune --no-event-tracking --timeline --timeline-csv $OUT/timeline-blocks.csv --cells 1:32768:8 --layouts 0 --kernels w8_bc128_s3 > $OUT/timeline.txt 2>&1
grep -vE "^\|" $OUT/timeline.txt | head -30
