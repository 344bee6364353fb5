"""`fuel bench`: the report's structure and arithmetic on a tiny model (never its speed)."""

from __future__ import annotations

import csv
import io
import json
import math
import os
import statistics
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from fuelcli.cli import app
from fuelcli.errors import InputError, MissingDependency
from fuelcli.measure import bench as B

sys.path.insert(0, str(Path(__file__).parent))
from tiny_models import write_tiny  # noqa: E402

# llama2 tiny: vocab 256, hidden 64, intermediate 128, 2 layers, 4 heads = 4 kv heads, untied, f32
TINY_PARAMS = 2 * 256 * 64 + 2 * (4 * 64 * 64 + 3 * 64 * 128) + (2 * 2 + 1) * 64


@pytest.fixture(scope="session")
def tiny(tmp_path_factory) -> Path:
    return write_tiny("llama2", tmp_path_factory.mktemp("bench"))


def bench(*args) -> str:
    r = CliRunner().invoke(app, ["bench", *map(str, args), "--no-progress"])
    if r.exception is not None and not isinstance(r.exception, SystemExit):
        raise r.exception
    assert r.exit_code == 0, r.output
    return r.stdout


def check_series(s: dict, n_tokens: int, reps: int):
    assert len(s["samples_s"]) == len(s["samples_ts"]) == reps
    assert all(sec > 0 for sec in s["samples_s"])
    for sec, ts in zip(s["samples_s"], s["samples_ts"]):
        assert ts == pytest.approx(n_tokens / sec, rel=1e-12)
    assert s["avg_ts"] == pytest.approx(statistics.fmean(s["samples_ts"]), rel=1e-12)
    want_std = statistics.stdev(s["samples_ts"]) if reps > 1 else 0.0
    assert s["stddev_ts"] == pytest.approx(want_std, rel=1e-9, abs=1e-9)


# ---------------------------------------------------------------------------------------------------
# library: the loop and its arithmetic with fake runners (exact seconds, no clock)


class FakeRunner:
    def __init__(self, name, log, pp_s=0.5, tg_s=0.25):
        self.name, self.log, self.pp_s, self.tg_s = name, log, pp_s, tg_s
        self.detail, self.threads, self.calls = f"{name} fake", 1, 0

    def prepare(self, depth_ids):
        self.log.append((self.name, "prepare", tuple(depth_ids)))

    def pp(self, ids):
        self.calls += 1
        self.log.append((self.name, "pp", tuple(ids)))
        return self.pp_s * self.calls  # 0.5, 1.0, 1.5, ... -> known rates

    def tg(self, ids):
        self.calls += 1
        self.log.append((self.name, "tg", tuple(ids)))
        return self.tg_s * self.calls


def test_run_bench_interleaves_and_computes():
    log = []
    fuel, peer = FakeRunner("fuel", log), FakeRunner("peer", log, pp_s=1.0, tg_s=1.0)
    tests = B.make_tests([8], [4], [0, 3])
    assert [t.name for t in tests] == ["pp8", "tg4", "pp8 @ d3", "tg4 @ d3"]
    ticks = []
    results, got_peer = B.run_bench(fuel, tests, 3, vocab_size=50, seed=1, peer_factory=lambda: peer,
                                    on_step=ticks.append)
    assert got_peer is peer
    assert len(ticks) == B.steps_total(len(tests), 3, True)
    # warm-ups: fuel on all tests, then the peer on all tests; then fuel/peer alternate per repetition
    runs = [(who, what) for who, what, _ in log if what != "prepare"]
    assert runs[:4] == [("fuel", "pp"), ("fuel", "tg")] * 2
    assert runs[4:8] == [("peer", "pp"), ("peer", "tg")] * 2
    timed = runs[8:]
    assert [w for w, _ in timed] == ["fuel", "peer"] * (len(tests) * 3)
    # every run is preceded by prepare(depth ids) of the right length; both runners get the same ids
    for i in range(0, len(log), 2):
        (w1, p, depth_ids), (w2, _, ids) = log[i], log[i + 1]
        assert p == "prepare" and w1 == w2
        assert len(ids) in (8, 4) and len(depth_ids) in (0, 3)
        assert all(0 <= t < 50 for t in depth_ids + ids)
    timed_log = log[16:]
    for i in range(0, len(timed_log), 4):
        assert timed_log[i][2] == timed_log[i + 2][2] and timed_log[i + 1][2] == timed_log[i + 3][2]
    # arithmetic: fuel's pp8 samples are the 5th..7th calls (after 4 warm-ups) -> 2.5, 3.0, 3.5 s
    pp8 = results[0]
    assert pp8.fuel.seconds == [2.5, 3.0, 3.5]
    rates = [8 / 2.5, 8 / 3.0, 8 / 3.5]
    assert pp8.fuel.rates == pytest.approx(rates)
    assert pp8.fuel.mean == pytest.approx(sum(rates) / 3)
    assert pp8.fuel.std == pytest.approx(math.sqrt(sum((r - sum(rates) / 3) ** 2 for r in rates) / 2))
    assert pp8.peer.seconds == [5.0, 6.0, 7.0]
    assert pp8.ratio == pytest.approx(pp8.fuel.mean / statistics.fmean([8 / 5, 8 / 6, 8 / 7]))


