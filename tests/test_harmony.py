"""The harmony format (gpt-oss) read back from a reply (fuelcli/text/harmony.py, with serve's call dicts): analysis as the
reasoning, final as the content, a message to functions.NAME as a call; the same parts whichever way
the streamed text is cut; what does not fit stays text and never raises. Then gpt-oss's own chat
template (HF's chat_template.jinja, as llama.cpp keeps it in models/templates/openai-gpt-oss-120b.jinja)
rendered by fuel as transformers renders it: system and developer messages, tools as a TypeScript
namespace, reasoning effort, an earlier call with its analysis and its result."""

from __future__ import annotations

import json
import random
import tarfile
from pathlib import Path

import pytest
from conftest import LLAMA_CPP_SDIST, cached, llama_cpp_sdist

from fuelcli.serve.harmony import parser
from fuelcli.serve.reply import whole
from fuelcli.text.harmony import is_harmony, turn_end_ids
from fuelcli.text.tokenizer import Tokenizer

ANALYSIS = "<|channel|>analysis<|message|>The user greets; answer briefly.<|end|>"
FINAL = "<|start|>assistant<|channel|>final<|message|>Hello! How can I help?"
CALL = ('<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>'
        '{"city": "Paris", "unit": "celsius"}')
# the recipient may also come before the channel, and the content type without <|constrain|>
CALL_RECIPIENT_FIRST = '<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>{"city": "Oslo"}'


def parts(text: str, cuts: list[int] | None = None, **kw) -> list:
    """The parser's parts for `text` fed in pieces ending at `cuts`, then finished."""
    p = parser(**kw)
    out, at = [], 0
    for cut in (cuts or []) + [len(text)]:
        out += p.feed(text[at:cut])
        at = cut
    return out + p.finish()


def joined(ps: list) -> tuple[str, str, list]:
    """(content, reasoning, calls as (name, arguments)) of parts."""
    return ("".join(v for k, v in ps if k == "content"), "".join(v for k, v in ps if k == "reasoning"),
            [(c["function"]["name"], json.loads(c["function"]["arguments"])) for k, c in ps if k == "tool_call"])


def test_analysis_then_final():
    assert whole(parser(), ANALYSIS + FINAL) == ("Hello! How can I help?", "The user greets; answer briefly.", [])


def test_a_call_after_the_analysis():
    content, reasoning, calls = whole(parser(), ANALYSIS + CALL)
    assert content is None and reasoning == "The user greets; answer briefly."
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == \
        [("get_weather", {"city": "Paris", "unit": "celsius"})]
    assert calls[0]["id"].startswith("call_") and calls[0]["type"] == "function"
    # the same when the model writes the call's end marker (its EOS is not always the stop)
    assert joined(parts(ANALYSIS + CALL + "<|call|>"))[2] == [("get_weather", {"city": "Paris", "unit": "celsius"})]
    assert joined(parts(CALL_RECIPIENT_FIRST))[2] == [("get_weather", {"city": "Oslo"})]


def test_no_analysis():
    assert whole(parser(), "<|channel|>final<|message|>Just the answer.") == ("Just the answer.", None, [])


def test_preamble_and_call():
    """commentary to no one is a preamble for the user: content, beside the call."""
    text = "<|channel|>commentary<|message|>Let me look that up.<|end|>" + CALL
    assert joined(parts(text)) == ("Let me look that up.", "", [("get_weather", {"city": "Paris", "unit": "celsius"})])


@pytest.mark.parametrize("text", [ANALYSIS + FINAL, ANALYSIS + CALL + "<|call|>", CALL_RECIPIENT_FIRST,
                                  "<|channel|>commentary<|message|>Checking.<|end|>" + CALL,
                                  "plain text with <|bits of <| markers", ANALYSIS + '<|start|>assistant<|chan'])
def test_any_cut_gives_the_same_parts(text):
    want = joined(parts(text))
    rng = random.Random(0)
    for _ in range(200):
        cuts = sorted(rng.sample(range(1, len(text)), rng.randint(1, min(12, len(text) - 1))))
        assert joined(parts(text, cuts)) == want, cuts
    every = joined(parts(text, list(range(1, len(text)))))  # one character at a time
    assert every == want


def test_streamed_reasoning_comes_before_the_end():
    """Reasoning is sent as it comes, not held to the message's end; a marker's start is held back."""
    p = parser()
    assert p.feed("<|channel|>analysis<|mes") == []
    assert p.feed("sage|>Thinking about") == [("reasoning", "Thinking about")]
    assert p.feed(" it<|e") == [("reasoning", " it")]
    assert p.phase == "reasoning"
    assert p.feed("nd|><|start|>assistant<|channel|>final<|message|>Hi") == [("content", "Hi")]
    assert p.phase == "content" and p.finish() == []


