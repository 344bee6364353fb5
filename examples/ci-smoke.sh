#!/usr/bin/env bash
# CI smoke check: does fuel's fast decode path (batched prefill, then one token at a time through the
# KV cache) match its own full-prefix numpy reference on MODEL?
#
#   examples/ci-smoke.sh MODEL [TOKENS]
#
# MODEL: a model directory, a .gguf file, a pulled demo alias or an already-cached hub id.
# TOKENS: comma-separated token ids (default 1..12; any model with a vocabulary > 12 takes them).
# Downloads nothing (HF_HUB_OFFLINE=1). Exit 0 = pass; anything else fails the job:
#   3 = mismatch (max|Δ| of the logits > --tol, or top-1 disagreement), 2 = bad input / model not
#   found, 4 = missing dependency. The JSON report is kept in ${FUEL_SMOKE_OUT:-fuel-smoke.json}.
# FUEL overrides the command (e.g. FUEL="python -m fuelcli").
set -uo pipefail

MODEL=${1:?usage: ci-smoke.sh MODEL [TOKENS]}
TOKENS=${2:-1,2,3,4,5,6,7,8,9,10,11,12}
FUEL=${FUEL:-fuel}
OUT=${FUEL_SMOKE_OUT:-fuel-smoke.json}
export HF_HUB_OFFLINE=1

# shellcheck disable=SC2086  # FUEL may be a command with arguments
$FUEL diff "$MODEL" --oracle self --tokens "$TOKENS" --layers --json >"$OUT"
rc=$?
if [ "$rc" -eq 0 ]; then
    echo "fuel smoke PASS: $MODEL (report: $OUT)"
    exit 0
fi
echo "fuel smoke FAIL: $MODEL (fuel diff exit code $rc; 3 = logits mismatch, 2 = bad input, 4 = missing dependency)" >&2
[ -s "$OUT" ] && cat "$OUT" >&2
exit "$rc"
