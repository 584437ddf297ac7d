#!/usr/bin/env bash
# The one script for the GPU machine (see shared/DESIGN.md, "The GPU machine"): builds there,
# runs the `gpu` tests, compute-sanitizer subsets, the program, the Python GPU tests and the
# benchmarks, and writes every log under $OUT (or ./gpu-out). Steps are chosen by name:
#   bash scripts/gpu_run.sh build tests sanitize cli python bench-quick
#   FUSEDATTN_BUILD_DIR=$PWD/build-flash bash scripts/gpu_run.sh build_flash flex_hopper ...
# Each step logs to $OUT/<step>.log and the summary of all steps to $OUT/summary.txt.
#
# FlashAttention-4 (a benchmark peer, not installed there) travels in two calls to the same warm
# machine, because its two parts together exceed what one call may carry: on the development
# machine, `bash ../shared/tools/fa4/prepare.sh` in the checkout fills the ignored folders .fa4a
# and .fa4b (see its header); then
#   call 1, carrying .fa4b:            bash scripts/gpu_run.sh fa4_stash ...
#   call 2, carrying .fa4a, while the machine is still warm (it is given back after a short
#   idle time):                        bash scripts/gpu_run.sh fa4_install ... bench-host ...
# fa4_stash leaves .fa4b's part in /tmp/fa4stash; fa4_install builds /tmp/fa4site from both.
# From then on, on that machine, the python and benchmark steps put /tmp/fa4site on PYTHONPATH
# (use_fa4) so that bench.py times `flash_attn.cute`; without it bench.py records FA4 as n/a.
set -uo pipefail
export ROOT OUT BUILD JOBS SHARDS CP_BENCH_ARGS CUDNN_MEMCHECK SANITIZE_FILTER RACECHECK_FILTER NATIVE_BENCHES BENCH_ARGS BENCH_HOST_ARGS KERNEL_PROFILE_ARGS DECODE_BENCH_ARGS GTEST_FILTER PYTEST_ARGS FLEX_BENCH_ARGS DROPIN_TESTS 2>/dev/null
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="${OUT:-$ROOT/gpu-out}"
mkdir -p "$OUT"
BUILD="${FUSEDATTN_BUILD_DIR:-$ROOT/build-gpu}"
JOBS="$(nproc)"

# Run with PyTorch's cuDNN, so that fusedattn and PyTorch use the same library.
TORCH_CUDNN="$(python3 - <<'EOF' 2>/dev/null
import os, nvidia.cudnn as c
print(os.path.join(list(c.__path__)[0], "lib"))
EOF
)"
[ -d "$TORCH_CUDNN" ] || TORCH_CUDNN=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cudnn/lib
export LD_LIBRARY_PATH="$TORCH_CUDNN:${LD_LIBRARY_PATH:-}"

summary() { echo "$*" | tee -a "$OUT/summary.txt"; }

# FlashAttention-4 on PYTHONPATH once fa4_install has put it in /tmp/fa4site (see the header).
use_fa4() {
  if [ -d /tmp/fa4site ]; then
    local site=/tmp/fa4site
    export PYTHONPATH="$site:$site/nvidia_cutlass_dsl/dsl_packages:${PYTHONPATH:-}"
  fi
  return 0
}

# Call 1 of FlashAttention-4's two (carry .fa4b): keeps its part on this machine.
step_fa4_stash() {
  if [ ! -f "$ROOT/.fa4b/stash.sh" ]; then
    echo "fa4_stash: no .fa4b here: carry .fa4b in this call"; return 1
  fi
  bash "$ROOT/.fa4b/stash.sh" && ls -l /tmp/fa4stash
}

# Call 2 (carry .fa4a, same warm machine): installs FA4 into /tmp/fa4site and checks the import.
step_fa4_install() {
  if [ ! -f "$ROOT/.fa4a/install.sh" ]; then
    echo "fa4_install: no .fa4a here: carry .fa4a in this call"; return 1
  fi
  bash "$ROOT/.fa4a/install.sh" || return 1
  use_fa4
  python3 -c "from flash_attn.cute import flash_attn_func, flash_attn_varlen_func
print('fa4: importable')"
}

step_info() {
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv
  nvcc --version | tail -1
  python3 -c "import torch; print('torch', torch.__version__, 'cudnn', torch.backends.cudnn.version())"
  echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
}

step_build() {
  local t0=$SECONDS
  cmake -G Ninja -S "$ROOT" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release \
    -DFUSEDATTN_CUDNN_FRONTEND_DIR="$ROOT/.deps/cudnn_frontend/include" &&
    cmake --build "$BUILD" -j "$JOBS"
  local rc=$?
  echo "build time: $((SECONDS - t0)) s"
  return $rc
}

