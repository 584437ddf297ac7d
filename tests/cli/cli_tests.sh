#!/usr/bin/env bash
# Tests of the `fusedattn` program, one behaviour per case:
#   cli_tests.sh <path to fusedattn> <case>
# Each case runs the program and checks its exit code and output; a failure says which command
# and what was expected.
set -u
FUSEDATTN="$1"
CASE="$2"
OUT="$(mktemp)"
trap 'rm -f "$OUT"' EXIT
FAILED=0

# run <args...>: runs the program, output (stdout and stderr) in $OUT, exit code in $RC.
run() {
  "$FUSEDATTN" "$@" >"$OUT" 2>&1
  RC=$?
  LAST="fusedattn $*"
}

fail() {
  echo "FAIL: $LAST: $1"
  echo "----- output:"
  cat "$OUT"
  echo "-----"
  FAILED=1
}

expect_rc() { [ "$RC" -eq "$1" ] || fail "exit code $RC, expected $1"; }
expect_output() { grep -qE -- "$1" "$OUT" || fail "output does not match /$1/"; }
expect_no_output() { ! grep -qE -- "$1" "$OUT" || fail "output matches /$1/ but should not"; }

case "$CASE" in
  acceptance)
    # The issue's acceptance command: the reference backend on the CPU, errors far below bf16's.
    run run --b 2 --h 8 --hkv 2 --sq 128 --skv 256 --d 64 --mask causal_bottom_right \
      --layout thd --bwd --check --device cpu
    expect_rc 0
    expect_output '^backend: +reference$'
    for out in o lse dq dk dv; do expect_output "^  $out +rel_error 0 .*PASS$"; done
    expect_output '^result: +PASS$'
    expect_output '^time fwd: .*TFLOP/s$'
    expect_output '^time bwd: .*TFLOP/s$'
    ;;
  acceptance_device_auto)
    # The same command exactly as the issue gives it: the device is chosen automatically (the
    # GPU and its backends on a GPU machine), checked against the reference on host copies.
    run run --b 2 --h 8 --hkv 2 --sq 128 --skv 256 --d 64 --mask causal_bottom_right \
      --layout thd --bwd --check
    expect_rc 0
    for out in o lse dq dk dv; do expect_output "^  $out +rel_error .*PASS$"; done
    expect_output '^result: +PASS$'
    ;;
  explain_cpu)
    run explain --device cpu --mask causal --h 4 --hkv 1
    expect_rc 0
    expect_output '^backend: +reference$'
    expect_output '^  reference +accepts \(chosen\)$'
    expect_no_output 'rel_error|TFLOP'  # explain prints only the selection
    ;;
  explain_names_every_backend)
    # On a machine without a GPU no backend runs CUDA tensors: every backend says why. With a GPU
    # a backend is chosen; every backend is still listed with its verdict.
    run explain --device cuda --sq 1 --skv 64 --d 128
    for backend in small_seq cudnn flash reference; do
      expect_output "^  $backend +(unavailable|refuses|accepts|not asked)"
    done
    if grep -q 'no CUDA device' "$OUT"; then
      expect_rc 1
      expect_output '^backend: +none$'
    fi
    # A forced backend that refuses (small_seq runs only sq = 1 on CUDA tensors; here sq = 128)
    # gives its reason, and explain exits 1.
    run explain --device cpu --backend small_seq
    expect_rc 1
    expect_output '^backend: +none$'
    expect_output "^selection: .*small_seq"
    ;;
  backends)
    run backends
    expect_rc 0
    for backend in small_seq cudnn flash reference; do
      expect_output "^  $backend +(available|unavailable: .+)$"
    done
    expect_output '^  reference +available$'
    ;;
  version)
    run --version
    expect_rc 0
    expect_output '^fusedattn [0-9]+\.[0-9]+\.[0-9]+ '
    ;;
  bad_options)
    # Usage errors: exit 2 and one line naming the option.
    check_usage() {
      local pattern="$1"
      shift
      run "$@"
      expect_rc 2
      expect_output "^fusedattn: .*$pattern"
      [ "$(wc -l <"$OUT")" -eq 1 ] || fail "expected a one-line message"
    }
    check_usage "'--bogus'" run --bogus
    check_usage "--b needs a value" run --b
    check_usage "--b: 'x' is not an integer" run --b x
    check_usage "--sq: 0 is out of range" run --sq 0
    check_usage "--dropout: 1 is out of range" run --dropout 1
    check_usage "--softcap: 'nan' is not a finite number" run --softcap nan
    check_usage "--dtype: 'fp64' is not one of" explain --dtype fp64
    check_usage "--window: '3' is not two integers" run --window 3
    check_usage "--bias-shape" run --bias pre_scale --bias-shape 2,1
    check_usage "--bwd is a flag" run --bwd=1
    check_usage "--lengths: per-sequence lengths need" run --lengths 4,4
    check_usage "--lengths: give --b = 2 lengths" run --layout thd --lengths 4,4,4
    check_usage "--lengths: query length 4 differs from --sq = 128" run --page-size 16 \
      --lengths 4,4:9,9
    check_usage "--page-size: -1 is out of range" run --page-size -1
    check_usage "unknown command 'bogus'" bogus
    ;;
  help_lists_every_option)
    # Every option of the table (fusedattn options) is documented, with its default, in the
    # help of run, of explain and of the program.
    run options
    expect_rc 0
    mapfile -t options <"$OUT"
    [ "${#options[@]}" -gt 30 ] || fail "only ${#options[@]} options listed"
    for help in "run --help" "explain --help" "--help"; do
      run $help
      expect_rc 0
      for option in "${options[@]}"; do
        grep -qE -- "^  $option( |$)" "$OUT" || fail "$option is not documented"
      done
    done
    run run --help
    expect_output '^  --b N +batch.*\[default: 2\]'
    expect_output '\[default: bf16\]'
    ;;
  invalid_problem)
    # The library's validation message, and a non-zero exit (not a usage error).
    run run --h 8 --hkv 3
    expect_rc 1
    expect_output 'invalid problem: config.heads_kv = 3 does not divide config.heads_q = 8'
    run explain --mask causal --window 4,2
    expect_rc 1
    expect_output 'config.window_right = 2'
    ;;
  features)
    # A few feature combinations run and pass on the CPU (small, so the check is automatic).
    for args in \
      "--dtype fp32 --bias pre_scale --bias-shape b,h --bias-grad --bwd" \
      "--dtype fp16 --layout sbhd --bias post_scale --bias-dtype same --bwd" \
      "--mask padding_causal --window 8,-1 --bias alibi --softmax sink --softcap 20 --dropout 0.1 --max-logit --bwd" \
      "--layout thd --thd-gaps --lse-packed --softmax off_by_one --bwd" \
      "--q-layout bhsd --kv-layout sbhd --padded-strides --dqk 32 --dv 48 --bwd"; do
      run run --device cpu --b 2 --h 4 --hkv 2 --sq 24 --skv 40 --d 16 --iters 1 $args
      expect_rc 0
      expect_output '^result: +PASS$'
    done
    ;;
  lengths)
    # Explicit lengths: FLOPs count exactly the visible pairs (causal top-left, q 5 and 0 rows,
    # kv 7 and 3 keys: 1+2+3+4+5 = 15 pairs).
    run run --device cpu --layout thd --mask causal --b 2 --h 2 --sq 8 --skv 8 --d 8 \
      --lengths 5,0:7,3 --bwd --iters 1
    expect_rc 0
    expect_output '^lengths: +q 5,0  kv 7,3$'
    expect_output '^flops: +15 visible'
    ;;
  json)
    # --json: one JSON object on stdout with the documented keys (README, "The program"), parsed
    # by Python's json module.
    PY="${PYTHON:-python3}"
    check_json() {
      local script="$1"
      "$PY" -c "import json, sys
d = json.load(open(sys.argv[1]))
$script" "$OUT" || fail "JSON check failed: $script"
    }
    "$FUSEDATTN" backends --json >"$OUT" 2>/dev/null; RC=$?; LAST="fusedattn backends --json"
    expect_rc 0
    check_json "
