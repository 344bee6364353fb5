"""Load figures for a running `fuel serve` (or any OpenAI-compatible server), through the openai client.

    fuel serve smollm2-135m --port 8080 &
    python examples/serve_load.py http://127.0.0.1:8080/v1 --clients 1,4 --requests 8 --max-tokens 64

For each number of concurrent clients: time to first token (TTFT; queueing included) and decode
tok/s per request (tokens after the first / time after the first), mean and max over the requests,
and the server's total generated tok/s. Then a 5-turn conversation: prompt tokens per turn, how many
came from the prompt cache, TTFT, and the last turn's TTFT again after another prompt has evicted
the cache. Greedy decoding with a fixed max_tokens keeps runs comparable.
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time

import openai

QUESTIONS = ["Tell me about the history of the bicycle.", "Explain how a rainbow forms.",
             "Describe a day in the life of a lighthouse keeper.", "What makes bread rise?",
             "Write a short story about a robot learning to paint.", "How do bees make honey?",
             "Explain the rules of chess briefly.", "Why is the sky blue?"]
TURNS = ["Name a fruit and describe it.", "What colour is it usually?", "Where does it grow best?",
         "Give me a recipe that uses it.", "Summarise our conversation in one sentence."]


def timed_chat(client, model, messages, max_tokens):
    """(TTFT s, decode tok/s after the first token, completion tokens, usage, text) of one streamed chat."""
    t0 = time.perf_counter()
    first = last = None
    usage, text = None, []
    for chunk in client.chat.completions.create(model=model, messages=messages, max_tokens=max_tokens,
                                                temperature=0, stream=True, stream_options={"include_usage": True}):
        if chunk.usage is not None:
            usage = chunk.usage
        if chunk.choices and chunk.choices[0].delta.content:
            now = time.perf_counter()
            first = first or now
            last = now
            text.append(chunk.choices[0].delta.content)
    n = usage.completion_tokens
    rate = (n - 1) / (last - first) if first and last > first else float("nan")
    return (first or time.perf_counter()) - t0, rate, n, usage, "".join(text)


def load(client, model, n_clients, n_requests, max_tokens):
    results, lock = [], threading.Lock()

    def one_client(c):
        for i in range(n_requests):
            q = QUESTIONS[(c + i) % len(QUESTIONS)] + f" (client {c}, request {i})"
            r = timed_chat(client, model, [{"role": "user", "content": q}], max_tokens)
            with lock:
                results.append(r)

    t0 = time.perf_counter()
    threads = [threading.Thread(target=one_client, args=(c,)) for c in range(n_clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    ttft = [r[0] for r in results]
    rate = [r[1] for r in results]
    total = sum(r[2] for r in results)
    print(f"{n_clients} client(s) x {n_requests} requests: TTFT mean {statistics.mean(ttft):.3f} s, "
          f"max {max(ttft):.3f} s | per-request decode {statistics.mean(rate):.1f} tok/s | "
          f"server total {total / wall:.1f} generated tok/s ({total} tokens in {wall:.1f} s)")


def conversation(client, model, max_tokens):
    messages, total, cached = [], 0, 0
    for turn, q in enumerate(TURNS, 1):
        messages.append({"role": "user", "content": q})
        ttft, _, _, usage, text = timed_chat(client, model, messages, max_tokens)
        hit = usage.prompt_tokens_details.cached_tokens if usage.prompt_tokens_details else 0
        total, cached = total + usage.prompt_tokens, cached + hit
        print(f"turn {turn}: prompt {usage.prompt_tokens} tokens, {hit} from the cache, "
              f"{usage.prompt_tokens - hit} prefilled; TTFT {ttft:.3f} s")
        messages.append({"role": "assistant", "content": text})
    print(f"5 turns: {total} prompt tokens, {cached} from the cache ({100 * cached / total:.0f} % of prefill saved)")
    last = messages[:-1]
    warm = timed_chat(client, model, last, 1)[0]
    client.completions.create(model=model, prompt="An unrelated prompt that evicts the cache.", max_tokens=1)
    cold = timed_chat(client, model, last, 1)[0]
    print(f"turn 5 again: TTFT {warm:.3f} s from the cache, {cold:.3f} s after eviction")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("base_url")
    ap.add_argument("--model", help="model id (default: the server's first)")
    ap.add_argument("--clients", default="1,4", help="comma-separated numbers of concurrent clients")
    ap.add_argument("--requests", type=int, default=4, help="requests per client")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--api-key", default="none")
    args = ap.parse_args()
    client = openai.OpenAI(base_url=args.base_url, api_key=args.api_key, max_retries=0, timeout=600)
    model = args.model or client.models.list().data[0].id
    timed_chat(client, model, [{"role": "user", "content": "warm up"}], 4)
    for n in (int(x) for x in args.clients.split(",")):
        load(client, model, n, args.requests, args.max_tokens)
    conversation(client, model, args.max_tokens)


if __name__ == "__main__":
    main()
