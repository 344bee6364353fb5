"""Turn the MODEL argument into files on disk.

MODEL is, in this order: a local path (model directory or .gguf file), a demo alias pulled with
`fuel pull`, or a hub repo id fetched (or found in the cache) by huggingface_hub.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from .errors import InputError, ModelNotFound

# Only what fuel reads: a repo's other weights formats (pytorch .bin, onnx, gguf) are not fetched.
HUB_PATTERNS = [
    "config.json",
    "generation_config.json",
    "*.safetensors",
    "model.safetensors.index.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "chat_template.jinja",
]

# What `fuel inspect tokens` needs: no weights.
TOKENIZER_PATTERNS = ["tokenizer.json", "tokenizer_config.json", "config.json", "chat_template.jinja"]

# owner/name as the hub spells them; anything path-like ("./x", "/x", "a/b/c") is not a repo id.
_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.\-]*/[A-Za-z0-9][\w.\-]*$")


@dataclass(frozen=True)
class ModelSource:
    kind: str  # "dir" or "gguf"
    path: Path  # the model directory (config.json + *.safetensors + tokenizer.json) or the .gguf file
    name: str  # display name: repo id, directory name or file name


def resolve(model: str, revision: str | None = None, tokenizer_only: bool = False) -> ModelSource:
    """tokenizer_only: a directory needs only tokenizer.json, and a hub repo gives only its tokenizer files."""
    path = Path(model).expanduser()
    if path.exists():
        return _local(path, tokenizer_only)
    demo = _demo(model)
    if demo is not None:
        return demo
    if _REPO_ID.match(model) and not model.endswith(".gguf"):
        return _hub(model, revision, TOKENIZER_PATTERNS if tokenizer_only else HUB_PATTERNS, tokenizer_only)
    raise ModelNotFound(f"{model}: no such file or directory, demo alias or hub repo id (owner/name)")


def _local(path: Path, tokenizer_only: bool = False) -> ModelSource:
    if path.is_dir():
        if tokenizer_only:
            if not (path / "tokenizer.json").is_file():
                raise InputError(f"{path}: directory has no tokenizer.json")
            return ModelSource("dir", path.resolve(), path.resolve().name)
        if not (path / "config.json").is_file():
            raise InputError(f"{path}: directory has no config.json (expected an HF model directory)")
        return ModelSource("dir", path.resolve(), path.resolve().name)
    if path.suffix.lower() == ".gguf":
        return ModelSource("gguf", path.resolve(), path.name)
    raise InputError(f"{path}: not a .gguf file nor a model directory with config.json")


def _demo(alias: str) -> ModelSource | None:
    from . import demo

    path = demo.lookup(alias)  # raises ModelNotFound ("run `fuel pull ALIAS`") if known but not pulled
    return None if path is None else ModelSource("gguf", Path(path), alias)


def _hub(repo_id: str, revision: str | None, patterns=HUB_PATTERNS, tokenizer_only: bool = False) -> ModelSource:
    # Imported here: it is slow to import and only this path needs it.
    import huggingface_hub
    from huggingface_hub import errors

    what = repo_id + (f" (revision {revision})" if revision else "")
    try:
        # huggingface_hub itself honours HF_HOME / HF_HUB_CACHE / HF_HUB_OFFLINE / HF_ENDPOINT / HF_TOKEN.
        folder = huggingface_hub.snapshot_download(repo_id, revision=revision, allow_patterns=patterns)
    except errors.RevisionNotFoundError:
        raise ModelNotFound(f"{what}: no such revision on the hub") from None
    except errors.GatedRepoError:
        raise ModelNotFound(f"{what}: gated repo; accept its terms on the hub and set HF_TOKEN") from None
    except errors.RepositoryNotFoundError:
        raise ModelNotFound(f"{what}: no such hub repo (or it is private and HF_TOKEN is not set)") from None
    except errors.IncompleteSnapshotError as e:
        raise ModelNotFound(f"{what}: the cached snapshot is incomplete and the hub cannot be reached") from e
    except errors.LocalEntryNotFoundError as e:
        offline = huggingface_hub.constants.HF_HUB_OFFLINE
        why = "HF_HUB_OFFLINE is set" if offline else "the hub cannot be reached"
        raise ModelNotFound(f"{what}: not in the local hub cache and {why}") from e
    except Exception as e:  # any other hub/network/validation error: one line naming the repo
        first = (str(e).strip().splitlines() or [""])[0][:200]
        raise ModelNotFound(f"{what}: hub error: {type(e).__name__}: {first}") from e
    folder = Path(folder)
    if tokenizer_only:
        if not (folder / "tokenizer.json").is_file():
            raise ModelNotFound(f"{what}: the repo has no tokenizer.json")
        return ModelSource("dir", folder, repo_id)
    if not (folder / "config.json").is_file():
        raise ModelNotFound(f"{what}: the repo has no config.json (fuel reads HF safetensors repos)")
    return ModelSource("dir", folder, repo_id)
