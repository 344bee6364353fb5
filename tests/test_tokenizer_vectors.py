"""fuel's GGUF tokenizer against llama.cpp's tokenizer test vectors: `models/ggml-vocab-NAME.gguf`
(vocabulary only, no tensors) with `.inp` (cases separated by "\\n__ggml_vocab_test__\\n") and `.out`
(one line of ids per case, no special tokens; the ids come from HF tokenizers), as llama.cpp's
tests/test-tokenizer-0 reads them. They ship inside the llama-cpp-python source package on PyPI.

Every vocabulary with vectors is either accepted and matched case for case, or refused with the
one-line error; the negative controls show the comparison can fail (Llama-3 without ignore_merges,
SentencePiece without the prefix space, Llama-3's vocabulary split by Qwen2's regex).
"""

from __future__ import annotations

import json
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from conftest import LLAMA_CPP_SDIST, cached, llama_cpp_sdist

from fuelcli.errors import InputError
from fuelcli.text import gguf_tokenizer
from fuelcli.text.gguf_tokenizer import tokenizer_from_gguf
from fuelcli.weights.gguf import read_gguf

SDIST = LLAMA_CPP_SDIST
SEP = "\n__ggml_vocab_test__\n"
# every vocabulary with vectors in that sdist, accepted (matched case for case) or refused
ACCEPTED = ["command-r", "deepseek-coder", "deepseek-llm", "falcon", "gemma-4", "gpt-2", "llama-bpe", "llama-spm",
            "mpt", "phi-3", "qwen2", "qwen35", "refact", "starcoder"]
REFUSED = {"bert-bge": "'bert'"}
# pre-tokenizers llama.cpp has no vectors for, each checked against its maker's own tokenizer instead
OTHER_ORACLES = {"tekken": "test_tekken.py",  # mistral-common's Tekkenizer on a real Tekken vocabulary
                 "gpt-4o": "test_o200k.py"}  # tiktoken's o200k pattern and gpt-oss's tokenizer.json shape


@pytest.fixture(scope="session")
def vocab_dir() -> Path:
    """models/ggml-vocab-* from the llama-cpp-python sdist (60 MB of vocabularies kept)."""

    def build(out: Path):
        sdist = llama_cpp_sdist()
        out.mkdir()
        with tarfile.open(sdist) as tar:
            for m in tar.getmembers():
                if "/vendor/llama.cpp/models/ggml-vocab-" in m.name and m.isfile():
                    with tar.extractfile(m) as src:
                        (out / Path(m.name).name).write_bytes(src.read())

    return cached("llama-cpp-vocab-0.3.36", build)


def cases(vocab_dir: Path, name: str) -> list:
    f = vocab_dir / f"ggml-vocab-{name}.gguf"
    text = (f.parent / (f.name + ".inp")).read_text(encoding="utf-8")
    if not text.endswith(SEP):  # gemma-4's file lacks the last separator (test-tokenizer-0 reads it the same)
        text += SEP
    inp = text.split(SEP)
    out = (f.parent / (f.name + ".out")).read_text(encoding="utf-8").split("\n")
    assert inp[-1] == "" and len(out) > len(inp) - 1  # the file ends with the separator
    return [(text, [int(x) for x in ids.split()]) for text, ids in zip(inp[:-1], out)]


def tokenizer(vocab_dir: Path, name: str, **meta):
    return tokenizer_from_gguf({**read_gguf(vocab_dir / f"ggml-vocab-{name}.gguf", tensors=False).meta, **meta})


def failures(tok, pairs) -> list:
    return [(t, ids) for t, ids in pairs if tok.encode(t, add_special_tokens=False, parse_special=False) != ids]


def test_every_vocabulary_with_vectors_is_covered(vocab_dir):
    with_vectors = sorted(p.name[len("ggml-vocab-"):-len(".gguf.inp")] for p in vocab_dir.glob("*.inp"))
    assert with_vectors == sorted(ACCEPTED + list(REFUSED))


@pytest.mark.parametrize("name", ACCEPTED)
def test_vectors(vocab_dir, name):
    pairs = cases(vocab_dir, name)
    assert len(pairs) >= 46
    assert failures(tokenizer(vocab_dir, name), pairs) == []


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_refused(vocab_dir, name):
    with pytest.raises(InputError, match=f"unsupported GGUF tokenizer model {REFUSED[name]}"):
        tokenizer(vocab_dir, name)


def test_every_pre_tokenizer_has_vectors(vocab_dir):
    """Each accepted tokenizer.ggml.pre is a vector vocabulary's own, or shares its entry (same regexes
    and ignore_merges) with one that is, or is in OTHER_ORACLES; smollm shares starcoder's and is also
    checked against SmolLM2's own tokenizer.json (test_tokenizer.py, test_gguf_model.py)."""
    tested = {read_gguf(vocab_dir / f"ggml-vocab-{n}.gguf", tensors=False).meta.get("tokenizer.ggml.pre")
              for n in ACCEPTED} | set(OTHER_ORACLES)
    assert all((Path(__file__).parent / f).is_file() for f in OTHER_ORACLES.values())
    tested_entries = [gguf_tokenizer.PRE_TOKENIZERS[p] for p in tested if p in gguf_tokenizer.PRE_TOKENIZERS]
    for pre, entry in gguf_tokenizer.PRE_TOKENIZERS.items():
        assert any(entry is e for e in tested_entries), pre


