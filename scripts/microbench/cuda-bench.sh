#!/usr/bin/env bash
# Builds one CUDA microbenchmark of this folder with the machine's nvcc
# (sm_90a: they need an H100-class GPU) and runs it, its table to
# $OUT/NAME.md (or stdout without $OUT); further arguments go to the program.
#   bash scripts/microbench/cuda-bench.sh decode_stream
set -u
name=${1:?usage: cuda-bench.sh NAME (decode_stream, decode_balance, decode_floor_variants, decode_floor_prologue, decode_cluster_combine, icache_cold)}
shift
dir=$(dirname "$0")
nvcc -O3 -arch=sm_90a -o /tmp/$name "$dir/$name.cu" || { echo "nvcc failed"; exit 1; }
if [ -n "${OUT:-}" ]; then /tmp/$name "$@" | tee "$OUT/$name.md"; else /tmp/$name "$@"; fi
