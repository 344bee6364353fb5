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
#   spec     speculative decoding's speed-up, greedy, TG tokens after examples/prompts/code-rewrite.txt
#            and open-ended.txt: the Qwen demo with --lookup-decoding against llama.cpp plain and with
#            its prompt lookup; the demo drafting for its own weights in f32 (llama.cpp's quantiser
#            writes that file once: the stand-in for a model ~5x the draft's size)
# The llama.cpp comparisons need llama-cpp-python (`pip install 'fuel-llm[llama-cpp]'`; on AMX CPUs see the README's Peers), the random-weight
# files `pip install libgguf gguf` (examples/synthetic_gguf.py writes them into SYNTH, once), the
# safetensors directories transformers (examples/gguf_to_safetensors.py writes them, once).
# Env: FUEL (default `fuel`), THREADS (-t), REPS (-r, default 3), PP / TG (defaults 512 / 128),
#      SYNTH (default $FUEL_HOME/synthetic), ACTIVATIONS (--activations: int16, the default, or q8). Keep the machine otherwise idle while it runs.
set -euo pipefail

OUT=${1:-bench-results}
FUEL=${FUEL:-fuel}
REPS=${REPS:-3}
PP=${PP:-512}
TG=${TG:-128}
SECTIONS=${SECTIONS:-demos kquants formats dirs first spec}
HOME_DIR=${FUEL_HOME:-$HOME/.cache/fuel}
SYNTH=${SYNTH:-$HOME_DIR/synthetic}
HERE=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$OUT" "$SYNTH"

common=(-p "$PP" -n "$TG" -r "$REPS" --no-progress)
[ -n "${THREADS:-}" ] && common+=(-t "$THREADS")
[ -n "${ACTIVATIONS:-}" ] && common+=(--activations "$ACTIVATIONS")

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

widened() {  # widened FILE FTYPE NAME -> FILE requantised by llama.cpp to FTYPE (0: f32), written once
    local f="$SYNTH/$3.gguf"
    [ -f "$f" ] || python -c 'import sys, llama_cpp
p = llama_cpp.llama_model_quantize_default_params()
p.ftype, p.allow_requantize = int(sys.argv[3]), True
sys.exit(llama_cpp.llama_model_quantize(sys.argv[1].encode(), sys.argv[2].encode(), p))' "$1" "$f" "$2" >&2 2>/dev/null
    echo "$f"
}

spec() {  # spec NAME MODEL PROMPT [extra bench args]
    local name=$1 model=$2 prompt=$3
    shift 3
    echo "== $name: speculation on $prompt" >&2
    # shellcheck disable=SC2086
    $FUEL bench "$model" -f "$HERE/prompts/$prompt.txt" -n "$TG" -r "$REPS" --no-progress "$@" | tee "$OUT/$name.md"
    echo
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
        spec)
            qwen=$(python -c 'import json, subprocess, sys
rows = json.loads(subprocess.run(sys.argv[1:], capture_output=True, text=True, check=True).stdout)
print(next(r["path"] for r in rows if r["name"] == "qwen2.5-coder-0.5b"))' $FUEL ls --json)
            for prompt in code-rewrite open-ended; do
                spec "spec-lookup-$prompt" qwen2.5-coder-0.5b "$prompt" --lookup-decoding --compare llama.cpp
                spec "spec-draft-$prompt" "$(widened "$qwen" 0 qwen2.5-coder-0.5b-f32)" "$prompt" \
                    --draft-model qwen2.5-coder-0.5b
            done ;;
        *) echo "unknown section $section" >&2; exit 2 ;;
    esac
done
