"""Baseline: transformers f32 greedy decode speed (KV cache) on an HF directory.

    python examples/bench_transformers_decode.py MODEL_DIR [--new 64] [--runs 3] [--prompt TEXT]

Loads the model in float32 with eager attention and torch's default thread count, runs one
warm-up generation, then times `--runs` greedy generations of exactly `--new` tokens (EOS ignored)
after a short prompt. Decode tok/s excludes the prefill: it is (new - 1) / (t_total - t_prefill),
with t_prefill measured separately as a 1-token generation of the same prompt.
"""
from __future__ import annotations

import argparse
import os
import statistics
import time


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model_dir")
    ap.add_argument("--new", type=int, default=64, help="new tokens per run (default 64)")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--prompt", default="The history of the printing press begins")
    ap.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (0 = torch default)")
    args = ap.parse_args()

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    if args.threads:
        torch.set_num_threads(args.threads)
    tok = AutoTokenizer.from_pretrained(args.model_dir)
    model = AutoModelForCausalLM.from_pretrained(args.model_dir, dtype=torch.float32, attn_implementation="eager")
    model.eval()
    model.generation_config = GenerationConfig()  # no checkpoint sampling defaults / eos
    ids = tok(args.prompt, return_tensors="pt")["input_ids"]

    def gen(n: int) -> float:
        gc = GenerationConfig(do_sample=False, max_new_tokens=n, min_new_tokens=n, eos_token_id=None,
                              pad_token_id=0, use_cache=True)
        t0 = time.perf_counter()
        with torch.inference_mode():
            out = model.generate(ids, attention_mask=torch.ones_like(ids), generation_config=gc)
        dt = time.perf_counter() - t0
        assert out.shape[1] - ids.shape[1] == n, out.shape
        return dt

    gen(8)  # warm-up
    t_pre = min(gen(1) for _ in range(3))
    rates = []
    for _ in range(args.runs):
        dt = gen(args.new)
        rates.append((args.new - 1) / (dt - t_pre))
    mean = statistics.mean(rates)
    std = statistics.stdev(rates) if len(rates) > 1 else 0.0
    print(f"model={args.model_dir} prompt_tokens={ids.shape[1]} new={args.new} threads={torch.get_num_threads()} "
          f"prefill={t_pre * 1e3:.1f} ms")
    print(f"transformers f32 decode: {mean:.1f} ± {std:.1f} tok/s (best {max(rates):.1f}; "
          f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs)")


if __name__ == "__main__":
    main()
