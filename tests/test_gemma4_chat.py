"""Gemma 4's chat template through fuel's chat templating, against transformers' rendering of the
same template (render_jinja_template, what apply_chat_template runs):

- the template llama.cpp's converter writes into a GGUF (`tokenizer.chat_template` of
  `ggml-vocab-gemma-4.gguf`, taken from the checkpoint's tokenizer_config), with the file's own
  tokenizer (the `gemma4` model: tests/test_tokenizer_vectors.py);
- llama.cpp's copy of the 31B's newer template (models/templates/google-gemma-4-31B-it.jinja), which
  reads OpenAI's role:tool messages after a tool call.

A system message becomes the system turn, the tools its `<|tool>declaration:...<tool|>` blocks, a
call `<|tool_call>call:NAME{...}<tool_call|>`, its results `<|tool_response>` blocks on the same
model turn (for the first template fuel folds OpenAI's tool messages into it, as llama.cpp does),
enable_thinking the `<|think|>` token; the turn and tool markers tokenize as single tokens.
"""

from __future__ import annotations

import tarfile

import pytest
from conftest import cached, llama_cpp_sdist
from test_tokenizer_vectors import tokenizer, vocab_dir  # noqa: F401 (a fixture)

from fuelcli.serve.schemas import Message
from fuelcli.text.gemma4_messages import folds_tool_results

SYSTEM = "You are a weather assistant. Answer in one sentence.  "
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "The weather now in a city",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "description": "The city's name"},
        "units": {"type": "string", "enum": ["celsius", "fahrenheit"]}}, "required": ["city"]}}}]
CALL = {"id": "call_1", "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Paris", "units": "celsius"}'}}
CHAT = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Weather in Paris?"}]
WITH_CALL = CHAT + [{"role": "assistant", "content": None, "tool_calls": [CALL]},
                    {"role": "tool", "tool_call_id": "call_1", "content": '{"temperature": 21, "sky": "clear"}'},
                    {"role": "assistant", "content": "It is 21 °C and clear."},
                    {"role": "user", "content": "And tomorrow?"}]


def as_served(messages):
    """The messages as fuel serve hands them to the template (a call's arguments as an object)."""
    return [Message.model_validate(m).as_template_message() for m in messages]


def transformers_render(template, messages, tools=None, **kwargs):
    from transformers.utils.chat_template_utils import render_jinja_template

    rendered, _ = render_jinja_template([messages], tools=tools, chat_template=template, add_generation_prompt=True,
                                        bos_token="<bos>", eos_token="<eos>", **kwargs)
    return rendered[0]


@pytest.fixture(scope="module")
def gguf_tok(vocab_dir):  # noqa: F811
    return tokenizer(vocab_dir, "gemma-4")


@pytest.fixture(scope="module")
def newer_template() -> str:
    def build(out):
        with tarfile.open(llama_cpp_sdist()) as tar:
            (member,) = [m for m in tar.getmembers() if m.name.endswith("models/templates/google-gemma-4-31B-it.jinja")]
            out.write_bytes(tar.extractfile(member).read())

    return cached("google-gemma-4-31B-it.jinja", build).read_text(encoding="utf-8")


def test_system_and_tools_render_as_transformers(gguf_tok):
    text = gguf_tok.render_chat(as_served(CHAT), tools=TOOLS)
    assert text == transformers_render(gguf_tok.chat_template, as_served(CHAT), TOOLS)
    assert text.startswith("<bos><|turn>system\nYou are a weather assistant. Answer in one sentence."
                           "<|tool>declaration:get_weather{description:<|\"|>The weather now in a city<|\"|>")
    assert "<tool|><turn|>\n<|turn>user\nWeather in Paris?<turn|>\n<|turn>model\n" in text


def test_a_system_message_alone_and_thinking(gguf_tok):
    text = gguf_tok.render_chat(as_served(CHAT), template_kwargs={"enable_thinking": True})
    assert text == transformers_render(gguf_tok.chat_template, as_served(CHAT), enable_thinking=True)
    assert text.startswith("<bos><|turn>system\n<|think|>You are a weather assistant.")
    plain = gguf_tok.render_chat(as_served(CHAT[1:]))
    assert plain == "<bos><|turn>user\nWeather in Paris?<turn|>\n<|turn>model\n<|channel>thought\n<channel|>"


