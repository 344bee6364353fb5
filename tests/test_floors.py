"""The house: each package stands on one floor and imports only from its floor or below, and no
module imports itself back through others (lazy imports inside functions count too)."""

import ast
from pathlib import Path

import fuelcli

ROOT = Path(fuelcli.__file__).parent

# bottom to top; packages on one floor may import each other's modules (families/ reads model/rope)
FLOORS = [
    {"__init__", "errors", "process", "fileio"},  # __init__: the version
    {"formats"},
    {"model", "families"},  # the model's description: config, blocks, RoPE, sizes, the weight schema
    {"weights"},
    {"backends"},
    {"text"},
    {"sources"},
    {"assembly"},  # a runnable model: loader, reference, forward paths, inspect views
    {"peers"},
    {"oracle"},
    {"measure"},
    {"serve"},
    {"cli", "__main__"},
]
FLOOR = {package: level for level, packages in enumerate(FLOORS) for package in packages}


def _modules():
    for path in ROOT.rglob("*.py"):
        rel = path.relative_to(ROOT).with_suffix("")
        parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
        yield path, ("fuelcli",) + parts, rel.name == "__init__"


def _imports(path, name, is_package):
    """Absolute fuelcli module names imported anywhere in the file."""
    package = name if is_package else name[:-1]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else ()
            target = base + (tuple(node.module.split(".")) if node.module else ())
            if target[:1] != ("fuelcli",):
                continue
            yield target
            for alias in node.names:  # `from . import reference` names a module
                yield target + (alias.name,)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("fuelcli"):
                    yield tuple(alias.name.split("."))


def _graph():
    known = {name for _, name, _ in _modules()}
    graph = {}
    for path, name, is_package in _modules():
        graph[name] = {t for t in _imports(path, name, is_package) if t in known and t != name}
    return graph


def _package(name):
    return name[1] if len(name) > 1 else "__init__"


def _upward(graph):
    return sorted(f"{'.'.join(m)} -> {'.'.join(t)}" for m, targets in graph.items() for t in targets
                  if FLOOR[_package(t)] > FLOOR[_package(m)])


def _circles(graph):
    # a package's __init__ that re-exports its modules is not a circle with them
    edges = {m: {t for t in ts if not (len(t) < len(m) and m[: len(t)] == t)} for m, ts in graph.items()}
    seen, on_path, circles = set(), [], []

    def visit(m):
        if m in on_path:
            circles.append(on_path[on_path.index(m):] + [m])
            return
        if m in seen:
            return
        seen.add(m)
        on_path.append(m)
        for t in sorted(edges.get(m, ())):
            visit(t)
        on_path.pop()

    for m in sorted(edges):
        visit(m)
    return [" -> ".join(".".join(x[1:]) for x in c) for c in circles]


def test_every_package_has_a_floor():
    packages = {_package(name) for name in _graph()}
    assert packages <= set(FLOOR), f"packages without a floor: {sorted(packages - set(FLOOR))}"


def test_no_package_imports_one_above_it():
    upward = _upward(_graph())
    assert not upward, "imports pointing up a floor:\n" + "\n".join(upward)


def test_no_import_circle_between_modules():
    circles = _circles(_graph())
    assert not circles, "import circles: " + "; ".join(circles)


def test_the_checks_see_an_upward_import_and_a_circle():
    """Negative controls: weights/ importing backends/, and two oracle modules importing each other."""
    graph = _graph()
    build, base = ("fuelcli", "weights", "build"), ("fuelcli", "backends", "base")
    graph[build] = graph[build] | {base}
    assert _upward(graph) == ["fuelcli.weights.build -> fuelcli.backends.base"]
    oracles, server = ("fuelcli", "oracle", "oracles"), ("fuelcli", "oracle", "server")
    graph[oracles] = graph[oracles] | {server}
    graph[server] = graph[server] | {oracles}
    assert any("oracle.oracles" in c and "oracle.server" in c for c in _circles(graph))
