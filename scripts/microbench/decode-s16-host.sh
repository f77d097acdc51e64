#!/usr/bin/env bash
# Decode, session 16 call 10: what a decode call costs the host —
# decode-tune --graph with its validation-and-plan column (calls that fail
# just before their launch). Binaries staged in .stage-t/bins.tar.xz
# (decode-tune).
set -u
source scripts/microbench/lib.sh
unpack_bins
gpu_name
/tmp/h/decode-tune --no-event-tracking --graph --cells 1:4096:8,1:32768:8,8:32768:8 --layouts 0,16 > $OUT/graph.md 2> /tmp/dt.log || tail -5 /tmp/dt.log
cat $OUT/graph.md