def test_run_bench_runs_engines_in_turn():
    """Several fuel runners (`--activations int16,q8`): a repetition runs each on the same ids, then
    the peer; each is a row of every test, its rate given against the first's, and all rows of a test
    share the peer's runs."""
    log = []
    one, two = FakeRunner("fuel int16", log), FakeRunner("fuel q8", log, pp_s=0.25, tg_s=0.125)
    one.backend, two.backend = "cpu numba", "cpu numba act q8"
    peer = FakeRunner("peer", log, pp_s=1.0, tg_s=1.0)
    tests = B.make_tests([8], [4], [0])
    ticks = []
    results, _ = B.run_bench([one, two], tests, 2, vocab_size=50, seed=1, peer_factory=lambda: peer,
                             on_step=ticks.append)
    assert len(ticks) == B.steps_total(len(tests), 2, True, 2)
    runs = [(who, tuple(ids)) for who, what, ids in log if what != "prepare"]
    timed = runs[6:]  # warm-ups: each fuel runner on both tests, then the peer
    assert [w for w, _ in timed] == ["fuel int16", "fuel q8", "peer"] * 4
    for i in range(0, len(timed), 3):
        assert timed[i][1] == timed[i + 1][1] == timed[i + 2][1]
    assert [(r.spec.name, r.backend) for r in results] == [("pp8", "cpu numba"), ("pp8", "cpu numba act q8"),
                                                          ("tg4", "cpu numba"), ("tg4", "cpu numba act q8")]
    pp_one, pp_two = results[:2]
    assert pp_one.fuel.seconds == [1.5, 2.0] and pp_two.fuel.seconds == [0.75, 1.0]
    assert pp_one.peer is pp_two.peer and pp_one.peer.seconds == [3.0, 4.0]
    assert pp_one.vs_baseline == 1.0
    assert pp_two.vs_baseline == pytest.approx(statistics.fmean([8 / 0.75, 8 / 1.0]) / statistics.fmean([8 / 1.5, 8 / 2.0]))
    md = B.render_md(B.Report(B.ModelInfo("m", "p", "dir", "llama", 1, 1, {}), 1, 2, 1, 9, results))
    lines = md.splitlines()
    assert "| vs cpu numba |" in lines[0]
    assert [c.strip() for c in lines[3].strip("|").split("|")][3] == "cpu numba act q8"
    # a baseline-free report has no such column
    assert "vs " not in B.render_md(B.Report(B.ModelInfo("m", "p", "dir", "llama", 1, 1, {}), 1, 2, 1, 9,
                                             [B.TestResult(results[0].spec, results[0].fuel)])).splitlines()[0]


def test_parse_and_context():
    assert B.parse_int_list("64, 512,64", "-p") == [64, 512]
    for bad in ("x", "-1", ""):
        with pytest.raises(InputError):
            B.parse_int_list(bad, "-p")
    tests = B.make_tests([0, 16], [0], [0])
    assert [t.name for t in tests] == ["pp16"]
    with pytest.raises(InputError):
        B.make_tests([0], [0], [0, 5])
    assert B.context_needed(B.make_tests([16], [40], [10, 2])) == 10 + 40 + 1


def test_fuel_runner_fills_depth_and_resets(tiny):
    from fuelcli.backends.cpu.engine import CpuEngine as Engine
    from fuelcli.assembly.loader import open_model

    m = open_model(str(tiny))
    e = Engine(m.cfg, m.weights, n_ctx=32)
    r = B.FuelRunner(e)
    rng = np.random.default_rng(0)
    r.prepare(rng.integers(0, 256, 5))
    assert e.pos == 5
    assert r.tg(rng.integers(0, 256, 4)) > 0 and e.pos == 9
    r.prepare(np.zeros(0, np.int64))
    assert e.pos == 0
    assert r.pp(rng.integers(0, 256, 7)) > 0 and e.pos == 7


def test_parallel_tests():
    """--parallel widens every tg test; pp tests stay one sequence; a width below 1 is refused."""
    tests = B.make_tests([8], [4], [0, 2], [1, 3])
    assert [t.name for t in tests] == ["pp8", "tg4", "tg4 x3", "pp8 @ d2", "tg4 @ d2", "tg4 x3 @ d2"]
    assert [t.tokens for t in tests[:3]] == [8, 4, 12]
    assert B.seqs_needed(tests) == 3 and B.context_needed(tests) == 2 + 8 + 1  # positions of one sequence
    with pytest.raises(InputError, match="at least 1"):
        B.make_tests([8], [4], [0], [2, 0])


