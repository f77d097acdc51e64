#!/usr/bin/env bash
# Builds here (release, without the embedded cubins: the binaries stay
# small) and packs the named GPU test binaries and benchmark binaries of
# flash-attn-tests into DIR/bins.tar.xz (DIR ignored by git when it starts
# with `.stage`; carry it with the device call).
#
#   scripts/microbench/pack-some.sh DIR --test NAME... --bin NAME...
#
# e.g. the FP8 prefill run (scripts/microbench/fp8-prefill.sh):
#   scripts/microbench/pack-some.sh .stage-f8 --test gpu_fp8_prefill --bin fa-bench-fp8
# the Hopper backward run (scripts/microbench/hopper-backward.sh):
#   scripts/microbench/pack-some.sh .stage-hb --test gpu_backward --bin fa-bench-bwd
# the FP8 decode run (scripts/microbench/fp8-decode.sh):
#   scripts/microbench/pack-some.sh .stage-fd --test gpu_fp8_decode --test ndarray_kvcache_fp8 --bin fa-bench-fp8-decode
set -euo pipefail
cd "$(dirname "$0")/../.."
dir="${1:?usage: pack-some.sh DIR --test NAME... --bin NAME...}"; shift
tests=() bins=() kind=""
for a in "$@"; do
  case "$a" in
    --test|--bin) kind="$a" ;;
    *) [[ "$kind" == --test ]] && tests+=("$a") || { [[ "$kind" == --bin ]] && bins+=("$a"); } || { echo "pack-some.sh: $a: --test or --bin first" >&2; exit 2; } ;;
  esac
done
export FLASH_ATTN_CUBINS=0
rm -rf "$dir" && mkdir -p "$dir/bins"
if ((${#tests[@]})); then
  targs=(); for t in "${tests[@]}"; do targs+=(--test "$t"); done
  cargo test --release -p flash-attn-tests "${targs[@]}" --no-run --message-format=json 2>/dev/null | DIR="$dir" python3 -c '
import json, os, shutil, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m.get("profile", {}).get("test"):
        shutil.copy(m["executable"], os.path.join(os.environ["DIR"], "bins", m["target"]["name"]))
'
  for t in "${tests[@]}"; do [[ -f "$dir/bins/$t" ]] || { echo "pack-some.sh: test binary $t not built" >&2; exit 1; }; done
fi
if ((${#bins[@]})); then
  bargs=(); for b in "${bins[@]}"; do bargs+=(--bin "$b"); done
  cargo build --release -p flash-attn-tests "${bargs[@]}" 2>&1 | tail -1
  for b in "${bins[@]}"; do cp "target/release/$b" "$dir/bins/"; done
fi
strip "$dir"/bins/*
tar cJf "$dir/bins.tar.xz" -C "$dir/bins" . && rm -rf "$dir/bins"
du -h "$dir/bins.tar.xz"