def test_a_tool_call_and_its_result_render_on_the_model_turn(gguf_tok):
    """The first template reads a call's results from `tool_responses` on the calling turn: fuel
    folds OpenAI's tool message and the answer after it into that turn, as llama.cpp does; the text
    is transformers' rendering of the conversation so folded (written out here)."""
    text = gguf_tok.render_chat(as_served(WITH_CALL), tools=TOOLS)
    folded = as_served(CHAT) + [
        {"role": "assistant", "tool_calls": [as_served(WITH_CALL)[2]["tool_calls"][0]],
         "tool_responses": [{"name": "get_weather", "response": {"temperature": 21, "sky": "clear"}}],
         "content": "It is 21 °C and clear."},
        {"role": "user", "content": "And tomorrow?"}]
    assert text == transformers_render(gguf_tok.chat_template, folded, TOOLS)
    assert ("<|turn>model\n<|tool_call>call:get_weather{city:<|\"|>Paris<|\"|>,units:<|\"|>celsius<|\"|>}<tool_call|>"
            "<|tool_response>response:get_weather{sky:<|\"|>clear<|\"|>,temperature:21}<tool_response|>"
            "It is 21 °C and clear.<turn|>\n<|turn>user\nAnd tomorrow?") in text


def test_negative_control_unfolded_results_form_a_tool_turn(gguf_tok):
    """The comparison sees the fold: the same messages as they come give a "tool" turn."""
    unfolded = transformers_render(gguf_tok.chat_template, as_served(WITH_CALL), TOOLS)
    assert "<turn|>\n<|turn>tool\n" in unfolded
    assert unfolded != gguf_tok.render_chat(as_served(WITH_CALL), tools=TOOLS)


def test_the_fold_as_llama_cpp(gguf_tok):
    """Parallel calls take their results' names in order, a result that is not JSON stays text, a
    result past the calls is named by its tool_call_id; a turn that ends at the results leaves the
    model's turn open (the template writes no generation prompt after them)."""
    from fuelcli.text.gemma4_messages import for_template

    calls = [{"id": f"c{k}", "type": "function", "function": {"name": n, "arguments": {}}}
             for k, n in enumerate(["a", "b"])]
    msgs = [{"role": "user", "content": "go"}, {"role": "assistant", "content": "", "tool_calls": calls},
            {"role": "tool", "tool_call_id": "c0", "content": "[1, 2]"},
            {"role": "tool", "tool_call_id": "c1", "content": "not json"},
            {"role": "tool", "tool_call_id": "c9", "content": "3"}]
    (user, turn) = for_template(msgs)
    assert user == msgs[0] and turn == {"role": "assistant", "tool_calls": calls, "tool_responses": [
        {"name": "a", "response": [1, 2]}, {"name": "b", "response": "not json"}, {"name": "c9", "response": 3}]}
    assert for_template(msgs[:1]) == msgs[:1]
    text = gguf_tok.render_chat(msgs)
    assert text.endswith("<|tool_response>response:c9{value:3}<tool_response|><|channel>thought\n<channel|>")


def test_negative_control_arguments_as_a_string(gguf_tok):
    """The comparison sees the call's form: OpenAI's arguments string, not turned into an object,
    is written as it is inside the braces."""
    text = gguf_tok.render_chat(WITH_CALL, tools=TOOLS)
    assert text != gguf_tok.render_chat(as_served(WITH_CALL), tools=TOOLS)
    assert 'call:get_weather{{"city": "Paris"' in text


def test_newer_template_reads_openai_tool_messages(gguf_tok, newer_template):
    text = _with_template(gguf_tok, newer_template).render_chat(as_served(WITH_CALL), tools=TOOLS)
    assert text == transformers_render(newer_template, as_served(WITH_CALL), TOOLS)
    assert "<|tool_response>response:get_weather{" in text and "<turn|>\n<|turn>tool" not in text
    assert not folds_tool_results(newer_template) and folds_tool_results(gguf_tok.chat_template)


def test_the_prompt_tokenizes_with_single_marker_tokens(gguf_tok):
    text = gguf_tok.render_chat(as_served(WITH_CALL), tools=TOOLS)
    ids = gguf_tok.encode(text, add_special_tokens=False)
    assert ids[:2] == [2, 105]  # <bos> <|turn>
    for marker, i in (("<|tool>", 46), ("<|tool_call>", 48), ("<|\"|>", 52), ("<turn|>", 106)):
        assert ids.count(i) == text.count(marker) > 0, marker
    assert gguf_tok.decode(ids) == text


def _with_template(tok, template):
    import copy

    other = copy.copy(tok)
    other.chat_template = template
    return other
