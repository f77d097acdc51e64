#!/usr/bin/env bash
# Decode, session 15 call 6 (decode step 42): the decode tests on the fixed
# build (gpu_decode, gpu_api, ndarray_kvcache, memcheck, racecheck), then
# where the address-ordered build spends its time: the per-block timeline
# of the full `_pg` entry with the `default` (address order) and `logical`
# schedules over 16-token pages in order and at random.
# .stage-t/bins.tar.xz: gpu_decode, gpu_api, ndarray_kvcache, decode-tune.
set -u
. scripts/microbench/lib.sh
unpack_bins
decode_checks
sanitize_decode racecheck gpu_decode_small_for_sanitizers
/tmp/h/decode-tune --no-event-tracking --layouts 16 --kernels s3_pg --schedules default,logical --page-order inorder,random --cells 1:131072:32,1:131072:8,1:32768:8 --timeline > $OUT/tl.md 2>&1
echo "## timeline"; grep -E "^\| [0-9]+ " $OUT/tl.md | cut -c1-330