@pytest.mark.parametrize("text, content", [
    ("Hello, no harmony here.", "Hello, no harmony here."),  # a model that ignores the format
    ("", ""),
    (ANALYSIS + CALL[:-8], CALL[:-8]),  # a call cut off by max_tokens: its JSON is incomplete
    (ANALYSIS + CALL.replace('{"city"', '{city'), CALL.replace('{"city"', '{city')),  # not JSON
    (ANALYSIS + CALL.replace('{"city": "Paris", "unit": "celsius"}', '["Paris"]'),
     CALL.replace('{"city": "Paris", "unit": "celsius"}', '["Paris"]')),  # JSON, not an object
    (ANALYSIS + "<|start|>assistant<|channel|>final", "<|start|>assistant<|channel|>final"),  # header cut off
    ("<|channel|>" + "x" * 300, "<|channel|>" + "x" * 300),  # no <|message|>: no header
    # a built-in tool's call is not a function call: as written
    ("<|channel|>analysis to=browser.search<|message|>{\"query\": \"x\"}<|call|>",
     "<|channel|>analysis to=browser.search<|message|>{\"query\": \"x\"}<|call|>"),
])
def test_what_does_not_fit_stays_text(text, content):
    got_content, _, calls = joined(parts(text))
    assert got_content == content and calls == []
    assert joined(parts(text, list(range(1, len(text))))) == joined(parts(text))


def test_reasoning_off_keeps_the_messages_as_written():
    """reasoning_format none: the reply is content as the model wrote it; calls are still calls."""
    assert whole(parser(reasoning=False), ANALYSIS + FINAL) == (ANALYSIS + FINAL, None, [])
    content, reasoning, calls = whole(parser(reasoning=False), ANALYSIS + CALL)
    assert content == ANALYSIS and reasoning is None and len(calls) == 1


def test_two_analysis_messages_and_a_final():
    text = ANALYSIS + "<|start|>assistant<|channel|>analysis<|message|> More.<|end|>" + FINAL
    assert whole(parser(), text) == ("Hello! How can I help?", "The user greets; answer briefly. More.", [])


# --- the chat template ---------------------------------------------------------------------------

SPECIALS = ["<|startoftext|>", "<|endoftext|>", "<|return|>", "<|constrain|>", "<|channel|>", "<|start|>",
            "<|end|>", "<|message|>", "<|call|>"]
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "description": "the city"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"], "default": "celsius"},
        "days": {"type": "array", "items": {"type": "integer"}},
        "detail": {"oneOf": [{"type": "string"}, {"type": "number"}]}},
        "required": ["city"]}}}
CONVERSATIONS = {
    "plain": [{"role": "user", "content": "Hi"}],
    "system as developer": [{"role": "system", "content": "Answer in French."}, {"role": "user", "content": "Hi"}],
    "a call and its result": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "", "thinking": "I should call get_weather.",
         "tool_calls": [{"id": "call_1", "type": "function",
                         "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": '{"temperature": 18}'}],
    "an earlier answer": [{"role": "user", "content": "Hi"},
                          {"role": "assistant", "content": "Hello!", "thinking": "greet"},
                          {"role": "user", "content": "Bye"}],
}


@pytest.fixture(scope="session")
def gpt_oss_template() -> str:
    """gpt-oss's chat template, from the llama-cpp-python sdist (llama.cpp keeps the hub file's text)."""
    member = "vendor/llama.cpp/models/templates/openai-gpt-oss-120b.jinja"

    def build(out: Path) -> None:
        with tarfile.open(llama_cpp_sdist()) as tar:
            (m,) = [m for m in tar.getmembers() if m.name.endswith(member)]
            out.write_bytes(tar.extractfile(m).read())

    return cached(f"openai-gpt-oss-120b-{LLAMA_CPP_SDIST.replace('==', '-')}.jinja", build).read_text()


def harmony_tokenizer(template: str) -> Tokenizer:
    from serve_helpers import char_tokenizer

    return Tokenizer(char_tokenizer(["<unk>"] + SPECIALS), template, "<|startoftext|>", "<|return|>")


@pytest.mark.parametrize("name", CONVERSATIONS)
@pytest.mark.parametrize("tools", [None, [WEATHER]], ids=["no tools", "tools"])
@pytest.mark.parametrize("effort", [None, "high"])
def test_the_template_renders_as_transformers(gpt_oss_template, name, tools, effort):
    from transformers import PreTrainedTokenizerFast

    tok = harmony_tokenizer(gpt_oss_template)
    kwargs = {"reasoning_effort": effort} if effort else {}
    ours = tok.render_chat(CONVERSATIONS[name], template_kwargs=kwargs, tools=tools)
    hf = PreTrainedTokenizerFast(tokenizer_object=tok.backend)
    theirs = hf.apply_chat_template(CONVERSATIONS[name], tools=tools, tokenize=False, add_generation_prompt=True,
                                    chat_template=gpt_oss_template, **kwargs)
    assert ours == theirs
    assert ours.startswith("<|start|>system<|message|>") and ours.endswith("<|start|>assistant")
    assert f"Reasoning: {effort or 'medium'}\n" in ours
    if tools:
        assert "namespace functions {" in ours and "type get_weather = (_: {\n// the city\ncity: string,\n" in ours
        assert 'unit?: "celsius" | "fahrenheit", // default: celsius' in ours
    if name == "a call and its result":
        assert ("<|start|>assistant<|channel|>analysis<|message|>I should call get_weather.<|end|>"
                "<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>"
                '{"city": "Paris"}<|call|>') in ours
        assert '<|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>"{\\"temperature\\": 18}"' in ours
    if name == "an earlier answer":
        assert "greet" not in ours  # earlier turns' analysis is dropped


