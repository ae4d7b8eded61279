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