# GTEST_FILTER: a subset of the gpu tests (default: all of them).
# The flash backend's targets only (no cuDNN backend, no tools, sm_90a): about 60-75 s on the
# GPU machine's 16 cores against about 150 s for step build (2026-11-28), for calls that test or
# time flash kernels. Python tests on it see cuDNN as not built (a test that expects cuDNN's own
# refusal, test_paged.py's test_paged_cuda_auto_names_every_gpu_backends_reason, fails there).
# Give it its own FUSEDATTN_BUILD_DIR to keep a full build beside it.
step_build_flash() {
  local t0=$SECONDS
  cmake -G Ninja -S "$ROOT" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DFUSEDATTN_CUDNN=OFF \
    -DCMAKE_CUDA_ARCHITECTURES=90a -DFUSEDATTN_BUILD_TOOLS=OFF &&
    cmake --build "$BUILD" -j "$JOBS" --target fusedattn fusedattn_gpu_tests fusedattn_tests \
      flash_bench fp8_bench
  local rc=$?
  echo "build time: $((SECONDS - t0)) s"
  return $rc
}

step_tests() {
  "$BUILD/tests/fusedattn_gpu_tests" --gtest_brief=1 --gtest_output="xml:$OUT/gpu_tests.xml" \
    --gtest_filter="${GTEST_FILTER:-*}"
}

# The gpu tests in SHARDS processes at once (default 8): the score_mod tests compile kernels with
# NVRTC on one CPU core each, which the machine's 16 cores then share.
step_tests_parallel() {
  local shards="${SHARDS:-8}" pids=() rc=0
  for ((i = 0; i < shards; ++i)); do
    GTEST_TOTAL_SHARDS=$shards GTEST_SHARD_INDEX=$i "$BUILD/tests/fusedattn_gpu_tests" \
      --gtest_brief=1 --gtest_output="xml:$OUT/gpu_tests_shard$i.xml" \
      --gtest_filter="${GTEST_FILTER:-*}" >"$OUT/tests_shard$i.log" 2>&1 &
    pids+=($!)
  done
  for pid in "${pids[@]}"; do wait "$pid" || rc=1; done
  grep -h -E "^\[  (FAILED|PASSED|SKIPPED) " "$OUT"/tests_shard*.log
  return $rc
}

step_cputests() {
  (cd "$BUILD" && ctest -L cpu -j "$JOBS" --output-on-failure)
}

# compute-sanitizer over a subset of the GPU tests (filters from each backend's tests).
CUDNN_MEMCHECK='CudnnGrid/CudnnGridTest.Matches/bshd_causal_bf16_d64:CudnnGrid/CudnnGridTest.Matches/bshd_padding_uneven_zero_lengths:CudnnGrid/CudnnGridTest.Matches/thd_causal_gaps_packed_lse:CudnnGrid/CudnnGridTest.Matches/thd_learnable_sink_causal:CudnnGrid/CudnnGridTest.Matches/bshd_post_bias_1h_dbias_causal_fp16:CudnnStrides.AnLseLaidOutAsBatchSeqHeadsKeepsThePlanCheckBuilt:Structures/CudnnSeqlenRoute.NewLengthsOfABuiltStructureRunThroughOneRaggedPlan/causal_bottom_right_sq_gt_skv:Structures/CudnnSeqlenRoute.NewLengthsOfABuiltStructureRunThroughOneRaggedPlan/padding_causal'
SANITIZE_FILTER="${SANITIZE_FILTER:-*Sanitize*:$CUDNN_MEMCHECK}"
step_sanitize() {
  compute-sanitizer --tool memcheck --error-exitcode 9 \
    "$BUILD/tests/fusedattn_gpu_tests" --gtest_filter="$SANITIZE_FILTER"
}
RACECHECK_FILTER="${RACECHECK_FILTER:-*Racecheck*:FlashSanitize*:FlashWgmmaSanitize*:FlashWgmmaBwdSanitize.DeterministicSmallCases:FlexFlashSanitize*:FlexFlashHopperSanitize*:FlashDecodeSanitize.PagedAndContiguousSplits:FlashPagedPrefillSanitize.SmallCases}"
step_racecheck() {
  compute-sanitizer --tool racecheck --error-exitcode 9 \
    "$BUILD/tests/fusedattn_gpu_tests" --gtest_filter="$RACECHECK_FILTER"
}

step_cli() {
  local bin="$BUILD/tools/fusedattn"
  "$bin" backends
  "$bin" run --b 2 --h 8 --hkv 2 --sq 128 --skv 256 --d 64 --mask causal_bottom_right \
    --layout thd --bwd --check || return 1
  "$bin" explain --b 30720 --h 8 --sq 1 --skv 16 --d 128
  "$bin" explain --b 30720 --h 8 --sq 1 --skv 17 --d 128
  "$bin" explain --b 2 --h 8 --sq 1024 --skv 1024 --d 512
  # Paged K/V: flash's decode kernel runs it (the other GPU backends say why not); the reference
  # runs it on CUDA tensors when forced, checked against its host run.
  "$bin" explain --b 8 --h 32 --hkv 8 --sq 1 --skv 4096 --d 128 --page-size 16 \
    --mask causal_bottom_right
  "$bin" run --b 3 --h 8 --hkv 2 --sq 4 --skv 300 --d 64 --page-size 16 --layout thd \
    --mask causal_bottom_right --backend reference --check --iters 1 || return 1
  "$bin" run --b 4 --h 16 --sq 2048 --skv 2048 --d 128 --mask causal --bwd --iters 20
}

