#!/usr/bin/env bash
# The main job: build, then run an attention problem end to end with the `fusedattn` program
# (forward and backward, checked against the CPU reference). Without a GPU it runs on the CPU
# reference backend. Arguments replace the default problem, e.g.
#   bash scripts/run.sh run --b 4 --h 16 --sq 512 --skv 512 --d 128 --mask causal --bwd
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$ROOT/scripts/build.sh" >/dev/null
BIN="${FUSEDATTN_BUILD_DIR:-$ROOT/build}/tools/fusedattn"
if [ $# -eq 0 ]; then
  set -- run --b 2 --h 8 --hkv 2 --sq 128 --skv 256 --d 64 --mask causal_bottom_right \
    --layout thd --bwd --check
fi
"$BIN" backends
"$BIN" "$@"
