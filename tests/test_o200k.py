"""fuel's tokenizer for GGUF `tokenizer.ggml.pre = "gpt-4o"`, llama.cpp's name for the o200k split
(gpt-oss's o200k_harmony vocabulary, GPT-4o's o200k_base). llama.cpp has no test vectors for it and
the vocabulary (200k tokens) ships in no package here, so two oracles stand in:

- the split itself against tiktoken's o200k_base pattern applied by the `regex` module (tiktoken's
  reference implementation, _educational.py, splits with regex.findall), piece for piece;
- ids against an HF `tokenizers` tokenizer built from gpt-oss's tokenizer.json shape, as transformers'
  TikTokenConverter writes it (a Split with the o200k pattern, Isolated, then ByteLevel without its
  own regex; BPE with ignore_merges, tiktoken's whole-piece lookup; the harmony specials as added
  tokens), on a byte-level BPE vocabulary trained here on the same texts with that split, whose
  tokens, merges and token types are handed to fuel as GGUF metadata.

The texts: code, numbers, CJK, emoji, contractions in all cases, runs of capitals before a word
("HTTPServerError"), whitespace runs, and random strings over each character class the pattern tells
apart. The negative controls split the same texts by Tekken's pattern (no contractions, one digit at a
time) and by Llama-3's: both differ.
"""

from __future__ import annotations

import json
import random

import pytest
from tokenizers import Regex, Tokenizer, models, pre_tokenizers, trainers

from fuelcli.text import gguf_tokenizer
from fuelcli.text.gguf_tokenizer import _byte_alphabet, tokenizer_from_gguf

regex = pytest.importorskip("regex")

# tiktoken_ext/openai_public.py, o200k_base: the parts as tiktoken writes them
TIKTOKEN_O200K = "|".join([
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
    r"""\p{N}{1,3}""",
    r""" ?[^\s\p{L}\p{N}]+[\r\n/]*""",
    r"""\s*[\r\n]+""",
    r"""\s+(?!\S)""",
    r"""\s+""",
])
HARMONY_SPECIALS = ["<|startoftext|>", "<|endoftext|>", "<|return|>", "<|constrain|>", "<|channel|>", "<|start|>",
                    "<|end|>", "<|message|>", "<|call|>"]
SAMPLES = [
    "HTTPServerError", "parseJSONResponse XMLHttpRequest getHTTPSUrl", "iPhone McDonald's O'Neil",
    "I'm sure you're right, they'll say we've done it; he'd know. IT'S DON'T WE'LL YOU'RE",
    "def f(x):\n    return x**2 + 1  # square\n\nclass A(B):\n\tpass\n",
    "if (a && b || !c) { console.log(`${a}`); } // end", "path/to/file.py:42:7 a/b//c\n/\n",
    "1234567890 3.14159 -42 1,000,000 0x1F 1e-10 2024-06-30 ١٢٣٤٥ ²³ Ⅻ ½",
    "中文文本，标点符号。日本語のテキスト、カタカナ。한국어 텍스트입니다.",
    "emoji 🦙🚀👍🏽 👨‍👩‍👧 flags 🇫🇷🇯🇵 and ❤️", "Ελληνικά Русский текст עברית العربية हिन्दी ไทย",
    "   leading spaces\n\n\n\ttabs\t\t and trailing   \n \n", "a\r\nb\r\n\r\nc", "\u00a0nbsp\u3000ideographic\u200dzwj",
    "café naïve résumé Ångström ﬁne ℌello x² H₂O", "e\u0301 combining a\u0308 marks", "ALLCAPS lower Title mIxEd CaSe",
    "<|channel|>analysis<|message|>We need to answer.<|end|><|start|>assistant<|channel|>final<|message|>Hi!",
    "",
]
# one or two characters of each class the o200k pattern tells apart, and contractions
ALPHABET = ["a", "é", "ß", "Z", "É", "ǅ", "ʰ", "ー", "中", "א", "\u0301", "\u0903", "3", "٣", "²", "Ⅻ", "_", ".",
            "'", "'s", "'S", "'ll", "'LL", "/", "-", " ", "  ", "\t", "\n", "\r", "\u00a0", "\u3000", "\u200d",
            "🦙", "the", "The", "THE", "HTTPServer", "123", "4567"]


def random_texts(n=3000, seed=0) -> list:
    rng = random.Random(seed)
    return ["".join(rng.choice(ALPHABET) for _ in range(rng.randint(1, 12))) for _ in range(n)]


TEXTS = list(dict.fromkeys(SAMPLES + random_texts()))


def spelled(piece: str) -> str:
    """A piece in the byte alphabet, as byte-level pre-tokenizers write it."""
    alphabet = _byte_alphabet()
    return "".join(alphabet[b] for b in piece.encode("utf-8"))