# The flash planner (src/backends/flash/planner.h): what explain prints of flash's plan for
# problems on each path, and runs whose kernels are the plan's (a Hopper launcher that declines
# what the plan chose fails the call). Expect, on an H100/H200: hopper-wgmma d128 plain with the
# thd-heavy-first schedule (forward and backward) for the THD line; for d256 hopper-wgmma forward
# and mma.sync backward ("hopper backward: instances 64 and 128 only"); for softcap
# hopper-wgmma d128 softcap-alibi forward and backward; for the post-scale bias line hopper-wgmma
# d128 bias forward and mma.sync d128 full backward, and the bias run PASSes; simple
# ("float16/bfloat16") for fp32; with FUSEDATTN_FLASH_WGMMA=0, mma.sync ("FUSEDATTN_FLASH_WGMMA=0");
# for the paged decode line (132 SMs), "decode d128 plain, 4 splits, workspace 528384 B" (the
# split count from the planner's DeviceFacts, as tests/cpu/flash_plan_test.cpp plans it); the
# runs PASS.
step_flash_plan() {
  local bin="$BUILD/tools/fusedattn" rc=0
  "$bin" explain --backend flash --b 4 --h 16 --hkv 4 --sq 1024 --skv 1024 --d 128 --layout thd \
    --mask causal --bwd || rc=1
  "$bin" explain --backend flash --b 2 --h 8 --sq 512 --skv 512 --d 256 --bwd || rc=1
  "$bin" explain --backend flash --b 2 --h 8 --sq 512 --skv 512 --d 128 --softcap 30 --bwd || rc=1
  "$bin" explain --backend flash --b 2 --h 8 --sq 512 --skv 512 --d 128 --mask causal \
    --deterministic --bwd || rc=1
  "$bin" explain --backend flash --b 2 --h 8 --sq 512 --skv 512 --d 128 --bias post_scale \
    --bwd || rc=1
  "$bin" run --backend flash --b 2 --h 8 --sq 300 --skv 333 --d 128 --bias pre_scale \
    --bias-shape b,1 --mask causal --bwd --check --iters 1 || rc=1
  "$bin" explain --backend flash --b 2 --h 8 --sq 512 --skv 512 --d 64 --dtype fp32 || rc=1
  FUSEDATTN_FLASH_WGMMA=0 "$bin" explain --backend flash --b 2 --h 8 --sq 512 --skv 512 --d 128 \
    || rc=1
  "$bin" explain --backend flash --b 8 --h 32 --hkv 8 --sq 1 --skv 4096 --d 128 --page-size 16 \
    --mask causal_bottom_right || rc=1
  "$bin" run --backend flash --b 3 --h 8 --hkv 2 --sq 1 --skv 700 --d 128 --page-size 16 \
    --mask causal_bottom_right --check --iters 1 || rc=1
  # Chunked prefill against pages: "hopper-wgmma d128 plain, thd-heavy-first schedule, paged K/V".
  "$bin" explain --backend flash --b 8 --h 32 --hkv 8 --sq 2048 --skv 10240 --d 128 \
    --page-size 16 --layout thd --mask causal_bottom_right || rc=1
  "$bin" run --backend flash --b 3 --h 8 --hkv 2 --sq 300 --skv 700 --d 128 --page-size 64 \
    --layout thd --mask causal_bottom_right --check --iters 1 || rc=1
  "$bin" run --backend flash --b 3 --h 8 --hkv 2 --sq 300 --skv 300 --d 128 --layout thd \
    --mask causal --bwd --check --iters 1 || rc=1
  "$bin" run --backend flash --b 2 --h 4 --sq 200 --skv 260 --d 64 --dtype fp16 \
    --mask causal_bottom_right --window 32,0 --bwd --check --iters 1 || rc=1
  # flash_bench names the planned kernels: [hopper-wgmma d128 plain] forward and backward, then
  # [hopper-wgmma d256 plain] forward and [mma.sync d256 plain] backward, then
  # [hopper-wgmma d128 softcap-alibi] forward and backward, then the deterministic Hopper backward
  # ([hopper-wgmma d128 plain, dQ fixed-order+convert]), then [hopper-wgmma d128 bias] forward and
  # [mma.sync d128 full] backward.
  local bench="$BUILD/bench/flash_bench"
  if [ -x "$bench" ]; then
    "$bench" --dtype bf16 --d 128 --seqlen 4096 --causal 1 --iters 3 || rc=1
    "$bench" --dtype bf16 --d 256 --seqlen 4096 --causal 1 --iters 3 || rc=1
    "$bench" --dtype bf16 --d 128 --seqlen 4096 --causal 1 --iters 3 --softcap 30 --alibi || rc=1
    "$bench" --dtype bf16 --d 128 --seqlen 4096 --causal 1 --iters 3 --deterministic || rc=1
    "$bench" --dtype bf16 --d 128 --seqlen 4096 --causal 1 --iters 3 --bias post \
      --bias-broadcast || rc=1
  fi
  return $rc
}

