#!/usr/bin/env bash
# candle on the GPU machine, from the repository root, with .stage-cg carried:
# train_gpt (bf16, 200 steps, our attention and candle's from one
# initialization: loss curves and tokens/s) and the candle FP8 tests
# (FA_REQUIRE_GPU=1). The machine's CUDA 13.0 libraries (cuBLAS, cuRAND,
# cudart) serve candle's dynamic linking.
#
# Here (candle's CUDA build: scripts/cuda-toolkit.sh; the first build takes
# ~40 min on 2 cores, docs/guide.md):
#   eval "$(bash scripts/cuda-toolkit.sh --env)"; cd candle-crate
#   CARGO_TARGET_DIR=$PWD/target/cuda cargo build --locked --release --no-default-features --features cuda --example train_gpt
#   CARGO_TARGET_DIR=$PWD/target/cuda cargo test --locked --release --no-default-features --features cuda --test fp8 --no-run
#   then strip train_gpt and the fp8 test binary (as candle_fp8) and pack each as
#   .stage-cg/NAME.tar.xz (tar cJf; ~15 MB each).
# There: OUT=/tmp/out bash scripts/microbench/candle-gpu.sh
set -u
mkdir -p /tmp/cg && for t in .stage-cg/*.tar.xz; do tar xJf $t -C /tmp/cg; done
libs=""
for n in libcublas.so.13 libcurand.so.10 libcudart.so.13 libcublasLt.so.13; do
  f=$(find / -xdev -name "$n*" -not -path "*/proc/*" 2>/dev/null | head -1); echo "$n: $f"; [ -n "$f" ] && libs="$libs:$(dirname $f)"
done
export LD_LIBRARY_PATH="${libs#:}:${LD_LIBRARY_PATH:-}"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
timeout 300 /tmp/cg/train_gpt --device cuda > $OUT/train_gpt.txt 2>&1; echo "train_gpt rc=$?"; cat $OUT/train_gpt.txt | tail -30
FA_REQUIRE_GPU=1 timeout 200 /tmp/cg/candle_fp8 --test-threads 1 > $OUT/candle_fp8.txt 2>&1; echo "candle_fp8 rc=$?"; grep -E "^test |test result|panicked" $OUT/candle_fp8.txt | head -20
