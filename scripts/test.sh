#!/usr/bin/env bash
# Builds everything and runs the whole test suite: the C++ tests through ctest (tests labelled
# `gpu` skip, saying why, when there is no device) and the Python package's tests: the package is
# built as a user builds it (pip's isolated build of the repository: a wheel, with
# nvidia-cudnn-frontend and the other build requirements from the index, no set-up script), that
# wheel is installed into .venv, then pytest (the torch/GPU tests skip without torch or a device;
# test_packaging.py inspects the installed libraries and checks that pip built every backend the
# build above built; PyTorch is installed for the torch tests, which run on CPU tensors here).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${FUSEDATTN_BUILD_DIR:-$ROOT/build}"
PY="$ROOT/.venv/bin/python"
bash "$ROOT/scripts/build.sh"
(cd "$BUILD" && ctest --output-on-failure -j "$(nproc)")
if [ -f "$ROOT/pyproject.toml" ]; then
  # The backends the build above has (not "not built: ..."): pip must build them too.
  FUSEDATTN_EXPECT_BUILT="$("$BUILD/tools/fusedattn" backends --json | "$PY" -c '
import json, sys
print(" ".join(b["name"] for b in json.load(sys.stdin)["backends"]
               if not (b["reason"] or "").startswith("not built")))')"
  export FUSEDATTN_EXPECT_BUILT
  rm -rf "$BUILD/wheel"
  # .deps/ (scripts/setup.sh's cudnn-frontend) is not looked at: the build requirement must do.
  "$PY" -m pip wheel -q --no-deps -w "$BUILD/wheel" \
    -Ccmake.define.FUSEDATTN_CUDNN_FRONTEND_DEPS_FALLBACK=OFF "$ROOT"
  "$PY" -m pip install -q --no-deps --force-reinstall "$BUILD"/wheel/fusedattn-*.whl
  "$PY" -c 'import fusedattn; print("installed fusedattn", fusedattn.version(), fusedattn.backends())'
  # The torch tests run on the CPU here as well (CPU tensors take the reference backend through
  # the same torch operators): PyPI's torch, pinned to the GPU machine's version (about 4 GB with
  # its nvidia-* wheels, cached by pip), and matplotlib for the benchmark harness's plots. The
  # wheel above was built without torch, so the first torch test compiles the operator library
  # (fusedattn/_torch.py, about a minute) into the user's cache directory.
  # JAX (CPU) for fusedattn.jax's tests (test_jax.py; the wheel was built without jax, so the
  # first of them compiles the XLA FFI handlers, a few seconds, into the user's cache directory)
  # and the tests that hand JAX arrays to the DLPack API. transformers, pinned to the GPU
  # machine's version, for the integration's tests (tiny random models on the CPU).
  "$PY" -m pip install -q "torch==${FUSEDATTN_TEST_TORCH_VERSION:-2.11.0}" "matplotlib>=3.7" \
    "jax==0.10.2" "jaxlib==0.10.2" "transformers==5.17.0"
  (cd "$ROOT/python" && "$PY" -m pytest -q tests)
fi
