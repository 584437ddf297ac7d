#!/usr/bin/env bash
# Installs what the build needs on a fresh Debian machine (the CI and build machines), idempotent:
#  - Debian packages: cmake, ninja, GoogleTest (when missing)
#  - a Python virtual environment .venv with the build and test tools (nanobind,
#    scikit-build-core, numpy, pytest)
#  - cudnn-frontend's C++ headers, pinned, from the nvidia-cudnn-frontend wheel, unpacked into
#    .deps/cudnn_frontend (not vendored: fetched from the Python package index)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CUDNN_FRONTEND_VERSION="1.32.0"

need_apt=()
command -v cmake >/dev/null || need_apt+=(cmake)
command -v ninja >/dev/null || need_apt+=(ninja-build)
[ -f /usr/include/gtest/gtest.h ] || need_apt+=(libgtest-dev)
if [ ${#need_apt[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq && $SUDO apt-get install -y -qq "${need_apt[@]}"
fi

PY="${PYTHON:-python3}"
if [ ! -x "$ROOT/.venv/bin/python" ]; then
  "$PY" -m venv "$ROOT/.venv"
fi
"$ROOT/.venv/bin/python" -m pip install -q --upgrade pip >/dev/null
"$ROOT/.venv/bin/python" -m pip install -q "nanobind==3.1.0" "scikit-build-core==1.1.0" \
  "numpy>=1.26" "pytest>=8" "ml_dtypes>=0.4"

FE="$ROOT/.deps/cudnn_frontend"
if [ ! -f "$FE/include/cudnn_frontend.h" ]; then
  rm -rf "$ROOT/.deps/fe_wheel" && mkdir -p "$ROOT/.deps/fe_wheel" "$FE"
  "$ROOT/.venv/bin/python" -m pip download -q --no-deps --only-binary=:all: \
    -d "$ROOT/.deps/fe_wheel" "nvidia-cudnn-frontend==${CUDNN_FRONTEND_VERSION}"
  "$ROOT/.venv/bin/python" - "$ROOT/.deps/fe_wheel" "$FE" <<'PYEOF'
import sys, zipfile, glob, os
wheel = glob.glob(os.path.join(sys.argv[1], "*.whl"))[0]
dest = sys.argv[2]
with zipfile.ZipFile(wheel) as z:
    for name in z.namelist():
        # The wheel carries the C++ headers under include/ at its top level.
        if name.startswith("include/") and not name.endswith("/"):
            out = os.path.join(dest, name)
            os.makedirs(os.path.dirname(out), exist_ok=True)
            with open(out, "wb") as f:
                f.write(z.read(name))
PYEOF
fi
echo "setup: ok (venv $ROOT/.venv, cudnn-frontend $CUDNN_FRONTEND_VERSION in $FE)"
