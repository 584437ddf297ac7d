#!/usr/bin/env bash
# Installs the built project into a scratch prefix, then configures, builds and runs a C program
# that finds it with find_package(fusedattn) and computes a small attention on the CPU:
#   check_find_package.sh <build> <this folder> <scratch> [shared|static]
# shared: links fusedattn::fusedattn (libfusedattn.so) and checks the installed library's
#         RUNPATH (no empty, relative or build-machine entry);
# static: links fusedattn::fusedattn_static (libfusedattn_static.a), which must bring cudart,
#         cuDNN and NVRTC itself (the consumer names none of them).
set -euo pipefail
BUILD="$1"; SOURCE="$2"; SCRATCH="$3"; KIND="${4:-shared}"
rm -rf "$SCRATCH" && mkdir -p "$SCRATCH"
cmake --install "$BUILD" --prefix "$SCRATCH/prefix" >/dev/null
TARGET=fusedattn::fusedattn
[ "$KIND" = static ] && TARGET=fusedattn::fusedattn_static
cmake -S "$SOURCE/consumer" -B "$SCRATCH/consumer" -DCMAKE_PREFIX_PATH="$SCRATCH/prefix" \
  -DFUSEDATTN_TARGET="$TARGET" >/dev/null
cmake --build "$SCRATCH/consumer" >/dev/null
if [ "$KIND" = static ]; then
  # Nothing of libfusedattn is loaded at run time: it is inside the program.
  if readelf -d "$SCRATCH/consumer/consumer" | grep -q 'NEEDED.*libfusedattn'; then
    echo "the static consumer needs libfusedattn.so at run time"; exit 1
  fi
  "$SCRATCH/consumer/consumer" | tee /dev/stderr | grep -q "^success"
  exit 0
fi
LIB="$(ls "$SCRATCH"/prefix/lib*/libfusedattn.so.[0-9]* | head -1)"
RUNPATH="$(readelf -d "$LIB" | sed -n 's/.*Library r\(un\)\{0,1\}path: \[\(.*\)\]/\2/p')"
if [ -n "$RUNPATH" ]; then
  echo "installed $LIB has RUNPATH/RPATH '$RUNPATH': expected none (the system loader path)"; exit 1
fi
LD_LIBRARY_PATH="$SCRATCH/prefix/lib:${LD_LIBRARY_PATH:-}" "$SCRATCH/consumer/consumer" | tee /dev/stderr | grep -q "^success"