def test_fuel_runner_sequences(tiny):
    """A tg run of B sequences steps every slot once a token; prepare fills each slot's depth."""
    from fuelcli.backends.cpu.engine import CpuEngine as Engine
    from fuelcli.assembly.loader import open_model

    m = open_model(str(tiny))
    e = Engine(m.cfg, m.weights, n_ctx=32, slots=3)
    r = B.FuelRunner(e)
    rng = np.random.default_rng(0)
    r.prepare(rng.integers(0, 256, 5), 3)
    assert list(e.positions) == [5, 5, 5]
    assert r.tg(rng.integers(0, 256, (4, 3))) > 0 and list(e.positions) == [9, 9, 9]
    r.prepare(np.zeros(0, np.int64), 2)
    assert list(e.positions) == [0, 0, 0]
    assert r.tg(rng.integers(0, 256, (2, 2))) > 0 and list(e.positions) == [2, 2, 0]


# ---------------------------------------------------------------------------------------------------
# the command on the tiny model


def test_md_table(tiny):
    out = bench(tiny, "-p", "8,16", "-n", "4", "-r", "2", "--no-roofline")
    lines = out.strip().splitlines()
    assert lines[0] == "| model | size | params | backend | threads | test | t/s |"
    assert lines[1].count("|") == 8
    rows = [ln.split(" | ") for ln in lines[2:5]]
    assert [r[5] for r in rows] == ["pp8", "pp16", "tg4"]
    import numba

    for r in rows:
        assert r[0] == "| llama2" and r[3] == "cpu numba" and r[4] == str(numba.get_num_threads())
        assert r[2] == B.human_count(TINY_PARAMS) and r[1] == B.human_bytes(4 * TINY_PARAMS)
        mean, std = r[6].rstrip(" |").split(" ± ")
        assert float(mean) > 0 and float(std) >= 0
    assert lines[5] == ""
    assert lines[6].startswith("formats: f32 16; r=2, seed 0, n_ctx 17;") and "peak RSS" in lines[6]


def test_progress_lines_where_stderr_is_not_a_terminal(tiny, monkeypatch):
    """In a pipe or a log the progress bar shows nothing: there a plain line per run goes to stderr
    (as llama-bench's --progress), the table to stdout as before; --no-progress prints none."""
    monkeypatch.delenv("FORCE_COLOR", raising=False)  # rich would take either for a terminal
    monkeypatch.delenv("TTY_COMPATIBLE", raising=False)
    args = ["bench", str(tiny), "-p", "8", "-n", "4", "-r", "2", "--no-roofline"]
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 0, r.output
    runs = ["fuel warm-up pp8", "fuel warm-up tg4", "fuel pp8 1/2", "fuel pp8 2/2", "fuel tg4 1/2", "fuel tg4 2/2"]
    assert len(runs) == B.steps_total(2, 2, False)
    assert [ln for ln in r.stderr.splitlines() if ln.startswith("fuel bench:")] == [
        f"fuel bench: {i}/{len(runs)} {run}" for i, run in enumerate(runs, 1)]
    assert r.stdout.startswith("| model | size |")
    quiet = CliRunner().invoke(app, args + ["--no-progress"])
    assert quiet.exit_code == 0 and "fuel bench:" not in quiet.stderr


def test_roofline(tiny):
    """tg rows carry read GB/s and the fraction of the measured read bandwidth; the bytes per token
    are the weights a decode step reads plus the mean KV cache it reads."""
    out = bench(tiny, "-p", "8", "-n", "4", "-r", "2")
    lines = out.strip().splitlines()
    assert lines[0] == "| model | size | params | backend | threads | test | t/s | read GB/s | roofline |"
    pp, tg = (ln.split(" | ") for ln in lines[2:4])
    assert pp[7:] == ["", " |"] and tg[7].strip() and tg[8].rstrip(" |").endswith("%")
    assert "roofline: read bandwidth" in lines[5] and "before / after the tests" in lines[5]
    rep = json.loads(bench(tiny, "-p", "0", "-n", "4", "-d", "0,6", "-r", "2", "-o", "json"))
    bw = rep["bandwidth"]
    assert bw["threads"] == rep["threads"] and bw["bytes_per_s"] > 1e8
    assert len(bw["measured"]) == 2 and bw["bytes_per_s"] == max(bw["measured"])  # before and after the tests
    # untied f32 llama: every matrix but the embedding, one embedding row, 5 norms of 64
    weights = 4 * (TINY_PARAMS - 256 * 64 + 64)
    for t, depth in zip(rep["tests"], (0, 6)):
        kv = 2 * 2 * (depth + 2.5) * 4 * 16 * 4  # K and V, layers, mean positions, kv heads, head_dim, f32
        assert t["bytes_per_token"] == int(weights + kv)
        assert t["read_bytes_per_s"] == pytest.approx(t["bytes_per_token"] * t["fuel"]["avg_ts"])
        assert t["roofline_fraction"] == pytest.approx(t["read_bytes_per_s"] / bw["bytes_per_s"])
    assert bw["bytes"] == rep["tests"][1]["bytes_per_token"]  # the largest working set


