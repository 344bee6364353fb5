"""Default verdict thresholds and window sizes of `fuel diff` (measured; the numbers are below)."""

# The verdict is on KL(oracle ‖ fuel) per position, which does not grow with the logits' scale
# (max|Δ| does: SmolLM2's residual stream reaches |x| ≈ 2.3e4). Measured, largest KL at any position:
#   tiny f32 checkpoints (tests/tiny_models.py) vs self or transformers: ≤ 1e-10
#   SmolLM2-135M bf16 directory, tokens 1..12, vs self: 1.6e-8 (max|Δ| 2.0e-3)
#   SmolLM2-135M Q4_1 GGUF, tokens 1..12, vs self: 1.5e-6 (max|Δ| 1.3e-2; int16 activations on decode)
#   SmolLM2-135M Q4_1 GGUF, tokens 1..8, vs self: 6.2e-5 (the worst seen: special-token ids drive
#     the massive activations of SmolLM2's residual stream, which int16 activations round hardest)
#   Qwen2.5-Coder-0.5B Q4_K_M, tokens 1..12, vs self: 2.1e-8 (max|Δ| 1.3e-3)
# Every semantic break we tried (window direction, top-k routing, RoPE scaling) gives a max KL of
# 3e-2 or more and usually flips top-1 somewhere; 1e-3 sits 16x above the worst correct case and
# 30x below the mildest break.
# --oracle URL (KL over the server's top-20 + the rest), against fuel serve:
#   on the same file: tiny f32 2e-12; SmolLM2 Q4_1, 13 tokens: 1.9e-6 (vs self on the same
#     tokens, full vocabulary: 1.8e-6); Qwen2.5-Coder Q4_K_M, 17 tokens: 1.7e-8
#   SmolLM2 served from other files made of the same Q4_1 weights: the bf16 directory 4.1e-4 (passes),
#     a Q8_0 GGUF converted from it 6.8e-3 (fails). The same default, then: it is about semantics; a
#     check that must also tell a bf16 copy apart takes --tol 1e-4 (a narrow margin: 6.2e-5 above)
DEFAULT_TOL = 1e-3
DEFAULT_MIN_TOP1 = 1.0
# per-layer max|Δ| / max|oracle state|. Measured worst: 8.3e-4 (SmolLM2 Q4_1, int16 activations,
# layer 9), ≤ 4e-5 in f32; the breaks give ≥ 7e-2 at the first bad layer.
DEFAULT_LAYER_RTOL = 1e-2
DEFAULT_DECODE_STEPS = 3

# --oracle URL: how many log-probabilities per position a server is asked for. vLLM's default
# --max-logprobs and fuel serve's limit are 20 (OpenAI's own: 20 on chat, 5 on completions);
# llama-server has no limit.
DEFAULT_TOP_K = 20

# Long texts: llama-perplexity's default window, and the most rows of [rows, vocab] logits either
# side holds at once (a [4096, 151936] float32 block would be 2.5 GB; 512 rows are 311 MB).
DEFAULT_CTX = 512
SLICE = 512
