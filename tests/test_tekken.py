"""fuel's tokenizer for GGUF `tokenizer.ggml.pre = "tekken"` (Mistral-Nemo, Mistral Small 3 and the
other Tekken-vocabulary models) against Mistral's own tokenizer, mistral-common's Tekkenizer (tiktoken
underneath), on a real Tekken vocabulary: tekken_240911.json, Mistral-Nemo's 131k tokens, shipped in
the mistral-common wheel. llama.cpp has no test vectors for tekken; the GGUF metadata is written by
llama.cpp's own converter (`convert_hf_to_gguf.py --mistral-format --vocab-only`, from the
llama-cpp-python sdist), as a Mistral-format checkpoint's GGUF gets it.

The texts: every ggml-vocab .inp case of that sdist, code and multilingual samples, random strings
over one or two characters of each class the split regex tells apart, and each vocabulary token that
is whole UTF-8, as a text of its own. The negative controls split the same vocabulary by llama-bpe's
and gpt-2's regexes: both fail. ignore_merges (on, as llama.cpp sets it for tekken) is not a control:
off, the ids are the same on all of these texts, because the converter writes every split of each
token as a merge, so BPE reaches each whole-token piece anyway.
"""

from __future__ import annotations

import json
import random
import shutil
import subprocess
import sys
from importlib import resources
from pathlib import Path

import pytest
from conftest import cached
from test_tokenizer_vectors import SDIST, SEP, vocab_dir  # noqa: F401 (a fixture)

from fuelcli.text.gguf_tokenizer import tokenizer_from_gguf
from fuelcli.weights.gguf import read_gguf

pytest.importorskip("mistral_common")
from mistral_common.tokens.tokenizers.base import SpecialTokenPolicy  # noqa: E402
from mistral_common.tokens.tokenizers.tekken import Tekkenizer  # noqa: E402

VOCAB = "tekken_240911.json"
# Mistral-Nemo's params.json: the converter wants one (its hyperparameters go into the file, no tensors)
PARAMS = {"dim": 5120, "n_layers": 40, "head_dim": 128, "hidden_dim": 14336, "n_heads": 32, "n_kv_heads": 8,
          "norm_eps": 1e-05, "vocab_size": 131072, "rope_theta": 1000000.0}

SAMPLES = [
    "def parse_json(path: str) -> dict:\n    with open(path) as f:\n        return json.load(f)\n",
    "for (int i = 0; i < n; ++i) {\n\tsum += a[i] * b[i];\n}\r\n",
    "const xmlHttpRequest = new XMLHttpRequest(); getHTTPResponseCode(); snake_case_name = 1_000_000",
    "#!/usr/bin/env bash\nset -euo pipefail\ncurl -sSL https://example.org/a//b?c=1&d=2 | jq '.x'\n",
    "src/fuelcli/text/gguf_tokenizer.py\nC:\\Users\\Me\\file.txt\n// comment\n/* block */\n",
    '{"key": [1, 2.5, -3e10], "ok": true, "nested": {"a": null}}',
    "'Tis the season.\n'twas the night; don'tcha, THEY'RE, it's, IT'S, y'all, she'd've",
    "Je m'appelle Émile, l'école est à côté du café. ÉCOLE NORMALE SUPÉRIEURE",
    "Größenmaßstäbe für Straßenbahnen; İstanbul'da ılık bir gün; Ǆungla ǅungla ǆungla",
    "Привет, мир! Как дела? МОСКВА — столица России.",
    "Γειά σου Κόσμε· ΑΘΗΝΑ, ἀρχή.",
    "مرحبا بالعالم ١٢٣٤ שלום עולם",
    "नमस्ते दुनिया १२३ สวัสดีชาวโลก",
    "こんにちは世界、カタカナー。日本語のテキストです。",
    "你好，世界！这是中文文本。안녕하세요 세계",
    "Tiếng Việt có dấu: Cửa Việt, người Việt Nam.",
    "emoji 🦙🔥👍🏽 👨‍👩‍👧 ZWJ\u200dx and\u00a0nbsp and\u3000ideographic space",
    "ﬁne ℌello ²³ Ⅻ ½ x² H₂O",
    "   leading spaces\n\n\n\ttabs\t\t and trailing   \n \n",
    "",
]
# one or two characters of each class tekken's regex tells apart (Lu, Ll, Lt, Lm, Lo, Mn, Mc, Nd in two
# scripts, No, Nl, punctuation and the '/' it keeps after punctuation, each kind of space, ZWJ, a
# symbol) and a few whole words in three cases
ALPHABET = ["a", "é", "ß", "Z", "É", "ǅ", "ʰ", "ー", "中", "א", "\u0301", "\u0903", "3", "٣", "²", "Ⅻ", "_", ".",
            "'", "/", "-", " ", "  ", "\t", "\n", "\r", "\u00a0", "\u3000", "\u200d", "🦙", "the", "The", "THE"]


def random_texts(n=4000, seed=0) -> list:
    rng = random.Random(seed)
    return ["".join(rng.choice(ALPHABET) for _ in range(rng.randint(1, 12))) for _ in range(n)]


@pytest.fixture(scope="session")
def tekken_json() -> Path:
    return Path(str(resources.files("mistral_common") / "data" / VOCAB))


