#!/usr/bin/env bash
# Decode, session 13 call 2 (perf notes, decode step 39): the paged
# prologue's lookups together (N1: one block-table round trip for the first
# S − 1 blocks; with step 39's one lookup per thread), and N2 = N1 + the
# next refill's lookup one iteration ahead, before the copies. Decode tests
# and memcheck on N2 (which holds N1's code); decode-tune B / N1 / N2
# alternating, two rounds, the `_pg_c` default (library schedule), pages at
# random; the full `_pg` entry's timeline of N1 and N2.
# .stage-t/bins.tar.xz: decode-tune-{B,N1,N2}, gpu_decode, gpu_api, ndarray_kvcache (N2).
set -u
. scripts/microbench/lib.sh
unpack_bins
decode_checks
for r in 1 2; do
  for b in B N1 N2; do
    /tmp/h/decode-tune-$b --no-event-tracking --cells 1:4096:8,1:32768:8,1:32768:32,1:131072:8,8:32768:8 --layouts 0,16,256 --kernels s3_pg_c > $OUT/tune-$b-$r.md 2>&1
    echo "## $b round $r"; grep -E "^\| [18] " $OUT/tune-$b-$r.md | sort -u
  done
done
for b in N1 N2; do
  /tmp/h/decode-tune-$b --no-event-tracking --cells 1:32768:8 --layouts 0,16,256 --kernels w8_bc128_s3_pg --timeline > $OUT/tl-$b.md 2>&1
  echo "## timeline $b"; grep -E "^\| 1 .*_pg \|" $OUT/tl-$b.md | tail -3
done