step_python_build() {
  # Build only the binding against the library built above (Python 3.12 here).
  cmake -G Ninja -S "$ROOT/python" -B "$BUILD/python" -DCMAKE_BUILD_TYPE=Release \
    -DFUSEDATTN_ROOT="$ROOT" -DFUSEDATTN_LIBRARY="$BUILD/libfusedattn.so" &&
    cmake --build "$BUILD/python" -j "$JOBS"
}

# The drop-ins' test files (issue 19), run by step dropin and left out of step python.
DROPIN_TESTS="tests/test_sdpa_dropin.py tests/test_flash_attn_dropin.py \
tests/test_transformers_integration.py tests/test_examples.py"

# The gpu-marked Python tests but the drop-ins' (step dropin runs those; test_jax.py has no gpu
# marks: step jax_tests runs it): test_torch.py, test_flex_torch.py and any new file. All of
# them together no longer fit one step: measured on the development machine's CPU (the CPU
# variants of the same tests), test_examples.py took 55 s (three subprocess runs of about 18 s),
# test_transformers_integration.py 36 s, test_torch.py 33 s (its benchmark smoke grid 20 s),
# the others under 3 s each; on the H100 the drop-in files took 100 s of a 240 s limit that the
# step (with its build) then ran past. PYTEST_ARGS replaces the default file selection.
step_python() {
  step_python_build || return 1
  use_fa4
  export PYTHONPATH="$BUILD/python/package:${PYTHONPATH:-}"
  local ignore="" file
  for file in $DROPIN_TESTS; do ignore+=" --ignore=$file"; done
  (cd "$ROOT/python" && eval python3 -m pytest -q -m gpu ${PYTEST_ARGS:-tests $ignore})
}

step_bench_quick() {
  step_python_build >/dev/null || return 1
  use_fa4
  export PYTHONPATH="$BUILD/python/package:${PYTHONPATH:-}"
  python3 "$ROOT/bench/bench.py" --grid all --quick --out "$OUT"
}

step_bench() {
  step_python_build >/dev/null || return 1
  use_fa4
  export PYTHONPATH="$BUILD/python/package:${PYTHONPATH:-}"
  # BENCH_ARGS: e.g. "--grid small_seq" or "--grid prefill --filter 'bf16 d128' --only ..."
  eval python3 "$ROOT/bench/bench.py" --out "$OUT" ${BENCH_ARGS:---grid prefill}
}

# The host's cost per warm call (bench.py --grid host: b1 s128 h4 d64 bf16, 2000 calls back to
# back, 5 rotated rounds; about 2-4 minutes: give it TIMEOUT_bench_host=540).
step_bench_host() {
  step_python_build >/dev/null || return 1
  use_fa4
  export PYTHONPATH="$BUILD/python/package:${PYTHONPATH:-}"
  python3 "$ROOT/bench/bench.py" --grid host --out "$OUT" ${BENCH_HOST_ARGS:-}
}

# The drop-in entry points (issue 19) on CUDA: the gpu-marked tests of the SDPA and flash_attn
# drop-ins, the transformers integration (tiny Llama, Mistral, Gemma 2, Qwen2, gpt-oss against
# eager in float32 and bfloat16, padded batches, generation) and the examples; then
# bench/hf_train_step.py (Llama 8 layers, GQA 16/4, 4 x 2048 tokens, bf16: train step with
# "fusedattn" against "sdpa", full and padded batches). Give it TIMEOUT_dropin=540 (score-modifier
# kernels compile with NVRTC on first use).
step_dropin() {
  step_python_build >/dev/null || return 1
  export PYTHONPATH="$BUILD/python/package:${PYTHONPATH:-}"
  local rc=0
  (cd "$ROOT/python" && python3 -m pytest -q -m gpu $DROPIN_TESTS) || rc=1
  python3 "$ROOT/bench/hf_train_step.py" --out "$OUT" || rc=1
  return $rc
}

