"""/metrics (fuel serve --metrics): Prometheus' text format, read back with prometheus_client's own
parser; the counts agree with the usage the responses reported; the queue gauge while the engine is
busy; off by default (501 naming the flag), behind the API key when there is one."""

from __future__ import annotations

import threading
import time

import pytest

from serve_helpers import assert_error_shape, raw
from test_serve_worker import chat, served, wait_for  # noqa: F401  (served: the fixture)

parser = pytest.importorskip("prometheus_client.parser")


def scrape(s) -> dict:
    """{sample name with labels: value}, through prometheus_client's parser (it refuses bad text)."""
    status, headers, body = raw(s.port, "GET", "/metrics")
    assert status == 200 and headers["content-type"].startswith("text/plain; version=0.0.4"), body
    out = {}
    for family in parser.text_string_to_metric_families(body.decode()):
        for sample in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
            out[sample.name + (f"{{{labels}}}" if labels else "")] = sample.value
    return out


def test_counts_agree_with_the_responses(served):
    s = served(metrics=True)
    before = scrape(s)
    assert before["fuel_generation_tokens_total"] == 0 and before["fuel_time_to_first_token_seconds_count"] == 0
    replies = [chat(s, "hi", max_tokens=5, temperature=0), chat(s, "hi", max_tokens=5, temperature=0),
               chat(s, "hello there", max_tokens=3, temperature=0)]
    text = s.client.completions.create(model="scripted", prompt="abc", max_tokens=4, temperature=0)
    m = scrape(s)
    usages = [r.usage for r in replies] + [text.usage]
    assert m["fuel_requests_total{endpoint=chat,finish_reason=length}"] == 3
    assert m["fuel_requests_total{endpoint=completion,finish_reason=length}"] == 1
    assert m["fuel_prompt_tokens_total"] == sum(u.prompt_tokens for u in usages)
    assert m["fuel_generation_tokens_total"] == sum(u.completion_tokens for u in usages) == 17
    cached = [u.prompt_tokens_details.cached_tokens for u in usages]
    assert m["fuel_prompt_cache_tokens_total"] == sum(cached) > 0  # the repeated prompt came from the cache
    assert m["fuel_prompt_cache_hits_total"] == sum(c > 0 for c in cached)
    for h in ("fuel_time_to_first_token_seconds", "fuel_time_per_output_token_seconds", "fuel_request_duration_seconds"):
        assert m[f"{h}_count"] == 4 and m[f"{h}_bucket{{le=+Inf}}"] == 4
        buckets = [v for k, v in m.items() if k.startswith(f"{h}_bucket")]
        assert buckets == sorted(buckets)  # cumulative
    assert m["fuel_requests_waiting"] == 0 and m["fuel_requests_running"] == 0


def test_queue_gauges_while_busy(served):
    s = served(metrics=True, delay_s=0.05)
    threads = [threading.Thread(target=chat, args=(s, f"q{i}"), kwargs={"max_tokens": 20}) for i in range(3)]
    for t in threads:
        t.start()
    wait_for(lambda: scrape(s)["fuel_requests_waiting"] >= 1)
    assert scrape(s)["fuel_requests_running"] == 1
    for t in threads:
        t.join()
    assert scrape(s)["fuel_requests_total{endpoint=chat,finish_reason=length}"] == 3


def test_a_finished_reply_is_counted(served, monkeypatch):
    """A client that has its whole answer finds it in /metrics: the worker counts a request before
    its reply ends (a slow count here widens the window; counted after, the scrape saw 0)."""
    from fuelcli.serve.metrics import Metrics

    finished = Metrics.finished

    def slow(self, *a, **k):
        time.sleep(0.3)
        finished(self, *a, **k)

    monkeypatch.setattr(Metrics, "finished", slow)
    s = served(metrics=True)
    chat(s, "hi", max_tokens=3)
    assert scrape(s)["fuel_requests_total{endpoint=chat,finish_reason=length}"] == 1


def test_the_parser_discriminates():
    """The negative control: prometheus_client's parser refuses what is not its format."""
    with pytest.raises(ValueError):
        list(parser.text_string_to_metric_families("fuel_x{le=1} 3\n"))


def test_off_by_default_and_behind_the_key(served):
    assert_error_shape(*raw(served().port, "GET", "/metrics")[::2], 501, "--metrics")
    s = served(metrics=True, api_key="k")
    assert raw(s.port, "GET", "/metrics")[0] == 401
    assert raw(s.port, "GET", "/metrics", headers={"Authorization": "Bearer k"})[0] == 200
