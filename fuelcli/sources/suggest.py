""""Did you mean": the name fuel knows (a demo alias, a model `fuel ls` lists) closest to a MODEL it
cannot find, as difflib measures closeness."""

from __future__ import annotations

import difflib


def known_names() -> list[str]:
    from . import demo
    from .local_models import list_models

    return list(dict.fromkeys([*demo.DEMOS, *(m.name for m in list_models())]))


def did_you_mean(name: str, names: list[str] | None = None) -> str:
    """'; did you mean NAME?' for the closest of `names` (default: every known name), case aside;
    '' when none is close."""
    try:
        names = known_names() if names is None else names
    except Exception:  # a hub cache fuel cannot read, say: no hint, and the error stays the one about MODEL
        return ""
    known = {n.lower(): n for n in names if n != name}
    close = difflib.get_close_matches(name.lower(), known, n=1, cutoff=0.6)
    return f"; did you mean {known[close[0]]}?" if close else ""
