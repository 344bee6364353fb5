"""A `tokenizers.Tokenizer` built from GGUF `tokenizer.ggml.*` metadata, matching llama.cpp.

Three vocabulary types (`tokenizer.ggml.model`):

  gpt2   byte-level BPE (Llama-3, Qwen, SmolLM, StarCoder, ...). The split regexes are not in the
         file: `tokenizer.ggml.pre` names them, and PRE_TOKENIZERS below has llama.cpp's
         (src/llama-vocab.cpp) for the names fuel accepts. Llama-3's BPE takes a whole pre-token
         from the vocabulary before any merge (HF `ignore_merges`).
  llama  SentencePiece BPE (Llama-2, TinyLlama, Mistral): per-token scores, byte fallback to
         `<0xNN>` tokens, `▁` for spaces, a space put in front of the text (`add_space_prefix`,
         default on) and BOS added by default. The file has no merges; they are rebuilt from the
         scores (a pair merges when the piece it forms is in the vocabulary; higher score first),
         which is what llama.cpp's SPM tokenizer does symbol pair by symbol pair.
  gemma4 BPE over the file's merges on the text's own UTF-8 with `▁` for spaces (Gemma 4's
         tokenizer.json: no pre-tokenizer, no prefix space), byte fallback to `<0xNN>` tokens;
         BOS always added (llama.cpp overrides the file's add_bos_token for it).

Every accepted name passes llama.cpp's tokenizer test vectors (`models/ggml-vocab-*.gguf` with
`.inp`/`.out`, whose ids come from HF tokenizers): see tests/test_tokenizer_vectors.py; tekken, which
has none, is checked against Mistral's own tokenizer (tests/test_tekken.py), gpt-4o (o200k: gpt-oss)
against tiktoken's pattern and HF tokenizers in gpt-oss's tokenizer.json shape (tests/test_o200k.py). Other vocabularies are
refused with one line naming what is supported.
"""

from __future__ import annotations

import re
from functools import lru_cache

import tokenizers
from tokenizers import AddedToken, Regex, decoders, models, normalizers, pre_tokenizers

from ..errors import InputError
from .tokenizer import Tokenizer
from ..process.panic_guard import call_quietly
from ..weights.gguf_meta import check_merges, positions

# llama.cpp's regexes (llama-vocab.cpp, llm_tokenizer_bpe), each applied in turn to the pieces the
# previous one left; matches and the text between them both become pieces.
_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
_LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
           r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
          r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN35 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"
           r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
# Mistral's Tekken (tekken.json's own pattern, which llama.cpp keeps in a comment and rewrites for
# its regex engine; Oniguruma has the case classes): a word is its capitals then lower case.
_TEKKEN = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
           r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
           r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
# o200k (OpenAI's gpt-4o and gpt-oss vocabularies; llama.cpp's "gpt-4o"): Tekken's words, each with
# an English contraction after it, and numbers three digits at a time. tiktoken's own pattern, as
# gpt-oss's tokenizer.json carries it: llama.cpp rewrites the letter classes for its regex engine
# ("not a-z", "not A-Z"), which cuts a word at a combining mark (Devanagari, Thai) where the model's
# tokenizer does not. Its BPE takes a whole pre-token from the vocabulary first, as tiktoken does
# (transformers' TikTokenConverter writes ignore_merges), where llama.cpp merges.
_O200K = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
          r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
          r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
