"""Test-side helpers for `fuel serve`: a live server process, a tiny checkpoint with a tokenizer and
chat template, and raw HTTP (the openai client is the client everywhere else)."""

from __future__ import annotations

import http.client
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

# A character-level vocabulary of exactly 256 entries for the tiny checkpoints (vocab_size 256):
# five specials, newline, printable ASCII, then Latin-1 and Latin Extended letters.
SPECIALS = ["<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>"]
CHARS = ["\n"] + [chr(c) for c in range(32, 127)]
CHARS += [chr(c) for c in range(161, 161 + 256 - len(SPECIALS) - len(CHARS))]
CHAT_TEMPLATE = ("{{ bos_token }}{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
                 "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def char_tokenizer(specials: list[str] = SPECIALS):
    """A tokenizers.Tokenizer over specials + CHARS (cut to 256 entries): one token per character,
    BOS (specials[1]) added on encode."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, processors

    vocab = {t: i for i, t in enumerate((specials + CHARS)[:256])}
    assert len(vocab) == 256
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in specials])
    tok.decoder = decoders.Fuse()
    tok.post_processor = processors.TemplateProcessing(single=f"{specials[1]} $A", special_tokens=[(specials[1], 1)])
    return tok


def with_tokenizer(checkpoint: Path, out: Path, specials: list[str] = SPECIALS,
                   chat_template: str = CHAT_TEMPLATE) -> Path:
    """A copy of a tiny checkpoint directory plus tokenizer.json and a chat template (ChatML-like by
    default); specials[1] and [2] are BOS and EOS, the ids the tiny configs say (1, 2)."""
    if not out.exists():
        shutil.copytree(checkpoint, out)
        char_tokenizer(specials).save(str(out / "tokenizer.json"))
        (out / "tokenizer_config.json").write_text(json.dumps(
            {"bos_token": specials[1], "eos_token": specials[2], "chat_template": chat_template}))
    return out


class ServerProcess:
    """`fuel serve MODEL --port 0 ARGS...` in a subprocess; its log (stderr) is collected."""

    def __init__(self, model, *args: str, startup_s: float = 300):
        cmd = [sys.executable, "-m", "fuelcli", "serve", str(model), "--port", "0", *args]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                     env=os.environ.copy())
        self.lines: list[str] = []
        self._ready = threading.Event()
        self.url = None
        threading.Thread(target=self._read, daemon=True).start()
        if not self._ready.wait(startup_s) or self.url is None:
            self.proc.kill()
            raise RuntimeError("fuel serve did not start:\n" + self.log)

    def _read(self):
        for line in self.proc.stderr:
            self.lines.append(line)
            found = re.search(r" on (http://\S+) ", line)
            if found and self.url is None:
                self.url = found.group(1)
                self._ready.set()
        self._ready.set()  # the process ended

    @property
    def log(self) -> str:
        return "".join(self.lines)

    @property
    def base_url(self) -> str:
        return self.url + "/v1"

    @property
    def port(self) -> int:
        return int(self.url.rsplit(":", 1)[1])

    def wait_log(self, pattern: str, timeout: float = 10.0) -> re.Match | None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            found = re.search(pattern, self.log)
            if found:
                return found
            time.sleep(0.05)
        return None

    def stop(self, sig=signal.SIGINT, timeout: float = 30) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise

    def rss_bytes(self) -> int:
        with open(f"/proc/{self.proc.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
        raise RuntimeError("no VmRSS")


def raw(port: int, method: str, path: str, body: bytes | str | None = None, headers: dict | None = None,
        timeout: float = 60) -> tuple[int, dict, bytes]:
    """One HTTP request: (status, headers, body)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request(method, path, body=body.encode() if isinstance(body, str) else body,
                     headers={"Content-Type": "application/json", **(headers or {})})
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()


def assert_error_shape(status: int, body: bytes, want_status: int, *must_contain: str) -> dict:
    """OpenAI's error object, one line of message, the expected status and words."""
    assert status == want_status, (status, body)
    data = json.loads(body)
    assert set(data) == {"error"} and set(data["error"]) == {"message", "type", "param", "code"}, data
    msg = data["error"]["message"]
    assert isinstance(msg, str) and msg and "\n" not in msg and "Traceback" not in msg, msg
    for word in must_contain:
        assert word in msg, (word, msg)
    return data["error"]