def test_roofline_counts_a_hybrids_recurrent_state(tmp_path_factory):
    """A linear-attention layer's decode step reads its sequence's state (conv window, delta-rule
    matrices) and writes it back: a hybrid's bytes per token are its tensors (one embedding row),
    the K and V of its attention layers only (1 of 4) and the engine's own state arrays twice.
    Control: the same sum without the state misses."""
    from safetensors.numpy import load_file

    from fuelcli.assembly.loader import open_model
    from fuelcli.backends import make_engine

    d = write_tiny("qwen3_5", tmp_path_factory.mktemp("bench_hybrid"))
    model = open_model(str(d))
    held = make_engine(model.cfg, model.weights, n_ctx=16).state
    state = held.rec[:, 0].nbytes + held.conv[:, 0].nbytes  # one sequence's
    # 3 linear layers, f32: 4 value heads of an 8 x 12 matrix, a conv window of 3 x (2 * 2 * 8 + 4 * 12)
    assert state == 4 * 3 * (4 * 8 * 12 + 3 * 80)
    tensors = sum(a.nbytes for f in d.glob("*.safetensors") for a in load_file(f).values())
    weights = tensors - 4 * (256 - 1) * 64  # untied: one row of the embedding
    rep = json.loads(bench(d, "-p", "0", "-n", "4", "-r", "1", "-t", "1", "-o", "json"))
    kv = 2 * 1 * 2.5 * 2 * 16 * 4  # K and V, 1 attention layer, mean position, kv heads, head_dim, f32
    got = rep["tests"][0]["bytes_per_token"]
    assert got == int(weights + kv + 2 * state)
    assert got != int(weights + kv)  # the control: the state left out


def test_roofline_reads_one_row_of_the_per_layer_input_table(tmp_path_factory):
    """Gemma 4's per-layer inputs read the token's row of their table, as the embedding does: bytes per
    token count one row of each. Control: the whole table counted (what the roofline did, reading
    133% on an E4B-shape file) misses."""
    from fuelcli.assembly.loader import open_model
    from fuelcli.measure.roofline import bytes_per_token
    from fuelcli.weights.build import layer_vectors

    model = open_model(str(write_tiny("gemma4_e2b", tmp_path_factory.mktemp("bench_ple"))))
    w = model.weights
    ple, emb = w.per_layer_embed, w.embed
    assert ple is not None and w.output is emb  # tied: the embedding is read whole, as the output
    rest = sum(t.nbytes for t in w.tensors() if t is not ple) + w.final_norm.nbytes
    rest += sum(int(v.nbytes) for layer in w.layers for v in layer_vectors(layer))
    got = bytes_per_token(model.cfg, w, 0)
    assert got == rest + ple.nbytes // ple.shape[0]
    assert got != rest + ple.nbytes  # the control: the whole table


def test_roofline_takes_the_higher_bandwidth():
    """A shared host's memory bandwidth moves within minutes: the roofline is the higher of the two
    measurements, whichever came first, so a test is not put above 100% by a low one."""
    from fuelcli.cli.bench import _roofline

    lo, hi = {"bytes": 8, "threads": 2, "bytes_per_s": 5e10}, {"bytes": 8, "threads": 2, "bytes_per_s": 9e10}
    for before, after in ((lo, hi), (hi, lo)):
        r = _roofline(before, after)
        assert r["bytes_per_s"] == 9e10 and r["measured"] == [before["bytes_per_s"], after["bytes_per_s"]]
    assert _roofline(lo, None) == lo  # no second measurement (a GPU without room): the first


def test_roofline_note_says_when_the_bandwidth_moved(tiny):
    """The notes name both measurements, and say so when they differ by more than a fifth (the
    control: two close ones do not)."""
    from fuelcli.measure.bench import render_md, report_from_dict

    rep = report_from_dict(json.loads(bench(tiny, "-p", "0", "-n", "2", "-r", "1", "-o", "json")))
    for measured, moved in (([5e10, 9e10], True), ([5e10, 5.5e10], False)):
        rep.bandwidth = dict(rep.bandwidth, bytes_per_s=max(measured), measured=measured)
        note = render_md(rep).strip().splitlines()[-1]
        assert "the higher of {:.2f} / {:.2f} before / after".format(*(m / 1e9 for m in measured)) in note
        assert ("it moved during the run" in note) == moved


