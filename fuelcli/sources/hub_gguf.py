"""GGUF files of a hub repo: `owner/name:QUANT` (llama.cpp's -hf convention) or --hf-file NAME.

Which file, as llama.cpp's common/download.cpp picks it: the first .gguf (by name) whose name has
QUANT followed by `.` or `-` (case-insensitive); without a QUANT, Q4_K_M, then Q8_0, then the
first .gguf. Projector and importance-matrix files (mmproj, imatrix) are never the model. A split
model (`NAME-00001-of-00003.gguf`) is picked by its first part and fetched whole. Only the chosen
files are downloaded (huggingface_hub, into its cache), never the rest of the repo.
"""

from __future__ import annotations

import glob
import re
from pathlib import Path

from ..errors import ModelNotFound

DEFAULT_QUANTS = ("Q4_K_M", "Q8_0")  # llama.cpp's choice when no QUANT is given
SPLIT = re.compile(r"^(?P<prefix>.+)-(?P<index>\d{5})-of-(?P<count>\d{5})\.gguf$", re.IGNORECASE)
_QUANT = re.compile(r"[-.](?P<tag>[A-Za-z0-9_]+)$")  # a file's tag: what follows its last - or .
_NOT_MODELS = ("mmproj", "imatrix")


def is_model_file(path: str) -> bool:
    name = path.rsplit("/", 1)[-1]
    return name.lower().endswith(".gguf") and not any(w in name.lower() for w in _NOT_MODELS)


def split_info(path: str) -> tuple[str, int, int]:
    """(prefix, index, count) of a file name; (name without .gguf, 1, 1) when it is not split."""
    m = SPLIT.match(path)
    if m:
        return m["prefix"], int(m["index"]), int(m["count"])
    return path[: -len(".gguf")], 1, 1


def quant_tag(path: str) -> str | None:
    """The QUANT that names a file (`qwen2.5-0.5b-instruct-q4_k_m.gguf` -> Q4_K_M), as llama.cpp reads it."""
    m = _QUANT.search(split_info(path)[0].rsplit("/", 1)[-1])
    return m["tag"].upper() if m else None


def shards(files: list[str], first: str) -> list[str]:
    """`first` and, when it is the first part of a split model, its other parts, in order."""
    prefix, _, count = split_info(first)
    if count == 1:
        return [first]
    parts = sorted(f for f in files if split_info(f)[0] == prefix and split_info(f)[2] == count)
    if len(parts) != count:
        missing = sorted(set(range(1, count + 1)) - {split_info(f)[1] for f in parts})
        raise ModelNotFound(f"{first}: split model of {count} parts, part {missing[0]} is missing")
    return parts


def pick(files: list[str], quant: str | None, hf_file: str | None, repo: str) -> list[str]:
    """The files to fetch for QUANT or --hf-file, from the repo's file list."""
    models = sorted(f for f in files if is_model_file(f))
    if hf_file is not None:
        if hf_file not in files:
            raise ModelNotFound(f"{repo}: no file {hf_file!r} in the repo" + _listing(models))
        prefix, index, count = split_info(hf_file)
        if index != 1:
            hf_file = next((f for f in models if split_info(f) == (prefix, 1, count)), hf_file)
        return shards(files, hf_file)
    firsts = [f for f in models if split_info(f)[1] == 1]
    for q in (quant,) if quant else DEFAULT_QUANTS:
        pattern = re.compile(r"(?:^|[^A-Za-z0-9])" + re.escape(q) + r"[.-]", re.IGNORECASE)
        hits = [f for f in firsts if pattern.search(f.rsplit("/", 1)[-1])]
        if len(hits) > 1:
            raise ModelNotFound(f"{repo}:{q} matches {len(hits)} files ({', '.join(hits[:4])}); "
                                "pick one with --hf-file NAME")
        if hits:
            return shards(files, hits[0])
    if quant:
        raise ModelNotFound(f"{repo}: no .gguf file for {quant}" + _listing(models))
    if not firsts:
        raise ModelNotFound(f"{repo}: the repo has no config.json and no .gguf model file")
    return shards(files, firsts[0])