# Written with \x{...} escapes: a literal Greek letter here may be NFC-normalised on the way into
# the file (U+1F7D becomes U+03CE), which turns a range around.
_CJK = r"[\x{4E00}-\x{9FA5}\x{800}-\x{4E00}\x{AC00}-\x{D7FF}]+"
_DEEPSEEK_LLM = [
    r"[\r\n]",
    r"\s?[A-Za-z\x{B5}\x{C0}-\x{D6}\x{D8}-\x{F6}\x{F8}-\x{1BA}\x{1BC}-\x{1BF}\x{1C4}-\x{293}\x{295}-\x{2AF}"
    r"\x{370}-\x{373}\x{376}\x{377}\x{37B}-\x{37D}\x{37F}\x{386}\x{388}-\x{38A}\x{38C}\x{38E}-\x{3A1}"
    r"\x{3A3}-\x{3F5}\x{3F7}-\x{481}\x{48A}-\x{52F}\x{531}-\x{556}\x{10A0}-\x{10C5}\x{13A0}-\x{13F5}"
    r"\x{13F8}-\x{13FD}\x{1C90}-\x{1CBA}\x{1CBD}-\x{1CBF}\x{1D00}-\x{1D2B}\x{1D6B}-\x{1D77}\x{1D79}-\x{1D9A}"
    r"\x{1E00}-\x{1F15}\x{1F18}-\x{1F1D}\x{1F20}-\x{1F45}\x{1F48}-\x{1F4D}\x{1F50}-\x{1F57}\x{1F59}\x{1F5B}"
    r"\x{1F5D}\x{1F5F}-\x{1F7D}\x{1F80}-\x{1FB4}\x{1FB6}-\x{1FBC}\x{1FBE}\x{1FC2}-\x{1FC4}\x{1FC6}-\x{1FCC}"
    r"\x{1FD0}-\x{1FD3}\x{1FD6}-\x{1FDB}\x{1FE0}-\x{1FEC}\x{1FF2}-\x{1FF4}\x{1FF6}-\x{1FFC}\x{2102}\x{2107}"
    r"\x{210A}-\x{2113}\x{2115}\x{2119}-\x{211D}\x{2124}\x{2126}\x{2128}\x{212A}-\x{212D}\x{212F}-\x{2134}"
    r"\x{2139}\x{213C}-\x{213F}\x{2145}-\x{2149}\x{214E}\x{2183}\x{2184}\x{2C00}-\x{2C7B}\x{2C7E}-\x{2CE4}"
    r"\x{2CEB}-\x{2CEE}\x{2CF2}\x{2CF3}\x{A640}-\x{A66D}\x{A680}-\x{A69B}\x{A722}-\x{A76F}\x{A771}-\x{A787}"
    r"\x{A78B}-\x{A78E}\x{AB70}-\x{ABBF}\x{FB00}-\x{FB06}\x{FB13}-\x{FB17}\x{FF21}-\x{FF3A}\x{FF41}-\x{FF5A}"
    r"\x{10400}-\x{1044F}\x{104B0}-\x{104D3}\x{104D8}-\x{104FB}\x{10C80}-\x{10CB2}\x{10CC0}-\x{10CF2}"
    r"\x{118A0}-\x{118DF}\x{1E900}-\x{1E943}]+",
    r"\s?[!-/:-~\x{FF01}-\x{FF0F}\x{FF1A}-\x{FF5E}\x{2018}-\x{201F}\x{3000}-\x{3002}]+",
    r"\s+$",
    _CJK,
    r"\p{N}+",
]
_DEEPSEEK_CODER = [r"[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", _CJK, r"\p{N}"]
_FALCON = [r"[\p{P}\$\+<=>\^~\|`]+", _GPT2, r"[0-9][0-9][0-9]"]

# tokenizer.ggml.pre -> (split regexes in order, ignore_merges). Each group is one llama.cpp
# pre-tokenizer type; the comment names the test-vector vocabulary that checks it.
PRE_TOKENIZERS = {
    **dict.fromkeys(("qwen2", "deepseek-r1-qwen"), ([_QWEN2], False)),  # qwen2
    "qwen35": ([_QWEN35], False),  # qwen35
    **dict.fromkeys(("llama-bpe", "llama3", "llama-v3"), ([_LLAMA3], True)),  # llama-bpe
    "tekken": ([_TEKKEN], True),  # none: Mistral's own Tekkenizer on its vocabulary (tests/test_tekken.py)
    "gpt-4o": ([_O200K], True),  # none: HF tokenizers and tiktoken's regex on the o200k pattern (tests/test_o200k.py)
    # every digit alone, then GPT-2's split (SmolLM2's own tokenizer.json: tests/test_tokenizer.py)
    **dict.fromkeys(("smollm", "starcoder", "refact", "command-r"), ([r"\p{N}", _GPT2], False)),  # starcoder, refact, command-r
    **dict.fromkeys(("gpt-2", "mpt"), ([_GPT2], False)),  # gpt-2, mpt
    "falcon": (_FALCON, False),  # falcon
    "deepseek-llm": (_DEEPSEEK_LLM, False),  # deepseek-llm
    "deepseek-coder": (_DEEPSEEK_CODER, False),  # deepseek-coder
}
# the pre-tokenizers llama.cpp adds BOS for by default (the file's add_bos_token overrides)
_ADD_BOS = ("llama-bpe", "llama3", "llama-v3", "tekken")
MODELS = ("gpt2 (byte-level BPE)", "llama (SentencePiece)", "gemma4 (BPE on ▁-spaced text)")

NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6


@lru_cache(maxsize=1)
def _byte_alphabet() -> dict:
    """GPT-2's bytes_to_unicode: the printable stand-in character of each byte."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


@lru_cache(maxsize=1)
def _outside_alphabet() -> re.Pattern:
    """Matches a character that is not in the byte alphabet (a regex scans a 151k-token vocabulary
    in a third of the time set() takes)."""
    return re.compile("[^" + "".join(map(re.escape, sorted(_byte_alphabet().values()))) + "]")


def _tokens(meta: dict) -> list:
    tokens = meta.get("tokenizer.ggml.tokens")
    if not tokens:
        raise InputError("GGUF metadata lacks tokenizer.ggml.tokens")
    return tokens


def _types(meta: dict, n: int) -> list:
    types = meta.get("tokenizer.ggml.token_type")
    return list(types) if types else [NORMAL] * n


def _byte_level(meta: dict) -> tuple[tokenizers.Tokenizer, list, list]:
    pre = meta.get("tokenizer.ggml.pre")
    if pre not in PRE_TOKENIZERS:
        got = "none" if pre is None else repr(pre)
        raise InputError(f"unsupported GGUF tokenizer.ggml.pre {got} for a byte-level BPE vocabulary "
                         f"(supported: {', '.join(PRE_TOKENIZERS)})")
    tokens = _tokens(meta)
    merges = meta.get("tokenizer.ggml.merges")
    if merges is None:
        raise InputError("GGUF metadata lacks tokenizer.ggml.merges (a byte-level BPE vocabulary needs them)")
    splits, ignore_merges = PRE_TOKENIZERS[pre]

    # Byte-level vocabularies spell every token in the byte alphabet; respell any that is not
    # (as transformers does) so BPE can reach it, unless a token already has that spelling
    # (Command-R stores both "\u200d" and its byte spelling "âĢį": llama.cpp finds the latter).
    # A user-defined token keeps its own text ("  " in MPT): it is matched whole, never by BPE.
    spell = _byte_alphabet()
    alpha = set(spell.values())
    types = _types(meta, len(tokens))
    # Usually every token is spelled in the byte alphabet and none repeats: then the vocabulary is
    # one dict (a per-token loop over 151k tokens costs a start ~0.2 s).
    vocab = dict(zip(tokens, range(len(tokens)))) if not _outside_alphabet().search("".join(tokens)) else {}
    if len(vocab) != len(tokens):
        vocab, respelled = {}, []
        for i, (t, ty) in enumerate(zip(tokens, types)):
            if set(t) <= alpha or ty == USER_DEFINED:
                vocab.setdefault(t, i)
            else:
                respelled.append(("".join(spell[b] for b in t.encode("utf-8")), i))
        for t, i in respelled:
            vocab.setdefault(t, i)
    try:  # tokenizers panics on a merge whose result is no token: diagnose after, not on every start
        bpe = call_quietly(models.BPE, vocab=vocab, merges=[tuple(m.split(" ", 1)) for m in merges], dropout=None,
                           continuing_subword_prefix="", end_of_word_suffix="", fuse_unk=False,
                           ignore_merges=ignore_merges)
    except RuntimeError as e:
        check_merges(vocab, merges)
        raise InputError(f"GGUF tokenizer metadata cannot be built into a BPE tokenizer: {e}") from None
    tok = tokenizers.Tokenizer(bpe)
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(r), behavior="isolated") for r in splits]
        + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()

    # Control tokens (<|im_start|>, ...) are matched whole and skipped on decode; user-defined
    # ones are matched whole but kept. A "control" token outside the byte alphabet is a
    # llama.cpp mislabel and is left alone (as transformers does).
    control = [AddedToken(tokens[i], normalized=False, special=True)
               for i in positions(types, CONTROL, len(tokens)) if set(tokens[i]) <= alpha]
    user = [AddedToken(tokens[i], normalized=False, special=False) for i in positions(types, USER_DEFINED, len(tokens))]
    return tok, control, user


def _spm_merges(tokens: list, scores: list, types: list) -> list:
    """Every split of a normal token into two vocabulary pieces, best merged score first: BPE over
    these ranks takes, at each step, the adjacent pair whose joined piece scores highest, as
    llama.cpp's SPM tokenizer (llm_tokenizer_spm_session) does. Kept on disk per vocabulary
    (spm-merges/ under derived_cache.cache_root()): Gemma 3's 262k tokens give 514k merges, ~3 s of Python
    a start, ~0.2 s to load."""
    import hashlib
    import pickle

    import numpy as np

    from ..fileio.derived_cache import cache_root, write_atomic

    h = hashlib.sha256("\x00".join(tokens).encode("utf-8", "surrogatepass"))
    h.update(np.asarray(scores, np.float64).tobytes() + np.asarray(types, np.int64).tobytes())
    path = cache_root() / "spm-merges" / h.hexdigest()
    try:
        data = path.read_bytes()
        if hashlib.sha256(data[32:]).digest() == data[:32]:
            return pickle.loads(data[32:])
    except (OSError, ValueError, pickle.UnpicklingError, EOFError):
        pass  # missing or damaged: build it again
    merges = _all_spm_merges(tokens, scores, types)
    payload = pickle.dumps(merges, protocol=pickle.HIGHEST_PROTOCOL)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, hashlib.sha256(payload).digest() + payload)
    except OSError:  # a read-only cache only costs the build
        pass
    return merges


def _all_spm_merges(tokens: list, scores: list, types: list) -> list:
    index = {t: i for i, t in enumerate(tokens)}
    merges = []
    for i, t in enumerate(tokens):
        if types[i] != NORMAL:
            continue
        for k in range(1, len(t)):
            left, right = t[:k], t[k:]
            if left in index and right in index:
                merges.append((-scores[i], index[left], left, right))
    merges.sort()
    return [(left, right) for _, _, left, right in merges]


def _sentencepiece(meta: dict) -> tuple[tokenizers.Tokenizer, list, list]:
    tokens = _tokens(meta)
    scores = meta.get("tokenizer.ggml.scores")
    if not scores or len(scores) != len(tokens):
        raise InputError("GGUF metadata lacks tokenizer.ggml.scores for every token "
                         "(a SentencePiece vocabulary needs them)")
    types = _types(meta, len(tokens))
    if len(types) != len(tokens):
        raise InputError(f"GGUF tokenizer.ggml.token_type has {len(types)} entries for {len(tokens)} tokens")
    unk = meta.get("tokenizer.ggml.unknown_token_id")
    unk = tokens[unk] if isinstance(unk, int) and 0 <= unk < len(tokens) else None
    vocab = {}
    for i, t in enumerate(tokens):
        vocab.setdefault(t, i)
    bpe = models.BPE(vocab=vocab, merges=_spm_merges(tokens, scores, types), dropout=None, unk_token=unk,
                     fuse_unk=True, byte_fallback=True)
    tok = tokenizers.Tokenizer(bpe)
    prefix = bool(meta.get("tokenizer.ggml.add_space_prefix", True))
    # llama.cpp puts one space before the text (and after every special token), whatever it starts
    # with: a normalizer, not Metaspace (which skips text already starting with a space).
    steps = ([normalizers.Prepend("▁")] if prefix else []) + [normalizers.Replace(" ", "▁")]
    tok.normalizer = normalizers.Sequence(steps)
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]
                                    + ([decoders.Strip(" ", 1, 0)] if prefix else []))
    special = [AddedToken(t, normalized=False, special=True)
               for t, ty in zip(tokens, types) if ty in (CONTROL, UNKNOWN)]
    user = [AddedToken(t, normalized=False, special=False) for t, ty in zip(tokens, types) if ty == USER_DEFINED]
    return tok, special, user


def _spaced_bpe(meta: dict) -> tuple[tokenizers.Tokenizer, list, list]:
    """gemma4: BPE over the file's merges, spaces as ▁, unknown characters as <0xNN> bytes."""
    tokens = _tokens(meta)
    types = _types(meta, len(tokens))
    if len(types) != len(tokens):
        raise InputError(f"GGUF tokenizer.ggml.token_type has {len(types)} entries for {len(tokens)} tokens")
    merges = meta.get("tokenizer.ggml.merges")
    if merges is None:
        raise InputError("GGUF metadata lacks tokenizer.ggml.merges (a gemma4 vocabulary needs them)")
    vocab = {}
    for i, t in enumerate(tokens):
        vocab.setdefault(t, i)
    unk = meta.get("tokenizer.ggml.unknown_token_id")
    unk = tokens[unk] if isinstance(unk, int) and 0 <= unk < len(tokens) else None
    pairs = []
    for m in merges:  # split at the first space after the first character, as llama.cpp reads them
        cut = m.find(" ", 1)
        pairs.append((m[:cut], m[cut + 1:]) if cut > 0 else (m, ""))
    try:  # tokenizers panics on a merge whose result is no token: diagnose after, not on every start
        bpe = call_quietly(models.BPE, vocab=vocab, merges=pairs, dropout=None, unk_token=unk, fuse_unk=True,
                           byte_fallback=True)
    except RuntimeError as e:
        check_merges(vocab, merges)
        raise InputError(f"GGUF tokenizer metadata cannot be built into a BPE tokenizer: {e}") from None
    tok = tokenizers.Tokenizer(bpe)
    tok.normalizer = normalizers.Replace(" ", "▁")
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()])
    special = [AddedToken(t, normalized=False, special=True)
               for t, ty in zip(tokens, types) if ty in (CONTROL, UNKNOWN)]
    user = [AddedToken(t, normalized=False, special=False) for t, ty in zip(tokens, types) if ty == USER_DEFINED]
    return tok, special, user