def test_load_average_around_the_run(tiny, monkeypatch):
    """The 1-minute load average before and after the run is in the notes and the JSON, and a machine
    whose load beyond the run's own threads reaches half its CPUs is called busy (the run's own load
    alone is not: the negative control)."""
    import os

    cpus = os.cpu_count()
    loads = iter([0.0, 1.4, 1.0, 1.0 + cpus / 2])
    monkeypatch.setattr(B.os, "getloadavg", lambda: (next(loads), 0.0, 0.0))
    quiet = bench(tiny, "-p", "4", "-n", "0", "-r", "1", "-t", "1")
    assert f"load average 0.00 before, 1.40 after, on {cpus} CPUs\n" in quiet and "busy" not in quiet
    rep = json.loads(bench(tiny, "-p", "4", "-n", "0", "-r", "1", "-t", "1", "-o", "json"))
    assert rep["load"] == {"cpus": cpus, "threads": 1, "before": 1.0, "after": 1.0 + cpus / 2}
    assert "(a busy machine" in B.render_md(B.report_from_dict(rep))


def test_weights_mapped_before_the_runs(tiny, monkeypatch):
    """bench maps every page of the weights and waits for it before its runs, as llama.cpp maps its
    file (MAP_POPULATE), so that no timed token faults in an expert first picked then. The control:
    the first timed run finds the mapping done, not merely started."""
    from fuelcli.weights import prefetch

    seen = {"bytes": 0, "joined": False, "at_run": None}

    class Mapping:
        def join(self):
            seen["joined"] = True

    def start(arrays):
        seen["bytes"] = sum(a.nbytes for a in arrays)
        return Mapping()

    run_bench = B.run_bench

    def runs(*args, **kwargs):
        seen["at_run"] = seen["joined"]
        return run_bench(*args, **kwargs)

    monkeypatch.setattr(prefetch, "start", start)
    monkeypatch.setattr(B, "run_bench", runs)
    bench(tiny, "-p", "0", "-n", "2", "-r", "1", "-t", "1")
    assert seen["bytes"] >= 4 * (TINY_PARAMS - (2 * 2 + 1) * 64)  # f32: every matrix (the norms aside)
    assert seen["at_run"] is True


def test_json_report(tiny):
    rep = json.loads(bench(tiny, "-p", "8", "-n", "0,4", "-d", "0,3", "-r", "3", "-o", "json"))
    assert rep["backend"] == "cpu numba" and rep["repetitions"] == 3 and rep["peer"] is None
    assert rep["model"]["params"] == TINY_PARAMS and rep["model"]["size_bytes"] == 4 * TINY_PARAMS
    assert rep["model"]["formats"] == {"f32": 16} and rep["model"]["kind"] == "dir"
    assert rep["n_ctx"] == 3 + 8 + 1
    # K and V: layers, ctx (K in whole blocks of 16 positions), kv heads, head_dim, f32
    assert rep["kv_bytes"] == 2 * (16 + rep["n_ctx"]) * 4 * 16 * 4
    assert rep["peak_rss_bytes"] > 0
    assert [(t["test"], t["kind"], t["n_tokens"], t["depth"]) for t in rep["tests"]] == [
        ("pp8", "pp", 8, 0), ("tg4", "tg", 4, 0), ("pp8 @ d3", "pp", 8, 3), ("tg4 @ d3", "tg", 4, 3)]
    for t in rep["tests"]:
        check_series(t["fuel"], t["n_tokens"], 3)
        assert "peer" not in t and "ratio" not in t


def test_json_round_trip(tiny):
    text = bench(tiny, "-p", "8", "-n", "4", "-r", "2", "-o", "json", "--seed", "7")
    rep = B.report_from_dict(json.loads(text))
    assert B.render_json(rep) == text
    md = B.render_md(rep)
    assert md.splitlines()[2].split(" | ")[5] == "pp8" and "seed 7" in md


def test_csv_report(tiny):
    rows = list(csv.DictReader(io.StringIO(bench(tiny, "-p", "8", "-n", "4", "-r", "2", "-o", "csv"))))
    assert [r["test"] for r in rows] == ["pp8", "tg4"]
    for r in rows:
        assert list(r) == B.CSV_FIELDS
        samples = [float(x) for x in r["samples_ts"].split(";")]
        assert len(samples) == 2
        assert float(r["avg_ts"]) == pytest.approx(statistics.fmean(samples), rel=1e-12)
        assert float(r["stddev_ts"]) == pytest.approx(statistics.stdev(samples), rel=1e-9)
        assert int(r["params"]) == TINY_PARAMS and r["formats"] == "f32 16" and r["peer"] == ""


