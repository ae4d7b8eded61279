"""No capability probe in the runtime, checkpoint and state layers.

What a state backend, a snapshot, an operator or a sink writer can do is
declared in its type (``state.backends.KeyedStateBackend``,
``KeyedSnapshot``, ``IncrementalSnapshot``, ``runtime.operators.StreamOperator``,
``connectors.base.SinkWriter``), with a default where one has nothing to do,
so the type checker sees every use and a renamed method fails loudly. A
``hasattr``/``getattr`` found here is one of the few that look at data or user
objects, each listed with its reason; any other fails this test.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "lockgate"
FOLDERS = ("runtime", "checkpoint", "state")

ALLOWED: dict[tuple[str, str], str] = {
    ("runtime/arrow_ops.py", "hasattr(batch, 'schema')"):
        "a batch is data: a pyarrow record batch or a list of records",
    ("runtime/arrow_ops.py", "hasattr(values, 'dtype')"):
        "an array is data: numpy's or Arrow's",
    ("state/script_classes.py", "getattr(main, cls.__qualname__, None)"):
        "a class of the user's script, looked up by its name",
    ("state/script_classes.py", "getattr(obj, '__dict__', {})"):
        "a walk over the objects of user code (any object)",
    ("state/rocksdb/changelog.py", "getattr(self.raw, name)"):
        "LoggedDB.__getattr__: what it does not log goes to the database it wraps",
}


def probes() -> dict[tuple[str, str], int]:
    """Every ``hasattr``/``getattr`` call in the folders, by file and source."""
    found: dict[tuple[str, str], int] = {}
    for folder in FOLDERS:
        for path in sorted((PACKAGE / folder).rglob("*.py")):
            tree = ast.parse(path.read_text(), str(path))
            for node in ast.walk(tree):
                if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                        and node.func.id in ("hasattr", "getattr")):
                    key = (path.relative_to(PACKAGE).as_posix(), ast.unparse(node))
                    found[key] = found.get(key, 0) + 1
    return found


def test_no_capability_probe_on_backends_snapshots_or_operators() -> None:
    found = probes()
    new = sorted(k for k in found if k not in ALLOWED)
    assert not new, (
        "hasattr/getattr in " + ", ".join(FOLDERS) + ": "
        + "; ".join(f"{f}: {src}" for f, src in new)
        + ". Declare the capability in the type that has it (a method or attribute of "
        "KeyedStateBackend, KeyedSnapshot, StreamOperator or SinkWriter, with a default "
        "where one has nothing to do) and call it; if the call looks at data or user "
        "objects instead, list it in ALLOWED here with the reason")


def test_every_allowed_probe_is_still_there() -> None:
    stale = sorted(k for k in ALLOWED if k not in probes())
    assert not stale, f"ALLOWED lists calls the code no longer has: {stale}; remove them"


def test_no_runtime_checkable_protocol() -> None:
    """``isinstance`` against a ``runtime_checkable`` protocol is a probe by
    method names too: a capability that ``isinstance`` tells is a base class
    (``state.backends.IncrementalSnapshot``)."""
    found = [path.relative_to(PACKAGE).as_posix() for folder in FOLDERS
             for path in sorted((PACKAGE / folder).rglob("*.py"))
             if "runtime_checkable" in path.read_text()]
    assert not found, f"runtime_checkable in {found}: make the capability a base class"
