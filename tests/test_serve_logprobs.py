"""Per-token logprobs and token bytes (fuelcli/serve/logprobs.py) on hand-made logits and tokenizers."""

import numpy as np
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, models, pre_tokenizers

from fuelcli.serve.logprobs import logprobs_of
from fuelcli.text.token_bytes import TokenBytes
from fuelcli.text.tokenizer import Tokenizer
from serve_helpers import char_tokenizer


def char_bytes():
    return TokenBytes(Tokenizer(char_tokenizer(), None, "<s>", "</s>"))


def test_logprobs_are_log_softmax_with_the_top_k_in_order():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=256).astype(np.float32) * 4
    want = logits.astype(np.float64) - np.log(np.exp(logits.astype(np.float64)).sum())
    lp = logprobs_of(logits, 42, 5, char_bytes())
    assert abs(lp.logprob - want[42]) < 1e-12
    top = np.argsort(-want)[:5]
    np.testing.assert_allclose([p for _, _, p in lp.top], want[top], atol=1e-12)
    assert [t for t, _, _ in lp.top] == [char_bytes().entry(int(i))[0] for i in top]
    assert logprobs_of(logits, 42, 0, char_bytes()).top == []
    assert len(logprobs_of(logits, 42, 300, char_bytes()).top) == 256  # k beyond the vocabulary: all of it


def test_logprobs_survive_extreme_logits():
    logits = np.full(256, -1e30, np.float32)
    logits[7] = 1e30
    lp = logprobs_of(logits, 7, 2, char_bytes())
    assert lp.logprob == 0.0 and np.isfinite(lp.top[1][2])


def test_special_tokens_take_no_room_in_the_text():
    tb = char_bytes()
    lp = logprobs_of(np.zeros(256, np.float32), 4, 0, tb)  # <|im_end|>
    assert lp.token == "<|im_end|>" and lp.special and lp.shown == 0
    assert logprobs_of(np.zeros(256, np.float32), 60, 0, tb).shown == 1


def sentencepiece_like():
    """Llama-2 style: Metaspace, byte fallback <0xNN> tokens, a Replace/ByteFallback/Fuse/Strip decoder."""
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    vocab.update({f"<0x{b:02X}>": 3 + b for b in range(256)})
    for piece in ("▁", "h", "i", "▁h", "▁hi"):
        vocab[piece] = len(vocab)
    tok = HFTokenizer(models.BPE(vocab=vocab, merges=[("▁", "h"), ("▁h", "i")], unk_token="<unk>",
                                 byte_fallback=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    return Tokenizer(tok, None, "<s>", "</s>")


def test_bytes_of_metaspace_and_byte_fallback_tokens_rebuild_the_text():
    tok = sentencepiece_like()
    ids = tok.encode("hi é", add_special_tokens=False)
    tb = TokenBytes(tok)
    pieces = [bytes(tb.entry(i)[1]) for i in ids]
    assert pieces == [b" hi", b" ", b"\xc3", b"\xa9"]  # "é" is two byte-fallback tokens
    assert b"".join(pieces).decode() == " hi é"
    assert tb.entry(ids[2])[0] == "\ufffd"  # half a character: its text is the replacement character


def test_bytes_of_byte_level_tokens():
    """GPT-2 byte-level BPE (SmolLM2, Qwen): each vocabulary character stands for one byte."""
    from tokenizers import trainers

    tok = HFTokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(["naïve café", "hello world"], trainers.BpeTrainer(
        vocab_size=300, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    ours = Tokenizer(tok, None, None, None)
    ids = ours.encode("naïve 日本", add_special_tokens=False)
    tb = TokenBytes(ours)
    assert b"".join(bytes(tb.entry(i)[1]) for i in ids).decode() == "naïve 日本"