def test_parallel_report(tiny):
    """tg xB rows: the rate counts the tokens of all B sequences, t/s/seq is that over B, and a step's
    weights are read once for its B tokens (bytes per token: weights / B + one sequence's KV)."""
    rep = json.loads(bench(tiny, "-p", "0", "-n", "4", "--parallel", "1,2", "-r", "2", "-o", "json"))
    one, two = rep["tests"]
    assert (one["test"], one["seqs"], two["test"], two["seqs"]) == ("tg4", 1, "tg4 x2", 2)
    check_series(one["fuel"], 4, 2)
    check_series(two["fuel"], 8, 2)
    weights = 4 * (TINY_PARAMS - 256 * 64 + 64)
    kv = 2 * 2 * 2.5 * 4 * 16 * 4
    assert one["bytes_per_token"] == int(weights + kv) and two["bytes_per_token"] == int(weights / 2 + kv)
    assert rep["bandwidth"]["bytes"] == max(one["bytes_per_token"], 2 * two["bytes_per_token"])
    md = B.render_md(B.report_from_dict(rep)).splitlines()
    assert md[0].startswith("| model | size | params | backend | threads | test | t/s | t/s/seq |")
    cells = [c.strip() for c in md[3].strip("|").split("|")]
    assert cells[5] == "tg4 x2" and float(cells[7]) == pytest.approx(two["fuel"]["avg_ts"] / 2, abs=0.006)
    rows = list(csv.DictReader(io.StringIO(bench(tiny, "-p", "0", "-n", "4", "--parallel", "2", "-r", "1",
                                                 "-o", "csv", "--no-roofline"))))
    assert [(r["test"], r["seqs"]) for r in rows] == [("tg4 x2", "2")]


def test_activations_list_report(tiny):
    """`--activations int16,q8`: an engine of each, a row of each per test with its backend, the q8
    row's rate against the int16 row's; JSON round-trips, CSV carries both."""
    text = bench(tiny, "-p", "8", "-n", "4", "-r", "2", "-o", "json", "--activations", "int16,q8", "--no-roofline")
    rep = json.loads(text)
    assert [(t["test"], t["backend"]) for t in rep["tests"]] == [
        ("pp8", "cpu numba"), ("pp8", "cpu numba act q8"), ("tg4", "cpu numba"), ("tg4", "cpu numba act q8")]
    for base, row in (rep["tests"][:2], rep["tests"][2:]):
        check_series(base["fuel"], base["n_tokens"], 2)
        check_series(row["fuel"], row["n_tokens"], 2)
        assert base["vs_baseline"] == 1.0
        assert row["vs_baseline"] == pytest.approx(row["fuel"]["avg_ts"] / base["fuel"]["avg_ts"], rel=1e-12)
    again = B.report_from_dict(rep)
    assert B.render_json(again) == text
    assert "| vs cpu numba |" in B.render_md(again).splitlines()[0]
    rows = list(csv.DictReader(io.StringIO(B.render_csv(again))))
    assert [r["backend"] for r in rows] == ["cpu numba", "cpu numba act q8"] * 2
    assert float(rows[1]["vs_baseline"]) == pytest.approx(rep["tests"][1]["vs_baseline"], rel=1e-12)
    plain = json.loads(bench(tiny, "-p", "8", "-n", "0", "-r", "1", "-o", "json", "--activations", "q8"))
    assert plain["backend"] == "cpu numba act q8" and "backend" not in plain["tests"][0]


def test_transformers_peer_sequences(tiny):
    """The transformers peer runs B sequences in its batch dimension, the cache B rows deep."""
    pytest.importorskip("transformers")
    from fuelcli.peers import PEERS
    from fuelcli.sources.source import resolve

    r = B.start_peer(PEERS["transformers"], resolve(str(tiny)), 1, 32, [])
    try:
        r.prepare(np.arange(3), 2)
        assert r.tg(np.arange(8).reshape(4, 2)) > 0
        assert r.process.call("cache_length") == 7
    finally:
        r.close()


def test_llama_cpp_peer_sequences(smollm2_gguf):
    """llama.cpp's context of B sequences: a step decodes one token of each; prepare clears them."""
    pytest.importorskip("llama_cpp")
    from fuelcli.peers import PEERS
    from fuelcli.sources.source import resolve

    tests = B.make_tests([0], [4], [0], [1, 2])
    r = B.start_peer(PEERS["llama.cpp"], resolve(str(smollm2_gguf)), 1, B.context_needed(tests) + 3, tests)
    try:
        for _ in range(2):  # a second run after prepare: the cleared cache takes positions from 3 again
            r.prepare(np.arange(3), 2)
            assert r.tg(np.arange(8).reshape(4, 2)) > 0
    finally:
        r.close()


