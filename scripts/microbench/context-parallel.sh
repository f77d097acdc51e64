#!/usr/bin/env bash
# Context parallelism on a multi-GPU machine, from the repository root, with
# .stage-cp carried (here: cargo xtask bench-cp --stage .stage-cp, then in it
# strip context_parallel && tar cJf cp.tar.xz context_parallel && rm context_parallel):
#   check  the ring against one GPU and the f64 reference: dense and packed
#          varlen (--docs), forward and backward, causal/zigzag, contiguous,
#          non-causal, MHA and GQA, one process and one process per GPU;
#          compute-sanitizer memcheck on one rank of a small varlen ring
#   fwd    the forward scaling table (128k, 256k tokens on 1.. GPUs), ring and Ulysses
#   bwd    the forward + backward scaling table of the ring (bwd-ulysses: Ulysses')
# Usage: OUT=/tmp/out bash scripts/microbench/context-parallel.sh [check|fwd|bwd]...
set -u
export NCCL_NVLS_ENABLE=0
if ! ldconfig -p 2>/dev/null | grep -q 'libnccl.so.2'; then
  dir=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))' 2>/dev/null || true)
  [ -n "$dir" ] && export LD_LIBRARY_PATH="$dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
mkdir -p /tmp/cp && tar xJf .stage-cp/cp.tar.xz -C /tmp/cp || exit 1
CP=/tmp/cp/context_parallel
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee $OUT/gpus.txt
nvidia-smi topo -m >> $OUT/gpus.txt 2>&1
fail=0
run() {  # run LOG TIMEOUT ARGS...
  local log=$1 t=$2; shift 2
  echo "--- $*" >> $OUT/$log
  timeout $t $CP "$@" >> $OUT/$log 2>&1
  local rc=$?
  echo "rc=$rc" >> $OUT/$log
  echo "rc=$rc: $*"
  [ $rc = 0 ] || fail=1
}
for mode in "${@:-check}"; do
  case $mode in
  check)
    S=16384
    run check.log 120 --seqlen $S --docs 5 --check-ref
    run check.log 120 --seqlen $S --docs 5 --backward --check-ref
    run check.log 120 --seqlen $S --docs 3 --contiguous --backward --check-ref
    run check.log 120 --seqlen $S --docs 4 --non-causal --backward --check-ref
    run check.log 120 --seqlen $S --docs 6 --nheads-k 32 --backward --check-ref
    run check.log 120 --seqlen $S --docs 4 --procs --backward
    run check.log 120 --seqlen $S --docs 4 --procs
    run check.log 120 --seqlen $S --procs --backward
    run check.log 120 --seqlen $S --backward --check-ref
    run check.log 120 --seqlen 32768 --docs 64 --backward --check-ref
    grep -E "^\| [0-9]|f64 check|Error|error" $OUT/check.log | head -60
    # one rank of a small varlen ring under memcheck (the other rank plain)
    timeout 200 compute-sanitizer --tool memcheck --report-api-errors no --target-processes all --print-limit 20 $CP --gpus 2 --seqlen 4096 --docs 3 --backward --iters 1 > $OUT/memcheck.log 2>&1
    echo "memcheck rc=$?: $(grep -E 'ERROR SUMMARY' $OUT/memcheck.log | sort | uniq -c | tr '\n' ' ')"
    ;;
  fwd)
    run fwd.log 280 --bench
    run fwd.log 200 --bench --ulysses
    grep -E "^\|" $OUT/fwd.log
    ;;
  bwd)
    run bwd.log 500 --bench --backward
    grep -E "^\|" $OUT/bwd.log
    ;;
  bwd-ulysses)
    run bwd-ulysses.log 500 --bench --backward --ulysses
    grep -E "^\|" $OUT/bwd-ulysses.log
    ;;
  esac
done
exit $fail
