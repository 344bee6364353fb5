"""The models on this machine that fuel can run, for `fuel ls` and `fuel rm`: demo models pulled
into FUEL_HOME, and repos in huggingface_hub's cache (HF_HOME) holding a supported safetensors
checkpoint or GGUF files (one entry per quant, named as `fuel run` takes it: owner/name:QUANT).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import InputError, ModelNotFound


@dataclass
class LocalModel:
    name: str  # what `fuel run` takes
    kind: str  # demo | hub
    format: str  # gguf | safetensors
    size: int  # bytes on disk
    path: str  # the .gguf file (the first part of a split one) or the model directory
    files: list = field(default_factory=list, repr=False)  # hub: (snapshot file, blob) of the entry

    def to_json(self) -> dict:
        return {"name": self.name, "kind": self.kind, "format": self.format, "size": self.size, "path": self.path}


def list_models() -> list[LocalModel]:
    return _demos() + _hub_models()


def _demos() -> list[LocalModel]:
    from . import demo

    return [LocalModel(d.alias, "demo", "gguf", d.size, str(demo.path_of(d.alias)))
            for d in demo.DEMOS.values() if demo.is_pulled(d.alias)]


def _scan():
    from huggingface_hub import constants, scan_cache_dir
    from huggingface_hub.errors import CacheNotFound

    try:  # the cache dir as huggingface_hub resolves it now (scan_cache_dir's default is fixed at import)
        return scan_cache_dir(constants.HF_HUB_CACHE)
    except CacheNotFound:
        return None


def _revision(repo):
    """The cached revision `fuel run owner/name` uses: the one refs/main names, else the newest."""
    revs = sorted(repo.revisions, key=lambda r: r.last_modified, reverse=True)
    return next((r for r in revs if "main" in r.refs), revs[0] if revs else None)


def _hub_models() -> list[LocalModel]:
    info = _scan()
    if info is None:
        return []
    out = []
    for repo in sorted(info.repos, key=lambda r: r.repo_id.lower()):
        rev = _revision(repo) if repo.repo_type == "model" else None
        if rev is not None:
            out += _entries(repo.repo_id, rev)
    return out


def _entries(repo_id: str, rev) -> list[LocalModel]:
    from ..families import BY_GGUF_ARCH, FAMILIES
    from ..weights.gguf import peek_architecture
    from .hub_gguf import is_model_file, pick, quant_tag, shards, split_info

    files = {f.file_path.relative_to(rev.snapshot_path).as_posix(): f for f in rev.files}
    out = []
    names = set(files)
    if "config.json" in names and any(n.endswith(".safetensors") for n in names):
        try:
            model_type = json.loads(Path(files["config.json"].file_path).read_text()).get("model_type")
        except (OSError, ValueError):
            model_type = None
        if model_type in FAMILIES:
            out.append(LocalModel(repo_id, "hub", "safetensors", sum(f.size_on_disk for f in files.values()),
                                  str(rev.snapshot_path), [(f.file_path, f.blob_path) for f in files.values()]))
    for first in sorted(n for n in names if is_model_file(n) and split_info(n)[1] == 1):
        try:
            parts = shards(list(names), first)
        except ModelNotFound:
            continue  # a split model with parts missing cannot run
        if peek_architecture(files[first].file_path) not in BY_GGUF_ARCH:
            continue
        tag = quant_tag(first)
        try:
            by_tag = tag is not None and pick(list(names), tag, None, repo_id) == parts
        except ModelNotFound:
            by_tag = False
        name = f"{repo_id}:{tag}" if by_tag else f"{repo_id} --hf-file {first}"
        out.append(LocalModel(name, "hub", "gguf", sum(files[p].size_on_disk for p in parts),
                              str(files[first].file_path), [(files[p].file_path, files[p].blob_path) for p in parts]))
    return out


def remove(name: str, hf_file: str | None = None) -> tuple[str, int]:
    """Delete a pulled demo model (by alias), a whole hub repo from the cache (owner/name, every
    revision, through huggingface_hub's cache API) or one quant of a GGUF repo (owner/name:QUANT or
    --hf-file: those files and their blobs). Returns (what was removed, bytes freed)."""
    from . import demo

    if name in demo.DEMOS:
        if hf_file is not None:
            raise InputError(f"--hf-file picks a file of a hub repo; {name} is a demo alias")
        path = demo.path_of(name)
        if not path.exists():
            raise ModelNotFound(f"{name}: demo model not pulled")
        size = path.lstat().st_size  # a symlinked file frees only its link
        path.unlink()
        return str(path), size
    repo_id, _, quant = name.partition(":")
    info = _scan()
    repo = next((r for r in (info.repos if info else ()) if r.repo_id == repo_id and r.repo_type == "model"), None)
    if repo is None:
        from .suggest import did_you_mean

        raise ModelNotFound(f"{name}: not a pulled demo alias nor a repo in the hub cache (fuel ls lists them)"
                            + did_you_mean(name, [m.name for m in list_models()]))
    if not quant and hf_file is None:
        strategy = info.delete_revisions(*(r.commit_hash for r in repo.revisions))
        strategy.execute()
        return f"{repo_id} ({len(repo.revisions)} revision{'s' if len(repo.revisions) > 1 else ''})", \
            strategy.expected_freed_size
    return _remove_gguf(info, repo, quant or None, hf_file)


def _remove_gguf(info, repo, quant: str | None, hf_file: str | None) -> tuple[str, int]:
    from .hub_gguf import pick

    rev = _revision(repo)
    files = {f.file_path.relative_to(rev.snapshot_path).as_posix(): f for f in rev.files}
    chosen = pick(list(files), quant, hf_file, repo.repo_id)
    # A blob may back the same file in several revisions: every link to it goes, then the blob,
    # unless it lives outside the repo's folder (a store shared between repos).
    doomed = {files[c].blob_path for c in chosen}
    for r in repo.revisions:
        for f in r.files:
            if f.blob_path in doomed:
                Path(f.file_path).unlink(missing_ok=True)
    freed = 0
    for blob in doomed:
        if Path(repo.repo_path) in Path(blob).parents and blob.exists():
            freed += blob.stat().st_size
            blob.unlink()
    emptied = [r.commit_hash for r in repo.revisions if not any(Path(f.file_path).exists() for f in r.files)]
    if emptied:  # nothing left in those snapshots: drop them (and their refs) through the cache API
        info.delete_revisions(*emptied).execute()
    return f"{repo.repo_id}: {', '.join(chosen)}", freed