# ---------------------------------------------------------------- negative controls


def test_llama3_needs_ignore_merges(vocab_dir, monkeypatch):
    """The issue's own case: without ignore_merges "Cửa Việt" splits into merges' pieces."""
    assert tokenizer(vocab_dir, "llama-bpe").encode("Cửa Việt", add_special_tokens=False) == [34, 91163, 101798]
    splits, _ = gguf_tokenizer.PRE_TOKENIZERS["llama-bpe"]
    monkeypatch.setitem(gguf_tokenizer.PRE_TOKENIZERS, "llama-bpe", (splits, False))
    tok = tokenizer(vocab_dir, "llama-bpe")
    assert tok.encode("Cửa Việt", add_special_tokens=False) == [34, 91163, 11655, 26298, 83]
    assert failures(tok, cases(vocab_dir, "llama-bpe"))


def test_spm_needs_the_prefix_space(vocab_dir):
    bad = failures(tokenizer(vocab_dir, "llama-spm", **{"tokenizer.ggml.add_space_prefix": False}),
                   cases(vocab_dir, "llama-spm"))
    assert len(bad) > 10 and "Hello world" in [t for t, _ in bad]


def test_wrong_split_fails(vocab_dir):
    """Llama-3's vocabulary split by Qwen2's regex (every digit alone, not in threes): the number cases fail."""
    bad = failures(tokenizer(vocab_dir, "llama-bpe", **{"tokenizer.ggml.pre": "qwen2"}), cases(vocab_dir, "llama-bpe"))
    assert "333" in [t for t, _ in bad]


def test_gemma4_runs_bpe_over_the_whole_text(vocab_dir):
    """Gemma 4's merges join across spaces ("▁▁Hello"): the same vocabulary split into words at each
    ▁ first (SentencePiece's Metaspace) fails the cases with runs of spaces."""
    from tokenizers import pre_tokenizers

    tok = tokenizer(vocab_dir, "gemma-4")
    tok._tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="never", split=True)
    bad = [t for t, _ in failures(tok, cases(vocab_dir, "gemma-4"))]
    assert "   Hello" in bad and "    Hello\n    Hello" in bad


def test_gemma4_adds_bos_whatever_the_file_says(vocab_dir):
    """llama.cpp adds BOS for a gemma4 vocabulary even where add_bos_token is false; bytes outside the
    vocabulary fall back to <0xNN> tokens and decode back."""
    tok = tokenizer(vocab_dir, "gemma-4", **{"tokenizer.ggml.add_bos_token": False})
    assert tok.encode("Hello world") == [2, 9259, 1902]
    assert tok.decode(tok.encode(" Hello\n\n\nworld  \U0001F999 x"), skip_special_tokens=True) == \
        " Hello\n\n\nworld  \U0001F999 x"
    assert tok.encode("<|turn>user", add_special_tokens=False) == [105, tok.encode("user", add_special_tokens=False)[0]]


# ---------------------------------------------------------------- fuel inspect tokens


def run(*args):
    return subprocess.run([sys.executable, "-m", "fuelcli", "inspect", "tokens", *map(str, args)],
                          capture_output=True, text=True, timeout=300)


