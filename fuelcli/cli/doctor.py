"""`fuel doctor`: what is installed, what each extra would add, where the caches are and their sizes."""

import json

from .app import app
from .options import Json, human_size


@app.command("doctor", short_help="Say what is installed, what each extra adds, and the caches.")
def doctor_cmd(as_json: bool = Json):
    """What is installed (fuel, its dependencies, each extra and peer), what each extra would add and
    how to install it, the CPU kernels' instruction set, and the cache directories with their sizes.
    Always exits 0: it reports, it does not judge."""
    from . import doctor_report as doctor

    r = doctor.report()
    if as_json:
        print(json.dumps(r, indent=2))
        return
    print(f"fuel {r['fuel']} ({r['distribution']}) from {r['fuel_package']}")
    print(f"Python {r['python']} at {r['executable']}")
    print("core: " + ", ".join(f"{k} {v or 'MISSING'}" for k, v in r["core"].items()))
    threads = f", FUEL_THREADS={r['fuel_threads']}" if r["fuel_threads"] else ""
    print(f"CPU: {r['cpu']}, {r['cores']} cores{threads}; kernels: {doctor.isa_text(r['kernels'])}")
    print("extras:")
    width = max(len(e["extra"]) for e in r["extras"])
    for e in r["extras"]:
        if e["installed"]:
            state = "installed (" + ", ".join(f"{p} {v}" for p, v in e["packages"].items()) + ")"
        else:
            state = "not installed: " + e["install"]
        print(f"  {e['extra']:<{width}}  {e['adds']}; {state}")
    print("peers (bench --compare, diff --oracle):")
    for p in r["peers"]:
        print(f"  {p['peer']}: " + ("installed" if p["installed"] else f"not installed (extra {p['extra']} above)"))
    print("caches:")
    width = max(len(c["name"]) for c in r["caches"])
    for c in r["caches"]:
        print(f"  {c['name']:<{width}}  {human_size(c['bytes']):>9}  {c['path']}  ({c['holds']})")