@pytest.mark.parametrize("args", [["-p", "0", "-n", "0"], ["-o", "xml"], ["-r", "0"], ["-p", "a"],
                                  ["-p", "300"], ["--compare", "vllm"], ["--compare", "llama.cpp"],
                                  ["--parallel", "0"], ["--parallel", "x"], ["--parallel", "-2"],
                                  ["--activations", "int16,int16"], ["--activations", "int16,q4"],
                                  ["--activations", "q8,"], ["--activations", ","]])
def test_bad_input(tiny, args):
    r = CliRunner().invoke(app, ["bench", str(tiny), "--no-progress", *args])
    if args == ["--compare", "llama.cpp"]:  # a directory: llama.cpp needs GGUF (or is not installed)
        assert isinstance(r.exception, (InputError, MissingDependency)), r.output
    else:
        assert isinstance(r.exception, InputError), r.output


# ---------------------------------------------------------------------------------------------------
# speculation: plain against speculative greedy decoding


@pytest.mark.parametrize("args", [["-f", "x.txt"], ["--lookup-decoding", "--first-token"],
                                  ["--lookup-decoding", "-n", "64,128"], ["--lookup-decoding", "-n", "1"],
                                  ["--lookup-decoding", "-o", "csv"], ["--lookup-decoding", "--draft-model", "x"],
                                  ["--lookup-decoding", "--compare", "transformers"], ["--draft-max", "4"],
                                  ["--lookup-decoding", "-f", "/nonexistent/prompt.txt"],
                                  ["--lookup-decoding", "-p", "64"], ["--lookup-decoding", "-d", "128"],
                                  ["--lookup-decoding", "--parallel", "2"],
                                  ["--lookup-decoding", "--activations", "int16,q8"]])
def test_speculation_bad_input(tiny, args):
    r = CliRunner().invoke(app, ["bench", str(tiny), "--no-progress", *args])
    assert isinstance(r.exception, InputError), (args, r.output)


def test_llama_cpp_peer_greedy(smollm2_gguf):
    """llama.cpp's greedy decoding, plain and through its prompt lookup: the same tokens."""
    pytest.importorskip("llama_cpp")
    from fuelcli.peers import PEERS
    from fuelcli.sources.source import resolve

    r = B.start_peer(PEERS["llama.cpp"], resolve(str(smollm2_gguf)), 1, 96, B.make_tests([0], [4], [0]))
    try:
        ids = np.array([1, 504, 3458, 282, 216, 504, 3458, 282, 216, 504], np.int64)
        plain, s0 = r.process.call("greedy", ids, 16, 0)
        looked, s1 = r.process.call("greedy", ids, 16, 10)
        assert len(plain) == 16 and looked == plain and s0 > 0 and s1 > 0
    finally:
        r.close()


# ---------------------------------------------------------------------------------------------------
# --compare transformers on the tiny model


def test_compare_transformers(tiny):
    pytest.importorskip("transformers")
    rep = json.loads(bench(tiny, "-p", "8", "-n", "4", "-d", "0,2", "-r", "2", "-o", "json", "--compare", "transformers"))
    assert rep["peer"]["name"] == "transformers" and "float32" in rep["peer"]["detail"]
    assert rep["peer"]["threads"] >= 1
    for t in rep["tests"]:
        check_series(t["fuel"], t["n_tokens"], 2)
        assert t["peer"]["name"] == "transformers"
        check_series(t["peer"], t["n_tokens"], 2)
        assert t["ratio"] == pytest.approx(t["fuel"]["avg_ts"] / t["peer"]["avg_ts"], rel=1e-12)
    md = bench(tiny, "-p", "8", "-n", "0", "-r", "1", "--compare", "transformers")
    head, _, row = md.splitlines()[:3]
    assert head.endswith("| t/s | transformers t/s | fuel/transformers |")
    cells = [c.strip() for c in row.strip("|").split("|")]
    fuel_mean, peer_mean = (float(c.split(" ± ")[0]) for c in cells[6:8])
    assert float(cells[8]) == pytest.approx(fuel_mean / peer_mean, abs=0.01 + 1e-3 * fuel_mean / peer_mean)
    assert "peer: transformers" in md and "in its own process (peak RSS" in md
    assert rep["peer"]["peak_rss_bytes"] > 0 and "peak_rss_fuel_bytes" not in rep


