"""The package's import graph, every import counted: at module level, inside
a function (loaded when first called) and under ``TYPE_CHECKING`` (read by
the type checker). An import that only runs later is still a dependency: a
circle through one is a circle in the design, even when Python never trips
on it.

- No circle between files: the modules form a DAG (every strongly connected
  component is one file).
- No circle between packages: the top-level packages and the modules at the
  package's root form a DAG too, so each folder is a layer.
- The layer rules hold (docs/architecture.md, *Packages*).
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


# Circles the package still has, each named by its members: a circle found
# that is not inside one of these fails, and so does one of these that is gone
# (remove it here). Empty once the house is a DAG.
KNOWN_FILE_CIRCLES: list[set[str]] = [
    {"lockgate.state.backend", "lockgate.state.backends", "lockgate.state.rocksdb",
     "lockgate.state.rocksdb_changelog", "lockgate.state.rocksdb_cleanup",
     "lockgate.state.rocksdb_handles", "lockgate.state.rocksdb_io",
     "lockgate.state.rocksdb_local", "lockgate.state.rocksdb_snapshots",
     "lockgate.state.rocksdb_tables"},
    # api -> cluster.submission (Pipeline.run), cluster -> runtime -> api
    {"lockgate.api.arrow", "lockgate.api.broadcast", "lockgate.api.connected",
     "lockgate.api.joins", "lockgate.api.pipeline", "lockgate.api.stream",
     "lockgate.api.windowed", "lockgate.cluster.client", "lockgate.cluster.forks",
     "lockgate.cluster.interrupt", "lockgate.cluster.jobmaster", "lockgate.cluster.launcher",
     "lockgate.cluster.local", "lockgate.cluster.metrics", "lockgate.cluster.progress",
     "lockgate.cluster.provenance", "lockgate.cluster.rescale", "lockgate.cluster.restarts",
     "lockgate.cluster.resume", "lockgate.cluster.spark_cds", "lockgate.cluster.spark_daemon",
     "lockgate.cluster.spark_host", "lockgate.cluster.spark_launcher",
     "lockgate.cluster.spark_session", "lockgate.cluster.spark_stage",
     "lockgate.cluster.spark_warm", "lockgate.cluster.specs", "lockgate.cluster.submission",
     "lockgate.graph.jobgraph", "lockgate.graph.rescale", "lockgate.runtime.arrow_ops",
     "lockgate.runtime.async_io", "lockgate.runtime.broadcast_process",
     "lockgate.runtime.chain", "lockgate.runtime.channel_state", "lockgate.runtime.channels",
     "lockgate.runtime.coprocess", "lockgate.runtime.forkserver",
     "lockgate.runtime.interval_join", "lockgate.runtime.metrics",
     "lockgate.runtime.operators", "lockgate.runtime.output", "lockgate.runtime.registry",
     "lockgate.runtime.snapshots", "lockgate.runtime.spec", "lockgate.runtime.task",
     "lockgate.runtime.task_control", "lockgate.runtime.task_main",
     "lockgate.runtime.unaligned", "lockgate.runtime.window_triggers",
     "lockgate.runtime.windows"},
]
KNOWN_PACKAGE_CIRCLES: list[set[str]] = [
    {"lockgate.api", "lockgate.checkpoint", "lockgate.cluster", "lockgate.connectors",
     "lockgate.graph", "lockgate.protocol", "lockgate.runtime", "lockgate.state"},
]


def _check(found: list[list[str]], known: list[set[str]], edges: dict[str, set[str]],
           what: str) -> None:
    new = [c for c in found if not any(set(c) <= k for k in known)]
    assert not new, f"import circle between {what}:\n" + "\n\n".join(
        describe(c, edges) for c in new)
    gone = [k for k in known if not any(set(c) & k for c in found)]
    assert not gone, f"a known circle between {what} is gone: take it out of the list\n" + \
        "\n".join(str(sorted(k)) for k in gone)


def test_no_circle_between_files() -> None:
    edges = graph()
    _check(circles(edges), KNOWN_FILE_CIRCLES, edges, "files")


def test_no_circle_between_packages() -> None:
    edges = package_graph(graph())
    _check(circles(edges), KNOWN_PACKAGE_CIRCLES, edges, "packages")


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


ALLOWED = {
    # the types a checkpoint is made of are pure leaves: the protocol carries them
    "lockgate.protocol": ("lockgate.checkpoint.metadata", "lockgate.checkpoint.kinds"),
}
RULES = [
    ("lockgate.api", ("lockgate.runtime",)),
    ("lockgate.graph", ("lockgate.runtime", "lockgate.cluster", "lockgate.connectors")),
    ("lockgate.checkpoint", ("lockgate.connectors", "lockgate.cluster", "lockgate.web")),
    ("lockgate.web", ("lockgate.cluster", "lockgate.runtime")),
    ("lockgate.protocol", ("lockgate.runtime", "lockgate.cluster", "lockgate.checkpoint.",
                           "lockgate.connectors", "lockgate.api", "lockgate.web")),
    ("lockgate.runtime", ("lockgate.cluster", "lockgate.web")),
]


def test_layers_import_only_what_they_may() -> None:
    every = graph()
    broken = [f"{n} imports {m}" for n, deps in every.items() for layer, banned in RULES
              if n == layer or n.startswith(layer + ".")
              for m in deps if any(m == b or m.startswith(b if b.endswith(".") else b + ".")
                                   for b in banned) and m not in ALLOWED.get(layer, ())]
    assert not broken, "\n".join(broken)