assert set(d) >= {'version', 'cuda_device', 'cuda_architectures', 'backends'}, d
assert isinstance(d['cuda_device'], bool) and isinstance(d['cuda_architectures'], str)
names = [b['name'] for b in d['backends']]
assert names == ['small_seq', 'cudnn', 'flash', 'reference'], names
for b in d['backends']:
    assert set(b) == {'name', 'available', 'reason'}, b
    assert isinstance(b['available'], bool)
    assert (b['reason'] is None) == b['available'], b
assert d['backends'][3]['available'] is True"
    "$FUSEDATTN" explain --json --device cpu --mask causal >"$OUT" 2>/dev/null; RC=$?
    LAST="fusedattn explain --json --device cpu --mask causal"
    expect_rc 0
    check_json "
assert set(d) == {'problem', 'device', 'backend', 'selection', 'backends', 'error'}, set(d)
assert d['device'] == 'cpu' and d['backend'] == 'reference' and d['error'] is None, d
for b in d['backends']:
    assert set(b) == {'name', 'verdict', 'reason', 'note', 'chosen'}, b
    assert b['verdict'] in ('accepts', 'refuses', 'unavailable', 'not_asked'), b
assert [b['name'] for b in d['backends'] if b['chosen']] == ['reference']"
    "$FUSEDATTN" run --json --device cpu --b 2 --h 2 --sq 8 --skv 8 --d 8 --layout thd \
      --lengths 5,0:7,3 --mask causal --bwd --iters 2 --dtype bfloat16 >"$OUT" 2>/dev/null
    RC=$?; LAST="fusedattn run --json ..."
    expect_rc 0
    check_json "
