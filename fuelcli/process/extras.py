"""The distribution's name on PyPI and its extras, for every message that says what to install.

`fuel` on PyPI is an unrelated data-pipeline package, so fuel is published as `fuel-llm` (the
command stays `fuel`, the import package `fuelcli`). What each extra adds is said here once: the
error messages and `fuel doctor` take it from here; tests/test_install.py holds it to
pyproject.toml's optional-dependencies.
"""

from __future__ import annotations

from typing import NamedTuple

DIST = "fuel-llm"


class Extra(NamedTuple):
    name: str
    packages: tuple  # distributions whose presence `fuel doctor` reports
    adds: str  # what a user gets from it


EXTRAS = {
    e.name: e
    for e in (
        Extra("serve", ("starlette", "uvicorn", "pydantic"), "fuel serve: the OpenAI-compatible HTTP server"),
        Extra("grammar", ("llguidance",), "constrained decoding: fuel run --json-schema/--grammar, serve's "
                                          "response_format and tool calls"),
        Extra("cuda", ("numba-cuda",), "--device cuda: NVIDIA's numba-cuda with the CUDA 12 toolkit wheels"),
        Extra("llama-cpp", ("llama-cpp-python",), "--oracle llama.cpp and bench --compare llama.cpp (llama-cpp-python, "
                                          "compiles llama.cpp)"),
        Extra("plot", ("matplotlib",), "fuel diff --plot FILE.png|svg"),
        Extra("test", ("pytest", "torch", "transformers", "gguf"), "the test suite; --oracle transformers and "
                                                                 "bench --compare transformers"),
    )
}


def pip_install(extra: str) -> str:
    """The command that installs one extra of the released package."""
    assert extra in EXTRAS, extra
    return f"pip install '{DIST}[{extra}]'"
