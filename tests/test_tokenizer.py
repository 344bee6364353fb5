"""fuelcli.text.tokenizer against transformers' AutoTokenizer (the oracle) on SmolLM2's real tokenizer."""

from __future__ import annotations

import json
import shutil

import pytest
import tokenizers
from tokenizers import decoders, models, pre_tokenizers

from fuelcli.errors import InputError
from fuelcli.text.tokenizer import Tokenizer

TEXT = (
    "The quick brown fox — naïve café, déjà vu.\n\n"
    "def fib(n: int) -> int:\n    return n if n < 2 else fib(n - 1) + fib(n - 2)  # O(2^n)\n"
    "Digits: 3.14159 2026-01-31 1234567890 0x1F\t\ttabs   and    runs of     spaces\n"
    "Emoji 🦙🔥👨‍👩‍👧 ✅, CJK 日本語のテキスト 你好，世界 한국어\n"
)

CHATS = [
    [{"role": "user", "content": TEXT}],
    [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "2+2?"}],
    [
        {"role": "user", "content": "Hi 👋"},
        {"role": "assistant", "content": "Hello! 你好"},
        {"role": "user", "content": "Code:\n```py\nprint(1)\n```"},
    ],
]


@pytest.fixture(scope="module")
def hf(smollm2_tokenizer_dir):
    transformers = pytest.importorskip("transformers")
    return transformers.AutoTokenizer.from_pretrained(smollm2_tokenizer_dir)


@pytest.fixture(scope="module")
def tok(smollm2_tokenizer_dir):
    return Tokenizer.from_dir(smollm2_tokenizer_dir)


def _hf_ids(x):
    return list(x["input_ids"] if not isinstance(x, list) else x)


def test_encode_decode_match_transformers(tok, hf):
    for text in (TEXT, "", " leading space", "<|im_start|>user\nhi<|im_end|>", "a" * 300):
        ids = tok.encode(text)
        assert ids == hf.encode(text)
        assert tok.encode(text, add_special_tokens=False) == hf.encode(text, add_special_tokens=False)
        for skip in (False, True):
            assert tok.decode(ids, skip_special_tokens=skip) == hf.decode(ids, skip_special_tokens=skip)
    assert tok.decode(tok.encode(TEXT)) == TEXT
    assert tok.vocab_size == len(hf)


def test_chat_matches_apply_chat_template(tok, hf):
    assert tok.chat_template == hf.chat_template
    for msgs in CHATS:
        for gen in (True, False):
            assert tok.render_chat(msgs, add_generation_prompt=gen) == hf.apply_chat_template(
                msgs, tokenize=False, add_generation_prompt=gen
            )
    for system in (None, "You are a pirate."):
        msgs = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": TEXT}]
        expect = _hf_ids(hf.apply_chat_template(msgs, tokenize=True, add_generation_prompt=True))
        assert tok.encode_prompt(TEXT, system=system) == expect
    assert tok.encode_prompt(TEXT, chat=False) == hf.encode(TEXT)


def test_special_tokens_and_eos(tok):
    assert tok.bos_token == "<|im_start|>" and tok.bos_token_id == 1
    assert tok.eos_token == "<|im_end|>" and tok.eos_token_id == 2


def _check_stream(tok, ids, skip=False):
    s = tok.stream(skip_special_tokens=skip)
    pieces = [s.push(i) for i in ids] + [s.flush()]
    assert not any("\ufffd" in p for p in pieces)  # never a split multi-byte character
    assert "".join(pieces) == tok.decode(ids, skip_special_tokens=skip)
    return pieces


def test_stream_byte_level(tok):
    ids = tok.encode(TEXT)
    # The test is only meaningful if some tokens carry part of a character.
    assert any("\ufffd" in t for t in tok.token_text(ids))
    _check_stream(tok, ids)
    chat = tok.encode(tok.render_chat(CHATS[2], add_generation_prompt=False), add_special_tokens=False)
    _check_stream(tok, chat)
    pieces = _check_stream(tok, chat, skip=True)
    assert "<|im_start|>" not in "".join(pieces)


