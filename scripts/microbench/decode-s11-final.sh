#!/usr/bin/env bash
# Decode, session 11 calls 6 and 11: the committed build (22881a4, then 583cd19) — every GPU test
# binary (decode, API, ndarray, attention, features, half, hopper), memcheck
# and racecheck over the decode cases, then the grid (fa-bench-decode,
# PyTorch in the same run). Outputs packed in $OUT/final.tar.xz (the run tool
# returns at most 8 files).
# .stage-t/bins.tar.xz: fa-bench-decode, decode-tune, the 7 GPU test binaries.
set -u
. scripts/microbench/lib.sh
unpack_bins
packed final f final_run 0
