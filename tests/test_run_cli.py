"""fuel run as people use it: prompts from pipes and files, -c, -t, --verbose-prompt, chat-template
options, --json, the help text and the conventions (no <bool>, exit codes, completion, NO_COLOR)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from fuelcli.cli import app
from fuelcli.errors import InputError

runner = CliRunner()


def run(*args, input=""):
    """`fuel run` in-process (stdin from `input`, never the terminal); stdout, stderr, exception."""
    r = runner.invoke(app, ["run", *args], input=input)
    return r.stdout, r.stderr, r.exception


def shown_prompt(stderr: str) -> str:
    """The text --verbose-prompt shows between `prompt: '` and the line with the token count."""
    return stderr.split("prompt: '", 1)[1].split("'\nnumber of tokens in prompt", 1)[0]


@pytest.fixture(scope="module")
def smol(smollm2_gguf):
    """The SmolLM2 GGUF, its kernels compiled: in a worker with an empty cache the first run says
    "compiling fuel's kernels" on stderr, which the tests that expect a quiet stderr must not see."""
    _, _, exc = run(str(smollm2_gguf), "Hi", "-n", "1", "-q")
    assert exc is None
    return str(smollm2_gguf)


RAW = ("--no-chat-template", "--verbose-prompt", "-n", "1", "-q", "--temp", "0")


def test_prompt_from_stdin_pipes_and_files(smol, tmp_path):
    out, err, exc = run(smol, "-", *RAW, input="all of stdin\n")
    assert exc is None and shown_prompt(err) == "all of stdin"  # one trailing newline dropped
    out, err, exc = run(smol, "Summarise:", *RAW, input="piped text\n")
    assert shown_prompt(err) == "piped text Summarise:"  # as ollama and llm: piped text, then PROMPT
    f = tmp_path / "p.txt"
    f.write_text("file text\n\n")
    out, err, exc = run(smol, "-f", str(f), "Q:", *RAW, input="not read")
    assert shown_prompt(err) == "file text\n Q:"
    out, err, exc = run(smol, "--file", str(f), *RAW)
    assert shown_prompt(err) == "file text\n"
    out, err, exc = run(smol, "plain", *RAW)  # empty stdin: PROMPT alone
    assert shown_prompt(err) == "plain"


@pytest.mark.parametrize("args, message", [
    ((), "no prompt: give PROMPT, - to read stdin, --file FILE, or pipe text in"),
    (("-", "-f", "x.txt"), "give the prompt as - (stdin) or with --file, not both"),
    (("hi", "-f", "/nonexistent/p.txt"), "--file /nonexistent/p.txt: cannot read"),
    (("hi", "--system", "a", "--system-file", "x"), "give --system or --system-file, not both"),
    (("hi", "-c", "8"), "the prompt has 31 tokens; the context is 8"),
    (("hi", "-c", "9000"), "-c 9000 exceeds the model's context of 8192 tokens"),
    (("hi", "-c", "-1"), "-c/--ctx-size must be >= 0"),
    (("hi", "-t", "0"), "-t/--threads must be from 1 to 512, got 0"),
    (("hi", "-t", "999"), "-t/--threads must be from 1 to 512, got 999"),
    (("hi", "-t", "500"), "-t 500 exceeds numba's pool"),
    (("hi", "--chat-template-kwargs", "{bad"), "--chat-template-kwargs is not valid JSON"),
    (("hi", "--chat-template-kwargs", "[1]"), "--chat-template-kwargs must be a JSON object, got list"),
    (("hi", "--chat-template-kwargs", '{"messages": []}'), "chat template kwargs cannot set messages"),
    (("hi", "--no-chat-template", "--chat-template-kwargs", "{}"), "--chat-template-kwargs needs the model's chat "
                                                                     "template (drop --no-chat-template)"),
    (("hi", "--min-keep", "-1"), "--min-keep must be >= 0"),
])
def test_bad_input_is_one_error(smol, args, message):
    _, _, exc = run(smol, *args)
    assert isinstance(exc, InputError) and message in str(exc) and "\n" not in str(exc), exc


def test_text_files_that_are_not_utf8(smol, tmp_path):
    """-f, --system-file and --chat-template name the file and the first bad byte."""
    bad = tmp_path / "latin1.txt"
    bad.write_bytes(b"caf\xe9")
    for flag in ("-f", "--system-file", "--chat-template"):
        args = (flag, str(bad)) if flag == "-f" else ("hi", flag, str(bad))
        _, _, exc = run(smol, *args)
        assert isinstance(exc, InputError) and str(exc).endswith(f"{bad}: not UTF-8 text (byte 3: unexpected "
                                                                 "end of data)"), exc


def test_ctx_size_threads_and_json(smol):
    out, err, exc = run(smol, "Count from one to one hundred.", "--json", "--temp", "0", "-n", "200", "-c", "40",
                        "-t", "1")
    assert exc is None and err == ""
    r = json.loads(out)
    assert r["n_ctx"] == 40 and r["threads"] == 1 and r["stats"]["stop_reason"] == "context full"
    assert r["stats"]["prompt_tokens"] == 37 and len(r["tokens"]) == r["stats"]["generated_tokens"] == 40 - 37 + 1
    assert r["stats"]["prefill_tok_s"] > 0 and r["interrupted"] is False
    plain, _, _ = run(smol, "Count from one to one hundred.", "--temp", "0", "-n", "200", "-c", "40", "-q")
    assert plain == r["text"] + "\n"  # the same text, streamed
    out, _, exc = run(smol, "Hi", "--json", "-n", "1", "-c", "0", "--temp", "0")
    assert json.loads(out)["n_ctx"] == 8192  # -c 0: the model's


def test_threads_size_the_pool_before_numba_starts(smol):
    """In a fresh process -t may exceed the cores (the pool is sized to it), as llama.cpp's -t."""
    n = os.cpu_count() + 1
    r = subprocess.run([sys.executable, "-m", "fuelcli", "run", smol, "Hi", "-t", str(n), "-n", "1", "--json"],
                       capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=600)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["threads"] == n