def _byte_fallback_tokenizer() -> tokenizers.Tokenizer:
    """A Llama-2-style SentencePiece BPE with byte fallback: chars outside the vocab become <0xNN>."""
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    vocab.update({f"<0x{b:02X}>": 3 + b for b in range(256)})
    pieces = ["▁"] + list("abcdefghijklmnopqrstuvwxyzTEDCJ.,:()+-=<>0123456789#\n") + ["日", "本"]
    pieces += ["▁t", "he", "▁the", "▁f", "ib"]
    for p in pieces:
        vocab.setdefault(p, len(vocab))
    merges = [("▁", "t"), ("h", "e"), ("▁t", "he"), ("▁", "f"), ("i", "b")]
    tok = tokenizers.Tokenizer(models.BPE(vocab, merges, unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=False)
    tok.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    tok.add_special_tokens(["<unk>", "<s>", "</s>"])
    return tok


def test_stream_byte_fallback_and_bos():
    tok = Tokenizer.from_parts(_byte_fallback_tokenizer(), None, "<s>", "</s>", add_bos=True)
    ids = tok.encode(TEXT)
    assert ids[0] == 1 and tok.encode("x", add_special_tokens=False)[0] != 1
    assert "<0xF0>" in tok.backend.encode(TEXT).tokens  # the emoji went through byte fallback
    assert tok.decode(ids, skip_special_tokens=True) == TEXT
    _check_stream(tok, ids)
    _check_stream(tok, ids, skip=True)  # BOS skipped: the first word must keep no leading space
    # A special token mid-stream, skipped: the space of the word after it must survive.
    mid = tok.encode("the fib") + [2] + tok.encode(" the", add_special_tokens=False)
    assert "".join(_check_stream(tok, mid, skip=True)) == "the fib the"
    assert tok.encode_prompt("hi", chat=True) == tok.encode("hi")  # no template: plain encode with BOS


def test_bos_follows_tokenizer_json(smollm2_tokenizer_dir, tmp_path):
    """BOS comes from tokenizer.json's post-processor; transformers 5 ignores tokenizer_config's
    add_bos_token when tokenizer.json exists. Both behaviours are checked against transformers."""
    transformers = pytest.importorskip("transformers")
    d = tmp_path / "tok"
    shutil.copytree(smollm2_tokenizer_dir, d)
    cfg = json.loads((d / "tokenizer_config.json").read_text())
    (d / "tokenizer_config.json").write_text(json.dumps({**cfg, "add_bos_token": True}))
    (d / "config.json").write_text(json.dumps({"eos_token_id": [2, 0]}))
    (d / "generation_config.json").write_text(json.dumps({"eos_token_id": 0}))

    def check(first_is_bos: bool):
        ours, theirs = Tokenizer.from_dir(d), transformers.AutoTokenizer.from_pretrained(d)
        assert ours.encode(TEXT) == theirs.encode(TEXT)
        assert (ours.encode(TEXT)[0] == 1) == first_is_bos
        assert ours.encode(TEXT, add_special_tokens=False) == theirs.encode(TEXT, add_special_tokens=False)
        msgs = CHATS[1]
        assert ours.encode_prompt("2+2?", system="Be terse.") == _hf_ids(
            theirs.apply_chat_template(msgs, tokenize=True, add_generation_prompt=True)
        )
        return ours

    assert check(first_is_bos=False).eos_token_id == 2
    tj = json.loads((d / "tokenizer.json").read_text())
    tj["post_processor"] = {
        "type": "TemplateProcessing",
        "single": [{"SpecialToken": {"id": "<|im_start|>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
        "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
        "special_tokens": {"<|im_start|>": {"id": "<|im_start|>", "ids": [1], "tokens": ["<|im_start|>"]}},
    }
    (d / "tokenizer.json").write_text(json.dumps(tj))
    check(first_is_bos=True)


def test_template_sources_and_errors(smollm2_tokenizer_dir, tmp_path):
    d = tmp_path / "tok"
    d.mkdir()
    shutil.copy(smollm2_tokenizer_dir / "tokenizer.json", d)
    template = (
        "{{ bos_token }}{% for m in messages %}{{ m.content | tojson }}{% endfor %}{{ strftime_now('%Y') | length }}"
    )
    templates = [{"name": "tool_use", "template": "x"}, {"name": "default", "template": template}]
    cfg = {"bos_token": "<|im_start|>", "chat_template": templates}
    (d / "tokenizer_config.json").write_text(json.dumps(cfg))
    tok = Tokenizer.from_dir(d)
    assert tok.render_chat([{"role": "user", "content": 'say "é"'}]) == '<|im_start|>"say \\"é\\""4'

    (d / "chat_template.jinja").write_text("{{ raise_exception('no system role') }}")
    with pytest.raises(InputError, match="chat template error: no system role"):
        Tokenizer.from_dir(d).encode_prompt("hi")
    (d / "chat_template.jinja").write_text("{% for %}")
    with pytest.raises(InputError, match="chat template error"):
        Tokenizer.from_dir(d).render_chat([])

    (d / "chat_template.jinja").unlink()
    (d / "tokenizer_config.json").write_text("{}")
    plain = Tokenizer.from_dir(d)
    assert plain.chat_template is None and plain.encode_prompt("hi") == plain.encode("hi")
    with pytest.raises(InputError, match="no chat template"):
        plain.render_chat([{"role": "user", "content": "hi"}])


def test_missing_tokenizer_json(tmp_path):
    with pytest.raises(InputError, match="tokenizer.json"):
        Tokenizer.from_dir(tmp_path)
    (tmp_path / "tokenizer.json").write_text("{not json")
    with pytest.raises(InputError, match="cannot load tokenizer"):
        Tokenizer.from_dir(tmp_path)
