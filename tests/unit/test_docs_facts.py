"""Facts docs/architecture.md states about the code stay true of it."""

from __future__ import annotations

import re
from pathlib import Path

from lockgate.runtime.faults import POINTS

ARCHITECTURE = Path(__file__).resolve().parents[2] / "docs" / "architecture.md"


def _section(title: str) -> str:
    text = ARCHITECTURE.read_text(encoding="utf-8")
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end >= 0 else None]


def test_the_fault_points_listed_are_the_codes():
    listed = set(re.findall(r"`([a-z_]+)`", _section("Fault injection")))
    assert listed == set(POINTS), (
        f"docs/architecture.md, *Fault injection*, lists {sorted(listed)}; "
        f"runtime/faults.py has {sorted(POINTS)}")


def test_the_repository_is_self_contained():
    """Nothing in the repository points at design files kept outside it."""
    root = ARCHITECTURE.parents[1]
    for path in [*root.glob("*.md"), *(root / "docs").rglob("*.md"),
                 *(root / "lockgate").rglob("*.py"), *(root / "tests").rglob("*.py")]:
        text = path.read_text(encoding="utf-8")
        assert "../shared" not in text or path.name == "test_docs_facts.py", path


def _package_rows() -> list[tuple[str, str]]:
    """(path, imports) of each row of docs/architecture.md's *Packages* table."""
    return re.findall(r"^\| `(lockgate/[^`]*)` \| .* \| ([^|]*) \|$", _section("Packages"), re.M)


def test_the_package_map_names_every_package_in_the_layers_order():
    from tests.unit.test_import_graph import LAYERS, ROOT, allowed_imports

    rows = _package_rows()
    tops = [path.removeprefix("lockgate/").removesuffix(".py") for path, _ in rows
            if path.count("/") == 1]
    assert tops == [name for name, _ in LAYERS], (
        "docs/architecture.md, *Packages*: one row per layer, in the order of "
        "tests/unit/test_import_graph.py's LAYERS")
    folders = sorted(path for path, _ in rows if path.count("/") > 1)
    assert folders == sorted(str(p.parent.relative_to(ROOT.parent))
                             for p in ROOT.glob("*/*/__init__.py")), \
        "docs/architecture.md, *Packages*: a row for every sub-package"
    allowed = allowed_imports()
    for path, imports in rows:
        name = path.removeprefix("lockgate/").removesuffix(".py")
        if "/" in name:
            assert imports.strip() == f"as `{name.split('/')[0]}`", path
            continue
        named = {n.split("/")[0].removesuffix(".py")
                 for n in re.findall(r"`([^`]+)`", imports)}
        if imports.startswith("everything above"):
            above = [n for n, _ in LAYERS][:[n for n, _ in LAYERS].index(name)]
            named = set(above) - named
        assert named == allowed[name], (
            f"docs/architecture.md, *Packages*: {path} imports {imports.strip()!r}; "
            f"LAYERS says {sorted(allowed[name])}")


def test_the_package_map_names_every_module():
    """Each module is named (``name.py``, in backticks) in its package's row;
    a module at the package's root has a row of its own."""
    from tests.unit.test_import_graph import ROOT

    rows = dict(re.findall(r"^\| `(lockgate/[^`]*)` \| (.*) \| [^|]* \|$",
                           _section("Packages"), re.M))
    missing = []
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT.parent)
        if path.parent == ROOT:
            if path.name != "__init__.py" and str(rel) not in rows:
                missing.append(str(rel))
        elif (row := rows.get(str(rel.parent))) is not None:
            if path.name != "__init__.py" and f"`{path.name}`" not in row:
                missing.append(str(rel))
        elif path.parent.name != "shim":  # the Spark daemon's shim: named as shim/...
            missing.append(f"{rel} (no row for {rel.parent})")
    assert not missing, "docs/architecture.md, *Packages*, does not name: " + ", ".join(missing)
