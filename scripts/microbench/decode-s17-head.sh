#!/usr/bin/env bash
# Decode, session 17 call 9: main's head after the review — gpu_decode_into
# with memcheck and racecheck on the order tests, then the batch-1 bar cells
# (32k and 131k, MHA and GQA) with PyTorch 2.11 in the same run, pages random
# and ordered by `order_block_table`.
# .stage-t/bins.tar.xz: gpu_decode_into, fa-bench-decode.
set -u
. scripts/microbench/lib.sh
unpack_bins
gpu_name
run_tests gpu_decode_into
sanitize_order
bar_cells 32768,131072 random ordered
