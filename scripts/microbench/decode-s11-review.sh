#!/usr/bin/env bash
# Decode, session 11 call 14: the review commit (host-only refactor of
# plan_attend) — decode GPU tests and memcheck, then the batch-1 GQA/MHA
# 32k and 131k cells with PyTorch in the same run.
# .stage-t/bins.tar.xz: fa-bench-decode, gpu_decode, gpu_api, ndarray_kvcache.
set -u
. scripts/microbench/lib.sh
unpack_bins
decode_checks
/tmp/h/fa-bench-decode /tmp/g --batches 1 --caches 32768,131072 --no-event-tracking > $OUT/grid.log 2>&1; echo "grid rc $?"
grep -E "\| 1 \| (32768|131072) " /tmp/g/decode.md | cut -c1-200 | tee $OUT/grid-b1.md
tail -2 /tmp/g/decode.md