def test_transformers_peer_keeps_cache(tiny):
    """In its own process the transformers peer keeps its KV cache across a run and drops it in prepare."""
    pytest.importorskip("transformers")
    from fuelcli.peers import PEERS
    from fuelcli.sources.source import resolve

    src = resolve(str(tiny))
    r = B.start_peer(PEERS["transformers"], src, 1, 32, [])
    try:
        assert r.threads == 1 and r.process.proc.pid != os.getpid()
        r.prepare(np.arange(3))
        assert r.tg(np.arange(4)) > 0
        assert r.process.call("cache_length") == 7
        r.prepare(np.zeros(0, np.int64))
        r.pp(np.arange(5))
        assert r.process.call("cache_length") == 5
    finally:
        r.close()
    assert r.process.proc.returncode == 0  # closed on request, not killed


# ---------------------------------------------------------------------------------------------------
# a missing peer: one line, exit 4, naming the pip package


@pytest.mark.parametrize("peer,module,pip", [("transformers", "transformers", "pip install torch transformers"),
                                             ("llama.cpp", "llama_cpp", "pip install 'fuel-llm[llama-cpp]'")])
def test_missing_peer(tiny, monkeypatch, peer, module, pip):
    import re

    from fuelcli.peers import require

    monkeypatch.setitem(sys.modules, module, None)  # as if it were not installed
    with pytest.raises(MissingDependency, match=re.escape(pip)):
        require(peer, "--compare")
    r = CliRunner().invoke(app, ["bench", str(tiny), "--no-progress", "--compare", peer])
    assert isinstance(r.exception, MissingDependency) and r.exception.exit_code == 4


def test_missing_peer_exit_code(tiny, tmp_path):
    """A `transformers` package on PYTHONPATH that fails to import, as if it were not installed: the
    peer's own process finds out, and fuel says so in one line, exit 4."""
    shadow = tmp_path / "shadow" / "transformers"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError(\"No module named 'transformers'\", name='transformers')\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(shadow.parent), str(Path(__file__).parents[1])]))
    p = subprocess.run([sys.executable, "-m", "fuelcli", "bench", str(tiny), "-p", "8", "-n", "4", "-r", "1",
                        "--no-progress", "--compare", "transformers"],
                       capture_output=True, text=True, env=env, timeout=300)
    assert p.returncode == 4, p.stderr
    assert p.stdout == ""
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: the transformers peer needs"), lines
    assert "pip install torch transformers" in lines[0]


# ---------------------------------------------------------------------------------------------------
# first token


def test_time_to_first_output():
    """The clock stops at the first byte, not at the exit; a failing command is an error."""
    code = "import sys, time; sys.stdout.write('x'); sys.stdout.flush(); time.sleep(3)"
    assert B.time_to_first_output([sys.executable, "-c", code], dict(os.environ)) < 2.5
    with pytest.raises(RuntimeError, match="failed"):
        B.time_to_first_output([sys.executable, "-c", "raise SystemExit(3)"], dict(os.environ))


def test_first_token(smollm2_gguf):
    """`fuel bench --first-token`: fresh processes with an empty and a warm kernel cache."""
    r = CliRunner().invoke(app, ["bench", str(smollm2_gguf), "--first-token", "-r", "1", "-o", "json",
                                 "--no-progress", "-t", "1"])
    assert r.exit_code == 0, r.output
    rep = json.loads(r.stdout)
    assert rep["threads"] == 1 and rep["repetitions"] == 1 and "llama.cpp" not in rep["seconds"]
    cold, warm = rep["seconds"]["fuel_cold"], rep["seconds"]["fuel_warm"]
    assert len(cold) == len(warm) == 1 and cold[0] > warm[0] > 0  # the empty cache compiles
    md = B.render_first_token_md(rep)
    assert "empty kernel cache (fresh install)" in md and "warm kernel cache" in md


def test_moe_bytes_per_token_count_the_distinct_experts(tmp_path):
    """An MoE step of B rows reads the experts they choose once each: n(1 - (1 - k/n)^B) of n on
    average (uniform, independent choices), so a token's share of them is not the one row's k/n
    divided by B. The control: a step's bytes are more than one row's (8 experts, top 2, B = 2:
    7/16 of them against 1/4)."""
    import gguf

    sys.path.insert(0, str(Path(__file__).parent))
    from test_moe_engine import write_tiny_qwen3moe

    from fuelcli.assembly.loader import open_model
    from fuelcli.families.schema import EXPERT_ROLES
    from fuelcli.measure.roofline import bytes_per_token

    m = open_model(str(write_tiny_qwen3moe(tmp_path / "moe.gguf", gguf.GGMLQuantizationType.Q8_0)), None, None)
    experts = sum(t.nbytes for layer in m.weights.layers for role in EXPERT_ROLES for t in getattr(layer, role))
    one, two = (bytes_per_token(m.cfg, m.weights, 0, seqs=b) for b in (1, 2))
    assert 2 * two - one == pytest.approx(experts * (7 / 16 - 1 / 4), abs=2)
    assert 2 * two > one
