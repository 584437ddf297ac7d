#!/usr/bin/env bash
# Configures the project (no build) where nvcc cannot be found (PATH without it, CUDACXX,
# CUDA_PATH and CUDAToolkit_ROOT unset) and with FUSEDATTN_CUDNN=OFF, and checks the reasons the
# CUDA backends will give (compiled into src/select/select.cpp):
#   check_not_built_reasons.sh <source> <scratch>
set -euo pipefail
SOURCE="$1"; SCRATCH="$2"
rm -rf "$SCRATCH" && mkdir -p "$SCRATCH"
fail() { echo "FAIL: $1"; exit 1; }
# select.cpp's compile line in the generated build files.
defines_of_select() { grep -h -A8 'select/select.cpp.o:' "$1"/build.ninja "$1"/CMakeFiles/*.ninja 2>/dev/null | grep DEFINES || true; }

# 1. No nvcc on PATH: a CPU-only configuration that says why.
NO_NVCC_PATH=""
IFS=: read -ra dirs <<<"$PATH"
for d in "${dirs[@]}"; do [ -x "$d/nvcc" ] || NO_NVCC_PATH="${NO_NVCC_PATH:+$NO_NVCC_PATH:}$d"; done
env -u CUDACXX -u CUDA_PATH -u CUDAToolkit_ROOT -u CUDAARCHS PATH="$NO_NVCC_PATH" \
  cmake -G Ninja -S "$SOURCE" -B "$SCRATCH/no-nvcc" -DFUSEDATTN_BUILD_TESTS=OFF \
  -DFUSEDATTN_BUILD_TOOLS=OFF >"$SCRATCH/no-nvcc.log" 2>&1 || { cat "$SCRATCH/no-nvcc.log"; fail "configure without nvcc failed"; }
grep -q "CUDA backends not built: nvcc not found when fusedattn was built" "$SCRATCH/no-nvcc.log" ||
  { cat "$SCRATCH/no-nvcc.log"; fail "configure without nvcc does not say why"; }
D="$(defines_of_select "$SCRATCH/no-nvcc")"
echo "$D" | grep -q 'FUSEDATTN_NO_CUDA_REASON=.*not built: nvcc not found when fusedattn was built' ||
  fail "select.cpp gets no 'nvcc not found' reason: $D"
echo "$D" | grep -q 'FUSEDATTN_NO_CUDNN_REASON=.*not built: nvcc not found when fusedattn was built' ||
  fail "select.cpp gets no cuDNN reason: $D"

# 2. With nvcc (when this machine has one) but FUSEDATTN_CUDNN=OFF: cuDNN says so.
if command -v nvcc >/dev/null || [ -n "${CUDACXX:-}" ]; then
  cmake -G Ninja -S "$SOURCE" -B "$SCRATCH/no-cudnn" -DFUSEDATTN_BUILD_TESTS=OFF \
    -DFUSEDATTN_BUILD_TOOLS=OFF -DFUSEDATTN_CUDNN=OFF >"$SCRATCH/no-cudnn.log" 2>&1 ||
    { cat "$SCRATCH/no-cudnn.log"; fail "configure with FUSEDATTN_CUDNN=OFF failed"; }
  D="$(defines_of_select "$SCRATCH/no-cudnn")"
  echo "$D" | grep -q 'FUSEDATTN_NO_CUDNN_REASON=.*not built: FUSEDATTN_CUDNN=OFF when fusedattn was built' ||
    fail "select.cpp gets no FUSEDATTN_CUDNN=OFF reason: $D"
  echo "$D" | grep -q 'FUSEDATTN_NO_CUDA_REASON' && fail "CUDA reason set although nvcc was found"
fi
echo "success"
