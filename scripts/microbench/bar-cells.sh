#!/usr/bin/env bash
# The batch-1 long-cache decode cells (fa-bench-decode, MHA and GQA, cache
# lengths CACHES, default 32768,131072; PyTorch in the same run) once per
# page placement in ORDERS (default "random inorder ordered"): each table
# to $OUT/b1-ORDER.md, its batch-1 rows printed. The quick check of the
# decode table's headline cells after a change.
# Needs .stage-t/bins.tar.xz with fa-bench-decode (see README.md).
set -u
. scripts/microbench/lib.sh
unpack_bins
gpu_name
bar_cells ${CACHES:-32768,131072} ${ORDERS:-random inorder ordered}