keys = {'problem', 'device', 'backend', 'selection', 'backends', 'lengths', 'pages', 'check',
        'flops', 'time', 'result', 'error'}
assert set(d) == keys, set(d) ^ keys
assert d['result'] == 'PASS' and d['error'] is None and d['backend'] == 'reference', d
assert d['lengths'] == {'q': [5, 0], 'kv': [7, 3]}, d['lengths']
assert d['pages'] is None, d['pages']
c = d['check']
assert set(c) == {'performed', 'reason', 'tolerance', 'outputs'} and c['performed'] is True
assert [o['name'] for o in c['outputs']] == ['o', 'lse', 'dq', 'dk', 'dv'], c['outputs']
for o in c['outputs']:
    assert set(o) == {'name', 'rel_error', 'max_abs_error', 'passed'} and o['passed'] is True
assert d['flops']['visible_pairs'] == 15 and set(d['flops']) == {'visible_pairs', 'dense_pairs', 'fwd_gflop', 'bwd_gflop'}
t = d['time']
assert set(t) == {'clock', 'iters', 'fwd_ms', 'fwd_tflops', 'bwd_ms', 'bwd_tflops'} and t['iters'] == 2, t
assert 'bfloat16' in d['problem'], d['problem']"
    # Errors keep the JSON form: an invalid problem gives "error" and exit 1.
    "$FUSEDATTN" run --json --h 8 --hkv 3 --device cpu >"$OUT" 2>/dev/null; RC=$?
    LAST="fusedattn run --json --h 8 --hkv 3"
    expect_rc 1
    check_json "