def test_system_file_template_file_and_kwargs(smol, tmp_path):
    sf = tmp_path / "system.txt"
    sf.write_text("Be terse.\n")
    _, err, exc = run(smol, "hi", "--system-file", str(sf), "--verbose-prompt", "-n", "1", "-q")
    assert exc is None and shown_prompt(err).startswith("<|im_start|>system\nBe terse.<|im_end|>\n<|im_start|>user\nhi")
    tf = tmp_path / "t.jinja"
    tf.write_text("{% for m in messages %}[{{ m.role }}{% if greeting is defined %} {{ greeting }}{% endif %}] "
                  "{% generation %}{{ m.content }}{% endgeneration %}\n{% endfor %}"
                  "{% if add_generation_prompt %}[assistant]{% endif %}")
    _, err, exc = run(smol, "hi", "--chat-template", str(tf), "--verbose-prompt", "-n", "1", "-q")
    assert exc is None and shown_prompt(err) == "[user] hi[assistant]"  # (trim_blocks eats the newline)
    _, err, exc = run(smol, "hi", "--chat-template", str(tf), "--chat-template-kwargs", '{"greeting": "ahoy"}',
                      "--system", "S", "--verbose-prompt", "-n", "1", "-q")
    assert exc is None and shown_prompt(err) == "[system ahoy] S[user ahoy] hi[assistant]"
    empty = tmp_path / "empty.jinja"
    empty.write_text("\n")
    _, _, exc = run(smol, "hi", "--chat-template", str(empty))
    assert isinstance(exc, InputError) and "is empty" in str(exc)


def test_verbose_prompt_lists_every_id(smol):
    _, err, exc = run(smol, "Hello", "--verbose-prompt", "-n", "1", "-q")
    lines = err.splitlines()
    n = int(next(x for x in lines if x.startswith("number of tokens in prompt = ")).rsplit(" ", 1)[1])
    ids = [x for x in lines if re.match(r"^ *\d+ -> '", x)]
    assert n == 31 and len(ids) == n and ids[0].split(" -> ")[1] == "'<|im_start|>'"


# --- chat templates: transformers' {% generation %} and template kwargs, against transformers ----

QWEN3_LIKE = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n"
    "{% if m.role == 'assistant' %}{% generation %}{{ m.content }}{% endgeneration %}{% else %}{{ m.content }}"
    "{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n{% endif %}{% endif %}"
)


@pytest.mark.parametrize("kwargs", [None, {"enable_thinking": False}, {"enable_thinking": True}])
def test_generation_tag_and_kwargs_render_as_transformers(smollm2_tokenizer_dir, kwargs):
    from transformers import AutoTokenizer

    from fuelcli.text.tokenizer import Tokenizer

    messages = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"},
                {"role": "user", "content": "2+2?"}]
    ours = Tokenizer.from_dir(smollm2_tokenizer_dir)
    ours.chat_template = QWEN3_LIKE
    theirs = AutoTokenizer.from_pretrained(smollm2_tokenizer_dir)
    want = theirs.apply_chat_template(messages, chat_template=QWEN3_LIKE, tokenize=False, add_generation_prompt=True,
                                      **(kwargs or {}))
    got = ours.render_chat(messages, True, kwargs)
    assert got == want
    assert ("<think>" in got) == (kwargs == {"enable_thinking": False})  # the kwarg reaches the template


# --- help and conventions ----------------------------------------------------------------------

def _commands(cmd, prefix=()):
    """Every command path of the click tree: (), ("run",), ..., ("inspect", "config"), ..."""
    yield prefix
    for name, sub in getattr(cmd, "commands", {}).items():
        yield from _commands(sub, prefix + (name,))


