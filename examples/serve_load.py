"""Load figures for a running `fuel serve` (or any OpenAI-compatible server), through the openai client.

    fuel serve smollm2-135m --port 8080 &
    python examples/serve_load.py http://127.0.0.1:8080/v1 --clients 1,4 --requests 8 --max-tokens 64

For each number of concurrent clients: time to first token (TTFT; queueing included) and decode
tok/s per request (tokens after the first / time after the first), mean and max over the requests,
and the server's total generated tok/s. Then a 5-turn conversation: prompt tokens per turn, how many
came from the prompt cache, TTFT, and the last turn's TTFT again after another prompt has evicted
the cache. Greedy decoding with a fixed max_tokens keeps runs comparable.

    python examples/serve_load.py --serve qwen2.5-coder-0.5b --parallel 1,4 --clients 4,8 --requests 1 --rounds 3 --ignore-eos

starts `fuel serve MODEL --parallel N` itself for each N (in turn, round after round, so that a
machine's load drifts over every setting alike), runs the clients against each, and prints one
markdown table: per setting and number of clients the medians over the rounds of the generated
tok/s summed over the clients, the mean TTFT and the last client's TTFT, and the aggregate against
--parallel 1's.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.request

import openai

QUESTIONS = ["Tell me about the history of the bicycle.", "Explain how a rainbow forms.",
             "Describe a day in the life of a lighthouse keeper.", "What makes bread rise?",
             "Write a short story about a robot learning to paint.", "How do bees make honey?",
             "Explain the rules of chess briefly.", "Why is the sky blue?"]
TURNS = ["Name a fruit and describe it.", "What colour is it usually?", "Where does it grow best?",
         "Give me a recipe that uses it.", "Summarise our conversation in one sentence."]


EXTRA = {}  # --ignore-eos: {"ignore_eos": True}, every request runs to max_tokens


def timed_chat(client, model, messages, max_tokens):
    """(TTFT s, decode tok/s after the first token, completion tokens, usage, text) of one streamed chat."""
    t0 = time.perf_counter()
    first = last = None
    usage, text = None, []
    for chunk in client.chat.completions.create(model=model, messages=messages, max_tokens=max_tokens,
                                                temperature=0, stream=True, stream_options={"include_usage": True},
                                                extra_body=EXTRA):
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
    return {"tok_s": total / wall, "ttft_mean": statistics.mean(ttft), "ttft_max": max(ttft)}


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


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def served(model, parallel, extra):
    """`fuel serve MODEL --parallel N` on a free loopback port, ready; stopped on exit."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "fuelcli", "serve", model, "--port", str(port),
                             "--parallel", str(parallel), *extra], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 300
        while True:
            if proc.poll() is not None:
                sys.exit(f"fuel serve exited {proc.returncode}: {proc.stderr.read().decode()[-500:]}")
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)
                break
            except OSError:
                if time.monotonic() > deadline:
                    sys.exit("fuel serve did not answer /health within 300 s")
                time.sleep(0.5)
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def compare(args):
    """--serve: every --parallel setting against the same clients, rounds interleaved; one table."""
    settings = [int(x) for x in args.parallel.split(",")]
    clients = [int(x) for x in args.clients.split(",")]
    runs = {}
    for r in range(args.rounds):
        for n in settings:
            with served(args.serve, n, args.serve_args.split()) as url:
                client = openai.OpenAI(base_url=url, api_key=args.api_key, max_retries=0, timeout=600)
                model = client.models.list().data[0].id
                # warm up with every slot busy: a first step of several sequences compiles the wide kernels
                with contextlib.redirect_stdout(io.StringIO()):
                    load(client, model, max(n, 2), 1, 4)
                for c in clients:
                    print(f"round {r + 1}, --parallel {n}: ", end="")
                    runs.setdefault((n, c), []).append(load(client, model, c, args.requests, args.max_tokens))
    med = {k: {f: statistics.median(x[f] for x in v) for f in v[0]} for k, v in runs.items()}
    print(f"\n{args.serve}, {args.requests} request(s) per client, {args.max_tokens} new tokens each, greedy; "
          f"medians of {args.rounds} round(s)\n")
    print("| --parallel | clients | generated tok/s (all clients) | vs --parallel 1 | TTFT mean s | last client's TTFT s |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: |")
    for n in settings:
        for c in clients:
            m, base = med[n, c], med.get((1, c))
            ratio = f"{m['tok_s'] / base['tok_s']:.2f}" if base else ""
            print(f"| {n} | {c} | {m['tok_s']:.1f} | {ratio} | {m['ttft_mean']:.2f} | {m['ttft_max']:.2f} |")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("base_url", nargs="?", help="a running server's /v1 URL (or --serve MODEL)")
    ap.add_argument("--serve", metavar="MODEL", help="start `fuel serve MODEL` for each --parallel setting")
    ap.add_argument("--parallel", default="1,4", help="--serve: comma-separated --parallel settings")
    ap.add_argument("--rounds", type=int, default=1, help="--serve: rounds over the settings")
    ap.add_argument("--serve-args", default="", help="--serve: more options for fuel serve, e.g. '-t 2'")
    ap.add_argument("--model", help="model id (default: the server's first)")
    ap.add_argument("--clients", default="1,4", help="comma-separated numbers of concurrent clients")
    ap.add_argument("--requests", type=int, default=4, help="requests per client")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--api-key", default="none")
    ap.add_argument("--ignore-eos", action="store_true", help="every request generates max_tokens (the server "
                    "must take ignore_eos: fuel serve, llama-server, vLLM)")
    args = ap.parse_args()
    if args.ignore_eos:
        EXTRA["ignore_eos"] = True
    if args.serve:
        return compare(args)
    if not args.base_url:
        ap.error("give a server's URL or --serve MODEL")
    client = openai.OpenAI(base_url=args.base_url, api_key=args.api_key, max_retries=0, timeout=600)
    model = args.model or client.models.list().data[0].id
    timed_chat(client, model, [{"role": "user", "content": "warm up"}], 4)
    for n in (int(x) for x in args.clients.split(",")):
        load(client, model, n, args.requests, args.max_tokens)
    conversation(client, model, args.max_tokens)


if __name__ == "__main__":
    main()