# fusedattn.jax on the GPU (jax 0.11.2 there). step_python_build also builds the JAX FFI handlers
# (libfusedattn_jax_ffi.so) when python3 imports jax. jax_tests: test_jax.py whole on the CPU
# platform (the CI tests under this jax), then its oracle cases, forward and gradients, on the
# GPU with the library's choice and with each GPU backend forced (float32, float16, bfloat16; a
# case the backend refuses is skipped with the reason; JAX_BACKENDS picks, default "auto cudnn
# flash small_seq"; JAX_CPU_TESTS=0 leaves out the CPU part); several minutes (the forward cases
# alone took 15-70 s per backend on the H100): TIMEOUT_jax_tests=580. jax_bench:
# bench/jax_bench.py, its check against the CPU reference and jax.nn's cuDNN, then the timing
# against jax.nn.dot_product_attention;
# JAX_BENCH_ARGS, e.g. "--grid all" (default: the headline points, b1 h16 d128 s16384 causal and
# not).
step_jax_tests() {
  step_python_build || return 1
  export PYTHONPATH="$BUILD/python/package:${PYTHONPATH:-}"
  ls "$BUILD/python/package/fusedattn/" | grep jax_ffi
  local rc=0
  if [ "${JAX_CPU_TESTS:-1}" = 1 ]; then  # JAX_CPU_TESTS=0: only the GPU oracle cases
    (cd "$ROOT/python" && JAX_PLATFORMS=cpu python3 -m pytest -q tests/test_jax.py) || rc=1
  fi
  for backend in ${JAX_BACKENDS:-auto cudnn flash small_seq}; do
    echo "== oracle cases on the GPU, backend $backend"
    (cd "$ROOT/python" && FUSEDATTN_TEST_JAX_BACKEND=$backend \
      python3 -m pytest -q -rs tests/test_jax.py \
      -k "test_forward_matches_oracle or test_gradients_match_oracle") || rc=1
  done
  return $rc
}

step_jax_bench() {
  step_python_build >/dev/null || return 1
  export PYTHONPATH="$BUILD/python/package:${PYTHONPATH:-}"
  # JAX_BENCH_ARGS may quote: "--grid prefill --filter 'd128 h16 b'"
  eval python3 "$ROOT/bench/jax_bench.py" --out "$OUT" ${JAX_BENCH_ARGS:-}
}

# Decode against paged and contiguous KV caches (bench/decode_bench.py: issue 21's grid, flash's
# decode kernel against fusedattn cuDNN, PyTorch's cuDNN SDPA and FA4, GB/s against the copy
# bandwidth). It stops starting points after --budget-s (default 280: the step's 300 s); the
# whole grid (336 points) takes longer: TIMEOUT_decode_bench=600 DECODE_BENCH_ARGS="--budget-s
# 570", or split it with --filter (e.g. "sq1", "d64").
step_decode_bench() {
  step_python_build >/dev/null || return 1
  use_fa4
  export PYTHONPATH="$BUILD/python/package:${PYTHONPATH:-}"
  eval python3 "$ROOT/bench/decode_bench.py" --out "$OUT" ${DECODE_BENCH_ARGS:---budget-s 280}
}

# score_mod graphs on flash's Hopper forward (issue 17 item 2; tests/gpu/flex_flash_hopper_test.cpp,
# flash README "Score modifiers on the Hopper forward"). flex_hopper: the Hopper score_mod cases
# and the older flex flash tests (whose forwards take the Hopper kernel on sm_90 now) in 8
# processes (NVRTC compiles on one core each), memcheck and racecheck on the small cases, and
# the CPU compile tests (ptxas's spill report per graph); about 4-6 minutes, give it
# TIMEOUT_flex_hopper=580. flex_hopper_fastmath: the Hopper cases again with every score_mod
# kernel compiled with --use_fast_math (FUSEDATTN_FLASH_JIT_FAST_MATH=1: tanh.approx, fast
# division), to see whether the tolerances hold there. flex_hopper_bench: flash_bench's
# score_mod lines, each beside the plain forward of the same problem ("speed score_mod/plain";
# issue 17 asks >= 0.9 for relbias and softcap), d128 s16384 bf16 for the five graphs, d64 and
# d256 lines, then relbias and softcap with fast math and with the overlap forced off and on
# (FUSEDATTN_FLASH_SM90_JIT_OVERLAP); about 3-5 minutes.
step_flex_hopper() {
  local rc=0
  GTEST_FILTER='FlexFlashHopper*:*FlexFlash*' step_tests_parallel || rc=1
  compute-sanitizer --tool memcheck --error-exitcode 9 "$BUILD/tests/fusedattn_gpu_tests" \
    --gtest_filter='FlexFlashHopperSanitize*' || rc=1
  compute-sanitizer --tool racecheck --error-exitcode 9 "$BUILD/tests/fusedattn_gpu_tests" \
    --gtest_filter='FlexFlashHopperSanitize*' || rc=1
  "$BUILD/tests/fusedattn_tests" --gtest_filter='FlexCodegen.Hopper*:FlashPlan*ScoreMod*' || rc=1
  return $rc
}

step_flex_hopper_fastmath() {
  FUSEDATTN_FLASH_JIT_FAST_MATH=1 GTEST_FILTER='FlexFlashHopper*' step_tests_parallel
}

