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
    assert e.value.exit_code == 4 and "pip install 'fuel[cuda]'" in str(e.value)


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
