#!/usr/bin/env bash
# Decode, session 12 calls 5 and 9: the committed build — every GPU test binary
# (decode, API, ndarray, attention, features, half, hopper), memcheck and
# racecheck over the decode cases, then the grid (fa-bench-decode, PyTorch in
# the same run) and the batch-1 32k cells twice more (PyTorch beside, for
# the bar cells' spread). Outputs packed in $OUT/final.tar.xz (the run tool
# returns at most 8 files).
# .stage-t/bins.tar.xz: fa-bench-decode, decode-tune, the 7 GPU test binaries.
set -u
. scripts/microbench/lib.sh
unpack_bins
packed final f final_run 2
