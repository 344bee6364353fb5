#!/usr/bin/env bash
# Check fuel's CUDA backend on a machine with an NVIDIA GPU and no internet, in under 8 minutes, as
# it is: on a lent H200 (python3 3.12, a CUDA 13 driver, numba-cuda and torch installed, no gguf).
#
#   examples/gpu-check.sh [--wheels DIR] [--dry-run] [--simulator]
#   examples/gpu-check.sh --fetch-wheels DIR     # on a machine with PyPI: the wheels below, into DIR
#   examples/gpu-check.sh --list-wheels          # the wheels, one name==version a line
#
# First the facts (python3, the packages' versions, the driver, where NVVM was found), then one step
# per line, each in its own process under `timeout -k`, going on after a failure:
#   gpu       the device as numba-cuda sees it
#   bench     `fuel bench --device cuda` (pp512, tg128) on a Llama-8B-shaped Q4_K GGUF of random
#             weights written here (examples/synthetic_gguf.py), its tg128 again through numba-cuda's
#             own launch path (FUEL_CUDA_LAUNCH=numba), then Q8_0 on 8 of its layers
#   diff      `fuel diff --device cuda --oracle self --layers` on tiny checkpoints of the families
#   ptx       every kernel compiled to PTX for sm_90, with ptxas -v's registers and spills
#   tests     tests/test_cuda_*.py with the simulator off (kernels against the CPU decode, the four
#             families against transformers and the CPU engine, the commands): last, the slowest
# A summary table last; with $OUT set (or --out DIR) also $OUT/summary.md and one archive of every log
# and bench table, $OUT/gpu-check-logs.tar.gz. Exit 0 when no step failed. Steps stop starting once
# BUDGET seconds (default 450) are spent; each step's limit is cut to what is left.
#
# Wheels: the packages the machine lacks travel as wheels (cp312, manylinux; 0.5 MB in all):
#   gguf, the tests' format oracle and the synthetic GGUF's writer; libgguf, its K-quant quantiser.
# `--wheels DIR` (default ./.whl when it exists) installs those of them that are missing into a
# folder on PYTHONPATH, offline. numba-cuda and NVVM are the machine's own: NVVM from the CUDA
# toolkit (CUDA_HOME, else /usr/local/cuda); NVIDIA's nvidia-nvvm wheel (75 MB) would not travel.
# --simulator runs the same steps on numba's CUDA simulator (no GPU; slow: tiny models only).
# PYTHON names the interpreter (default python3).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2

WHEELS_LIST=(gguf==0.19.0 libgguf==0.2.2)
WHEEL_MODULES=(gguf libgguf)
PLATFORMS=(manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_24_x86_64 manylinux_2_17_x86_64
           manylinux2014_x86_64 manylinux1_x86_64)