def _listing(models: list[str]) -> str:
    if not models:
        return " (it has no .gguf model files)"
    tags = sorted({quant_tag(f) or f for f in models if split_info(f)[1] == 1})
    return f" (it has: {', '.join(tags[:12])}{', ...' if len(tags) > 12 else ''})"


def fetch(repo: str, quant: str | None, hf_file: str | None, revision: str | None, what: str,
          tqdm_class=None) -> Path:
    """Download (or find in the cache) the chosen .gguf file(s); the path of the first part.

    The file list comes from the hub (model_info) or, offline or when the hub cannot be reached,
    from the cached snapshot, as huggingface_hub's snapshot_download falls back to it.
    """
    import huggingface_hub
    from huggingface_hub import constants

    files = _hub_files(repo, revision)
    if files is None:
        offline = constants.HF_HUB_OFFLINE
        missing = f"{what}: not in the local hub cache and {'HF_HUB_OFFLINE is set' if offline else 'the hub cannot be reached'}"
        folder = _cached_snapshot(repo, revision)
        if folder is None:
            raise ModelNotFound(missing)
        files = [p.relative_to(folder).as_posix() for p in folder.rglob("*.gguf")]
        try:
            chosen = pick(files, quant, hf_file, repo)
        except ModelNotFound as e:
            cached = sorted({quant_tag(f) or f for f in files if is_model_file(f)})
            raise ModelNotFound(f"{missing} (cached: {', '.join(cached) or 'nothing'})") from e
    else:
        chosen = pick(files, quant, hf_file, repo)
        # the branch name, not the commit, so that refs/<branch> is written for later offline use
        folder = Path(huggingface_hub.snapshot_download(repo, revision=revision,
                                                        allow_patterns=[glob.escape(f) for f in chosen],
                                                        tqdm_class=tqdm_class))
    for f in chosen:
        if not (folder / f).is_file():
            raise ModelNotFound(f"{what}: {f} is not in the local hub cache")
    return folder / chosen[0]


def _hub_files(repo: str, revision: str | None):
    """The repo's file names from the hub; None when it cannot be reached (or offline)."""
    import huggingface_hub
    from huggingface_hub import constants, errors

    if constants.HF_HUB_OFFLINE:
        return None
    try:
        info = huggingface_hub.HfApi().model_info(repo, revision=revision)
    except errors.HfHubHTTPError as e:  # an answer from the hub
        status = e.response.status_code if getattr(e, "response", None) is not None else None
        if isinstance(e, (errors.RepositoryNotFoundError, errors.RevisionNotFoundError, errors.GatedRepoError)) \
                or status in (401, 403, 404):
            raise  # the caller names it in one line
        return None  # the hub is down: use the cache
    except _unreachable():
        return None
    return [s.rfilename for s in info.siblings or []]


def _unreachable() -> tuple:
    """No answer from the hub: connection refused, timeouts, offline mode. requests' errors are
    OSErrors; httpx's (huggingface_hub 1.x) and httpx2's (later) are TransportErrors."""
    import sys

    kinds = [OSError]
    for name in ("httpx", "httpx2"):
        mod = sys.modules.get(name)
        if mod is not None and hasattr(mod, "TransportError"):
            kinds.append(mod.TransportError)
    return tuple(kinds)


def _cached_snapshot(repo: str, revision: str | None) -> Path | None:
    """The snapshot folder of the cached revision (a branch's ref or a commit), if any."""
    from huggingface_hub import constants
    from huggingface_hub.file_download import repo_folder_name

    storage = Path(constants.HF_HUB_CACHE) / repo_folder_name(repo_id=repo, repo_type="model")
    rev = revision or "main"
    commit = rev
    ref = storage / "refs" / rev
    if ref.is_file():
        commit = ref.read_text().strip()
    folder = storage / "snapshots" / commit
    return folder if folder.is_dir() else None
