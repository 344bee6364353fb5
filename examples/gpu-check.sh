#!/usr/bin/env bash
# Check fuel's CUDA backend on a machine with an NVIDIA GPU and no internet, in under 8 minutes:
#
#   examples/gpu-check.sh [--wheels DIR] [--out DIR] [--layers N] [--dry-run] [--simulator]
#
#  1. numba-cuda and the CUDA toolkit wheels: used when installed, else installed from --wheels DIR
#     (pip --no-index; also gguf, libgguf and pytest when missing and found there);
#  2. the GPU as numba-cuda sees it;
#  3. the CUDA tests with the simulator off (tests/test_cuda_*.py: per-format kernels against the CPU
#     kernels, four families against transformers and the CPU engine; needs pytest, torch, transformers);
#  4. `fuel bench --device cuda` (pp512, tg128) on a Llama-8B-shaped GGUF of random weights in Q4_K and
#     in Q8_0, written here by examples/synthetic_gguf.py (--layers N: fewer layers, a smaller file);
#  5. `fuel diff --device cuda --oracle self --layers` on tiny checkpoints of the four families
#     (tests/tiny_models.py) and on the demo GGUFs when pulled (FUEL_HOME, default ~/.cache/fuel).
#
# One line per check: PASS / FAIL (with the log's tail) / SKIP (and why), then the bench tables.
# Exit 0 when nothing failed. Logs and written files stay in --out (default $TMPDIR/fuel-gpu-check).
# --dry-run prints the checks without running them. --simulator runs them on numba's CUDA simulator
# instead (no GPU needed; slow: tiny models only, no demo GGUFs, the bench on a tiny checkpoint; up to 25 min).
# PYTHON names the interpreter (default python). Checks stop starting after BUDGET seconds (450).
set -uo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python}
WHEELS="" OUT=${TMPDIR:-/tmp}/fuel-gpu-check LAYERS="" DRY=0 SIM=0
while (($#)); do
    case $1 in
        --wheels) WHEELS=$2; shift 2 ;;
        --out) OUT=$2; shift 2 ;;
        --layers) LAYERS=$2; shift 2 ;;
        --dry-run) DRY=1; shift ;;
        --simulator) SIM=1; shift ;;
        *) sed -n '2,20p' "$0"; exit 2 ;;
    esac
