"""GGUF repos on the hub: owner/name:QUANT and --hf-file, split files, `fuel ls` and `fuel rm`.

Which file a QUANT picks is checked on file lists (llama.cpp's rule); the rest runs the real
huggingface_hub against the fake hub of tests/fake_hub.py, as test_source.py does, with tiny
GGUF files (one of them split in three parts the way gguf-split writes them).
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import set_offline
from gguf_split import split_gguf
from test_gguf_model import _tiny_llama

from fuelcli.errors import InputError, ModelNotFound
from fuelcli.sources.hub_gguf import pick, quant_tag
from fuelcli.assembly.loader import open_model
from fuelcli.sources.source import resolve

REPO = "fuel-test/tiny-GGUF"
COMMIT = "89abcdef0123456789abcdef0123456789abcdef"

# --- which file --------------------------------------------------------------------------------

QWEN = ["README.md", "qwen2.5-0.5b-instruct-fp16.gguf", "qwen2.5-0.5b-instruct-q4_k_m.gguf",
        "qwen2.5-0.5b-instruct-q4_k_s.gguf", "qwen2.5-0.5b-instruct-q8_0.gguf", "qwen2.5-0.5b-instruct-iq4_xs.gguf"]


def test_quant_is_matched_case_insensitively_and_whole():
    assert pick(QWEN, "Q4_K_M", None, REPO) == ["qwen2.5-0.5b-instruct-q4_k_m.gguf"]
    assert pick(QWEN, "q8_0", None, REPO) == ["qwen2.5-0.5b-instruct-q8_0.gguf"]
    assert pick(QWEN, "IQ4_XS", None, REPO) == ["qwen2.5-0.5b-instruct-iq4_xs.gguf"]
    with pytest.raises(ModelNotFound, match=r"no \.gguf file for Q4_K\b.*FP16, IQ4_XS, Q4_K_M, Q4_K_S, Q8_0"):
        pick(QWEN, "Q4_K", None, REPO)  # a prefix of Q4_K_M and Q4_K_S is neither
    with pytest.raises(ModelNotFound, match="no .gguf file for Q4_NL"):
        pick(["m-IQ4_NL.gguf"], "Q4_NL", None, REPO)  # whole tags: Q4_NL is not IQ4_NL
    assert quant_tag("qwen2.5-0.5b-instruct-q4_k_m.gguf") == "Q4_K_M"
    assert quant_tag("Llama-3.2-1B-Instruct-Q4_K_M-00001-of-00002.gguf") == "Q4_K_M"


def test_default_quant_as_llama_cpp():
    assert pick(QWEN, None, None, REPO) == ["qwen2.5-0.5b-instruct-q4_k_m.gguf"]
    no_q4 = [f for f in QWEN if "q4_k_m" not in f]
    assert pick(no_q4, None, None, REPO) == ["qwen2.5-0.5b-instruct-q8_0.gguf"]
    assert pick(["mmproj-model-f16.gguf", "b-F16.gguf", "a-BF16.gguf"], None, None, REPO) == ["a-BF16.gguf"]
    with pytest.raises(ModelNotFound, match="no config.json and no .gguf model file"):
        pick(["README.md", "mmproj-model-f16.gguf"], None, None, REPO)


def test_split_files_come_as_a_set():
    files = [f"big-Q4_K_M-{i:05d}-of-00003.gguf" for i in (3, 1, 2)] + ["big-Q8_0.gguf"]
    want = [f"big-Q4_K_M-{i:05d}-of-00003.gguf" for i in (1, 2, 3)]
    assert pick(files, "Q4_K_M", None, REPO) == want
    assert pick(files, None, "big-Q4_K_M-00002-of-00003.gguf", REPO) == want  # any part names the set
    with pytest.raises(ModelNotFound, match="split model of 3 parts, part 2 is missing"):
        pick([f for f in files if "00002" not in f], "Q4_K_M", None, REPO)


def test_hf_file_and_ambiguity():
    assert pick(QWEN, None, "qwen2.5-0.5b-instruct-fp16.gguf", REPO) == ["qwen2.5-0.5b-instruct-fp16.gguf"]
    with pytest.raises(ModelNotFound, match="no file 'nope.gguf' in the repo"):
        pick(QWEN, None, "nope.gguf", REPO)
    with pytest.raises(ModelNotFound, match="Q4_K_M matches 2 files.*--hf-file"):
        pick(["a/m-Q4_K_M.gguf", "b/m-Q4_K_M.gguf"], "Q4_K_M", None, REPO)


# --- through huggingface_hub and the fake hub ----------------------------------------------------

@pytest.fixture(scope="module")
def gguf_files(tmp_path_factory):
    """{name: bytes}: a tiny model as one Q8_0-named file and as three Q4_K_M-named parts."""
    d = tmp_path_factory.mktemp("gguf")
    _tiny_llama(d / "tiny-Q8_0.gguf", np.random.default_rng(5))
    (d / "tiny-Q4_K_M.gguf").write_bytes((d / "tiny-Q8_0.gguf").read_bytes())
    (d / "parts").mkdir()
    parts = split_gguf(d / "tiny-Q4_K_M.gguf", d / "parts", 4)
    assert len(parts) == 3
    files = {p.name: p.read_bytes() for p in parts}
    files["tiny-Q8_0.gguf"] = (d / "tiny-Q8_0.gguf").read_bytes()
    files["mmproj-tiny-f16.gguf"] = b"GGUF not a model"
    files["README.md"] = b"never fetched"
    return files


@pytest.fixture
def hub(fake_hub_server, gguf_files):
    fake_hub_server.repos[REPO] = (COMMIT, gguf_files)
    return fake_hub_server


def snapshot(hf_home):
    return hf_home / "hub" / "models--fuel-test--tiny-GGUF" / "snapshots" / COMMIT


def test_quant_fetches_only_its_file_and_runs_offline_later(hub, hf_home, monkeypatch):
    src = resolve(f"{REPO}:q8_0")
    assert src.kind == "gguf" and src.name == f"{REPO}:q8_0" and src.path == snapshot(hf_home) / "tiny-Q8_0.gguf"
    assert sorted(p.name for p in snapshot(hf_home).iterdir()) == ["tiny-Q8_0.gguf"]  # never the whole repo
    assert [s for s in hub.served if s.endswith(".gguf")] == [f"{REPO}/tiny-Q8_0.gguf"]
    assert open_model(f"{REPO}:Q8_0").cfg.family == "llama"

    set_offline(monkeypatch, True)
    hub.shutdown()
    assert resolve(f"{REPO}:Q8_0").path == src.path
    with pytest.raises(ModelNotFound, match=r"tiny-GGUF:Q4_K_M: not in the local hub cache and HF_HUB_OFFLINE is "
                                            r"set \(cached: Q8_0\)"):
        resolve(f"{REPO}:Q4_K_M")  # the cache lists only what was fetched


def test_split_quant_gives_the_single_files_model(hub, hf_home):
    from fuelcli.assembly.forward_paths import logits_by_path

    split = open_model(f"{REPO}:Q4_K_M")
    assert sorted(p.name for p in snapshot(hf_home).iterdir() if "Q4_K_M" in p.name) == [
        f"tiny-Q4_K_M-0000{i}-of-00003.gguf" for i in (1, 2, 3)]
    assert split.source.path.name == "tiny-Q4_K_M-00001-of-00003.gguf" and len(split.gguf.parts) == 3
    one = open_model(REPO, hf_file="tiny-Q8_0.gguf")
    assert one.source.name == f"{REPO}/tiny-Q8_0.gguf"
    assert split.cfg == one.cfg and sorted(split.gguf.tensors) == sorted(one.gguf.tensors)
    ids = [1, 5, 2, 9]
    np.testing.assert_array_equal(logits_by_path(split, ids, "reference"), logits_by_path(one, ids, "reference"))


def test_repo_without_config_takes_the_default_quant(hub, hf_home):
    src = resolve(REPO)
    assert src.kind == "gguf" and src.path.name == "tiny-Q4_K_M-00001-of-00003.gguf" and src.name == f"{REPO}:Q4_K_M"


def test_hub_gguf_errors(hub):
    with pytest.raises(ModelNotFound, match=r"tiny-GGUF: no \.gguf file for Q2_K \(it has: Q4_K_M, Q8_0\)"):
        resolve(f"{REPO}:Q2_K")
    with pytest.raises(ModelNotFound, match="fuel-test/nope:Q8_0: no such hub repo"):
        resolve("fuel-test/nope:Q8_0")
    with pytest.raises(InputError, match="not both"):
        resolve(f"{REPO}:Q8_0", hf_file="tiny-Q8_0.gguf")
    with pytest.raises(InputError, match="--hf-file picks a file of a hub repo"):
        resolve(".", hf_file="x.gguf")


def test_split_part_missing_locally(tmp_path, gguf_files):
    for name, data in gguf_files.items():
        if "-of-" in name and "00002" not in name:
            (tmp_path / name).write_bytes(data)
    with pytest.raises(InputError, match=r"tiny-Q4_K_M-00002-of-00003.gguf: part 2 of the split GGUF"):
        open_model(str(tmp_path / "tiny-Q4_K_M-00001-of-00003.gguf"))
    (tmp_path / "tiny-Q4_K_M-00002-of-00003.gguf").write_bytes(gguf_files["tiny-Q4_K_M-00003-of-00003.gguf"])
    with pytest.raises(InputError, match="split.no 2 of 3 where part 1 of 3"):
        open_model(str(tmp_path / "tiny-Q4_K_M-00003-of-00003.gguf"))  # any part opens the set


# --- fuel ls / fuel rm ------------------------------------------------------------------------------

def test_ls_and_rm(hub, hf_home, tmp_path, monkeypatch):
    from fuelcli.sources.local_models import list_models, remove

    monkeypatch.setenv("FUEL_HOME", str(tmp_path / "fuel"))  # no demo models
    assert list_models() == []
    resolve(f"{REPO}:Q8_0")
    resolve(f"{REPO}:Q4_K_M")
    rows = {m.name: m for m in list_models()}
    assert sorted(rows) == [f"{REPO}:Q4_K_M", f"{REPO}:Q8_0"]  # the mmproj file is no model
    q4 = rows[f"{REPO}:Q4_K_M"]
    assert (q4.kind, q4.format) == ("hub", "gguf") and q4.path.endswith("tiny-Q4_K_M-00001-of-00003.gguf")
    assert q4.size == sum(len(b) for n, b in hub.repos[REPO][1].items() if "Q4_K_M" in n)

    what, freed = remove(f"{REPO}:Q8_0")
    assert freed == len(hub.repos[REPO][1]["tiny-Q8_0.gguf"]) and "tiny-Q8_0.gguf" in what
    assert sorted(m.name for m in list_models()) == [f"{REPO}:Q4_K_M"]
    blobs = hf_home / "hub" / "models--fuel-test--tiny-GGUF" / "blobs"
    assert len(list(blobs.iterdir())) == 3  # the Q8_0 blob went with its link
    set_offline(monkeypatch, True)
    assert open_model(f"{REPO}:Q4_K_M").cfg.family == "llama"  # the other quant still runs

    remove(REPO)
    assert list_models() == [] and not (hf_home / "hub" / "models--fuel-test--tiny-GGUF").exists()
    with pytest.raises(ModelNotFound, match="not a pulled demo alias nor a repo in the hub cache"):
        remove(REPO)


def test_ls_lists_demo_models_and_safetensors_repos(fake_hub_server, tmp_path, monkeypatch):
    from fuelcli.sources import demo
    from fuelcli.sources.local_models import list_models, remove

    monkeypatch.setenv("FUEL_HOME", str(tmp_path / "fuel"))
    d = demo.DEMOS["smollm2-135m"]
    demo.path_of(d.alias).parent.mkdir(parents=True)
    with open(demo.path_of(d.alias), "wb") as f:
        f.truncate(d.size)  # a pulled file as far as is_pulled() can tell
    fake_hub_server.repos["fuel-test/st"] = (COMMIT, {"config.json": b'{"model_type": "qwen2"}',
                                                      "model.safetensors": b"x" * 10})
    fake_hub_server.repos["fuel-test/other"] = (COMMIT, {"config.json": b'{"model_type": "gpt2"}',
                                                         "model.safetensors": b"x"})
    resolve("fuel-test/st")
    resolve("fuel-test/other")
    rows = [(m.name, m.kind, m.format) for m in list_models()]
    assert rows == [("smollm2-135m", "demo", "gguf"), ("fuel-test/st", "hub", "safetensors")]  # no gpt2
    assert remove("smollm2-135m")[1] == d.size and not demo.path_of(d.alias).exists()


def test_uncached_quant_offline_is_one_error(tmp_path):
    """In a fresh process (huggingface_hub's submodules not imported yet), as a user runs it."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "HF_HOME": str(tmp_path), "HF_HUB_OFFLINE": "1"}
    r = subprocess.run([sys.executable, "-m", "fuelcli", "run", "fuel-test/absent:Q4_K_M", "hi"], env=env,
                       capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=300)
    assert r.returncode == 2 and r.stderr == ("error: fuel-test/absent:Q4_K_M: not in the local hub cache and "
                                              "HF_HUB_OFFLINE is set\n")
