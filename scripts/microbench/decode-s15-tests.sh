#!/usr/bin/env bash
# Decode, session 15 call 8: gpu_decode on the committed kernels with the new
# gpu_decode_page_tables test (page sizes 8/16/32/48/64 over the `_pg`
# kernel; block tables with repeated, out-of-range and one-page entries
# against the f64 reference). .stage-t/bins.tar.xz: gpu_decode.
set -u
. scripts/microbench/lib.sh
unpack_bins
gpu_name
run_tests gpu_decode
/tmp/h/gpu_decode --test-threads 1 gpu_decode_page_tables --nocapture 2>&1 | grep -E "cases passed|test result" | tee -a $OUT/tests.txt
