#!/usr/bin/env bash
# The commands behind the README's performance tables (llama-bench style: pp512 / tg128, 5 runs each
# after a warm-up, random token ids; fuel and the peer interleaved run by run in one process).
#
#   examples/bench.sh [OUT_DIR]          # writes OUT_DIR/*.md and *.json (default ./bench-results)
#
# 1. SmolLM2-135M-Instruct as an HF safetensors directory (bf16), against transformers (float32).
#    The directory is written once by transformers from the demo GGUF (no hub access) unless
#    SMOLLM2_DIR already holds one.
# 2. The two demo GGUF files against llama.cpp (needs `pip install llama-cpp-python`, which builds
#    llama.cpp from source; not a fuel dependency).
# Env: FUEL (default `fuel`), THREADS (-t, default numba's), REPS (-r, default 5),
#      PP / TG (-p / -n, defaults 512 / 128), DEPTH (-d, default 0).
# Keep the machine otherwise idle while it runs: the numbers are only as quiet as the box.
set -euo pipefail

OUT=${1:-bench-results}
FUEL=${FUEL:-fuel}
REPS=${REPS:-5}
PP=${PP:-512}
TG=${TG:-128}
DEPTH=${DEPTH:-0}
SMOLLM2_DIR=${SMOLLM2_DIR:-${FUEL_HOME:-$HOME/.cache/fuel}/SmolLM2-135M-Instruct-hf}
mkdir -p "$OUT"

common=(-p "$PP" -n "$TG" -d "$DEPTH" -r "$REPS")
[ -n "${THREADS:-}" ] && common+=(-t "$THREADS")

# shellcheck disable=SC2086  # FUEL may be a command with arguments
$FUEL pull smollm2-135m
# shellcheck disable=SC2086
$FUEL pull qwen2.5-coder-0.5b

if [ ! -f "$SMOLLM2_DIR/config.json" ]; then
    echo "writing $SMOLLM2_DIR (SmolLM2 safetensors, bf16) from the demo GGUF" >&2
    GGUF=$(python -c 'from fuelcli import demo; print(demo.path_of("smollm2-135m"))')
    python - "$GGUF" "$SMOLLM2_DIR" <<'EOF'
import sys
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

gguf, out = Path(sys.argv[1]), sys.argv[2]
model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.bfloat16)
model.save_pretrained(out, safe_serialization=True)
AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name).save_pretrained(out)
EOF
fi

run() {  # run NAME MODEL PEER
    local name=$1 model=$2 peer=$3
    echo "== $name: $model vs $peer" >&2
    # shellcheck disable=SC2086
    $FUEL bench "$model" "${common[@]}" --compare "$peer" -o json >"$OUT/$name.json"
    python - "$OUT/$name.json" >"$OUT/$name.md" <<'EOF'
import json, sys

from fuelcli import bench as B

d = json.load(open(sys.argv[1]))
print(B.render_md(B.report_from_dict(d)), end="")
EOF
    cat "$OUT/$name.md"
    echo
}

run smollm2-135m-safetensors "$SMOLLM2_DIR" transformers
run smollm2-135m-q4_1 smollm2-135m llama.cpp
run qwen2.5-coder-0.5b-q4_k_m qwen2.5-coder-0.5b llama.cpp