@pytest.fixture(scope="session")
def tekken_gguf(tekken_json, llama_converter) -> Path:
    """A vocabulary-only GGUF of tekken_240911.json written by llama.cpp's converter (8 MB kept)."""

    def build(out: Path):
        work, lcpp = out.parent, llama_converter
        model = work / "model"
        model.mkdir()
        shutil.copyfile(tekken_json, model / "tekken.json")
        (model / "params.json").write_text(json.dumps(PARAMS))
        r = subprocess.run([sys.executable, str(lcpp / "convert_hf_to_gguf.py"), str(model), "--mistral-format",
                            "--vocab-only", "--outfile", str(out)], capture_output=True, text=True, timeout=600)
        assert r.returncode == 0 and out.is_file(), r.stderr[-3000:]

    return cached(f"{Path(VOCAB).stem}-{SDIST.replace('==', '-')}.gguf", build)


@pytest.fixture(scope="session")
def meta(tekken_gguf) -> dict:
    return read_gguf(tekken_gguf, tensors=False).meta


@pytest.fixture(scope="session")
def mistral(tekken_json) -> Tekkenizer:
    return Tekkenizer.from_file(tekken_json)


@pytest.fixture(scope="session")
def tok(meta):
    return tokenizer_from_gguf(meta)


@pytest.fixture(scope="session")
def texts(vocab_dir) -> list:
    inp = [t for f in sorted(vocab_dir.glob("*.inp")) for t in f.read_text(encoding="utf-8").split(SEP)[:-1]]
    return list(dict.fromkeys(inp + SAMPLES + random_texts()))


def failures(tok, mistral, texts) -> list:
    return [t for t in texts if tok.encode(t, add_special_tokens=False, parse_special=False)
            != mistral.encode(t, bos=False, eos=False)]


def test_the_converter_writes_tekken(meta, mistral):
    assert meta["tokenizer.ggml.model"] == "gpt2" and meta["tokenizer.ggml.pre"] == "tekken"
    assert len(meta["tokenizer.ggml.tokens"]) == mistral.n_words == 131072


def test_ids_match_mistral(tok, mistral, texts):
    assert len(texts) > 3500
    assert failures(tok, mistral, texts) == []
    for t in texts:
        assert tok.decode(tok.encode(t, add_special_tokens=False, parse_special=False)) == t, t


def test_every_token_as_text(tok, mistral):
    """Each vocabulary token that is whole UTF-8, as a text of its own: the same ids as Mistral's
    (usually the token itself) and back to the same text."""
    texts = []
    for i in range(mistral.num_special_tokens, mistral.n_words):
        try:
            texts.append(mistral.id_to_byte_piece(i, SpecialTokenPolicy.RAISE).decode("utf-8"))
        except UnicodeDecodeError:  # a piece of a character
            pass
    assert len(texts) > 125_000
    bad = []
    for t in texts:
        ids = tok.encode(t, add_special_tokens=False, parse_special=False)
        if ids != mistral.encode(t, bos=False, eos=False) or tok.decode(ids) != t:
            bad.append(t)
    assert bad == []


def test_bos_as_llama_cpp(tok, meta, mistral):
    """BOS first, as llama.cpp adds it for tekken, whether the file says so (the converter writes
    add_bos_token) or not; special-token text stays text unless asked for."""
    for tok in (tok, tokenizer_from_gguf({k: v for k, v in meta.items() if k != "tokenizer.ggml.add_bos_token"})):
        assert tok.adds_bos and tok.bos_token_id == mistral.bos_id and tok.eos_token_id == mistral.eos_id
        for t in ("Hello world", "[INST] hi [/INST]", " x"):
            assert tok.encode(t, parse_special=False) == mistral.encode(t, bos=True, eos=False), t
    ids = tok.encode("[INST]hi[/INST]")
    assert (ids[1], ids[-1]) == (mistral.get_special_token("[INST]"), mistral.get_special_token("[/INST]"))
    assert tok.decode(tok.encode("Hello"), skip_special_tokens=True) == "Hello"


# ---------------------------------------------------------------- negative controls


def sample(word: str) -> str:
    (s,) = [s for s in SAMPLES if word in s]
    return s


def test_llama3_split_fails(meta, mistral, texts):
    """Llama-3's regex takes the "'d" of "İstanbul'da" for a contraction and leaves combining marks
    (the Devanagari virama of "नमस्ते") out of a word; tekken's keeps both in."""
    bad = failures(tokenizer_from_gguf({**meta, "tokenizer.ggml.pre": "llama-bpe"}), mistral, texts)
    assert len(bad) > 20 and sample("İstanbul'da") in bad and sample("नमस्ते") in bad


def test_gpt2_split_fails(meta, mistral, texts):
    """GPT-2's regex splits a word at "_" and does not keep "/" after punctuation."""
    bad = failures(tokenizer_from_gguf({**meta, "tokenizer.ggml.pre": "gpt-2"}), mistral, texts)
    assert len(bad) > 500 and sample("snake_case") in bad and sample("src/fuelcli") in bad


def test_a_named_builtin_template_is_refused_when_used(meta, tok):
    """--mistral-format files name llama.cpp's built-in template ("mistral-v3-tekken") instead of
    carrying Jinja: rendering says so in one line; raw text still encodes."""
    from fuelcli.errors import InputError

    assert "{" not in meta["tokenizer.chat_template"]
    with pytest.raises(InputError, match="names llama.cpp's built-in chat template 'mistral-v3-tekken'"):
        tok.render_chat([{"role": "user", "content": "hi"}])
    assert tok.encode_prompt("hi", chat=False) == tok.encode("hi")
