#!/usr/bin/env bash
# Session 18 call 2: head dims zero-padded onto the Hopper kernels (40 -> 64;
# 80, 96 -> 128; 160, 192, 224 -> 256). gpu_hopper (padded dims in every
# test), then fa-bench-infer's head-dim rows: the mma.sync kernels
# (FA_BENCH_FAMILY=mma-sync, the previous dispatch) and the padded Hopper
# kernels, PyTorch 2.11 flash in the same run; then the compiled dims'
# Hopper kernels before (B) and after (N) the epilogue's column guard,
# alternating; then the other GPU tests and memcheck over the small cases.
# .stage-t/bins.tar.xz: gpu_hopper, gpu_half, gpu_attention, gpu_features,
# gpu_api, fa-bench-{B,N}, fa-bench-infer-{B,N}.
set -u
. scripts/microbench/lib.sh
unpack_bins
gpu_name
run_tests gpu_hopper
grep -E "^(ok|FAIL) .*d(40|80|96|160|192|224)" /tmp/t.txt | head -4
FA_BENCH_FAMILY=mma-sync timeout 150 /tmp/h/fa-bench-infer-N --groups headdim --no-torch --out /tmp/hd-mma > /tmp/hd1.log 2>&1; echo "mma-sync rc $?"
cp /tmp/hd-mma/bench-infer.md $OUT/headdim-mma-sync.md
timeout 200 /tmp/h/fa-bench-infer-N --groups headdim --out /tmp/hd-hop > /tmp/hd2.log 2>&1; echo "hopper rc $?"
cp /tmp/hd-hop/bench-infer.md $OUT/headdim-hopper.md; tail -5 /tmp/hd2.log
grep -E "^\| .*d=" $OUT/headdim-mma-sync.md | head -30
grep -E "^\| .*d=" $OUT/headdim-hopper.md | head -30
for b in B N B N; do
  timeout 100 /tmp/h/fa-bench-$b --impls hopper --dims 64,128,256 --seqlens 4096,16384 --dtypes bf16 --no-torch --out /tmp/pf-$b > /tmp/pf.log 2>&1
  echo "## $b (rc $?)" >> $OUT/prefill-ab.txt; grep -E "^\| " /tmp/pf-$b/*.md | grep -v -- "---" >> $OUT/prefill-ab.txt
done
cat $OUT/prefill-ab.txt | cut -c1-160
run_tests gpu_half gpu_attention gpu_features gpu_api
sanitize gpu_hopper memcheck gpu_hopper_small gpu_hopper_varlen_small
