"""A benchmark's figures kept over time: one JSON line per row appended to
``benchmarks/results/<name>.jsonl`` (see ``benchmarks/results/README.md``),
each headed by the date, the commit measured, the machine and its load
average.

    from benchmarks.record import record
    record("cdc", [{"run": "snapshot", "rows_per_s": 120_000}])
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"


def commit() -> str | None:
    """The short hash of the checked-out commit, or None outside a git work tree."""
    try:
        done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, cwd=Path(__file__).resolve().parent)
    except OSError:
        return None
    if done.returncode != 0:
        return None
    return done.stdout.strip() or None


def machine() -> str:
    """The machine, as the results name it: cores, memory and host name."""
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return f"{os.cpu_count()}-core, {memory:.0f} GiB ({platform.node()})"


def record(name: str, rows: Iterable[Mapping[str, Any]]) -> Path:
    """Append one JSON line per row to ``benchmarks/results/<name>.jsonl``:
    the date (UTC), the commit, the machine and the load average now, then
    the row's own fields (a ``load`` the row measured during its run
    replaces the one now). Returns the file."""
    head = {"date": datetime.now(UTC).date().isoformat(), "commit": commit(),
            "machine": machine(), "load": round(os.getloadavg()[0], 2)}
    path = RESULTS / f"{name}.jsonl"
    with path.open("a") as f:
        for row in rows:
            f.write(json.dumps({**head, **row}) + "\n")
    return path