assert d['result'] == 'error' and 'heads_kv = 3' in d['error'], d"
    ;;
  quiet_verbose)
    run run --device cpu --h 2 --sq 8 --d 8 --iters 1 --quiet
    expect_rc 0
    [ "$(cat "$OUT")" = "result:     PASS" ] || fail "--quiet run printed more than the result line"
    run explain --device cpu -q
    expect_rc 0
    [ "$(cat "$OUT")" = "reference" ] || fail "-q explain printed more than the backend"
    run backends -q
    expect_rc 0
    expect_output '^reference available$'
    [ "$(wc -l <"$OUT")" -eq 4 ] || fail "backends -q: expected one line per backend"
    run run --device cpu --h 2 --sq 8 --d 8 --iters 2 --verbose
    expect_rc 0
    expect_output '^fusedattn: +[0-9]+\.[0-9]+\.[0-9]+ \(GPU code for '
    expect_output '^  fwd calls \(ms\):( [0-9.e+-]+){2}$'
    run backends --bogus
    expect_rc 2
    ;;
  dtype_spellings)
    # Every spelling of each dtype, in --dtype and --bias-dtype; the output names the dtype as
    # the library does (bfloat16, float16, float32).
    for spelling in bf16:bfloat16 bfloat16:bfloat16 fp16:float16 float16:float16 half:float16 \
                    fp32:float32 float32:float32; do
      run explain --device cpu --dtype "${spelling%%:*}"
      expect_rc 0
      expect_output "${spelling#*:}"
    done
    run run --device cpu --h 2 --sq 8 --d 8 --iters 1 --dtype half --bias post_scale \
      --bias-dtype float16
    expect_rc 0
    expect_output '^result: +PASS$'
    run run --device cpu --dtype bf16 --bias post_scale --bias-dtype float32 --iters 1 --sq 8 --d 8
    expect_rc 0
    run run --device cpu --dtype bf16 --bias post_scale --bias-dtype half
    expect_rc 2
    expect_output "--bias-dtype: float16 is neither float32 nor --dtype \(bfloat16\)"
    ;;
  paged)
    # Paged K/V on the CPU: chunked prefill (thd queries, pages bshd by default there) and
    # decode (bhsd pages), every output checked against the reference; the key lengths and the
    # pool are printed.
    run run --device cpu --page-size 4 --layout thd --mask causal_bottom_right --b 3 --h 4 \
      --hkv 2 --sq 4 --skv 13 --d 8 --lengths 4,1,0:13,5,0 --lse --iters 1
    expect_rc 0
    expect_output '^problem: .* q:THD kv:BSHD .*paged\(page_size=4\)'
    expect_output '^lengths: +q 4,1,0  kv 13,5,0$'
    expect_output '^pages: +[0-9]+ of 4 tokens in a shuffled pool \(2 spare\), table \[3, 4\]$'
    for out in o lse; do expect_output "^  $out +rel_error 0 .*PASS$"; done
    expect_output '^result: +PASS$'
    run run --device cpu --page-size 16 --kv-layout bhsd --mask causal_bottom_right --b 2 \
      --h 8 --hkv 2 --sq 1 --skv 40 --d 16 --softcap 30 --softmax sink --iters 1
    expect_rc 0
    expect_output '^result: +PASS$'
    # Forward only: --bwd is an invalid problem.
    run run --device cpu --page-size 16 --bwd
    expect_rc 1
    expect_output 'invalid problem: config.is_training = 1 with config.page_size = 16: paged K/V is forward only'
    # On CUDA tensors every GPU backend refuses paged K/V, naming it (or is not available here),
    # and the reference runs only when forced.
    run explain --device cuda --page-size 16 --sq 1 --skv 4096 --d 128
    for backend in small_seq cudnn flash; do
      expect_output "^  $backend +(unavailable: .*|refuses: paged K/V \(page_size = 16\).*)$"
    done
    run explain --device cpu --page-size 16 --json
    expect_rc 0
    "${PYTHON:-python3}" -c "import json, sys
d = json.load(open(sys.argv[1]))
assert d['backend'] == 'reference' and 'paged(page_size=16)' in d['problem'], d" "$OUT" \
      || fail "explain --json of a paged problem"
    ;;
  *)
    echo "unknown case '$CASE'"
    exit 2
    ;;
esac
exit $FAILED
