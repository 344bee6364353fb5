"""What was compared, for the JSON report: a CI artefact must say which fuel, which oracle (and its
version: the oracle can be wrong too, transformers#35924) and which model bytes."""

from __future__ import annotations

import os
import platform

import numpy as np


def model_record(source) -> dict:
    from ..fileio.filehash import model_files, sha256

    files = [{"name": p.name, "bytes": os.path.getsize(p), "sha256": sha256(p)} for p in model_files(source)]
    return {"name": source.name, "kind": source.kind, "path": str(source.path), "files": files}


def provenance(model, fuel, oracle) -> dict:
    import numba

    from .. import __version__

    e = fuel.engine
    return {
        "fuel": {"version": __version__, "device": e.device, "backend": e.backend,
                 "threads": numba.get_num_threads(), "dtype": "weights as stored, activations float32"},
        "model": model_record(model.source),
        "oracle": oracle.provenance(),
        "python": platform.python_version(),
        "numpy": np.__version__,
    }


def speed(*sides) -> dict:
    """name -> tokens, seconds and tokens/s spent inside that side's forwards."""
    return {name: {"tokens": s.tokens, "seconds": round(s.seconds, 3),
                   "tokens_per_second": round(s.tokens / s.seconds, 2) if s.seconds > 0 else None}
            for name, s in sides}
