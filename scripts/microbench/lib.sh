# Shared steps of the decode device scripts (sourced; $OUT from the run
# tool): unpack the carried binaries, run GPU test binaries, sanitizers.

# Unpacks .stage-t/bins.tar.xz into /tmp/h and requires a GPU in the tests.
unpack_bins() {
  mkdir -p /tmp/h && tar xJf .stage-t/bins.tar.xz -C /tmp/h || exit 1
  export FA_REQUIRE_GPU=1
}

# run_tests T...: each test binary in /tmp/h, its summary (and the first
# failures) appended to $OUT/tests.txt.
run_tests() {
  for t in "$@"; do
    /tmp/h/$t --test-threads 1 > /tmp/t.txt 2>&1
    echo "=== $t: $(grep -E 'test result' /tmp/t.txt)" | tee -a $OUT/tests.txt
    grep -E "FAILED|panicked" /tmp/t.txt | head -5 | tee -a $OUT/tests.txt
  done
}

# sanitize BIN TOOL TEST...: compute-sanitizer TOOL (memcheck, racecheck)
# over the named tests of the test binary /tmp/h/BIN, its summary (and the
# tests' result line) appended to $OUT/tests.txt.
sanitize() {
  local bin=$1 tool=$2; shift 2
  timeout 200 compute-sanitizer --tool $tool /tmp/h/$bin --test-threads 1 "$@" > /tmp/s.txt 2>&1
  echo "=== $tool $bin (rc $?): $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' /tmp/s.txt | tail -1) $(grep -E 'test result' /tmp/s.txt)" | tee -a $OUT/tests.txt
}

# sanitize_decode TOOL TEST...: sanitize over gpu_decode's named tests.
sanitize_decode() {
  sanitize gpu_decode "$@"
}

# sanitize_order: memcheck and racecheck over the block-table order tests
# (gpu_decode_into: the device sort, a decode loop over an ordered table).
sanitize_order() {
  for tool in memcheck racecheck; do
    sanitize gpu_decode_into $tool gpu_order_block_table gpu_decode_ordered_table
  done
}

# gpu_name: the GPU's name to $OUT/gpu.txt (and stdout).
gpu_name() {
  nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
}

# decode_checks: the GPU name to $OUT/gpu.txt, the decode test binaries
# (gpu_decode, gpu_api, ndarray_kvcache), and memcheck over every
# flash-decoding kernel and the append cases.
decode_checks() {
  gpu_name
  run_tests gpu_decode gpu_decode_into gpu_api ndarray_kvcache
  sanitize_decode memcheck gpu_every_decode_kernel gpu_kvcache_append_strides gpu_decode_small_for_sanitizers
}

# ab_grid ARGS...: the previous build B and the new build N of
# fa-bench-decode (/tmp/h/fa-bench-decode-{B,N}) alternating, two rounds,
# over the cells ARGS select (e.g. --batches 8 --kv-heads 8), without peers;
# each run's [ours ...] lines appended to $OUT/ab.txt under "## B" / "## N",
# then printed.
ab_grid() {
  for b in B N B N; do
    /tmp/h/fa-bench-decode-$b /tmp/ab-$b --no-torch --no-event-tracking "$@" > /tmp/ab.log 2>&1
    echo "## $b" >> $OUT/ab.txt; grep -E "^\[ours" /tmp/ab.log >> $OUT/ab.txt
  done
  cat $OUT/ab.txt
}

# all_checks: decode_checks, then the other GPU test binaries (attention,
# features, half, hopper) and racecheck over the small decode case.
all_checks() {
  decode_checks
  run_tests gpu_attention gpu_features gpu_half gpu_hopper
  sanitize_decode racecheck gpu_decode_small_for_sanitizers
}

