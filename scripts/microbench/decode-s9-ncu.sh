#!/usr/bin/env bash
# Decode, session 9, call 1: where the default kernel's time goes at GQA 32/8
# (batch 1, 32k and 4k, contiguous): baseline timings with the per-block
# timeline, then ncu warp-state sampling per SASS line (stall reasons by
# region: prologue, loop, warp merge, count, fused combine).
# .stage-t/bins.tar.xz: decode-tune (and fa-bench-decode).
set -u
mkdir -p /tmp/h && tar xJf .stage-t/bins.tar.xz -C /tmp/h || exit 1
/tmp/h/decode-tune --no-event-tracking --cells 1:32768:8,1:4096:8 --layouts 0,16,256 --kernels w8_bc128_s3_c,w8_bc128_s3_pg_c --timeline > $OUT/tune.md 2>&1
grep -E "^\| [0-9]" $OUT/tune.md | sed 's/flash_fwd_tc_dec_bf16_d128_//g' | cut -c1-220
for c in 32768 4096; do
  timeout 240 ncu --clock-control none --cache-control all -k regex:w8_bc128_s3_c --launch-skip 3 --launch-count 1 \
    --section WarpStateStats --section SourceCounters --section SpeedOfLight --section LaunchStats --import-source no \
    --metrics smsp__pcsamp_warps_issue_stalled_no_instructions,smsp__pcsamp_warps_issue_stalled_long_scoreboard,smsp__pcsamp_warps_issue_stalled_barrier,smsp__pcsamp_warps_issue_stalled_membar,smsp__pcsamp_warps_issue_stalled_wait,smsp__pcsamp_sample_count \
    -o /tmp/r$c /tmp/h/decode-tune --quick --no-event-tracking --cells 1:$c:8 --layouts 0 --kernels w8_bc128_s3_c > /tmp/ncu$c.log 2>&1
  echo "ncu $c rc $?"; tail -2 /tmp/ncu$c.log
  ncu -i /tmp/r$c.ncu-rep --page details > $OUT/details$c.txt 2>&1
  ncu -i /tmp/r$c.ncu-rep --page raw --csv 2>/dev/null | tr ',' '\n' > /tmp/raw$c.txt; grep -c . /tmp/raw$c.txt
  ncu -i /tmp/r$c.ncu-rep --page source --csv --print-source sass > /tmp/src$c.csv 2>&1; echo "src rc $? lines $(wc -l < /tmp/src$c.csv)"
  head -2 /tmp/src$c.csv | cut -c1-1500
  xz -T0 -6 -c /tmp/src$c.csv > $OUT/src$c.csv.xz
done
grep -E "Stall|Duration|Warp Cycles|No Instruction|Registers" $OUT/details32768.txt | head -30