step_flex_hopper_bench() {
  local rc=0 bench="$BUILD/bench/flash_bench" mod s
  for mod in relbias softcap alibi window doc; do
    "$bench" --dtype bf16 --d 128 --seqlen 16384 --causal all --iters 10 --fwd-only \
      --score-mod "$mod" || rc=1
  done
  for s in 1024 16384; do
    "$bench" --dtype bf16 --d 64 --seqlen "$s" --causal 0 --iters 10 --fwd-only \
      --score-mod relbias || rc=1
  done
  "$bench" --dtype bf16 --d 256 --seqlen 16384 --causal 0 --iters 10 --fwd-only \
    --score-mod softcap || rc=1
  for mod in relbias softcap; do
    echo "== $mod with FUSEDATTN_FLASH_JIT_FAST_MATH=1"
    FUSEDATTN_FLASH_JIT_FAST_MATH=1 "$bench" --dtype bf16 --d 128 --seqlen 16384 --causal 0 \
      --iters 10 --fwd-only --score-mod "$mod" || rc=1
    for overlap in 0 1; do
      echo "== $mod with FUSEDATTN_FLASH_SM90_JIT_OVERLAP=$overlap"
      FUSEDATTN_FLASH_SM90_JIT_OVERLAP=$overlap "$bench" --dtype bf16 --d 128 --seqlen 16384 \
        --causal 0 --iters 10 --fwd-only --score-mod "$mod" || rc=1
    done
  done
  return $rc
}

# cuDNN's paged SDPA forward (issue 21; cuDNN README "Paged K/V"): its GPU tests with the other
# paged ones (flash decode and chunked prefill, selection's paged refusals), memcheck on the
# table and one decode case, the Python paged tests; needs the full build (step build). Give it
# TIMEOUT_cudnn_paged=400.
step_cudnn_paged() {
  local rc=0
  GTEST_FILTER='*CudnnPaged*:ReferenceOnCudaSelection.*:*FlashDecode*:*PagedPrefill*' \
    step_tests_parallel || rc=1
  compute-sanitizer --tool memcheck --error-exitcode 9 "$BUILD/tests/fusedattn_gpu_tests" \
    --gtest_filter='CudnnPagedTable*:Shapes/CudnnPagedDecode.MatchesReference/Page16_Gqa8x2_D128*' \
    || rc=1
  PYTEST_ARGS='tests/test_paged.py' step_python || rc=1
  return $rc
}

# Dropout on flash's Hopper forward (issue 17; flash README "Hopper forward: dropout").
# hopper_dropout: the Hopper forward's tests (its dropout cases, the mask checks and the dispatch
# test among them), the mma.sync, simple and small_seq tests (every kernel that draws the mask:
# Philox's device multiply changed with it), again with FUSEDATTN_FLASH_WGMMA=0, memcheck and
# racecheck on the dropout sanitize cases, and the CPU planner, dropout and NVRTC codegen tests;
# give it TIMEOUT_hopper_dropout=580.
# hopper_dropout_bench: flash_bench --dropout (each line beside
# the same problem without dropout: "speed dropout/plain") on the Hopper kernel, then the same
# lines with FUSEDATTN_FLASH_WGMMA=0 (the mma.sync full kernel that ran dropout before).
step_hopper_dropout() {
  local rc=0 hopper='FlashWgmma/*:FlashWgmma.*:FlashWgmmaSanitize*'
  local masks='Flash.*:FlashGrid/*:FlashSanitize*:SmallSeq*:*Dropout*'
  GTEST_FILTER="$hopper:$masks" step_tests_parallel || rc=1
  # The same mask tests on the mma.sync kernels (their Philox multiply changed too, and plain
  # dropout no longer reaches them on sm_90 otherwise): the bit-for-bit test then checks the
  # mma.sync forward's mask.
  FUSEDATTN_FLASH_WGMMA=0 GTEST_FILTER='Flash.*:FlashGrid/*:*Dropout*' step_tests_parallel || rc=1
  compute-sanitizer --tool memcheck --error-exitcode 9 "$BUILD/tests/fusedattn_gpu_tests" \
    --gtest_filter='FlashWgmmaSanitize.DropoutSmallCases' || rc=1
  compute-sanitizer --tool racecheck --error-exitcode 9 "$BUILD/tests/fusedattn_gpu_tests" \
    --gtest_filter='FlashWgmmaSanitize.DropoutSmallCases' || rc=1
  "$BUILD/tests/fusedattn_tests" --gtest_filter='FlashPlan*:*Dropout*:FlexCodegen.*' || rc=1
  return $rc
}

step_hopper_dropout_bench() {
  local rc=0 bench="$BUILD/bench/flash_bench" wgmma p
  for wgmma in 1 0; do
    echo "== FUSEDATTN_FLASH_WGMMA=$wgmma"
    for p in 0.1 0.5; do
      FUSEDATTN_FLASH_WGMMA=$wgmma "$bench" --dtype bf16 --d 128 --seqlen 16384 --causal all \
        --iters 10 --fwd-only --dropout "$p" || rc=1
    done
    FUSEDATTN_FLASH_WGMMA=$wgmma "$bench" --dtype bf16 --d 64 --seqlen 1024 --causal all \
      --iters 10 --fwd-only --dropout 0.1 || rc=1
    FUSEDATTN_FLASH_WGMMA=$wgmma "$bench" --dtype bf16 --d 64 --seqlen 16384 --causal all \
      --iters 10 --fwd-only --dropout 0.1 || rc=1
    FUSEDATTN_FLASH_WGMMA=$wgmma "$bench" --dtype bf16 --d 256 --seqlen 16384 --causal 0 \
      --iters 10 --fwd-only --dropout 0.1 || rc=1
  done
  # A training step: the Hopper dropout forward and the mma.sync backward.
  "$bench" --dtype bf16 --d 128 --seqlen 16384 --causal all --iters 10 --dropout 0.1 || rc=1
  return $rc
}

