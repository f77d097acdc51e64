#!/usr/bin/env bash
# Decode, session 15 call 1 (decode step 42's question, before any kernel
# work): does reading each split's pages in address order stream like pages
# in order? The committed `_pg_c` kernel over block tables placed so that
# each split's run of logical pages is sorted by address (`sorted:N`, N = the
# pages of one split's share: 128 at GQA 32k over 16-token pages with 16
# splits, 512 at GQA 131k and MHA 32k) beside the random permutation, pages
# in order, and runs of other lengths; two rounds. .stage-t/bins.tar.xz:
# decode-tune.
set -u
. scripts/microbench/lib.sh
unpack_bins
gpu_name
for r in 1 2; do
  /tmp/h/decode-tune --no-event-tracking --cells 1:32768:8 --layouts 16 --page-order random,inorder,sorted:128,sorted:64,sorted:8,sorted:256 --kernels s3_pg_c > $OUT/g32-$r.md 2>&1
  echo "## GQA 32k round $r"; grep -E "^\| [0-9]+ " $OUT/g32-$r.md
  /tmp/h/decode-tune --no-event-tracking --cells 1:131072:8,1:32768:32 --layouts 16 --page-order random,inorder,sorted:512,sorted:128 --kernels s3_pg_c > $OUT/g131-$r.md 2>&1
  echo "## GQA 131k, MHA 32k round $r"; grep -E "^\| [0-9]+ " $OUT/g131-$r.md
done
/tmp/h/decode-tune --no-event-tracking --cells 1:32768:8 --layouts 16 --page-order random,sorted:128 --kernels s3_pg --timeline > $OUT/tl.md 2>&1
echo "## timeline"; grep -E "^\| 1 " $OUT/tl.md | cut -c1-400
