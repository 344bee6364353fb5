#!/usr/bin/env bash
# The commands behind the performance tables (README, docs/performance.md; llama-bench style: pp512
# / tg128 after a warm-up, random token ids; fuel and the peer, in a process of its own, interleaved
# run by run, so the ratios hold on a noisy machine even when the absolute figures move).
#
#   examples/bench.sh [OUT_DIR]          # writes OUT_DIR/NAME.md and NAME.json (default ./bench-results)
#
# Sections (SECTIONS, default all, space-separated):
#   demos    the two demo GGUF files against llama.cpp, at depth 0 and 2048
#   kquants  a Q4_K_M file in Qwen2-1.5B's shape (random weights: 168 Q4_K + 29 Q6_K tensors, the
#            most common download) against llama.cpp
#   formats  one file per weight format fuel reads, random weights, against llama.cpp: Qwen2-0.5B's
#            shape for f32 f16 bf16 q8_0 q4_0 q4_1 q5_0, Qwen2-1.5B's for the K-quants, q5_1 and the
#            IQ types (K-quants need rows that are multiples of 256)
#   dirs     both demos as bf16 safetensors directories against transformers (float32)
#   first    seconds to the first token of `fuel run` (empty and warm kernel cache) against
#            llama.cpp's load + first token, on the Qwen demo
# The llama.cpp comparisons need llama-cpp-python (`pip install 'fuel-llm[llama-cpp]'`; on AMX CPUs see the README's Peers), the random-weight
# files `pip install libgguf gguf` (examples/synthetic_gguf.py writes them into SYNTH, once), the
# safetensors directories transformers (examples/gguf_to_safetensors.py writes them, once).
# Env: FUEL (default `fuel`), THREADS (-t), REPS (-r, default 3), PP / TG (defaults 512 / 128),
#      SYNTH (default $FUEL_HOME/synthetic). Keep the machine otherwise idle while it runs.
set -euo pipefail

OUT=${1:-bench-results}
FUEL=${FUEL:-fuel}
REPS=${REPS:-3}
PP=${PP:-512}
TG=${TG:-128}
SECTIONS=${SECTIONS:-demos kquants formats dirs first}
HOME_DIR=${FUEL_HOME:-$HOME/.cache/fuel}
SYNTH=${SYNTH:-$HOME_DIR/synthetic}
HERE=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$OUT" "$SYNTH"

common=(-p "$PP" -n "$TG" -r "$REPS" --no-progress)
[ -n "${THREADS:-}" ] && common+=(-t "$THREADS")

run() {  # run NAME MODEL PEER [extra bench args]
    local name=$1 model=$2 peer=$3
    shift 3
    echo "== $name: $model vs $peer" >&2
    # shellcheck disable=SC2086  # FUEL may be a command with arguments
    $FUEL bench "$model" "${common[@]}" --compare "$peer" "$@" -o json >"$OUT/$name.json"
    python - "$OUT/$name.json" >"$OUT/$name.md" <<'EOF'
import json, sys

from fuelcli.measure import bench as B

print(B.render_md(B.report_from_dict(json.load(open(sys.argv[1])))), end="")
EOF
    cat "$OUT/$name.md"
    echo
}

synthetic() {  # synthetic SHAPE TYPE -> path of the file, written once
    local f="$SYNTH/$1-$2.gguf"
    [ -f "$f" ] || python "$HERE/synthetic_gguf.py" --shape "$1" --type "$2" "$f" >&2
    echo "$f"
}

hf_dir() {  # hf_dir ALIAS -> a bf16 safetensors directory of a demo model, written once
    local d="$HOME_DIR/$1-hf-bf16"
    [ -f "$d/config.json" ] || python "$HERE/gguf_to_safetensors.py" "$1" "$d" >&2
    echo "$d"
}

# shellcheck disable=SC2086
$FUEL pull smollm2-135m qwen2.5-coder-0.5b >&2

for section in $SECTIONS; do
    case $section in
        demos)
            run smollm2-135m-q4_1 smollm2-135m llama.cpp -d 0,2048
            run qwen2.5-coder-0.5b-q4_k_m qwen2.5-coder-0.5b llama.cpp -d 0,2048 ;;
        kquants)
            run qwen2-1.5b-q4_k_m "$(synthetic qwen2-1.5b q4_k_m)" llama.cpp ;;
        formats)
            for t in f32 f16 bf16 q8_0 q4_0 q4_1 q5_0; do
                run "qwen2-0.5b-$t" "$(synthetic qwen2-0.5b "$t")" llama.cpp
            done
            for t in q2_k q3_k q4_k q5_k q6_k q5_1 iq3_xxs iq3_s iq4_nl iq4_xs iq2_xxs iq2_xs iq2_s iq1_s iq1_m tq2_0 tq1_0 mxfp4; do
                run "qwen2-1.5b-$t" "$(synthetic qwen2-1.5b "$t")" llama.cpp
            done ;;
        dirs)
            run smollm2-135m-bf16-dir "$(hf_dir smollm2-135m)" transformers
            run qwen2.5-coder-0.5b-bf16-dir "$(hf_dir qwen2.5-coder-0.5b)" transformers ;;
        first)
            echo "== first token: qwen2.5-coder-0.5b" >&2
            # shellcheck disable=SC2086
            $FUEL bench qwen2.5-coder-0.5b --first-token --compare llama.cpp -r "$REPS" --no-progress \
                | tee "$OUT/first-token.md" ;;
        *) echo "unknown section $section" >&2; exit 2 ;;
    esac
done
