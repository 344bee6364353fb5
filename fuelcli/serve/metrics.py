"""The server's counters and histograms, served at /metrics in Prometheus' text format (0.0.4).

What llama-server's --metrics and vLLM's /metrics report, under fuel_ names: requests by endpoint
and finish reason, prompt and generated tokens, prompt-cache hits, the queue, and histograms of the
time to first token (from arrival, so queueing counts), the time per output token and the whole
request. The engine thread writes, the event loop reads: one lock.
"""

from __future__ import annotations

import threading
from collections import Counter

# bucket upper bounds, seconds
TTFT_BUCKETS = (0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
TPOT_BUCKETS = (0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.15, 0.3, 0.6, 1.2)
E2E_BUCKETS = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)


class Histogram:
    def __init__(self, bounds):
        self.bounds, self.counts, self.sum, self.n = tuple(bounds), [0] * len(bounds), 0.0, 0

    def observe(self, x: float) -> None:
        self.sum += x
        self.n += 1
        for i, b in enumerate(self.bounds):
            if x <= b:
                self.counts[i] += 1

    def lines(self, name: str) -> list[str]:
        out = [f'{name}_bucket{{le="{b:g}"}} {c}' for b, c in zip(self.bounds, self.counts)]
        return out + [f'{name}_bucket{{le="+Inf"}} {self.n}', f"{name}_sum {self.sum:.6f}", f"{name}_count {self.n}"]


class Metrics:
    def __init__(self):
        self._lock = threading.Lock()
        self.requests: Counter = Counter()  # (endpoint, finish_reason) -> count
        self.prompt_tokens = self.generated_tokens = self.cached_tokens = self.cache_hits = 0
        self.prefill_s = self.decode_s = 0.0
        self.ttft = Histogram(TTFT_BUCKETS)
        self.tpot = Histogram(TPOT_BUCKETS)
        self.e2e = Histogram(E2E_BUCKETS)

    def first_token(self, seconds: float) -> None:
        with self._lock:
            self.ttft.observe(seconds)

    def finished(self, endpoint: str, finish: str, stats, seconds: float) -> None:
        """A request is over (stats: generate.Stats; seconds since it arrived)."""
        with self._lock:
            self.requests[endpoint, finish] += 1
            self.prompt_tokens += stats.prompt_tokens
            self.generated_tokens += stats.generated
            self.cached_tokens += stats.cached_tokens
            self.cache_hits += stats.cached_tokens > 0
            self.prefill_s += stats.prefill_s
            self.decode_s += stats.decode_s
            if stats.decode_steps:
                self.tpot.observe(stats.decode_s / stats.decode_steps)
            self.e2e.observe(seconds)

    def render(self, waiting: int, running: int) -> str:
        with self._lock:
            families = [
                ("fuel_requests_total", "counter", "Requests finished, by endpoint and finish reason",
                 [f'fuel_requests_total{{endpoint="{e}",finish_reason="{f}"}} {n}'
                  for (e, f), n in sorted(self.requests.items())]),
                ("fuel_prompt_tokens_total", "counter", "Prompt tokens, cached ones included",
                 [f"fuel_prompt_tokens_total {self.prompt_tokens}"]),
                ("fuel_generation_tokens_total", "counter", "Generated tokens",
                 [f"fuel_generation_tokens_total {self.generated_tokens}"]),
                ("fuel_prompt_cache_tokens_total", "counter", "Prompt tokens the prompt cache held (not prefilled)",
                 [f"fuel_prompt_cache_tokens_total {self.cached_tokens}"]),
                ("fuel_prompt_cache_hits_total", "counter", "Requests whose prompt reused cached tokens",
                 [f"fuel_prompt_cache_hits_total {self.cache_hits}"]),
                ("fuel_prompt_seconds_total", "counter", "Seconds spent prefilling",
                 [f"fuel_prompt_seconds_total {self.prefill_s:.6f}"]),
                ("fuel_decode_seconds_total", "counter", "Seconds spent decoding",
                 [f"fuel_decode_seconds_total {self.decode_s:.6f}"]),
                ("fuel_requests_waiting", "gauge", "Requests in the queue", [f"fuel_requests_waiting {waiting}"]),
                ("fuel_requests_running", "gauge", "Requests on the engine", [f"fuel_requests_running {running}"]),
                ("fuel_time_to_first_token_seconds", "histogram", "From arrival to the first generated token",
                 self.ttft.lines("fuel_time_to_first_token_seconds")),
                ("fuel_time_per_output_token_seconds", "histogram", "Mean decode step of a request",
                 self.tpot.lines("fuel_time_per_output_token_seconds")),
                ("fuel_request_duration_seconds", "histogram", "From arrival to the last token",
                 self.e2e.lines("fuel_request_duration_seconds")),
            ]
        out = []
        for name, kind, help_, lines in families:
            out += [f"# HELP {name} {help_}", f"# TYPE {name} {kind}", *lines]
        return "\n".join(out) + "\n"
