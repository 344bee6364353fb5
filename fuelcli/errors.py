"""Typed errors: each kind carries the exit code the CLI returns for it.

The CLI prints `error: <message>` on one line and exits with `exit_code`; no traceback. Anything
else that escapes is a bug: `error: internal error: ...` and EXIT_INTERNAL (cli/app.py).
"""

EXIT_INTERNAL = 70  # EX_SOFTWARE (sysexits.h): an exception fuel did not expect
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as a shell reports Ctrl-C


class FuelError(Exception):
    exit_code = 1


class InputError(FuelError):
    """Bad input: a broken or unsupported file, a wrong config, a bad argument, a prompt too long."""

    exit_code = 2


class ConfigError(InputError):
    """config.json (or GGUF metadata) that fuel cannot turn into a ModelConfig."""


class NonFinite(InputError):
    """A forward produced NaN or inf logits (broken weights, or values beyond float32)."""


class ModelNotFound(InputError):
    """MODEL names no local path, cached hub repo or pulled demo model."""


class Mismatch(FuelError):
    """An oracle comparison failed its tolerance."""

    exit_code = 3


class MissingDependency(FuelError):
    """An optional package (transformers, llama-cpp-python, ...) is needed but not installed."""

    exit_code = 4


def located(where: str, build):
    """build() with an InputError's message prefixed by `where` (the file the input came from),
    unless it already names it."""
    try:
        return build()
    except InputError as e:
        if str(e).startswith(where):
            raise
        raise type(e)(f"{where}: {e}") from None


class FetchError(FuelError):
    """A download failed or its checksum did not match (not the input's fault)."""

    exit_code = 5


class PeerFailed(FuelError):
    """A peer (llama.cpp, transformers) crashed or failed in its own process: fuel is fine, the
    comparison cannot go on."""

    exit_code = 5


class ServerFailed(PeerFailed):
    """An oracle server (OpenAI-compatible, over HTTP) could not be reached, answered with an error
    or answered what fuel cannot read: the server's failure, not the input's."""
