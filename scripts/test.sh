#!/usr/bin/env bash
# Builds everything and runs the whole test suite: the C++ tests through ctest (tests labelled
# `gpu` skip, saying why, when there is no device) and the Python package's tests (pip install .
# into .venv, then pytest; the torch/GPU tests skip without torch or a device).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${FUSEDATTN_BUILD_DIR:-$ROOT/build}"
bash "$ROOT/scripts/build.sh"
(cd "$BUILD" && ctest --output-on-failure -j "$(nproc)")
if [ -f "$ROOT/pyproject.toml" ]; then
  "$ROOT/.venv/bin/python" -m pip install -q "$ROOT"
  (cd "$ROOT/python" && "$ROOT/.venv/bin/python" -m pytest -q tests)
fi
