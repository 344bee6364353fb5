"""The release as a user gets it: a wheel built from the project's own files installs into a fresh
environment and its `fuel` command runs; `fuel --version` and `fuel doctor` say what a bug report
needs; process/extras.py says what pyproject.toml declares."""

from __future__ import annotations

import json
import os
import shutil
import site
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from typer.testing import CliRunner

from fuelcli import __version__
from fuelcli.cli import app
from fuelcli.process.extras import DIST, EXTRAS

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]


def test_name_version_and_extras_agree():
    assert PYPROJECT["name"] == DIST == "fuel-llm"  # `fuel` on PyPI is another project
    assert PYPROJECT["version"] == __version__
    assert PYPROJECT["scripts"] == {"fuel": "fuelcli.__main__:main"}
    declared = PYPROJECT["optional-dependencies"]
    assert set(declared) == set(EXTRAS)
    for name, extra in EXTRAS.items():  # every package doctor reports is one the extra installs
        reqs = " ".join(declared[name]).lower().replace("_", "-")
        assert all(p in reqs for p in extra.packages), (name, extra.packages, declared[name])


def _project_copy(dst: Path) -> Path:
    """The files a wheel is built from, outside the work tree (a build there leaves build/ and
    *.egg-info behind, and parallel tests would share them)."""
    dst.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, dst / name)
    shutil.copytree(ROOT / "fuelcli", dst / "fuelcli", ignore=shutil.ignore_patterns("__pycache__", "*.nb[ic]"))
    return dst


def _see_site_packages_of_this_python(venv: Path) -> None:
    """Make the running interpreter's site-packages (numba and the rest) importable in `venv`, after
    its own, so that nothing is downloaded. `--system-site-packages` would not do it when the tests run
    in a venv themselves: it gives the base interpreter's, not this venv's. Plain paths in a .pth file
    add those directories without running their .pth files, so an editable install of fuel there
    does not take over from the wheel."""
    paths = site.getsitepackages() + ([site.getusersitepackages()] if site.ENABLE_USER_SITE else [])
    (own,) = (venv / "lib").glob("python3*/site-packages")
    (own / "_fuel_test_parent_site.pth").write_text("".join(f"{p}\n" for p in paths), encoding="utf-8")


def test_wheel_installs_into_a_fresh_venv(tmp_path):
    """pip wheel of the project's files, installed into a new venv that sees this interpreter's
    site-packages: its own `fuel --version` runs the wheel's code."""
    pytest.importorskip("setuptools")
    pytest.importorskip("pip")
    src = _project_copy(tmp_path / "src")
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                            "-w", str(tmp_path / "dist"), str(src)], capture_output=True, text=True, timeout=300)
    assert build.returncode == 0, build.stderr
    (wheel,) = (tmp_path / "dist").glob("*.whl")
    assert wheel.name == f"fuel_llm-{__version__}-py3-none-any.whl"
    venv = tmp_path / "venv"
    r = subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)],
                       capture_output=True, text=True, timeout=120)
    if r.returncode != 0:
        pytest.skip(f"python -m venv does not work here: {r.stderr.strip()[-200:]}")
    _see_site_packages_of_this_python(venv)
    py = venv / "bin" / "python"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    r = subprocess.run([str(py), "-m", "pip", "install", "--no-deps", "--no-index", "-q", str(wheel)],
                       capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr
    r = subprocess.run([str(venv / "bin" / "fuel"), "--version"], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[0] == f"fuel {__version__} ({DIST})" and "CPU kernels:" in r.stdout
    r = subprocess.run([str(py), "-c", "import fuelcli, importlib.metadata as m; "
                        "print(fuelcli.__file__); print(m.version('fuel-llm'))"],
                       capture_output=True, text=True, env=env, timeout=60, cwd=tmp_path)
    where, version = r.stdout.split()
    assert Path(where).is_relative_to(venv) and version == __version__  # the wheel's code, not a checkout's


def test_version_says_what_a_bug_report_needs():
    r = CliRunner().invoke(app, ["--version"])
    assert r.exit_code == 0
    lines = r.stdout.splitlines()
    assert lines[0] == f"fuel {__version__} ({DIST})"
    assert lines[1].startswith("numba ") and "llvmlite " in lines[1] and "LLVM " in lines[1]
    from fuelcli.backends.cpu.llvm import host_isa

    assert lines[2].startswith(f"CPU kernels: {host_isa().name}")


def test_version_with_an_impossible_isa(monkeypatch):
    """A FUEL_ISA the CPU cannot run is reported, and --version still exits 0."""
    monkeypatch.setenv("FUEL_ISA", "no-such-isa")
    r = CliRunner().invoke(app, ["--version"])
    assert r.exit_code == 0 and "CPU kernels: unavailable (FUEL_ISA='no-such-isa'" in r.stdout


def test_doctor(tmp_path, monkeypatch):
    home = tmp_path / "home"
    (home / "gguf-headers").mkdir(parents=True)
    (home / "gguf-headers" / "x").write_bytes(b"0" * 1234)
    monkeypatch.setenv("FUEL_HOME", str(home))
    monkeypatch.delenv("NUMBA_CACHE_DIR", raising=False)
    r = CliRunner().invoke(app, ["doctor", "--json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert d["fuel"] == __version__ and d["distribution"] == DIST and d["core"]["numba"]
    assert [e["extra"] for e in d["extras"]] == list(EXTRAS)
    for e in d["extras"]:
        assert e["installed"] == all(e["packages"].values()) and e["adds"]
        assert e["install"].startswith(f"pip install '{DIST}[{e['extra']}]'")
    caches = {c["name"]: c for c in d["caches"]}
    assert caches["FUEL_HOME"]["path"] == str(home) and caches["FUEL_HOME"]["bytes"] == 1234
    assert caches["gguf-headers"]["bytes"] == 1234 and caches["fuel-kernels"]["bytes"] == 0
    r = CliRunner().invoke(app, ["doctor"])
    assert r.exit_code == 0 and "extras:" in r.stdout and "caches:" in r.stdout
    assert "llama-cpp" in r.stdout and str(home) in r.stdout
