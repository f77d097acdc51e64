#!/usr/bin/env bash
# Decode, session 14 calls 3-4 (call 3: both hints, an illegal-instruction
# error; call 4: 256B alone): two L2 hints on the `_pg` build's K/V copies
# (decode step 41): `.L2::256B` instead of `.L2::128B` (`_pg_l256`), and an
# evict-first cache policy with `.L2::128B` (`_pg_ef`: the stream's lines
# leave the L2 first, so the block table, partials and code stay). Every
# flash-decoding kernel against the f64 reference (gpu_every_decode_kernel),
# then decode-tune with `_pg_c` and `_pg_l256_c` as columns of one
# run, two rounds. .stage-t/bins.tar.xz: gpu_decode, decode-tune.
set -u
. scripts/microbench/lib.sh
unpack_bins
gpu_name
/tmp/h/gpu_decode --test-threads 1 gpu_every_decode_kernel > /tmp/t.txt 2>&1; echo "=== gpu_every_decode_kernel: $(grep 'test result' /tmp/t.txt)" | tee $OUT/tests.txt
cells=1:32768:8,1:131072:8,1:32768:32,1:4096:8,8:32768:8
for r in 1 2; do
  /tmp/h/decode-tune --no-event-tracking --cells $cells --layouts 16,0,256 --kernels s3_pg_c,s3_pg_l256_c > $OUT/tune-$r.md 2>&1
  echo "## round $r"; grep -E "^\| [0-9]+ " $OUT/tune-$r.md | sort -u
done
