"""Qwen3.5 GGUFs as llama.cpp's converter writes them (qwen35, qwen35moe), against llama.cpp itself:
`fuel diff --oracle llama.cpp` at its default tolerance, when llama-cpp-python is installed.

llama.cpp 0.3.36 loads a qwen35 file only when the value heads have the key heads' size (its loader
sizes attn_qkv from ssm.state_size for both), so these are the tiny *_square checkpoints (4 value
heads of 8 over 2 key heads of 8: the converter still reorders the value heads). The tiny byte
tokenizer's file gets what llama.cpp's vocabulary loader asks for and the tests do not use (ids go
in with --tokens): a merges list and a pre-tokenizer name it knows.

Measured on an AMD EPYC Zen 4 (family 25 model 17), 80 tokens (fuel: 77 prefilled, the chunked form
across a chunk boundary, then 3 decoded): qwen35 max KL 5.2e-8 (max|Δ| 1.3e-3), qwen35moe max KL
7.5e-7 (max|Δ| 2.6e-3), top-1 agreement 1.0 on both; with the value heads left tiled fuel fails.
"""

import dataclasses
import json

import numpy as np
import pytest
from llama_convert import convert, for_llama_cpp
from test_diff import invoke
from test_qwen3_5_files import BREAKS

from fuelcli.families import FAMILIES

CASES = {"qwen3_5": "qwen3_5_square_wrapped", "qwen3_5_moe": "qwen3_5_moe_square_wrapped"}


@pytest.fixture(scope="module")
def files(tiny, llama_converter, tmp_path_factory):
    pytest.importorskip("llama_cpp")
    out = tmp_path_factory.mktemp("gguf")
    convert(llama_converter, [(tiny(source), out / f"{case}.converted.gguf") for case, source in CASES.items()])
    for case in CASES:
        for_llama_cpp(out / f"{case}.converted.gguf", out / f"{case}.gguf", "qwen35")
    return lambda case: out / f"{case}.gguf"


def _diff(path):
    ids = ",".join(map(str, np.random.default_rng(1).integers(0, 256, 80).tolist()))
    code, out, err = invoke("diff", path, "--tokens", ids, "--oracle", "llama.cpp", "-t", "1", "--json")
    return code, json.loads(out) if out.strip() else None, err


@pytest.mark.parametrize("case", CASES)
def test_llama_cpp_agrees(files, case):
    code, r, err = _diff(files(case))
    assert code == 0, err
    assert 0 < r["summary"]["max_kl"] < 1e-5 and r["summary"]["top1_rate"] == 1.0


@pytest.mark.parametrize("case", CASES)
def test_value_heads_left_tiled_fail(files, case, monkeypatch):
    family = FAMILIES[f"{case}_text"]
    monkeypatch.setitem(FAMILIES, family.model_type,
                        dataclasses.replace(family, weights=BREAKS["value heads left tiled"](family.weights)))
    code, r, _ = _diff(files(case))
    assert code == 3 and r["summary"]["max_kl"] > 1e-3
