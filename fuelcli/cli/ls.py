"""`fuel ls`: the models on this machine fuel can run (pulled demo models, hub-cache repos)."""

import json

from .app import app
from .options import Json, human_size


@app.command("ls", short_help="List the models fuel can run from this machine.")
def ls_cmd(as_json: bool = Json):
    """List the models fuel can run from this machine: name (as fuel run takes it), kind, format,
    size, path. Demo models pulled into FUEL_HOME; repos in the hub cache (HF_HOME)."""
    from ..sources.local_models import list_models

    models = list_models()
    if as_json:
        print(json.dumps([m.to_json() for m in models], indent=2))
        return
    rows = [("NAME", "KIND", "FORMAT", "SIZE", "PATH")]
    rows += [(m.name, m.kind, m.format, human_size(m.size), m.path) for m in models]
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    for r in rows:  # plain columns, as ollama list: greppable, no colour
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)) + "  " + r[4])
