"""Turn the MODEL argument into files on disk.

MODEL is, in this order: a local path (model directory or .gguf file), a demo alias pulled with
`fuel pull`, or a hub repo id fetched (or found in the cache) by huggingface_hub: `owner/name`
(safetensors; a repo of GGUF files only gets llama.cpp's default quant), `owner/name:QUANT` or
`owner/name` with --hf-file (a GGUF file of the repo, hub_gguf.py).
"""

from __future__ import annotations

import os
import re
import sys
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from ..errors import InputError, ModelNotFound
from ..fileio.files import is_present
from .suggest import did_you_mean

def known_names() -> list[str]:
    """The demo aliases and the models `fuel ls` lists, for "did you mean" ([] where the caches cannot
    be read: no hint, and the error stays the one about MODEL)."""
    from . import demo
    from .local_models import list_models

    try:
        return list(dict.fromkeys([*demo.DEMOS, *(m.name for m in list_models())]))
    except Exception:
        return []


# Only what fuel reads: a repo's other weights formats (pytorch .bin, onnx, gguf) are not fetched.
HUB_PATTERNS = [
    "config.json",
    "generation_config.json",
    "*.safetensors",
    "model.safetensors.index.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "chat_template.jinja",
    "modules.json",  # sentence-transformers' modules: the pooling fuel serve's /v1/embeddings follows
    "1_Pooling/config.json",
]

# What `fuel inspect tokens` needs: no weights.
TOKENIZER_PATTERNS = ["tokenizer.json", "tokenizer_config.json", "config.json", "chat_template.jinja"]

# owner/name as the hub spells them; anything path-like ("./x", "/x", "a/b/c") is not a repo id.
_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.\-]*/[A-Za-z0-9][\w.\-]*$")
_QUANT_TAG = re.compile(r"^[A-Za-z0-9][\w.\-]*$")


@dataclass(frozen=True)
class ModelSource:
    kind: str  # "dir" or "gguf"
    path: Path  # the model directory (config.json + *.safetensors + tokenizer.json) or the .gguf file
    name: str  # display name: repo id, directory name or file name


def resolve(model: str, revision: str | None = None, hf_file: str | None = None,
            tokenizer_only: bool = False, tqdm_class=None) -> ModelSource:
    """tokenizer_only: a directory needs only tokenizer.json, and a hub repo gives only its tokenizer
    files (a GGUF repo still its one .gguf file). tqdm_class: huggingface_hub's progress bars
    (hub_progress.py; None: its own)."""
    try:
        path = Path(model).expanduser()
    except RuntimeError:  # ~user of no such user: the name as given
        path = Path(model)
    if is_present(path):
        _no_hf_file(hf_file, model)
        return _local(path, tokenizer_only)
    demo = _demo(model)
    if demo is not None:
        _no_hf_file(hf_file, model)
        return demo
    if is_hub_id(model):
        repo, _, quant = model.partition(":")
        if quant and hf_file:
            raise InputError(f"give {model} or --hf-file, not both")
        if quant or hf_file:
            return _hub_gguf(repo, quant or None, hf_file, revision, tqdm_class)
        return _hub(repo, revision, tokenizer_only, tqdm_class)
    raise ModelNotFound(f"{model}: no such file or directory, demo alias or hub repo id (owner/name)"
                        + did_you_mean(model, known_names()))


def is_hub_id(model: str) -> bool:
    """OWNER/REPO or OWNER/REPO:QUANT as the hub spells them."""
    repo, _, quant = model.partition(":")
    return bool(_REPO_ID.match(repo)) and not repo.endswith(".gguf") and (not quant or bool(_QUANT_TAG.match(quant)))


def _no_hf_file(hf_file: str | None, model: str):
    if hf_file is not None:
        raise InputError(f"--hf-file picks a file of a hub repo; {model} is a local path or demo alias")


def _local(path: Path, tokenizer_only: bool = False) -> ModelSource:
    if path.is_dir():
        if tokenizer_only:
            if not is_present(path / "tokenizer.json"):
                raise InputError(f"{path}: directory has no tokenizer.json")
            return ModelSource("dir", path.resolve(), path.resolve().name)
        if not is_present(path / "config.json"):
            raise InputError(f"{path}: directory has no config.json (expected an HF model directory)")
        return ModelSource("dir", path.resolve(), path.resolve().name)
    if path.suffix.lower() == ".gguf":
        # abspath, not resolve(): a hub cache entry is a symlink to a blob named by its hash, and a
        # split file's other parts are found by name beside it
        return ModelSource("gguf", Path(os.path.abspath(path)), path.name)
    raise InputError(f"{path}: not a .gguf file nor a model directory with config.json")


