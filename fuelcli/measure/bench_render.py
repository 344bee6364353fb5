"""`fuel bench`'s report as a markdown table (llama-bench's columns), CSV or JSON."""

from __future__ import annotations

import csv
import io
import json
import math

from .bench_results import Report, Series


def load_text(load: dict) -> str:
    """How busy the machine was around the run: fuel's threads compete with whatever else is runnable
    (the figures of a busy machine are not a quiet one's). The load average counts the run's own
    threads too (fuel's and its peer's, taking turns): busy is other work of half the CPUs or more."""
    busy = max(load["before"], load["after"]) - load["threads"] >= load["cpus"] / 2
    return (f"load average {load['before']:.2f} before, {load['after']:.2f} after, on {load['cpus']} CPUs"
            + (" (a busy machine: other work shared the CPUs)" if busy else ""))


def human_bytes(n: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n} B"


def human_count(n: int) -> str:
    for unit, scale in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return str(n)


def formats_text(formats: dict) -> str:
    return ", ".join(f"{k} {v}" for k, v in formats.items())


def _ts(s: Series) -> str:
    return f"{s.mean:.2f} ± {s.std:.2f}"


def render_md(rep: Report) -> str:
    m, peer = rep.model, rep.peer_name
    cols = ["model", "size", "params", "backend", "threads", "test", "t/s"]
    align = ["---", "---:", "---:", "---", "---:", "---:", "---:"]
    per_seq = any(t.spec.seqs > 1 for t in rep.tests)
    if per_seq:
        cols.append("t/s/seq")
        align.append("---:")
    base = next((t.backend for t in rep.tests if t.baseline is not None), None)
    if base:
        cols.append(f"vs {base}")
        align.append("---:")
    if peer:
        cols += [f"{peer} t/s", f"fuel/{peer}"]
        align += ["---:", "---:"]
    roof = rep.bandwidth_bps > 0
    if roof:
        cols += ["read GB/s", "roofline"]
        align += ["---:", "---:"]
    lines = ["| " + " | ".join(cols) + " |", "| " + " | ".join(align) + " |"]
    for t in rep.tests:
        row = [m.name, human_bytes(m.size_bytes), human_count(m.params), t.backend or rep.backend, str(rep.threads),
               t.spec.name, _ts(t.fuel)]
        if per_seq:
            row.append(f"{t.fuel.mean / t.spec.seqs:.2f}")
        if base:
            row.append(f"{t.vs_baseline:.2f}")
        if peer:
            row += [_ts(t.peer), f"{t.ratio:.2f}"]
        if roof:
            row += [f"{t.read_rate() / 1e9:.2f}", f"{t.read_rate() / rep.bandwidth_bps:.0%}"] if t.bytes_per_token \
                else ["", ""]
        lines.append("| " + " | ".join(row) + " |")
    notes = [f"formats: {formats_text(m.formats)}", f"r={rep.repetitions}, seed {rep.seed}, n_ctx {rep.n_ctx}",
             f"KV cache {human_bytes(rep.kv_bytes)}", f"peak RSS {human_bytes(rep.peak_rss_bytes)}"]
    if peer:
        notes.append(f"peer: {rep.peer['detail']}, threads {rep.peer['threads']}, in its own process"
                     + (f" (peak RSS {human_bytes(rep.peer['peak_rss_bytes'])})" if rep.peer.get("peak_rss_bytes")
                        else ""))
    if rep.load:
        notes.append(load_text(rep.load))
    if roof:
        b = rep.bandwidth
        both = b.get("measured")
        notes.append(f"roofline: read bandwidth {b['bytes_per_s'] / 1e9:.2f} GB/s over {human_bytes(b['bytes'])} "
                     + (f"with {b['threads']} threads" if b['threads'] else "on the GPU")
                     + (" (the higher of {:.2f} / {:.2f} before / after the tests{})".format(
                         *(v / 1e9 for v in both), "; it moved during the run" if max(both) > 1.2 * min(both) else "")
                        if both else "")
                     + " (a tg test reads its bytes per token x t/s)")
    return "\n".join(lines) + "\n\n" + "; ".join(notes) + "\n"


CSV_FIELDS = ["model", "model_kind", "family", "size_bytes", "params", "formats", "backend", "threads",
              "repetitions", "peak_rss_bytes", "test", "kind", "n_tokens", "depth", "avg_ts", "stddev_ts",
              "samples_ts", "seqs", "peer", "peer_avg_ts", "peer_stddev_ts", "peer_samples_ts", "ratio", "bytes_per_token",
              "roofline_fraction", "vs_baseline"]


def render_csv(rep: Report) -> str:
    buf = io.StringIO()
    w = csv.DictWriter(buf, CSV_FIELDS, lineterminator="\n")
    w.writeheader()
    m = rep.model
    for t in rep.tests:
        row = dict(model=m.name, model_kind=m.kind, family=m.family, size_bytes=m.size_bytes, params=m.params,
                   formats=formats_text(m.formats), backend=t.backend or rep.backend, threads=rep.threads,
                   repetitions=rep.repetitions, peak_rss_bytes=rep.peak_rss_bytes, test=t.spec.name,
                   kind=t.spec.kind, n_tokens=t.spec.n_tokens, depth=t.spec.depth, seqs=t.spec.seqs,
                   avg_ts=repr(t.fuel.mean),
                   stddev_ts=repr(t.fuel.std), samples_ts=";".join(repr(r) for r in t.fuel.rates))
        if t.peer is not None:
            row.update(peer=rep.peer_name, peer_avg_ts=repr(t.peer.mean), peer_stddev_ts=repr(t.peer.std),
                       peer_samples_ts=";".join(repr(r) for r in t.peer.rates), ratio=repr(t.ratio))
        if t.baseline is not None:
            row.update(vs_baseline=repr(t.vs_baseline))
        if t.bytes_per_token:
            row.update(bytes_per_token=t.bytes_per_token,
                       roofline_fraction=repr(t.read_rate() / rep.bandwidth_bps) if rep.bandwidth_bps else "")
        w.writerow(row)
    return buf.getvalue()


def render_json(rep: Report) -> str:
    def clean(x):  # NaN/inf are not JSON
        if isinstance(x, float) and not math.isfinite(x):
            return None
        if isinstance(x, dict):
            return {k: clean(v) for k, v in x.items()}
        if isinstance(x, list):
            return [clean(v) for v in x]
        return x

    return json.dumps(clean(rep.to_dict()), indent=2) + "\n"


RENDERERS = {"md": render_md, "json": render_json, "csv": render_csv}


def render_json_obj(obj: dict) -> str:
    return json.dumps(obj, indent=2) + "\n"