def _template(text):
    """tokenizer.chat_template as a Jinja template. A file converted with --mistral-format names one
    of llama.cpp's built-in templates instead ("mistral-v3-tekken"): rendering that name as Jinja
    would send it as the prompt, so it becomes a template that says so when used."""
    if not isinstance(text, str) or "{" in text or not text.strip():
        return text
    message = (f"the file names llama.cpp's built-in chat template {text.strip()[:60]!r} instead of carrying one; "
               "give a template with --chat-template FILE, or send raw text with --no-chat-template")
    return "{{ raise_exception(" + repr(message) + ") }}"


def tokenizer_from_gguf(meta: dict) -> Tokenizer:
    model = meta.get("tokenizer.ggml.model")
    if model == "gpt2":
        tok, special, user = _byte_level(meta)
        add_bos_default = meta.get("tokenizer.ggml.pre") in _ADD_BOS
    elif model == "llama":
        tok, special, user = _sentencepiece(meta)
        add_bos_default = True  # llama.cpp's default for SentencePiece vocabularies
    elif model == "gemma4":
        tok, special, user = _spaced_bpe(meta)
        add_bos_default = True
    else:
        raise InputError(f"unsupported GGUF tokenizer model {model!r} (supported: {', '.join(MODELS)})")
    tok.add_special_tokens(special)
    tok.add_tokens(user)
    tokens = meta["tokenizer.ggml.tokens"]

    def token(key):
        i = meta.get(f"tokenizer.ggml.{key}")
        return tokens[i] if isinstance(i, int) and 0 <= i < len(tokens) else None

    return Tokenizer.from_parts(
        tok,
        chat_template=_template(meta.get("tokenizer.chat_template")),
        bos_token=token("bos_token_id"),
        eos_token=token("eos_token_id"),
        # llama.cpp adds BOS for Gemma 4 whatever the file says (its models fail without it)
        add_bos=model == "gemma4" or bool(meta.get("tokenizer.ggml.add_bos_token", add_bos_default)),
        add_eos=bool(meta.get("tokenizer.ggml.add_eos_token", False)),
    )
