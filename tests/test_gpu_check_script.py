"""examples/gpu-check.sh without a GPU: its syntax, the wheel list it carries, and the dry run's plan
(every step listed, nothing skipped, nothing run)."""

import re
import shutil
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "examples" / "gpu-check.sh"


def run(*args, **kw):
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=120, **kw)


def test_syntax():
    assert subprocess.run(["bash", "-n", str(SCRIPT)]).returncode == 0
    if shutil.which("shellcheck"):
        r = subprocess.run(["shellcheck", str(SCRIPT)], capture_output=True, text=True)
        assert r.returncode == 0, r.stdout


def test_wheel_list_is_pinned_and_small():
    """Exact pins, one version each; the machine has numba-cuda, torch and pytest, so only what it
    lacks travels (the two wheels are 0.5 MB; nvidia-nvvm, 75 MB, would not fit in 64 MiB)."""
    lines = run("--list-wheels").stdout.split()
    assert lines == ["gguf==0.19.0", "libgguf==0.2.2"]


def test_dry_run_lists_every_step_and_skips_none(tmp_path):
    r = run("--dry-run", env={"PATH": "/usr/bin:/bin", "TMPDIR": str(tmp_path), "HOME": str(tmp_path)})
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "SKIP" not in out and "FAIL" not in out
    steps = re.findall(r"^DRY   (\S+)\s+(\d+)s", out, re.M)
    names = [s for s, _ in steps]
    assert names[:3] == ["gpu", "write-tiny", "write-llama-8b-q4_k"]
    assert names.index("bench-llama-8b-q4_k") < names.index("ptx-sm_90") < names.index("tests-cuda")  # slowest last
    assert {f"diff-tiny-{c}" for c in ("qwen2_window", "qwen3_bias_headdim", "qwen3_moe_norm_false", "llama31")} <= set(names)
    assert "python3 -m fuelcli bench" in out and "timeout" not in out  # planned, not run
    budget = 450
    assert sum(int(t) for _, t in steps) > budget  # the budget, not the limits, bounds the run: under 8 minutes
    assert not (tmp_path / "fuel-gpu-check" / "logs" / "gpu.log").exists()


@pytest.mark.parametrize("args", [["--bogus"], ["--wheels"]])
def test_bad_arguments(args):
    assert run(*args).returncode == 2
