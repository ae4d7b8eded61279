"""The package's import graph: no cycle among module-level imports, and the
layering rules (docs/architecture.md: ``api`` and ``graph`` never import
``runtime``; ``checkpoint`` never imports ``connectors``; ``web`` never
imports ``cluster`` or ``runtime``; ``protocol`` imports only the pure
checkpoint types it carries).

Module-level imports are what Python runs when a module loads; an import
inside a function (loaded when first called: the Spark session, the launcher
of a job) or under ``TYPE_CHECKING`` is not a cycle at run time, but the
layering rules hold for every import, wherever it stands."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2] / "lockgate"


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path) -> tuple[set[str], set[str]]:
    """(module-level imports, every import) of Lockgate modules in ``path``."""
    tree = ast.parse(path.read_text(), str(path))
    top: set[str] = set()
    every: set[str] = set()
    package = module_name(path).rsplit(".", 1)[0] if path.name != "__init__.py" \
        else module_name(path)

    def names(node: ast.AST) -> list[str]:
        if isinstance(node, ast.Import):
            return [a.name for a in node.names]
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[:len(package.split(".")) - node.level + 1]
                                + ([base] if base else []))
            # ``from lockgate.runtime import wire`` imports the module lockgate.runtime.wire
            return [f"{base}.{a.name}" if _is_module(f"{base}.{a.name}") else base
                    for a in node.names]
        return []

    def visit(node: ast.AST, at_top: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                for n in ast.walk(child):
                    every.update(m for m in names(n) if m.startswith("lockgate"))
                continue
            found = [m for m in names(child) if m.startswith("lockgate")]
            every.update(found)
            if at_top:
                top.update(found)
            inner = at_top and not isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef
                                              | ast.Lambda)
            visit(child, inner)

    visit(tree, True)
    return top, every


def _is_module(name: str) -> bool:
    rel = Path(*name.split("."))
    return (ROOT.parent / rel).with_suffix(".py").exists() or (ROOT.parent / rel).is_dir()


def graph() -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    top, every = {}, {}
    for path in sorted(ROOT.rglob("*.py")):
        name = module_name(path)
        top[name], every[name] = imports(path)
    return top, every


def find_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def dfs(n: str) -> list[str] | None:
        state[n] = 1
        stack.append(n)
        for m in sorted(edges.get(n, ())):
            if m == n or m not in edges:
                continue
            if state.get(m) == 1:
                return stack[stack.index(m):] + [m]
            if m not in state and (cycle := dfs(m)):
                return cycle
        stack.pop()
        state[n] = 2
        return None

    for n in sorted(edges):
        if n not in state and (cycle := dfs(n)):
            return cycle
    return None


def test_module_level_imports_have_no_cycle() -> None:
    top, _ = graph()
    # a package's __init__ importing its own modules is how a package is made:
    # leave out the edges into a package from its own modules
    edges = {n: {m for m in deps if not n.startswith(m + ".")} for n, deps in top.items()}
    cycle = find_cycle(edges)
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_the_cycle_finder_finds_one() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


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
    _, every = graph()
    broken = [f"{n} imports {m}" for n, deps in every.items() for layer, banned in RULES
              if n == layer or n.startswith(layer + ".")
              for m in deps if any(m == b or m.startswith(b if b.endswith(".") else b + ".")
                                   for b in banned) and m not in ALLOWED.get(layer, ())]
    assert not broken, "\n".join(broken)
