"""Request parsing (fuelcli/serve/schemas.py) and prompt building (jobs.py): the forms OpenAI clients
send are accepted and mean what they say. The refusals are tested over HTTP in test_serve_tiny.py."""

import json

import pytest

from fuelcli.serve.errors import APIError
from fuelcli.serve.jobs import ServedModel, chat_job, completion_job
from fuelcli.serve.schemas import ChatRequest, CompletionRequest, parse
from fuelcli.text.generate import SamplerParams
from fuelcli.text.tokenizer import Tokenizer
from serve_helpers import CHAT_TEMPLATE, char_tokenizer


def chat(**kw):
    return parse(ChatRequest, json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}], **kw}))


def text(**kw):
    return parse(CompletionRequest, json.dumps({"model": "m", "prompt": "hi", **kw}))


@pytest.fixture
def model():
    tok = Tokenizer(char_tokenizer(), CHAT_TEMPLATE, "<s>", "</s>")
    return ServedModel("m", {"m"}, tok, 64, 256, {2}, 0)


def job(build, req, model):
    return build(req, model, None)  # no event loop: these jobs are only looked at


def test_defaults_are_fuel_runs(model):
    j = job(chat_job, chat(), model)
    assert j.params == SamplerParams() and j.stops == [] and j.n_logprobs is None
    assert j.max_tokens == model.n_ctx  # chat: until EOS or the context is full
    assert job(completion_job, text(), model).max_tokens == 16  # completions: OpenAI's default


def test_sampling_fields_and_extensions(model):
    j = job(chat_job, chat(temperature=0, top_p=0.5, seed=3, top_k=7, min_p=0.2, repeat_penalty=1.3,
                           repeat_last_n=-1, stop="x", max_tokens=5), model)
    assert j.params == SamplerParams(temp=0, top_k=7, top_p=0.5, min_p=0.2, repeat_penalty=1.3,
                                     repeat_last_n=-1, seed=3)
    assert (j.stops, j.max_tokens) == (["x"], 5)
    assert job(chat_job, chat(temperature=1), model).params.temp == 1.0  # an integer is a number
    assert job(chat_job, chat(max_tokens=9, max_completion_tokens=4), model).max_tokens == 4
    assert job(chat_job, chat(stop=["a", "b"]), model).stops == ["a", "b"]


def test_neutral_values_of_unsupported_fields_are_accepted():
    chat(n=1, presence_penalty=0, frequency_penalty=0.0, logit_bias={}, tools=[], tool_choice="none",
         response_format={"type": "text"}, parallel_tool_calls=False, user="u", stream=True,
         stream_options={"include_usage": True}, temperature=None, seed=None, stop=None)
    text(echo=False, best_of=1, suffix=None, logprobs=0)


def test_chat_prompt_is_the_rendered_template(model):
    req = chat(messages=[{"role": "developer", "content": "sys"},
                         {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
                         {"role": "assistant", "content": "c", "name": "bot"}, {"role": "user", "content": "d"}])
    ids = job(chat_job, req, model).prompt_ids
    want = ("<s><|im_start|>system\nsys<|im_end|>\n<|im_start|>user\nab<|im_end|>\n<|im_start|>assistant\nc"
            "<|im_end|>\n<|im_start|>user\nd<|im_end|>\n<|im_start|>assistant\n")
    assert model.tokenizer.decode(ids) == want  # developer is the system role; text parts are joined
    assert ids[0] == 1 and ids.count(1) == 1  # BOS once, written by the template


def test_completion_prompts(model):
    assert job(completion_job, text(prompt="ab"), model).prompt_ids == [1, 71, 72]  # BOS added, as fuel run
    assert job(completion_job, text(prompt=[5, 6, 7]), model).prompt_ids == [5, 6, 7]
    assert job(completion_job, text(prompt=["ab"]), model).prompt_ids == [1, 71, 72]
    assert job(completion_job, text(prompt=[[5, 6]]), model).prompt_ids == [5, 6]


def test_logprob_settings():
    assert chat(logprobs=True).n_logprobs == 0 and chat(logprobs=True, top_logprobs=3).n_logprobs == 3
    assert chat(logprobs=False).n_logprobs is None and text(logprobs=2).n_logprobs == 2


def test_template_refusal_is_a_400(model):
    strict = Tokenizer(char_tokenizer(), "{{ raise_exception('roles must alternate') }}", "<s>", "</s>")
    with pytest.raises(APIError) as e:
        job(chat_job, chat(), ServedModel("m", {"m"}, strict, 64, 256, {2}, 0))
    assert e.value.status == 400 and "roles must alternate" in e.value.message
    no_template = Tokenizer(char_tokenizer(), None, "<s>", "</s>")
    with pytest.raises(APIError, match="no chat template"):
        job(chat_job, chat(), ServedModel("m", {"m"}, no_template, 64, 256, {2}, 0))


def test_without_llguidance_the_grammar_fields_are_400s_naming_it(model, monkeypatch):
    import sys

    from test_serve_agents import QWEN3_SHAPED, WEATHER

    monkeypatch.setitem(sys.modules, "llguidance", None)  # import llguidance raises ImportError
    tools_model = ServedModel("m", {"m"}, Tokenizer(char_tokenizer(), QWEN3_SHAPED, "<s>", "</s>"), 4096, 256, {2}, 0)
    cases = [(model, chat(response_format={"type": "json_object"}), "response_format"),
             (model, chat(response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {}}}),
              "response_format.json_schema"),
             (tools_model, chat(tools=[WEATHER], tool_choice="required"), "tools")]
    for m, req, param in cases:
        with pytest.raises(APIError) as e:
            job(chat_job, req, m)
        assert e.value.status == 400 and e.value.param == param
        assert "llguidance" in e.value.message and "fuel-llm[grammar]" in e.value.message
    job(chat_job, chat(tools=[WEATHER]), tools_model)  # a call neither demanded nor strict needs no grammar


def test_server_defaults_for_template_kwargs_and_reasoning():
    from test_serve_agents import QWEN3_SHAPED

    tok = Tokenizer(char_tokenizer(), QWEN3_SHAPED, "<s>", "</s>")
    served = ServedModel("m", {"m"}, tok, 4096, 256, {2}, 0, template_kwargs={"enable_thinking": False})
    off = job(chat_job, chat(), served)
    on = job(chat_job, chat(chat_template_kwargs={"enable_thinking": True}), served)  # the request's wins
    assert tok.decode(off.prompt_ids).endswith("<think>\n\n</think>\n\n") and tok.decode(on.prompt_ids).endswith("<think>\n")
    assert (off.reply["in_reasoning"], on.reply["in_reasoning"]) == (False, True)
    none = ServedModel("m", {"m"}, tok, 4096, 256, {2}, 0, reasoning_format="none")
    assert not job(chat_job, chat(), none).reply["reasoning"]
    assert job(chat_job, chat(reasoning_format="auto"), none).reply["reasoning"]
