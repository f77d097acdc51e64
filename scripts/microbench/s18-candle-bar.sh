#!/usr/bin/env bash
# Session 18 call 1: the candle adapter on the H100 — its GPU tests
# (`FlashAttnKvCache::order_block_table` on candle tensors included) and
# llama-check --bench (candle-transformers' Llama, candle's attention vs
# ours) — then main's batch-1 bar cells (32k and 131k, MHA and GQA) with
# PyTorch 2.11 in the same run, pages placed by a random permutation, in
# order (FlashInfer's decode benchmark's convention) and random then
# ordered by `order_block_table`.
# .stage-t/bins.tar.xz: fa-bench-decode; .stage-t/candle.tar.xz: the
# `cargo xtask candle --stage` folder.
set -u
. scripts/microbench/lib.sh
unpack_bins
gpu_name
mkdir -p /tmp/c && tar xJf .stage-t/candle.tar.xz -C /tmp/c || exit 1
(cd /tmp/c && timeout 420 bash run.sh) > $OUT/candle.log 2>&1
echo "candle rc $?"
grep -E "^== |test result|FAILED|panicked|llama-check: " $OUT/candle.log
bar_cells 32768,131072 random inorder ordered