def test_the_template_is_harmony(gpt_oss_template):
    tok = harmony_tokenizer(gpt_oss_template)
    assert is_harmony(gpt_oss_template) and not is_harmony("<|im_start|>{{ m.content }}<|im_end|>")
    assert turn_end_ids(tok) == {tok.backend.token_to_id("<|return|>"), tok.backend.token_to_id("<|call|>")}
    assert turn_end_ids(Tokenizer(tok.backend, "{{ messages }}", None, None)) == set()


def test_random_token_soup_never_raises():
    """A random model's reply (the tiny checkpoint's): any mix of markers, JSON bits and text is parsed
    without an exception, into the same parts however it is cut, and loses no text outside markers."""
    pieces = ["<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|constrain|>", "<|call|>", "<|return|>",
              "assistant", "analysis", "final", "commentary", " to=functions.f", " to=", "json", "{", "}", '"a"',
              ":", "1", " ", "x", "<", "|", "<|", "\n"]
    rng = random.Random(1)
    for _ in range(1000):
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 30)))
        whole_parts = joined(parts(text))
        cuts = sorted(set(rng.sample(range(1, len(text)), min(rng.randint(1, 12), len(text) - 1)))) if len(text) > 1 else []
        assert joined(parts(text, cuts)) == whole_parts, (text, cuts)
        assert joined(parts(text, cuts, reasoning=False)) == joined(parts(text, reasoning=False))


# --- grammars on a harmony reply (serve/harmony.py) ------------------------------------------------

def refused(grammar, text: str) -> str | None:
    """The reply up to the first token the grammar refuses (None: all of it allowed), and whether only
    a turn end may follow."""
    import numpy as np

    from fuelcli.text.grammar import Constraint

    tok = harmony_tokenizer("<|start|><|channel|><|message|>")
    eos = {tok.backend.token_to_id("<|return|>"), tok.backend.token_to_id("<|call|>")}
    c = Constraint(grammar, tok, 256, eos)
    ids = tok.encode(text, add_special_tokens=False)
    for k, i in enumerate(ids):
        scores = np.zeros(256)
        c.mask(scores)
        if not np.isfinite(scores[i]):
            return tok.decode(ids[:k + 1])
        c.accept(i)
    return None


CALLED = ANALYSIS + CALL


@pytest.mark.parametrize("lazy", [False, True], ids=["demanded", "strict under auto"])
def test_the_call_grammar(lazy):
    pytest.importorskip("llguidance")
    from fuelcli.serve.harmony import HarmonyTools
    from fuelcli.serve.tools import Function

    params = WEATHER["function"]["parameters"]
    grammar = HarmonyTools().grammar([Function("get_weather", params, True), Function("get_time", {}, True)],
                                     True, lazy=lazy, strict=True)
    assert refused(grammar, CALLED) is None and refused(grammar, ANALYSIS + CALL_RECIPIENT_FIRST) is None
    assert refused(grammar, CALLED.replace('"celsius"', '"kelvin"')).endswith('"k')  # not in the enum
    assert refused(grammar, CALLED.replace("get_weather", "get_wind")).endswith("get_wi")  # no such tool
    answer = ANALYSIS + FINAL
    if lazy:  # until a call begins, the reply is free
        assert refused(grammar, answer) is None
    else:  # a call must come: a final answer is refused at its channel's name
        assert refused(grammar, answer).endswith("<|start|>assistant<|channel|>f")


def test_the_final_json_grammar():
    pytest.importorskip("llguidance")
    from fuelcli.serve.harmony import final_json

    schema = {"type": "object", "properties": {"answer": {"type": "integer"}}, "required": ["answer"]}
    grammar = final_json(schema, True, "the schema")
    assert refused(grammar, ANALYSIS + '<|start|>assistant<|channel|>final<|message|>{"answer": 42}') is None
    assert refused(grammar, '<|channel|>final<|message|>{"answer": 4.5}').endswith("4.")
    assert refused(grammar, ANALYSIS + FINAL).endswith("<|message|>H")
    assert refused(grammar, CALLED).endswith("<|channel|>commentary ")