# Times fusedattn with score modifiers against compiled FlexAttention (bench/flex_bench.py).
# Chunked prefill against a paged K/V cache next to the same problem with contiguous K/V
# (bench/flash_bench.cpp --paged-prefill: 8 sequences x 2048 new tokens against 8192 cached, hq 32,
# hkv 8, d128 bf16, pages 16 and 64, both on flash's Hopper forward). Issue 21 asks for
# contiguous/paged >= 0.95 on each line.
step_paged_prefill_bench() {
  "$BUILD/bench/flash_bench" --paged-prefill --iters 20
}

step_flex_bench() {
  step_python_build >/dev/null || return 1
  use_fa4
  export PYTHONPATH="$BUILD/python/package:${PYTHONPATH:-}"
  python3 "$ROOT/bench/flex_bench.py" --out "$OUT" ${FLEX_BENCH_ARGS:-}
}

# Times the training forward on its own next to PyTorch's (bench/cudnn_train_probe.py).
step_probe() {
  step_python_build >/dev/null || return 1
  use_fa4
  export PYTHONPATH="$BUILD/python/package:${PYTHONPATH:-}"
  python3 "$ROOT/bench/cudnn_train_probe.py"
}

# The kernels behind benchmark points (bench/kernel_profile.py); KERNEL_PROFILE_ARGS: one
# argument list per point, separated by '|' (default: flash against PyTorch's flash, d128 s1024).
step_kernel_profile() {
  step_python_build >/dev/null || return 1
  use_fa4
  export PYTHONPATH="$BUILD/python/package:${PYTHONPATH:-}"
  local IFS='|' rc=0
  for args in ${KERNEL_PROFILE_ARGS:---ours flash --theirs flash --d 128 --seqlen 1024}; do
    (IFS=' '; eval python3 "$ROOT/bench/kernel_profile.py" $args) || rc=1
  done
  return $rc
}

# Context parallelism (issue 23, fusedattn.distributed). NVLink multicast stays off (the device
# notes: NCCL_NVLS_ENABLE=0 and its siblings). cp_tests: python/tests/test_distributed.py whole:
# its gloo tests on this machine's CPUs (2 and 4 processes, every mode against one process), the
# bf16 CUDA tests with every rank simulated on one GPU (expect: all pass), and the NCCL tests
# when 2 or 4 GPUs are visible (else skipped, saying so). cp_bench: bench/cp_bench.py on one GPU
# (simulated ranks, s = 128k/256k/512k, N = 2 and 4: rel_err < 1e-2, ratio = slowest rank /
# (single / N), the target <= 1.1), then, per N in 2 4 that this machine has GPUs for, torchrun
# over NCCL with a profile of one step (rank 0's trace in $OUT/cp_profile; plot it with
# bench/cp_timeline.py). On 4 H200s (2026-11-28) cp_tests took 99 s (157 passed, the 12 NCCL
# cases among them) and cp_bench 305 s (the 512k single-GPU step takes 7.6 s there, ~9 s on an
# H100): give it TIMEOUT_cp_bench=540. CP_BENCH_ARGS
# replaces the defaults of both (e.g. "--seqlens 131072 --modes ring all_to_all all_gather").
step_cp_tests() {
  step_python_build || return 1
  export PYTHONPATH="$BUILD/python/package:${PYTHONPATH:-}"
  export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
  (cd "$ROOT/python" && python3 -m pytest -q -rs tests/test_distributed.py)
}

step_cp_bench() {
  step_python_build >/dev/null || return 1
  export PYTHONPATH="$BUILD/python/package:${PYTHONPATH:-}"
  export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
  local rc=0 gpus n
  gpus="$(python3 -c 'import torch; print(torch.cuda.device_count())')"
  eval python3 "$ROOT/bench/cp_bench.py" --out "$OUT" ${CP_BENCH_ARGS:-} || rc=1
  for n in 2 4; do
    if [ "$gpus" -ge "$n" ]; then
      eval torchrun --nproc_per_node="$n" "$ROOT/bench/cp_bench.py" --out "$OUT" \
        --profile "$OUT/cp_profile" ${CP_BENCH_ARGS:-} || rc=1
    else
      echo "cp_bench: $gpus GPU(s) here: torchrun over $n GPUs not run"
    fi
  done
  return $rc
}

