#!/usr/bin/env bash
# Installs the CUDA toolkit pieces that building candle-core with its `cuda`
# feature needs (nvcc + headers for candle-kernels, the shared libraries
# candle links with `dynamic-linking`), from PyPI, pinned to CUDA 13.0, into
# one folder, and prints the environment to build with.
#
#   scripts/cuda-toolkit.sh [DIR]        (default: .cuda-toolkit at the repo root)
#   eval "$(scripts/cuda-toolkit.sh --env [DIR])"
#   scripts/cuda-toolkit.sh --env-lines [DIR]   (KEY=VALUE lines, for `cargo xtask candle`)
#
# Running a binary built this way on a machine without a GPU (candle's CPU
# device only) needs the libraries at run time too:
#   LD_LIBRARY_PATH=DIR/lib:DIR/nvidia/cu13/lib   (the stub libcuda.so.1 never gets called)
# On a GPU machine use the driver's libcuda instead (never DIR/lib).
#
# Why 13.0: the H100 box's driver is CUDA 13.0 and JIT-compiles PTX ISA <= 9.0;
# nvcc 13.5 emits ISA 9.5, and cudarc 0.19.10's build script refuses it.
# Why a stub libcuda: no PyPI package ships the driver's link stub, and candle
# links `-lcuda`; so we build one as NVIDIA's toolkit does: every driver entry
# point of cuda.h (as the preprocessor spells it, `cuMemAlloc_v2`, and as
# written) as an empty function, soname `libcuda.so.1`. The binary records
# `libcuda.so.1` and binds the real driver's functions at run time.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
env_only=0
if [[ "${1:-}" == "--env" ]]; then env_only=1; shift; fi
if [[ "${1:-}" == "--env-lines" ]]; then env_only=2; shift; fi
dir="${1:-$root/.cuda-toolkit}"
mkdir -p "$dir"
dir="$(cd "$dir" && pwd)"
cu="$dir/nvidia/cu13"

print_env() {
  echo "export CUDA_ROOT='$cu' CUDA_PATH='$cu' CUDA_HOME='$cu'"
  echo "export PATH='$cu/bin':\"\$PATH\""
  echo "export LIBRARY_PATH='$dir/lib':\"\${LIBRARY_PATH:-}\""
  # No nvidia-smi here: say which GPU to build candle's kernels for (H100).
  echo "export CUDA_COMPUTE_CAP=\"\${CUDA_COMPUTE_CAP:-90}\""
}
print_env_lines() {
  echo "CUDA_ROOT=$cu"; echo "CUDA_PATH=$cu"; echo "CUDA_HOME=$cu"
  echo "PATH=$cu/bin:$PATH"
  echo "LIBRARY_PATH=$dir/lib${LIBRARY_PATH:+:$LIBRARY_PATH}"
  echo "CUDA_COMPUTE_CAP=${CUDA_COMPUTE_CAP:-90}"
}
if [[ $env_only == 1 ]]; then print_env; exit 0; fi
if [[ $env_only == 2 ]]; then print_env_lines; exit 0; fi

pkgs=(
  "nvidia-cuda-nvcc==13.0.88" "nvidia-nvvm==13.0.*" "nvidia-cuda-crt==13.0.*" "nvidia-cuda-cccl==13.0.*"
  "nvidia-cuda-runtime==13.0.*" "nvidia-cuda-nvrtc==13.0.*" "nvidia-curand==10.4.0.*" "nvidia-cublas==13.0.*"
)
if [[ ! -x "$cu/bin/nvcc" || ! -e "$dir/.complete" ]]; then
  # One command: a second `pip install --target` would replace the folder.
  python3 -m pip install --quiet --disable-pip-version-check --no-deps --target "$dir" --upgrade "${pkgs[@]}"
fi
"$cu/bin/nvcc" --version | tail -2 >&2

# Unversioned .so names for the linker, in one lib folder.
mkdir -p "$dir/lib"
for lib in cudart nvrtc curand cublas cublasLt; do
  f=$(find "$dir/nvidia" -name "lib$lib.so.*" | sort | head -1)
  [[ -n "$f" ]] || { echo "cuda-toolkit: lib$lib.so.* not found under $dir/nvidia" >&2; exit 1; }
  ln -sf "$f" "$dir/lib/lib$lib.so"
done
# The libcuda link stub (see the header).
if [[ ! -e "$dir/lib/libcuda.so" ]]; then
  {
    echo '#include <cuda.h>' | gcc -E -P -I "$cu/include" -x c - | grep -oE '\bcu[A-Z][A-Za-z0-9_]*[[:space:]]*\('
    grep -oE 'CUDAAPI[[:space:]]+cu[A-Z][A-Za-z0-9_]*' "$cu/include/cuda.h" | sed 's/CUDAAPI//'
  } | tr -d ' (' | sort -u | sed 's/.*/void &(void) {}/' > "$dir/lib/libcuda_stub.c"
  gcc -shared -fPIC -Wl,-soname,libcuda.so.1 -o "$dir/lib/libcuda.so" "$dir/lib/libcuda_stub.c"
fi
ln -sf libcuda.so "$dir/lib/libcuda.so.1"
touch "$dir/.complete"
echo "cuda-toolkit: installed in $dir; build with:" >&2
print_env
