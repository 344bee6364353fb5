""""Did you mean": the name fuel knows (a demo alias, a model `fuel ls` lists) closest to a MODEL it
cannot find, as difflib measures closeness."""

from __future__ import annotations

import difflib


def did_you_mean(name: str, names: list[str]) -> str:
    """'; did you mean NAME?' for the closest of `names`, case aside; '' when none is close."""
    known = {n.lower(): n for n in names if n != name}
    close = difflib.get_close_matches(name.lower(), known, n=1, cutoff=0.6)
    return f"; did you mean {known[close[0]]}?" if close else ""
