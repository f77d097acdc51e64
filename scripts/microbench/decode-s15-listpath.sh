#!/usr/bin/env bash
# Decode, session 15 call 10 (decode step 42, a diagnostic): why is the v3
# address-order build slower over pages in order, where its sorted list is the
# logical order? N = v3 (decode-address-order-v3.patch); N2 = v3 with the
# sort replaced by a copy of the entries in logical order (the same list
# path, no sort). Each binary with the `default` (list path) and `logical`
# (block-table lookups) schedules as columns, pages in order and at random,
# N and N2 alternating, two rounds. .stage-t/bins.tar.xz: decode-tune-{N,N2}.
set -u
. scripts/microbench/lib.sh
unpack_bins
gpu_name
for r in 1 2; do
  for b in N N2; do
    /tmp/h/decode-tune-$b --no-event-tracking --layouts 16 --kernels s3_pg_c --schedules default,logical --page-order inorder,random --cells 1:131072:32,1:131072:8,1:32768:8 > $OUT/$b-$r.md 2>&1
    echo "## $b round $r (list | logical)"; grep -E "^\| [0-9]+ " $OUT/$b-$r.md | sort -u
  done
done