PY=${PYTHON:-python3}
WHEELS="" OUTDIR=${OUT:-} DRY=0 SIM=0
[ -d .whl ] && WHEELS=.whl
usage() { sed -n '2,30p' "$0"; exit 2; }
while (($#)); do
    case $1 in --wheels | --out | --fetch-wheels) (($# >= 2)) || { echo "$1 needs a folder" >&2; exit 2; } ;; esac
    case $1 in
        --wheels) WHEELS=$2; shift 2 ;;
        --out) OUTDIR=$2; shift 2 ;;
        --dry-run) DRY=1; shift ;;
        --simulator) SIM=1; shift ;;
        --list-wheels) printf '%s\n' "${WHEELS_LIST[@]}"; exit 0 ;;
        --fetch-wheels)
            dir=$2
            args=(--no-deps --only-binary=:all: --python-version 3.12 --implementation cp -d "$dir")
            for p in "${PLATFORMS[@]}"; do args+=(--platform "$p"); done
            "$PY" -m pip download "${args[@]}" "${WHEELS_LIST[@]}" || exit 5
            du -ch "$dir"/*.whl | tail -n 1
            exit 0 ;;
        *) usage ;;
    esac
done

WORK=${TMPDIR:-/tmp}/fuel-gpu-check
mkdir -p "$WORK/logs"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}  # this checkout's fuel, installed or not
# no network there: a test that would fetch (pip download) fails at once and skips, no retries
export PIP_RETRIES=0 PIP_TIMEOUT=5
export HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 NUMBA_ENABLE_CUDASIM=$SIM NUMBA_CACHE_DIR=$WORK/numba-cache
FUEL=("$PY" -m fuelcli)
if ((SIM)); then  # the simulator's speed-ups and warp shuffle (tests/cuda_sim.py) for the commands too
    FUEL=("$PY" -c "import sys; sys.path.insert(0, 'tests'); import cuda_sim; cuda_sim.speed_up()
from fuelcli.cli import main; main()")
fi
BUDGET=${BUDGET:-450} START=$SECONDS ROWS=()

have() { "$PY" -c "import $1" >/dev/null 2>&1; }

# step NAME LIMIT CMD...: CMD in its own process, its output in logs/NAME.log; one table row
step() {
    local name=$1 limit=$2; shift 2
    local log="$WORK/logs/$name.log"
    if ((DRY)); then
        printf 'DRY   %-30s %4ss  %s\n' "$name" "$limit" "$*"
        ROWS+=("| $name | planned | - | - | limit ${limit}s |")
        return 0
    fi
    local left=$((BUDGET - (SECONDS - START)))
    if ((left < 15)); then
        ROWS+=("| $name | SKIP | - | - | the ${BUDGET}s budget was spent |")
        printf 'SKIP  %-30s (the %ss budget was spent)\n' "$name" "$BUDGET"
        return 1
    fi
    ((limit > left)) && limit=$left
    local t0=$SECONDS rc
    timeout -k 10 "$limit" "$@" >"$log" 2>&1
    rc=$?
    local took=$((SECONDS - t0)) verdict=PASS note=""
    if ((rc != 0)); then
        verdict=FAIL
        ((rc == 124 || rc == 137)) && note="timed out at ${limit}s"
        [ -z "$note" ] && note=$(grep -v '^\s*$' "$log" | tail -n 1 | cut -c1-120 | tr '|' '/')
    fi
    ROWS+=("| $name | $verdict | $took | $rc | $note |")
    printf '%-5s %-30s %4ss  exit %s  %s\n' "$verdict" "$name" "$took" "$rc" "$note"
    ((rc == 0)) || tail -n 8 "$log" | sed 's/^/      /'
    return $rc
}

# ---------------------------------------------------------------- wheels, then the facts
if ((DRY)); then
    echo "DRY   install from ${WHEELS:-(no --wheels DIR)} whichever of ${WHEEL_MODULES[*]} python3 lacks (pip --no-index --target)"
elif [ -n "$WHEELS" ]; then
    site=$WORK/site
    for i in "${!WHEEL_MODULES[@]}"; do
        mod=${WHEEL_MODULES[$i]} name=${WHEELS_LIST[$i]%%==*}
        have "$mod" && continue
        whl=$(find "$WHEELS" -maxdepth 1 -name "${name//-/_}-*.whl" | head -n 1)
        if [ -z "$whl" ]; then echo "note: $mod is missing and $WHEELS has no $name wheel"; continue; fi
        "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" "$whl" \
            && echo "installed $(basename "$whl") into $site"
    done
    [ -d "$site" ] && export PYTHONPATH=$PYTHONPATH:$site
fi
if [ -z "${CUDA_HOME:-}" ] && ls /usr/local/cuda/nvvm/lib64/libnvvm.so* >/dev/null 2>&1; then
    export CUDA_HOME=/usr/local/cuda  # where numba-cuda looks for the toolkit's NVVM
fi

echo "== facts"
if ((DRY)); then
    echo "DRY   python3 -V; versions of numba numba-cuda llvmlite cuda-bindings numpy torch transformers gguf libgguf"
    echo "DRY   nvidia-smi (name, driver, memory); NVVM's path and version; CUDA_HOME; ptxas --version"
else
    {
        "$PY" -V
        "$PY" - <<'EOF'
import importlib.metadata as md
for name in ("numba", "numba-cuda", "llvmlite", "cuda-bindings", "cuda-core", "numpy", "torch", "transformers",
             "gguf", "libgguf", "pytest"):
    try:
        print(f"{name} {md.version(name)}")
    except md.PackageNotFoundError:
        print(f"{name} missing")
try:
    from numba.cuda.cudadrv.nvvm import NVVM
    from numba.cuda.cuda_paths import get_cuda_paths

    print("NVVM", NVVM().get_version(), "from", get_cuda_paths()["nvvm"])
except Exception as e:
    print("NVVM not found:", " ".join(str(e).split())[:200])
EOF
        echo "CUDA_HOME ${CUDA_HOME:-unset}"
        command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used \
            --format=csv,noheader
        command -v ptxas >/dev/null && ptxas --version | tail -n 1
    } 2>&1 | tee "$WORK/logs/facts.log"
fi

# ---------------------------------------------------------------- the steps
echo "== steps"
step gpu 60 "$PY" -c "from fuelcli.backends.cuda.runtime import require; d = require().get_current_device(); \
print(getattr(d, 'name', b'simulator'), 'compute capability', d.compute_capability)"

TINY=(qwen2_window qwen3_bias_headdim qwen3_moe_norm_false llama31) TOKENS=5,17,200,3,99,42,7,128,64,31
((SIM)) && TINY=(qwen2_window llama31) TOKENS=5,17,200,3,99
# tests/tiny_models.py's random checkpoints (torch, transformers), for the diffs and the simulator's bench
step write-tiny 90 "$PY" -c "import sys; sys.path.insert(0, 'tests')
from tiny_models import write_tiny
for case in sys.argv[2:]: write_tiny(case, sys.argv[1])" "$WORK/tiny" "${TINY[@]}"
bench() {  # [LAUNCH=numba] bench NAME MODEL LIMIT ARGS...: the table goes to $WORK/logs/NAME.md too
    local name=$1 model=$2 limit=$3; shift 3
    step "$name" "$limit" env FUEL_CUDA_LAUNCH="${LAUNCH:-}" "${FUEL[@]}" bench "$model" --device cuda --no-progress "$@" \
        && ((!DRY)) && cp "$WORK/logs/$name.log" "$WORK/logs/$name.md"
}
if ((SIM)); then
    bench bench-tiny-simulator "$WORK/tiny/llama31" 600 -p 4 -n 2 -r 1
else
    q4=$WORK/llama-8b-q4_k.gguf q8=$WORK/llama-8b-q8_0-8-layers.gguf
    { [ -s "$q4" ] && ((!DRY)); } || step write-llama-8b-q4_k 120 "$PY" examples/synthetic_gguf.py "$q4" \
        --shape llama-8b --type q4_k
    bench bench-llama-8b-q4_k "$q4" 150 -p 512 -n 128 -r 3
    # the same decode through numba-cuda's own launch path (backends/cuda/launcher.py's reason)
    LAUNCH=numba bench bench-llama-8b-q4_k-numba-launch "$q4" 90 -p 0 -n 128 -r 3
    { [ -s "$q8" ] && ((!DRY)); } || step write-llama-8b-q8_0 60 "$PY" examples/synthetic_gguf.py "$q8" \
        --shape llama-8b --type q8_0 --layers 8
    bench bench-llama-8b-q8_0-8L "$q8" 90 -p 512 -n 128 -r 2
fi

for case in "${TINY[@]}"; do
    step "diff-tiny-$case" 60 "${FUEL[@]}" diff "$WORK/tiny/$case" --device cuda --oracle self --tokens "$TOKENS" --layers
done

# the PTX of every kernel, with ptxas -v's registers and spills
step ptx-sm_90 120 env NUMBA_ENABLE_CUDASIM=0 "$PY" -m fuelcli.backends.cuda.ptx sm_90 --facts

# last, with what is left of the budget: the kernel and model tests (every format's kernels compile)
TESTS=(tests/test_cuda_kernels.py tests/test_cuda_models.py tests/test_cuda_cli.py)
step tests-cuda $((SIM ? 1500 : 300)) "$PY" -m pytest -q -p no:cacheprovider --no-header -rfE "${TESTS[@]}"

# ---------------------------------------------------------------- summary
TABLE=$(printf '%s\n' "| step | result | s | exit | note |" "| --- | --- | --- | --- | --- |" "${ROWS[@]}")
printf '\n== summary (%ss)\n%s\n' "$((SECONDS - START))" "$TABLE"
for md in "$WORK"/logs/bench-*.md; do [ -e "$md" ] && printf '\n%s\n' "$(cat "$md")"; done
if ((DRY)); then
    echo "DRY   with \$OUT (or --out DIR): summary.md and gpu-check-logs.tar.gz there"
    exit 0
fi
failed=$(printf '%s\n' "${ROWS[@]}" | grep -c '| FAIL |')
if [ -n "$OUTDIR" ]; then
    mkdir -p "$OUTDIR"
    printf '%s\n' "$TABLE" >"$OUTDIR/summary.md"
    tar -czf "$OUTDIR/gpu-check-logs.tar.gz" -C "$WORK" logs
    echo "wrote $OUTDIR/summary.md and $OUTDIR/gpu-check-logs.tar.gz"
fi
exit $((failed > 0))
