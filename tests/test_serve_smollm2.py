"""A live `fuel serve` on the SmolLM2-135M-Instruct demo GGUF (its real chat template, EOS ids and
byte-level tokenizer), spoken to with the openai client: greedy answers equal `fuel run --temp 0`,
the prompt cache on a multi-turn conversation, logprob bytes, disconnects and Ctrl-C."""

from __future__ import annotations

import re
import signal
import subprocess
import sys

import openai
import pytest

from serve_helpers import ServerProcess

pytestmark = pytest.mark.slow
MODEL = "SmolLM2-135M-Instruct.Q4_1.gguf"


@pytest.fixture(scope="module")
def server(smollm2_gguf):
    s = ServerProcess(smollm2_gguf, "-c", "2048")
    yield s
    assert s.stop() == 130
    assert "Traceback" not in s.log


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.base_url, api_key="none", max_retries=0, timeout=300)


def fuel_run(model, *args):
    out = subprocess.run([sys.executable, "-m", "fuelcli", "run", str(model), *args, "--temp", "0", "-q"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return out.stdout.removesuffix("\n")


def test_greedy_chat_equals_fuel_run(smollm2_gguf, client):
    prompt = "Write a haiku about the sea."  # the template adds SmolLM2's default system message
    r = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": prompt}], temperature=0,
                                       max_tokens=48)
    want = fuel_run(smollm2_gguf, prompt, "-n", "48")
    assert r.choices[0].message.content == want and want


def test_greedy_completion_equals_fuel_run(smollm2_gguf, client):
    r = client.completions.create(model=MODEL, prompt="The three primary colours are", temperature=0, max_tokens=32)
    assert r.choices[0].text == fuel_run(smollm2_gguf, "The three primary colours are", "--no-chat-template",
                                         "-n", "32")


def test_five_turn_conversation_reuses_the_cache(smollm2_gguf, client):
    """Each turn's prompt holds the whole history: the cache has all of it but the new user message
    (and the last answer's final token). The last answer, built on four turns of cached KV, equals a
    fresh engine's, and so does the same prompt sent again after the cache was evicted."""
    from fuelcli.backends import make_engine
    from fuelcli.assembly.loader import open_model
    from fuelcli.text.generate import Sampler, SamplerParams, Stats, generate

    m = open_model(str(smollm2_gguf))
    questions = ["Name a fruit.", "What colour is it?", "Where does it grow?", "Is it sweet?", "Thank you!"]
    system = "You are a friendly assistant who answers in plain words. " * 20  # a long fixed system prompt
    messages, total, cached, n = [{"role": "system", "content": system}], 0, 0, 24
    for q in questions:
        messages.append({"role": "user", "content": q})
        r = client.chat.completions.create(model=MODEL, messages=messages, temperature=0, max_tokens=n)
        if total:
            new = len(m.tokenizer.encode(f"<|im_start|>user\n{q}<|im_end|>\n<|im_start|>assistant\n",
                                         add_special_tokens=False))
            assert r.usage.prompt_tokens_details.cached_tokens >= r.usage.prompt_tokens - new - 3
        total += r.usage.prompt_tokens
        cached += r.usage.prompt_tokens_details.cached_tokens
        messages.append({"role": "assistant", "content": r.choices[0].message.content})
    assert cached > 0.6 * total
    ids = m.tokenizer.encode(m.tokenizer.render_chat(messages[:-1]), add_special_tokens=False)
    engine = make_engine(m.cfg, m.weights, n_ctx=len(ids) + n)
    fresh = "".join(generate(engine, m.tokenizer, ids, n, Sampler(SamplerParams(temp=0)), m.eos_ids(), [], Stats()))
    assert messages[-1]["content"] == fresh
    # evicted by another prompt, the last turn is prefilled afresh, in chunks of 256 tokens
    # (worker.PREFILL_CHUNK), to the same answer
    client.completions.create(model=MODEL, prompt="Something else entirely.", max_tokens=1)
    r = client.chat.completions.create(model=MODEL, messages=messages[:-1], temperature=0, max_tokens=n)
    assert r.usage.prompt_tokens > 256 and r.usage.prompt_tokens_details.cached_tokens == 0
    assert r.choices[0].message.content == fresh


def test_logprob_bytes_rebuild_the_text(client):
    r = client.chat.completions.create(model=MODEL, temperature=0, max_tokens=40, logprobs=True, top_logprobs=3,
                                       messages=[{"role": "user", "content": "Say 'café crème' and 'Köln' twice."}])
    content = r.choices[0].message.content
    entries = r.choices[0].logprobs.content
    assert bytes(b for e in entries for b in e.bytes).decode() == content
    assert any(ord(ch) > 127 for ch in content)  # the case that needs bytes: characters of several bytes
    for e in entries:
        assert e.logprob <= 0 and e.top_logprobs[0].logprob >= e.logprob - 1e-9


def test_disconnect_stops_generation(server, client):
    stream = client.completions.create(model=MODEL, prompt="Here is a very long story about a dragon:",
                                       max_tokens=400, temperature=0.8, seed=1, stream=True)
    chunks = iter(stream)
    for _ in range(3):
        next(chunks)
    stream.close()
    line = server.wait_log(r"completion: .*generated (\d+) tokens.*stop: cancelled", timeout=60)
    assert line and int(line.group(1)) < 100, server.log[-2000:]


def test_ctrl_c_mid_generation_shuts_down_cleanly(smollm2_gguf):
    s = ServerProcess(smollm2_gguf, "-c", "512")
    c = openai.OpenAI(base_url=s.base_url, api_key="none", max_retries=0)
    stream = c.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=400, stream=True, seed=2)
    chunks = iter(stream)
    next(chunks)
    s.proc.send_signal(signal.SIGINT)
    with pytest.raises(openai.APIError, match="shutting down"):
        for _ in chunks:
            pass
    assert s.proc.wait(30) == 130
    assert "Traceback" not in s.log and "Finished server process" in s.log
    assert re.search(r"generated (\d+) tokens.*stop: cancelled", s.log)
