#!/usr/bin/env bash
# Decode, session 10: why 16-token pages stream ~4% slower than 256-token
# pages in the same kernel (`w8_bc128_s3_pg_c`, GQA 32/8 batch 1, 32k keys):
# ncu warp-state samples per SASS line for both page sizes (the SASS lines'
# samples, stall reasons and instruction counts come back as CSV).
# (Call 3 ran it with `--quick`, which skips 16-token pages; its page-16 half
# was rerun without, as now here.)
# .stage-t/bins.tar.xz: decode-tune.
set -u
. scripts/microbench/lib.sh
unpack_bins
/tmp/h/decode-tune --no-event-tracking --cells 1:32768:8 --layouts 0,16,256 --kernels w8_bc128_s3_c,w8_bc128_s3_pg_c > $OUT/tune.md 2>&1
grep -E "^\| [0-9]" $OUT/tune.md | sed 's/flash_fwd_tc_dec_bf16_d128_//g' | head -3
for ps in 16 256; do
  timeout 200 ncu --clock-control none --cache-control all -k regex:w8_bc128_s3_pg_c --launch-skip 3 --launch-count 1 \
    --section WarpStateStats --section SourceCounters --section SpeedOfLight --section MemoryWorkloadAnalysis --import-source no \
    -o /tmp/r$ps /tmp/h/decode-tune --no-event-tracking --cells 1:32768:8 --layouts $ps --kernels w8_bc128_s3_pg_c > /tmp/ncu$ps.log 2>&1
  echo "ncu $ps rc $?"; tail -1 /tmp/ncu$ps.log
  ncu -i /tmp/r$ps.ncu-rep --page details > $OUT/details$ps.txt 2>&1
  ncu -i /tmp/r$ps.ncu-rep --page source --csv --print-source sass > /tmp/src$ps.csv 2>&1
  xz -T0 -6 -c /tmp/src$ps.csv > $OUT/src$ps.csv.xz
  grep -E "Duration|DRAM Throughput|Memory Throughput|L2 Hit|Warp Cycles Per Issued|Registers" $OUT/details$ps.txt | head -8
done