def fuel_pieces(tok, text: str) -> list[str]:
    return [p for p, _ in tok.backend.pre_tokenizer.pre_tokenize_str(text)]


def gpt_oss_tokenizer_json(vocab: dict, merges: list) -> str:
    """The shape of gpt-oss's tokenizer.json: its pre-tokenizer, model and decoder as the hub file has
    them, around the given vocabulary; the harmony specials as added tokens."""
    added = [{"id": vocab[t], "content": t, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": True} for t in HARMONY_SPECIALS]
    return json.dumps({
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added, "normalizer": None,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": gguf_tokenizer._O200K}, "behavior": "Isolated", "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]},
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": True,
                  "vocab": vocab, "merges": [list(m) for m in merges]}})


@pytest.fixture(scope="module")
def trained() -> tuple[dict, list]:
    """A byte-level BPE vocabulary (2000 tokens) learnt on TEXTS with the o200k split, then the specials."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(gguf_tokenizer._O200K), "isolated"),
                                                 pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    trainer = trainers.BpeTrainer(vocab_size=2000, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(TEXTS * 3, trainer)
    model = json.loads(tok.to_str())["model"]
    vocab = dict(model["vocab"])
    for s in HARMONY_SPECIALS:
        vocab[s] = len(vocab)
    return vocab, [tuple(m) if isinstance(m, list) else tuple(m.split(" ", 1)) for m in model["merges"]]


@pytest.fixture(scope="module")
def pair(trained):
    vocab, merges = trained
    tokens = sorted(vocab, key=vocab.get)
    meta = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "gpt-4o", "tokenizer.ggml.tokens": tokens,
            "tokenizer.ggml.token_type": [3 if t in HARMONY_SPECIALS else 1 for t in tokens],
            "tokenizer.ggml.merges": [" ".join(m) for m in merges],
            "tokenizer.ggml.eos_token_id": vocab["<|return|>"], "tokenizer.ggml.bos_token_id": vocab["<|startoftext|>"]}
    return tokenizer_from_gguf(meta), Tokenizer.from_str(gpt_oss_tokenizer_json(vocab, merges))


def test_the_split_is_tiktokens(pair):
    fuel, _ = pair
    bad = [t for t in TEXTS if "<|" not in t and fuel_pieces(fuel, t) != [spelled(p) for p in regex.findall(TIKTOKEN_O200K, t)]]
    assert bad == []
    assert fuel_pieces(fuel, "HTTPServerError they'LL 12345") == ["HTTPServer", "Error", "Ġthey'LL", "Ġ", "123", "45"]


def test_ids_match_hf_tokenizers(pair):
    fuel, hf = pair
    bad = [t for t in TEXTS if fuel.encode(t, add_special_tokens=False) != hf.encode(t, add_special_tokens=False).ids]
    assert bad == []
    for t in TEXTS:
        assert fuel.decode(fuel.encode(t, add_special_tokens=False)) == t, t
    # the harmony markers are one token each, and kept when asked
    ids = fuel.encode(SAMPLES[-2], add_special_tokens=False)
    markers = [t for t in fuel.token_text(ids) if t.startswith("<|")]
    assert markers == ["<|channel|>", "<|message|>", "<|end|>", "<|start|>", "<|channel|>", "<|message|>"]
    assert fuel.decode(ids) == SAMPLES[-2] and "<|" not in fuel.decode(ids, skip_special_tokens=True)


@pytest.mark.parametrize("other", ["tekken", "llama-bpe"])
def test_other_splits_differ(pair, other):
    fuel, _ = pair
    split, _ = gguf_tokenizer.PRE_TOKENIZERS[other]
    wrong = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(r), "isolated") for r in split]
                                    + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    differ = [t for t in TEXTS if [p for p, _ in wrong.pre_tokenize_str(t)] != fuel_pieces(fuel, t)]
    assert len(differ) > 100


# llama.cpp's rewrite of the pattern for its regex engine (llama-vocab.cpp, LLAMA_VOCAB_PRE_TYPE_GPT4O)
LLAMA_CPP_REWRITE = (r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+"
                     r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?"
                     r"|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*"
                     r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?"
                     r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")


@pytest.mark.parametrize("text", ["नमस्ते दुनिया", "ที่นี่", "עִבְרִית", "e\u0301te"])
def test_combining_marks_stay_in_their_word(pair, text):
    """tiktoken's letter classes hold the combining marks (\\p{M}); llama.cpp's rewrite cuts there, so
    fuel follows the model's own tokenizer and not llama.cpp on these scripts."""
    fuel, _ = pair
    want = [spelled(p) for p in regex.findall(TIKTOKEN_O200K, text)]
    rewrite = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(LLAMA_CPP_REWRITE), "isolated"),
                                       pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    assert fuel_pieces(fuel, text) == want != [p for p, _ in rewrite.pre_tokenize_str(text)]