# grid_runs R: the grid (fa-bench-decode, PyTorch in the same run) into
# $OUT/grid, then the batch-1 32k cells R more times ($OUT/b1-32k-N.md, for
# the bar cells' spread).
grid_runs() {
  timeout 300 /tmp/h/fa-bench-decode $OUT/grid --no-event-tracking > $OUT/grid.log 2>&1; echo "grid rc $?"; tail -3 $OUT/grid.log
  grep -E "\| 1 \| (4096|32768|131072) " $OUT/grid/decode.md | cut -c1-200
  for r in $(seq 2 $(( $1 + 1 ))); do
    timeout 120 /tmp/h/fa-bench-decode /tmp/b1-$r --no-event-tracking --batches 1 --caches 32768 > /tmp/b1.log 2>&1
    cp /tmp/b1-$r/decode.md $OUT/b1-32k-$r.md
    echo "## repeat $r"; grep -E "\| 1 \| 32768 " /tmp/b1-$r/decode.md | cut -c1-200
  done
}

# ab_tune ARGS...: decode-tune of the previous build B and the new build N
# (/tmp/h/decode-tune-{B,N}) alternating, two rounds, over the cells and
# kernels ARGS select; tables in $OUT/tune-{B,N}-{1,2}.md, their rows printed.
# AB_BUILDS="X Y" names other builds (/tmp/h/decode-tune-{X,Y}).
ab_tune() {
  for r in 1 2; do
    for b in ${AB_BUILDS:-B N}; do
      /tmp/h/decode-tune-$b --no-event-tracking "$@" > $OUT/tune-$b-$r.md 2>&1
      echo "## $b round $r"; grep -E "^\| [0-9]+ " $OUT/tune-$b-$r.md | sort -u
    done
  done
}

# final_run R: all_checks, then grid_runs R (the committed build's record).
final_run() {
  all_checks
  grid_runs "$1"
}

# packed TAR DIR CMD...: runs CMD with $OUT pointing at $OUT/DIR, then packs
# that folder into $OUT/TAR.tar.xz (the run tool returns at most 8 files).
packed() {
  local tarname=$1 dir=$2 out=$OUT
  shift 2
  mkdir -p $out/$dir
  OUT=$out/$dir
  "$@"
  OUT=$out
  tar cJf $OUT/$tarname.tar.xz -C $OUT $dir && rm -rf $OUT/$dir
}

# headdim_rows PEER ROWS B...: fa-bench-infer's head-dim rows of each build
# /tmp/h/fa-bench-infer-B in turn (PyTorch in the run of build PEER only),
# each run's table to $OUT/headdim-B.md and its rows matching the regex ROWS
# (e.g. 'd=(160|192)') appended to $OUT/headdim.txt under "## B", then printed.
headdim_rows() {
  local peer=$1 rows=$2; shift 2
  for b in "$@"; do
    local extra=--no-torch; [ "$b" = "$peer" ] && extra=
    timeout 200 /tmp/h/fa-bench-infer-$b --groups headdim $extra --out /tmp/hd-$b > /tmp/hd.log 2>&1; echo "$b rc $?"
    cp /tmp/hd-$b/bench-infer.md $OUT/headdim-$b.md
    echo "## $b" >> $OUT/headdim.txt; grep -E "^\| $rows " /tmp/hd-$b/bench-infer.md | cut -c1-120 >> $OUT/headdim.txt
  done
  cat $OUT/headdim.txt
}

# bar_cells CACHES ORDER...: issue 9's batch-1 bar cells (fa-bench-decode,
# MHA and GQA, the cache lengths CACHES, PyTorch in the same run) once per
# page placement ORDER (random, inorder, ordered, …): each table to
# $OUT/b1-ORDER.md, its batch-1 rows printed.
bar_cells() {
  local caches=$1; shift
  for order in "$@"; do
    timeout 240 /tmp/h/fa-bench-decode /tmp/p-$order --no-event-tracking --batches 1 --caches $caches --kv-heads 8,32 --page-order $order > /tmp/p.log 2>&1
    echo "rc $? ($order)"; cp /tmp/p-$order/decode.md $OUT/b1-$order.md
    echo "## $order"; grep -E "^\| 1 \| " /tmp/p-$order/decode.md | cut -c1-200
  done
}
