"""`--device cuda` through the commands (simulator here, GPU under NUMBA_ENABLE_CUDASIM=0), and the
one-line exit-4 error where the CUDA packages, a driver or a GPU are missing."""

import cuda_sim  # noqa: I001  (first: sets up the simulator before numba.cuda is imported)

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from typer.testing import CliRunner

from fuelcli.cli import app
from fuelcli.errors import FuelError, MissingDependency

cuda_sim.speed_up()
pytestmark = cuda_sim.needs_numba_cuda

TOKENS = "5,17,200,3,99,42"  # 6 > the window of 4: 4 prefilled + 2 decoded (diff's decode path)


def invoke(*args):
    r = CliRunner().invoke(app, [str(a) for a in args])
    if r.exception is not None and not isinstance(r.exception, (FuelError, SystemExit)):
        raise r.exception
    code = r.exception.exit_code if isinstance(r.exception, FuelError) else r.exit_code
    return code, r.stdout, (str(r.exception) if isinstance(r.exception, FuelError) else "")


def test_diff_self_oracle_on_cuda(tiny):
    """What examples/gpu-check.sh runs on a GPU: the CUDA engine against fuel's numpy reference,
    per layer, on the decode path (prefill then decode through the device cache)."""
    code, out, err = invoke("diff", tiny("qwen2_window"), "--device", "cuda", "--oracle", "self", "--tokens", TOKENS,
                            "--decode-steps", "2", "--layers", "--json")
    r = json.loads(out)
    assert code == 0 and r["passed"], (err, r)


def test_logits_and_bench_on_cuda(tiny, tmp_path, monkeypatch):
    d = tiny("llama31", legacy_rope=True)
    cpu, gpu = tmp_path / "cpu.npy", tmp_path / "gpu.npy"
    assert invoke("logits", d, "--tokens", "1,2,3", "--path", "prefill", "--out", cpu)[0] == 0
    monkeypatch.setenv("FUEL_DEVICE", "cuda")  # the environment names the device too
    assert invoke("logits", d, "--tokens", "1,2,3", "--path", "prefill", "--out", gpu)[0] == 0
    assert np.abs(np.load(gpu) - np.load(cpu)).max() <= 2e-4
    code, out, _ = invoke("bench", d, "-p", "3", "-n", "1", "-r", "1", "--no-progress", "-o", "json")
    assert code == 0 and json.loads(out)["backend"] == "cuda numba"


def test_missing_package_is_exit_4(monkeypatch):
    import importlib.util

    from fuelcli.backends.cuda import runtime

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "numba_cuda" else find_spec(name, *a))
    with pytest.raises(MissingDependency) as e:
        runtime.require()
    assert e.value.exit_code == 4 and "pip install 'fuel-llm[cuda]'" in str(e.value)


def test_no_gpu_is_one_line_exit_4(tiny):
    env = {**os.environ, "NUMBA_ENABLE_CUDASIM": "0", "HF_HUB_OFFLINE": "1"}
    probe = subprocess.run([sys.executable, "-c", "from numba import cuda; print(cuda.is_available())"],
                           capture_output=True, text=True, env=env)
    if probe.stdout.strip() == "True":
        pytest.skip("a GPU is here")
    r = subprocess.run([sys.executable, "-m", "fuelcli", "logits", str(tiny("llama2")), "--tokens", "1,2",
                        "--device", "cuda", "--out", os.devnull], capture_output=True, text=True, env=env, timeout=300)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 4 and len(lines) == 1 and lines[0].startswith("error: --device cuda"), r.stderr
    assert "Traceback" not in r.stderr


def test_memory_is_checked_on_the_device(tiny, monkeypatch):
    """The weights, KV cache and activations live on the GPU: the check asks the device, not the
    host, and names the GPU; the simulator (no device memory info) keeps the host's check."""
    from fuelcli.backends import make_engine
    from fuelcli.backends.cuda.engine import CudaEngine
    from fuelcli.errors import InputError
    from fuelcli.model import sizes
    from fuelcli.assembly.loader import open_model

    m = open_model(str(tiny("llama31", legacy_rope=True)))
    monkeypatch.setattr(sizes, "available_bytes", lambda: 1 << 10)  # a host with no memory to spare
    monkeypatch.setattr(CudaEngine, "device_free", lambda self: 1 << 40)
    assert make_engine(m.cfg, m.weights, n_ctx=None, device="cuda").n_ctx == m.cfg.max_position
    monkeypatch.setattr(CudaEngine, "device_free", lambda self: 1 << 16)
    with pytest.raises(InputError) as e:
        make_engine(m.cfg, m.weights, n_ctx=8, device="cuda")
    assert "GPU memory" in str(e.value) and "\n" not in str(e.value)
    monkeypatch.setattr(CudaEngine, "device_free", lambda self: None)  # negative control: the host's check
    with pytest.raises(InputError, match="not enough memory for a context"):
        make_engine(m.cfg, m.weights, n_ctx=8, device="cuda")


def test_default_context_is_the_cpus(tiny, tmp_path):
    """`run` sizes the context the same way on both devices (the prompt + -n, not the model's)."""
    import shutil

    from tiny_models import write_byte_tokenizer

    d = shutil.copytree(tiny("llama31", legacy_rope=True), tmp_path / "m")  # the shared checkpoint stays as it is
    write_byte_tokenizer(d)
    got = {}
    for device in ("cpu", "cuda"):
        code, out, err = invoke("run", d, "hello", "-n", "2", "--json", "--device", device, "--no-chat-template")
        assert code == 0, err
        got[device] = json.loads(out)["n_ctx"]
    assert got["cuda"] == got["cpu"] < 64
