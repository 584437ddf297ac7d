#!/usr/bin/env bash
# Installs the built project into a scratch prefix, then configures, builds and runs a C program
# that finds it with find_package(fusedattn) and computes a small attention on the CPU.
set -euo pipefail
BUILD="$1"; SOURCE="$2"; SCRATCH="$3"
rm -rf "$SCRATCH" && mkdir -p "$SCRATCH"
cmake --install "$BUILD" --prefix "$SCRATCH/prefix" >/dev/null
cmake -S "$SOURCE/consumer" -B "$SCRATCH/consumer" -DCMAKE_PREFIX_PATH="$SCRATCH/prefix" >/dev/null
cmake --build "$SCRATCH/consumer" >/dev/null
LD_LIBRARY_PATH="$SCRATCH/prefix/lib:${LD_LIBRARY_PATH:-}" "$SCRATCH/consumer/consumer" | tee /dev/stderr | grep -q "^success"