# FP8 attention (issue 22): cuDNN's FP8 graphs against the reference's emulation (GPU tests), the
# FP8 CPU tests (conversions, emulation bounds, validation, cuDNN FP8 planning), memcheck of one
# FP8 forward+backward, then bench/fp8_bench: FP8 against our BF16, d128, s 4096 / 8192 / 16384,
# causal and not, forward and forward+backward. About 3-5 minutes: give it TIMEOUT_fp8=540.
step_fp8() {
  local rc=0
  "$BUILD/tests/fusedattn_gpu_tests" --gtest_brief=1 --gtest_output="xml:$OUT/fp8_gpu_tests.xml" \
    --gtest_filter='CudnnFp8*' || rc=1
  "$BUILD/tests/fusedattn_tests" --gtest_brief=1 --gtest_filter='*Fp8*' || rc=1
  compute-sanitizer --tool memcheck --error-exitcode 9 "$BUILD/tests/fusedattn_gpu_tests" \
    --gtest_filter='Shapes/CudnnFp8.ForwardAndBackwardMatchTheReferenceEmulation/d128_causal_e5m2' ||
    rc=1
  "$BUILD/bench/fp8_bench" || rc=1
  return $rc
}

# flash's FP8 forward (issue 22 item 4; flash README "Hopper forward: FP8"): its GPU tests against
# the reference's emulation, the cuDNN FP8 tests again (they share tests/gpu/fp8_check.h),
# memcheck and racecheck of the small cases, the CPU planner / FP8 tests, then fp8_bench --fp8:
# flash FP8, cuDNN FP8 and both BF16 forwards of d128 s 4096 / 8192 / 16384, causal and not, with
# the ratios (FP8 / BF16 >= 1.5, flash FP8 / cuDNN FP8 >= 1.0). With step build (full build:
# cuDNN lines too) or build_flash (cuDNN lines n/a). About 3-5 minutes: TIMEOUT_hopper_fp8=580.
step_hopper_fp8() {
  local rc=0
  GTEST_FILTER='*FlashFp8*:*CudnnFp8*' step_tests_parallel || rc=1
  compute-sanitizer --tool memcheck --error-exitcode 9 "$BUILD/tests/fusedattn_gpu_tests" \
    --gtest_filter='FlashFp8Sanitize.*' || rc=1
  compute-sanitizer --tool racecheck --error-exitcode 9 "$BUILD/tests/fusedattn_gpu_tests" \
    --gtest_filter='FlashFp8Sanitize.*' || rc=1
  "$BUILD/tests/fusedattn_tests" --gtest_brief=1 --gtest_filter='FlashPlan*:*Fp8*' || rc=1
  "$BUILD/bench/fp8_bench" --fp8 --iters 10 || rc=1
  return $rc
}

# The FP8 Hopper forward under Nsight Compute beside the BF16 one (issue 22: flash FP8 ran at
# 0.62-0.78x cuDNN's FP8 on an H200, 2026-11-28; the arithmetic says neither its products nor its
# exponentials alone explain ~2500 cycles per 128x128 tile): every launch (up to 30) of the
# Hopper forward kernel and of the FP8 V^T pre-pass in fp8_bench's fp8 and bf16 flash lines (d128
# s16384 non-causal, warm-ups included), with the pipe utilization (tensor, MUFU/XU, FMA, ALU), the warp stall reasons and the
# scheduler's issue rate; the report goes to $OUT/fp8_ncu.ncu-rep as well. About 1-2 minutes.
step_fp8_ncu() {
  ncu --kernel-name "regex:WgmmaForwardKernel|Fp8TransposeValuesKernel" --launch-count 30 \
    --section SpeedOfLight --section ComputeWorkloadAnalysis --section WarpStateStats \
    --section SchedulerStats --section Occupancy --section MemoryWorkloadAnalysis \
    --export "$OUT/fp8_ncu" --force-overwrite \
    "$BUILD/bench/fp8_bench" --fp8 --seqlen 16384 --causal 0 --iters 2
}

# NATIVE_BENCHES: which of build/bench's programs to run (default: all of them).
step_native_bench() {
  local names="${NATIVE_BENCHES:-flash_bench small_seq_bench cudnn_overhead fp8_bench}"
  for name in $names; do
    local b="$BUILD/bench/$name"
    [ -x "$b" ] && { echo "== $b"; "$b"; }
  done
}

[ $# -eq 0 ] && set -- info build tests cli
for step in "$@"; do
  fn="step_${step//-/_}"
  if ! declare -F "$fn" >/dev/null; then
    summary "unknown step: $step"
    continue
  fi
  t0=$SECONDS
  # Each step has its own time limit (STEP_TIMEOUT, seconds) so one hang cannot eat the call.
  # Every step function, so that a step may call another (cudnn_paged runs step python).
  export -f $(declare -F | awk '$3 ~ /^step_/ {print $3}') use_fa4 summary
  limit_var="TIMEOUT_${step//-/_}"
  PYTHONUNBUFFERED=1 timeout "${!limit_var:-${STEP_TIMEOUT:-300}}" bash -c "$fn" >"$OUT/$step.log" 2>&1
  rc=$?
  summary "$step: rc=$rc ($((SECONDS - t0)) s)"
  tail -n 15 "$OUT/$step.log"
done
cat "$OUT/summary.txt"
# The device tool brings back at most 8 files: everything also goes into one archive.
tar czf "$OUT/all-logs.tgz" -C "$OUT" --exclude=all-logs.tgz . 2>/dev/null || true
