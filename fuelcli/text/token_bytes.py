"""The bytes each token id stands for: OpenAI's `token` / `bytes` logprob fields, and the vocabulary a
grammar matcher walks (fuelcli/text/grammar.py), for every tokenizer fuel builds (byte-level BPE,
SentencePiece with byte fallback, Metaspace, added tokens)."""

from __future__ import annotations

import json
import re


def _gpt2_byte_decoder() -> dict[str, int]:
    """Inverse of GPT-2's bytes_to_unicode: byte-level BPE spells byte b as this printable char."""
    bs = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    cs, n = list(bs), 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


_BYTE_TOKEN = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")  # SentencePiece byte fallback


class TokenBytes:
    """Token id -> (text, UTF-8 bytes) as OpenAI's `token` and `bytes` fields: the bytes the token
    adds to the output, so a client can join the bytes of a character split over several tokens."""

    def __init__(self, tokenizer):
        backend = tokenizer.backend
        decoder = backend.decoder
        spec = json.dumps(json.loads(decoder.__getstate__())) if decoder is not None else ""
        self._byte_level = '"ByteLevel"' in spec
        self._metaspace = '"Metaspace"' in spec or '"\\u2581"' in spec
        self._backend, self._tokenizer = backend, tokenizer
        self._added = {i: t.content for i, t in backend.get_added_tokens_decoder().items()}
        self._byte_decoder = _gpt2_byte_decoder() if self._byte_level else {}
        self._cache: dict[int, tuple[str, list[int]]] = {}

    def bytes_of(self, i: int) -> bytes:
        piece = self._backend.id_to_token(i)
        if piece is None:
            return b""
        if i in self._added:
            return self._added[i].encode()
        if self._byte_level and all(c in self._byte_decoder for c in piece):
            return bytes(self._byte_decoder[c] for c in piece)
        byte = _BYTE_TOKEN.match(piece)
        if byte:
            return bytes([int(byte.group(1), 16)])
        if self._metaspace:
            return piece.replace("\u2581", " ").encode()
        return self._tokenizer.decode([i]).encode()

    def is_special(self, i: int) -> bool:
        return self._tokenizer.is_special(i)

    def entry(self, i: int) -> tuple[str, list[int]]:
        if i not in self._cache:
            raw = self.bytes_of(i)
            self._cache[i] = (raw.decode("utf-8", errors="replace"), list(raw))
        return self._cache[i]