done
mkdir -p "$OUT/logs"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}  # this checkout's fuel, installed or not
export HF_HUB_OFFLINE=1 NUMBA_ENABLE_CUDASIM=$SIM NUMBA_CACHE_DIR=$OUT/numba-cache  # one kernel cache for every step
FUEL=("$PY" -m fuelcli)
BUDGET=${BUDGET:-450} START=$SECONDS FAILED=0 TABLES=()
if ((SIM)); then  # the simulator's speed-ups of the tests (tests/cuda_sim.py) for the commands too
    FUEL=("$PY" -c "import sys; sys.path.insert(0, 'tests'); import cuda_sim; cuda_sim.speed_up()
from fuelcli.cli import main; main()")
    BUDGET=${BUDGET_SIMULATOR:-1500}
fi

line() { printf '%-5s %-46s %s\n' "$1" "$2" "$3"; }
have() { "$PY" -c "import $1" >/dev/null 2>&1; }

# check NAME SECONDS CMD...: runs CMD with its output in a log, prints PASS / FAIL
check() {
    local name=$1 limit=$2; shift 2
    if ((DRY)); then line DRY "$name" "$*"; return 0; fi
    local left=$((BUDGET - (SECONDS - START)))
    if ((left < 20)); then line SKIP "$name" "(time budget of ${BUDGET}s spent)"; return 1; fi
    ((limit > left)) && limit=$left
    LOG="$OUT/logs/$(echo "$name" | tr -c 'A-Za-z0-9._-' '_').log"
    local t0=$SECONDS rc
    timeout "$limit" "$@" >"$LOG" 2>&1
    rc=$?
    if ((rc == 0)); then
        line PASS "$name" "$((SECONDS - t0))s"
    else
        FAILED=$((FAILED + 1))
        line FAIL "$name" "$((SECONDS - t0))s, exit $rc$( ((rc == 124)) && echo ' (timeout)'), log: $LOG"
        tail -n 6 "$LOG" | sed 's/^/      /'
    fi
    return $rc
}

# 1. packages
missing=()
for mod in numba_cuda gguf libgguf pytest; do have $mod || missing+=("$mod"); done
if ((${#missing[@]})) && [ -n "$WHEELS" ]; then
    pkgs=()
    for mod in "${missing[@]}"; do
        case $mod in numba_cuda) pkgs+=("numba-cuda[cu12]") ;; *) pkgs+=("$mod") ;; esac
    done
    check "pip install ${pkgs[*]} from $WHEELS" 300 \
        "$PY" -m pip install --no-index --find-links "$WHEELS" "${pkgs[@]}"
fi
if ! have numba_cuda && ((!DRY)); then
    line FAIL "numba-cuda" "not installed: pip install 'fuel[cuda]', or --wheels DIR holding its wheels"
    exit 1
fi

# 2. the device
check "GPU seen by numba-cuda" 120 "$PY" -c "from fuelcli.backends.cuda.runtime import require; \
d = require().get_current_device(); print(getattr(d, 'name', b'simulator'), 'compute capability', d.compute_capability)" \
    || exit 1
((DRY)) || line INFO "device" "$(head -n 1 "$LOG")"

# 3. the CUDA tests, simulator off (on with --simulator)
if have pytest && have torch && have transformers; then
    check "CUDA tests (tests/test_cuda_*.py)" $((SIM ? 900 : 300)) "$PY" -m pytest -q -p no:cacheprovider \
        tests/test_cuda_kernels.py tests/test_cuda_models.py tests/test_cuda_cli.py
else
    line SKIP "CUDA tests" "(needs pytest, torch and transformers: pip install '.[test]')"
fi
# each later step is a new process: it loads the kernels from this cache, or compiles them again
((DRY)) || line INFO "CUDA kernel cache" \
    "$(find "$NUMBA_CACHE_DIR" -path '*/kernels_*' -name '*.nbi' 2>/dev/null | wc -l) kernels in $NUMBA_CACHE_DIR"

# 4. fuel bench --device cuda (first: the numbers this script is run for)
bench() {  # bench NAME MODEL ARGS...
    local name=$1 model=$2; shift 2
    if check "bench cuda $name" 300 "${FUEL[@]}" bench "$model" --device cuda --no-progress "$@" && ((!DRY)); then
        TABLES+=("$(cat "$LOG")")
    fi
}
write_tiny() {  # write_tiny CASE: tests/tiny_models.py's checkpoint in $OUT/tiny/CASE (needs torch, transformers)
    ((DRY)) || [ -d "$OUT/tiny/$1" ] || "$PY" -c "import sys; sys.path.insert(0, 'tests')
from tiny_models import write_tiny; write_tiny(sys.argv[1], sys.argv[2])" "$1" "$OUT/tiny" >/dev/null 2>&1
}
if ((SIM)); then
    write_tiny llama31
    bench "tiny llama31 (simulator)" "$OUT/tiny/llama31" -p 4 -n 2 -r 1
elif have gguf && have libgguf; then
    for type in q4_k q8_0; do
        gguf=$OUT/llama-8b-$type${LAYERS:+-$LAYERS-layers}.gguf
        written=1
        { [ -s "$gguf" ] && ((!DRY)); } || check "write synthetic llama-8b $type" 300 "$PY" examples/synthetic_gguf.py \
            "$gguf" --shape llama-8b --type "$type" ${LAYERS:+--layers "$LAYERS"} || written=0
        ((written)) && bench "llama-8b $type" "$gguf" -p 512 -n 128 -r 3
    done
else
    line SKIP "bench cuda llama-8b q4_k, q8_0" "(writing the GGUFs needs gguf and libgguf)"
fi

# 5. fuel diff --device cuda --oracle self: tiny checkpoints, then the demo GGUFs
TINY=(qwen2_window qwen3_bias_headdim qwen3_moe_norm_false llama31) TOKENS=5,17,200,3,99,42,7,128,64,31
((SIM)) && TINY=(qwen2_window llama31) TOKENS=5,17,200,3,99
if have torch && have transformers; then
    for case in "${TINY[@]}"; do
        write_tiny "$case"
        check "diff cuda/self tiny $case" 180 "${FUEL[@]}" diff "$OUT/tiny/$case" --device cuda --oracle self \
            --tokens "$TOKENS" --layers
    done
else
    line SKIP "diff cuda/self on tiny checkpoints" "(writing them needs torch and transformers)"
fi
for alias in smollm2-135m qwen2.5-coder-0.5b; do
    if ((SIM)); then
        line SKIP "diff cuda/self $alias" "(too large for the simulator)"
    elif ((DRY)) || "$PY" -c "import sys; from fuelcli.demo import path_of; sys.exit(not path_of(sys.argv[1]).exists())" "$alias"; then
        check "diff cuda/self $alias" 180 "${FUEL[@]}" diff "$alias" --device cuda --oracle self \
            --prompt "The quick brown fox jumps over the lazy dog." --layers
    else
        line SKIP "diff cuda/self $alias" "(not pulled: fuel pull $alias)"
    fi
done

for t in "${TABLES[@]}"; do printf '\n%s\n' "$t"; done
((DRY)) && exit 0
printf '\n%s in %ds\n' "$( ((FAILED)) && echo "$FAILED check(s) FAILED" || echo "all checks passed")" $((SECONDS - START))
exit $((FAILED > 0))
