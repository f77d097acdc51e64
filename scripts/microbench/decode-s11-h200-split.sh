#!/usr/bin/env bash
# Decode, session 11 call 9 (perf notes, decode step 33), on an H200: the
# no-split share by device — B (75fe17f: 45% everywhere but small pages and
# ticket-balanced long caches) / N (80% where the peak DRAM bandwidth per SM
# is over 30 GB/s) alternating, two rounds, the batch-8 GQA cells without
# peers. .stage-t/bins.tar.xz: fa-bench-decode-{B,N}.
set -u
. scripts/microbench/lib.sh
unpack_bins
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
for b in B N B N; do
  /tmp/h/fa-bench-decode-$b /tmp/ab-$b --no-torch --batches 8 --kv-heads 8 --no-event-tracking > /tmp/ab.log 2>&1
  echo "## $b" >> $OUT/ab.txt; grep -E "^\[ours" /tmp/ab.log >> $OUT/ab.txt
done
cat $OUT/ab.txt