def test_inspect_tokens_on_vocab_only_gguf(vocab_dir, tmp_path):
    f = vocab_dir / "ggml-vocab-llama-bpe.gguf"
    r = run(f, "--text", "Cửa Việt", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == {"ids": [34, 91163, 101798]}
    spm = vocab_dir / "ggml-vocab-llama-spm.gguf"
    (tmp_path / "t.txt").write_text(" Hello world", encoding="utf-8")
    plain = json.loads(run(spm, "--file", tmp_path / "t.txt", "--json").stdout)["ids"]
    assert plain == cases(vocab_dir, "llama-spm")[12][1]  # the " Hello world" vector
    assert json.loads(run(spm, "--file", tmp_path / "t.txt", "--json", "--special").stdout)["ids"] == [1] + plain
    table = run(spm, "--text", " Hello world")
    assert table.returncode == 0 and "▁Hello" in table.stdout and "' Hello'" in table.stdout


def test_inspect_tokens_on_tokenizer_dir(tmp_path):
    from fuelcli.assembly.loader import open_tokenizer

    from tiny_models import write_byte_tokenizer

    d = tmp_path / "tok"
    d.mkdir()
    write_byte_tokenizer(d)
    r = run(d, "--text", "hi", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == {"ids": [ord("h"), ord("i")]}
    assert open_tokenizer(str(d))[1].encode("hi") == [104, 105]


def test_inspect_tokens_errors(vocab_dir, tmp_path):
    for args, what in [((vocab_dir / "ggml-vocab-bert-bge.gguf", "--text", "x"), "unsupported GGUF tokenizer model"),
                       ((vocab_dir / "ggml-vocab-qwen2.gguf",), "exactly one of --text and --file"),
                       ((vocab_dir / "ggml-vocab-qwen2.gguf", "--text", "x", "--file", "y"), "exactly one"),
                       ((vocab_dir / "ggml-vocab-qwen2.gguf", "--file", tmp_path / "none.txt"), "no such file"),
                       ((tmp_path, "--text", "x"), "no tokenizer.json")]:
        r = run(*args)
        assert r.returncode == 2 and r.stderr.startswith("error: ") and what in r.stderr, (args, r.stderr)
        assert len(r.stderr.strip().splitlines()) == 1



def test_llama2_style_gguf_runs(vocab_dir, tmp_path):
    """A Llama GGUF with a SentencePiece vocabulary (Llama-2's, from llama-spm) opens, tokenizes as
    llama.cpp (BOS first), agrees with transformers' own GGUF tokenizer on text that does not start
    with a space, and runs."""
    gguf = pytest.importorskip("gguf")
    import numpy as np

    from fuelcli.assembly.loader import open_model

    meta = read_gguf(vocab_dir / "ggml-vocab-llama-spm.gguf", tensors=False).meta
    tokens = meta["tokenizer.ggml.tokens"]
    V, H, I = len(tokens), 32, 64
    path = tmp_path / "llama2-tiny.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(1)
    w.add_embedding_length(H)
    w.add_feed_forward_length(I)
    w.add_head_count(2)
    w.add_head_count_kv(2)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_context_length(64)
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(meta["tokenizer.ggml.scores"])
    w.add_token_types(meta["tokenizer.ggml.token_type"])
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    rng = np.random.default_rng(0)
    for name, shape in [("token_embd.weight", (V, H)), ("output_norm.weight", (H,)), ("blk.0.attn_norm.weight", (H,)),
                        ("blk.0.ffn_norm.weight", (H,)), ("blk.0.attn_q.weight", (H, H)),
                        ("blk.0.attn_k.weight", (H, H)), ("blk.0.attn_v.weight", (H, H)),
                        ("blk.0.attn_output.weight", (H, H)), ("blk.0.ffn_gate.weight", (I, H)),
                        ("blk.0.ffn_up.weight", (I, H)), ("blk.0.ffn_down.weight", (H, I))]:
        w.add_tensor(name, rng.standard_normal(shape).astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()

    tok = open_model(str(path)).tokenizer
    assert tok.encode("Hello world") == [1, 15043, 3186] and tok.adds_bos
    assert tok.decode(tok.encode("Hello world 🦙"), skip_special_tokens=True) == "Hello world 🦙"
    transformers = pytest.importorskip("transformers")
    hf = transformers.AutoTokenizer.from_pretrained(str(tmp_path), gguf_file=path.name)
    for text in ("Hello world", "Cửa Việt 🦙 3333", "def f(x):\n    return x  # done", "нещо на Български"):
        assert tok.encode(text) == hf.encode(text), text
    r = subprocess.run([sys.executable, "-m", "fuelcli", "run", str(path), "Hello", "--temp", "0", "-n", "3",
                        "--no-chat-template"], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr


def test_spm_merges_are_kept_per_vocabulary(vocab_dir, tmp_path, monkeypatch):
    """The merges of a SentencePiece vocabulary are built once, kept under the cache root, loaded
    the same, and rebuilt when the kept file is damaged (negative control: a corrupted payload is
    never trusted)."""
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path))
    meta = read_gguf(vocab_dir / "ggml-vocab-llama-spm.gguf", tensors=False).meta
    args = (meta["tokenizer.ggml.tokens"], meta["tokenizer.ggml.scores"], meta["tokenizer.ggml.token_type"])
    fresh = gguf_tokenizer._all_spm_merges(*args)
    assert gguf_tokenizer._spm_merges(*args) == fresh
    (kept,) = (tmp_path / "spm-merges").iterdir()
    assert gguf_tokenizer._spm_merges(*args) == fresh  # from the file
    data = bytearray(kept.read_bytes())
    data[-5] ^= 0xFF
    kept.write_bytes(bytes(data))
    assert gguf_tokenizer._spm_merges(*args) == fresh
    other = [-x for x in args[1]]  # another vocabulary's scores: its own entry, other merges
    assert gguf_tokenizer._spm_merges(args[0], other, args[2]) == gguf_tokenizer._all_spm_merges(args[0], other, args[2])
    assert gguf_tokenizer._spm_merges(args[0], other, args[2]) != fresh
    assert len(list((tmp_path / "spm-merges").iterdir())) == 2