def test_help_shows_flags_without_bool_and_the_exit_codes():
    helps = {}
    import typer.main

    for path in _commands(typer.main.get_command(app)):
        r = runner.invoke(app, [*path, "--help"])
        assert r.exit_code == 0, (path, r.output)
        helps[path] = r.stdout
    assert {("run",), ("chat",), ("ls",), ("rm",), ("inspect", "config")} <= set(helps)
    for path, text in helps.items():
        assert "<bool>" not in text and "BOOLEAN" not in text, (path, text)
        assert "\x1b[" not in text  # plain text, no colour
    assert "--json  " in helps[("run",)] and "--verbose-prompt  " in helps[("run",)]
    top = " ".join(helps[()].split())  # the wrapping follows the terminal's width
    assert "--install-completion" in top
    assert re.search(r"Exit codes: 0 success, .*2 bad input.*3 oracle mismatch.*4 missing optional dependency.*"
                     r"130 interrupted", top)
    for cmd in ("run", "chat"):
        assert "repetition penalty -> top-k -> top-p -> min-p -> temperature" in " ".join(helps[(cmd,)].split())
    r = runner.invoke(app, ["inspect", "config", "x", "--json", "true"])
    assert r.exit_code == 2  # a flag takes no value, as its help says


def fuel_main(*args, env=None):
    code = "import sys; from fuelcli.cli import main; sys.argv[0] = 'fuel'; main()"
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=300,
                          stdin=subprocess.DEVNULL, env={**os.environ, **(env or {})})


def test_shell_completion():
    # the shell named, not detected: detection walks the parent processes, and a test run whose shell
    # has exited (started in the background) has none
    r = fuel_main("--show-completion", "bash", env={"_TYPER_COMPLETE_TEST_DISABLE_SHELL_DETECTION": "1"})
    assert r.returncode == 0 and "complete -o default -F _fuel_completion fuel" in r.stdout
    env = {"_FUEL_COMPLETE": "complete_bash", "COMP_WORDS": "fuel run x --top", "COMP_CWORD": "3"}
    assert fuel_main(env=env).stdout.split() == ["--top-k", "--top-p"]
    env = {"_FUEL_COMPLETE": "complete_bash", "COMP_WORDS": "fuel ch", "COMP_CWORD": "1"}
    assert fuel_main(env=env).stdout.split() == ["chat"]


SGR = re.compile(r"\x1b\[([0-9;]*)m")


def _colours(text: str) -> list[str]:
    """SGR parameters that set a colour (30-38, 40-48, 90-107), as opposed to bold or reset."""
    out = []
    for params in SGR.findall(text):
        out += [p for p in params.split(";") if p and (30 <= int(p) <= 48 or 90 <= int(p) <= 107)]
    return out


def test_no_color_is_honoured(tiny):
    d = str(tiny("llama2"))
    forced = fuel_main("diff", d, "--tokens", "1,2,3,4", env={"FORCE_COLOR": "1"})
    assert forced.returncode == 0 and _colours(forced.stdout)  # control: colour when forced
    plain = fuel_main("diff", d, "--tokens", "1,2,3,4", env={"FORCE_COLOR": "1", "NO_COLOR": "1"})
    assert plain.returncode == 0 and _colours(plain.stdout) == [] and "verdict: PASS" in plain.stdout


def test_warm_up_leaves_the_cache_as_it_was(tiny):
    """run and chat warm the engine up (compile or load the kernels) before the clock starts; the
    warm-up's token must leave no trace in what the engine holds."""
    import numpy as np

    from fuelcli.backends import make_engine
    from fuelcli.assembly.loader import open_model

    m = open_model(str(tiny("llama2")))
    plain = make_engine(m.cfg, m.weights, n_ctx=16)  # the same calls without warm-ups
    want = np.vstack([plain.prefill([1, 2, 3], all_logits=True), plain.decode(4)[None]])
    e = make_engine(m.cfg, m.weights, n_ctx=16)
    e.warm_up()
    assert e.pos == 0
    first = e.prefill([1, 2, 3], all_logits=True)
    e.warm_up()
    assert e.pos == 3
    np.testing.assert_array_equal(np.vstack([first, e.decode(4)[None]]), want)


def test_cpu_warm_up_loads_the_forward_every_prefill_calls(tiny):
    """The CPU warm-up compiles or loads the forward for argument types it builds itself, without
    running it: they must be those of every later prefill (any other would load or compile again
    inside the first timed prefill)."""
    from fuelcli.backends import make_engine
    from fuelcli.assembly.loader import open_model

    class Spy:  # numba's dispatcher, recording what is compiled and what is called
        def __init__(self, f):
            self.f, self.compiled, self.called = f, [], []

        def typeof_pyval(self, a):
            return self.f.typeof_pyval(a)

        def compile(self, sig):
            self.compiled.append(sig)
            return self.f.compile(sig)

        def __call__(self, *args):
            self.called.append(tuple(self.f.typeof_pyval(a) for a in args))
            return self.f(*args)

    m = open_model(str(tiny("llama2")))
    e = make_engine(m.cfg, m.weights, n_ctx=16)
    e._forward = spy = Spy(e._forward)
    e.warm_up()
    assert e.pos == 0 and spy.called == []  # loaded, not run
    e.prefill([1, 2, 3])
    e.prefill([4], all_logits=True)
    e.prefill([5], hidden=True)
    e.decode(6)
    assert len(spy.compiled) == 1 and set(spy.called) == set(spy.compiled)
    # control: the recorded signature tells argument types apart (a 1-D logits buffer differs)
    assert spy.f.typeof_pyval(e._logits(1)[0]) != spy.compiled[0][-2]
