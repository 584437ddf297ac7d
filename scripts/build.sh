#!/usr/bin/env bash
# Configures and builds fusedattn (library, program, tests) in build/, after installing what the
# build needs (scripts/setup.sh). Extra arguments go to CMake's configure step.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$ROOT/scripts/setup.sh"
BUILD="${FUSEDATTN_BUILD_DIR:-$ROOT/build}"
cmake -G Ninja -S "$ROOT" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release \
  -DFUSEDATTN_CUDNN_FRONTEND_DIR="$ROOT/.deps/cudnn_frontend/include" "$@"
cmake --build "$BUILD" -j "$(nproc)"
