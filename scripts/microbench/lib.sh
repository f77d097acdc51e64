# Shared steps of the decode device scripts (sourced; $OUT from the run
# tool): unpack the carried binaries, run GPU test binaries, memcheck.

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

# memcheck_decode TEST...: compute-sanitizer memcheck over gpu_decode's
# named tests, its error summary appended to $OUT/tests.txt.
memcheck_decode() {
  timeout 200 compute-sanitizer --tool memcheck /tmp/h/gpu_decode --test-threads 1 "$@" > /tmp/s.txt 2>&1
  echo "=== memcheck (rc $?): $(grep -E 'ERROR SUMMARY' /tmp/s.txt | tail -1)" | tee -a $OUT/tests.txt
}
