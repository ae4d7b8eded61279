"""The package's import graph, every import counted: at module level, inside
a function (loaded when first called) and under ``TYPE_CHECKING`` (read by
the type checker). An import that only runs later is still a dependency: a
circle through one is a circle in the design, even when Python never trips
on it.

- No circle between files: the modules form a DAG (every strongly connected
  component is one file).
- No circle between packages: the top-level packages and the modules at the
  package's root form a DAG too, so each folder is a layer.
- Each package imports only the layers below it that ``LAYERS`` names
  (docs/architecture.md, *Packages*, is the same table).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2] / "lockgate"


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path) -> set[str]:
    """Every Lockgate module ``path`` imports, wherever the import stands."""
    tree = ast.parse(path.read_text(), str(path))
    package = module_name(path).rsplit(".", 1)[0] if path.name != "__init__.py" \
        else module_name(path)
    found: set[str] = set()
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[:len(package.split(".")) - node.level + 1]
                                + ([base] if base else []))
            # ``from lockgate.runtime import wire`` imports the module lockgate.runtime.wire
            names = [f"{base}.{a.name}" if _is_module(f"{base}.{a.name}") else base
                     for a in node.names]
        found.update(n for n in names if n == "lockgate" or n.startswith("lockgate."))
    return found


def _is_module(name: str) -> bool:
    rel = Path(*name.split("."))
    return (ROOT.parent / rel).with_suffix(".py").exists() or (ROOT.parent / rel).is_dir()


def graph() -> dict[str, set[str]]:
    """Module -> the Lockgate modules it imports. A package's ``__init__``
    is how the package is made: the edges from a module into the packages
    that hold it are left out."""
    edges: dict[str, set[str]] = {}
    for path in sorted(ROOT.rglob("*.py")):
        name = module_name(path)
        edges[name] = {m for m in imports(path)
                       if m != name and not name.startswith(m + ".")}
    return edges


def package_of(module: str) -> str:
    """The layer a module belongs to: its top-level package (``lockgate.state``
    for ``lockgate.state.rocksdb.tables``), or the module itself at the root."""
    return ".".join(module.split(".")[:2])


def package_graph(edges: dict[str, set[str]]) -> dict[str, set[str]]:
    packages: dict[str, set[str]] = {}
    for n, deps in edges.items():
        here = package_of(n)
        packages.setdefault(here, set()).update(
            package_of(m) for m in deps if package_of(m) != here)
    return packages


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan's
    algorithm, without recursion), each sorted, in sorted order."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    work: list[tuple[str, Iterator[str]]] = []
    found: list[list[str]] = []

    def enter(n: str) -> None:
        index[n] = low[n] = len(index)
        stack.append(n)
        on_stack.add(n)
        work.append((n, iter(sorted(m for m in edges.get(n, ()) if m in edges))))

    for start in sorted(edges):
        if start not in index:
            enter(start)
        while work:
            n, todo = work[-1]
            for m in todo:
                if m not in index:
                    enter(m)
                    break
                if m in on_stack:
                    low[n] = min(low[n], index[m])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[n])
                if low[n] == index[n]:
                    component = []
                    while True:
                        m = stack.pop()
                        on_stack.discard(m)
                        component.append(m)
                        if m == n:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return sorted(found)


def describe(component: list[str], edges: dict[str, set[str]]) -> str:
    inside = set(component)
    return "\n".join(f"  {n} -> {', '.join(sorted(edges[n] & inside))}" for n in component)


# The imports that still close a circle, to be broken: with them left out
# the graph is a DAG, and each must still be there (take it out of the list
# once it is gone). Empty once the house is a DAG.
KNOWN_FILE_EDGES: set[tuple[str, str]] = {
}
KNOWN_PACKAGE_EDGES: set[tuple[str, str]] = {
}


def _check(edges: dict[str, set[str]], known: set[tuple[str, str]], what: str) -> None:
    known = {(f"lockgate.{a}", f"lockgate.{b}") for a, b in known}
    gone = sorted(f"{a} -> {b}" for a, b in known if b not in edges.get(a, ()))
    assert not gone, f"no longer imported: take them out of the known circles between {what}" \
        f"\n" + "\n".join(gone)
    rest = {n: {m for m in deps if (n, m) not in known} for n, deps in edges.items()}
    found = circles(rest)
    assert not found, f"import circle between {what}:\n" + "\n\n".join(
        describe(c, rest) for c in found)


def test_no_circle_between_files() -> None:
    _check(graph(), KNOWN_FILE_EDGES, "files")


def test_no_circle_between_packages() -> None:
    _check(package_graph(graph()), KNOWN_PACKAGE_EDGES, "packages")


def test_every_import_is_counted(tmp_path: Path) -> None:
    """Module level, inside a function, under ``TYPE_CHECKING``, relative."""
    global ROOT
    root, ROOT = ROOT, tmp_path / "lockgate"
    try:
        (ROOT / "sub").mkdir(parents=True)
        for name in ("__init__.py", "a.py", "b.py", "c.py", "d.py", "sub/__init__.py",
                     "sub/e.py"):
            (ROOT / name).write_text("")
        (ROOT / "sub" / "e.py").write_text(
            "from typing import TYPE_CHECKING\n"
            "import lockgate.a\n"
            "if TYPE_CHECKING:\n    from lockgate.b import X\n"
            "def f():\n    from lockgate import c\n"
            "    def g():\n        from .. import d\n"
            "from . import e2\n")
        assert imports(ROOT / "sub" / "e.py") == {
            "lockgate.a", "lockgate.b", "lockgate.c", "lockgate.d", "lockgate.sub"}
    finally:
        ROOT = root


def test_the_circle_finder_finds_them() -> None:
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": set()}) == []
    assert circles({"a": {"b"}, "b": {"a"}, "c": {"d"}, "d": {"c", "a"}}) == [
        ["a", "b"], ["c", "d"]]
    assert package_graph({"lockgate.x.m": {"lockgate.y.n.o"}, "lockgate.y.n.o": set(),
                          "lockgate.z": {"lockgate.x"}}) == {
        "lockgate.x": {"lockgate.y"}, "lockgate.y": set(), "lockgate.z": {"lockgate.x"}}


class Above:
    """Every layer below this one in :data:`LAYERS` (but those named)."""

    def __init__(self, *but: str) -> None:
        self.but = but


# The layers, from the bottom up: each package (a top-level folder, or a
# module at the package's root; ``__init__`` is lockgate/__init__.py) and
# the packages it may import, all below it. docs/architecture.md,
# *Packages*, lists them in this order with the same imports
# (tests/unit/test_docs_facts.py).
LAYERS: list[tuple[str, tuple[str, ...] | Above]] = [
    ("errors", ()),
    ("config", ()),
    ("redact", ()),
    ("untrusted", ("errors",)),
    ("fs", ("errors",)),
    ("web", ("errors", "config")),
    ("state", ("errors", "untrusted", "fs")),
    ("checkpoint", ("errors", "untrusted", "fs", "state")),
    ("protocol", ("errors", "checkpoint")),
    ("connectors", ("errors", "redact", "untrusted", "fs", "state", "checkpoint")),
    ("api", ("errors", "config", "state", "checkpoint", "connectors")),
    ("graph", ("errors", "api")),
    ("runtime", Above("web")),
    ("cluster", Above()),
    ("spark", ("errors", "fs", "state", "checkpoint", "connectors")),
    ("cli", Above("runtime", "spark")),
    ("__init__", ("api", "cluster", "config", "errors", "state")),
]


def allowed_imports() -> dict[str, set[str]]:
    """Each layer's name -> the names of the layers it may import."""
    allowed: dict[str, set[str]] = {}
    below: list[str] = []
    for name, may in LAYERS:
        if isinstance(may, Above):
            allowed[name] = set(below) - set(may.but)
        else:
            assert set(may) <= set(below), f"{name} may import only layers below it"
            allowed[name] = set(may)
        below.append(name)
    return allowed


def _layer(package: str) -> str:
    return "__init__" if package == "lockgate" else package.removeprefix("lockgate.")


def test_packages_import_only_the_layers_below() -> None:
    allowed = allowed_imports()
    packages = package_graph(graph())
    assert sorted(allowed) == sorted(_layer(p) for p in packages), \
        "every package (and module at the package's root) is one layer of LAYERS"
    broken = [f"{_layer(p)} imports {_layer(m)}" for p, deps in sorted(packages.items())
              for m in sorted(deps) if _layer(m) not in allowed[_layer(p)]]
    assert not broken, "imports against the layers (LAYERS, docs/architecture.md):\n" + \
        "\n".join(broken)


def test_the_protocol_imports_only_the_pure_types_it_carries() -> None:
    """Narrower than its layer: of ``checkpoint``, only the pure types a
    message carries (no storage, no I/O)."""
    pure = {"lockgate.checkpoint.metadata", "lockgate.checkpoint.kinds"}
    imported = {m for m in graph()["lockgate.protocol"] if m.startswith("lockgate.checkpoint")}
    assert imported <= pure, sorted(imported - pure)