def _demo(alias: str) -> ModelSource | None:
    from . import demo

    path = demo.lookup(alias)  # raises ModelNotFound ("run `fuel pull ALIAS`") if known but not pulled
    return None if path is None else ModelSource("gguf", Path(path), alias)


@contextmanager
def _hub_errors(what: str, name: str):
    """huggingface_hub's errors as one line naming the repo (`name` as MODEL spells it, to find a
    close one when it is not there); its progress bars only on a terminal (in a log they are lines
    of their own, before any error)."""
    from huggingface_hub import constants, errors
    from huggingface_hub.utils import disable_progress_bars

    if not sys.stderr.isatty():
        disable_progress_bars()

    try:
        yield
    except errors.RevisionNotFoundError:
        raise ModelNotFound(f"{what}: no such revision on the hub") from None
    except errors.GatedRepoError:
        raise ModelNotFound(f"{what}: gated repo; accept its terms on the hub and set HF_TOKEN") from None
    except errors.RepositoryNotFoundError:
        raise ModelNotFound(f"{what}: no such hub repo (or it is private and HF_TOKEN is not set)"
                            + did_you_mean(name, known_names())) from None
    except errors.IncompleteSnapshotError as e:
        raise ModelNotFound(f"{what}: the cached snapshot is incomplete and the hub cannot be reached") from e
    except errors.LocalEntryNotFoundError as e:
        offline = constants.HF_HUB_OFFLINE
        why = "HF_HUB_OFFLINE is set" if offline else "the hub cannot be reached"
        raise ModelNotFound(f"{what}: not in the local hub cache and {why}"
                            + did_you_mean(name, known_names())) from e
    except InputError:
        raise
    except Exception as e:  # any other hub/network/validation error: one line naming the repo
        first = (str(e).strip().splitlines() or [""])[0][:200]
        raise ModelNotFound(f"{what}: hub error: {type(e).__name__}: {first}") from e


def _hub(repo_id: str, revision: str | None, tokenizer_only: bool = False, tqdm_class=None) -> ModelSource:
    # Imported here: it is slow to import and only this path needs it.
    import huggingface_hub

    what = repo_id + (f" (revision {revision})" if revision else "")
    patterns = TOKENIZER_PATTERNS if tokenizer_only else HUB_PATTERNS
    with _hub_errors(what, repo_id):
        # huggingface_hub itself honours HF_HOME / HF_HUB_CACHE / HF_HUB_OFFLINE / HF_ENDPOINT / HF_TOKEN.
        folder = Path(huggingface_hub.snapshot_download(repo_id, revision=revision, allow_patterns=patterns,
                                                        tqdm_class=tqdm_class))
    if tokenizer_only and (folder / "tokenizer.json").is_file():
        return ModelSource("dir", folder, repo_id)
    if tokenizer_only and (folder / "config.json").is_file():
        raise ModelNotFound(f"{what}: the repo has no tokenizer.json")
    if not (folder / "config.json").is_file():
        # a repo of GGUF files: llama.cpp's default quant, as `llama-cli -hf owner/name` would take
        return _hub_gguf(repo_id, None, None, revision, tqdm_class)
    return ModelSource("dir", folder, repo_id)


def _hub_gguf(repo_id: str, quant: str | None, hf_file: str | None, revision: str | None,
              tqdm_class=None) -> ModelSource:
    from .hub_gguf import fetch, quant_tag

    what = repo_id + (f":{quant}" if quant else "") + (f" (revision {revision})" if revision else "")
    with _hub_errors(what, repo_id + (f":{quant}" if quant else "")):
        path = fetch(repo_id, quant, hf_file, revision, what, tqdm_class)
    name = f"{repo_id}:{quant or quant_tag(path.name) or path.name}" if hf_file is None else f"{repo_id}/{hf_file}"
    return ModelSource("gguf", path, name)
