"""Fixtures and helpers shared by the test areas; ``tests/conftest.py``
registers this module as a plugin, so every test can ask for its fixtures.

- ``launcher``: runs a test on each launcher;
- the committed output of a file sink, read back and checked record by record;
- the operator state a checkpoint or savepoint holds;
- starting a job and awaiting a progress report;
- which modules a fresh interpreter imports.

Helpers that drive a job under kills (finding, stopping and killing its task
processes) are the fault tests' own: ``tests/fault/checks.py``.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections import defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from lockgate import fs

if TYPE_CHECKING:
    from lockgate import Pipeline
    from lockgate.api.client import JobClient
    from lockgate.api.result import Progress

LAUNCHERS = ("local", "spark")
"""The launchers every integration and fault test runs on: on ``spark`` the
tasks run in the Python workers of a Spark barrier stage."""


@pytest.fixture(params=LAUNCHERS, ids=LAUNCHERS)
def launcher(request: pytest.FixtureRequest) -> str:
    """A test that asks for ``launcher`` runs once on each launcher, with the
    ids ``[local]`` and ``[spark]``; a test meant for one launcher names it
    instead."""
    return str(request.param)


# ------------------------------------------------------- committed output


def committed_lines(out: Path | str) -> list[list]:
    """Every record of every committed (visible) JSONL file of the folder
    ``out`` (a path, or a URL such as ``s3://...``)."""
    records = []
    for name in sorted(fs.listdir(out)):
        if name.startswith((".", "_")):
            continue
        records += [json.loads(line) for line in fs.read_bytes(fs.join(out, name)).splitlines()]
    return records


def hidden_files(out: Path | str) -> list[str]:
    """The hidden (in-progress or pending) files of the folder ``out`` (a path or a URL)."""
    return sorted(name for name in fs.listdir(out) if name.startswith((".", "_")))


def visible_files(folder: Path) -> dict[str, bytes]:
    """Name -> content of every committed (visible) file of a sink folder."""
    return {f.name: f.read_bytes() for f in sorted(folder.iterdir())
            if not f.name.startswith((".", "_"))}


def check_running_sums(records: list[list], n: int, keys: int,
                       inputs: list[int] | None = None) -> None:
    """For every key, the committed running sums, sorted, have successive
    differences equal to the multiset of that key's inputs: nothing lost,
    nothing twice. The inputs are ``1..n``, or ``inputs`` (an unbounded
    source's records up to where it stopped)."""
    sums: dict[int, list[int]] = defaultdict(list)
    for k, s in records:
        sums[k].append(s)
    expected: dict[int, list[int]] = defaultdict(list)
    for x in sorted(inputs) if inputs is not None else range(1, n + 1):
        expected[x % keys].append(x)
    assert sorted(sums) == sorted(expected), f"keys differ: {sorted(sums)}"
    for k, inputs in expected.items():
        got = sorted(sums[k])
        diffs = [b - a for a, b in zip([0] + got, got, strict=False)]
        assert len(got) == len(inputs), (
            f"key {k}: {len(got)} committed sums for {len(inputs)} inputs "
            f"({'duplicates' if len(got) > len(inputs) else 'losses'})"
        )
        assert sorted(diffs) == inputs, f"key {k}: committed sums do not match the inputs"


def check_exact_sums(out: Path | str, n: int, keys: int,
                     inputs: list[int] | None = None) -> None:
    """The running sums committed to the folder ``out`` are exact
    (:func:`check_running_sums`), and no in-progress or pending file is left."""
    check_running_sums(committed_lines(out), n, keys, inputs)
    left = hidden_files(out)
    assert left == [], f"in-progress or pending files were left behind: {left}"


# ------------------------------------------------- checkpoints' operator state


def operator_state(savepoint: str, uid: str) -> list[list]:
    """Per subtask, the operator-state entries of operator ``uid`` in a
    checkpoint or savepoint folder (``[]`` for a subtask without any)."""
    from lockgate.checkpoint import storage
    from lockgate.state.serde import StateSerializer

    meta = storage.read_metadata(savepoint)
    out: list[list] = []
    for handle in meta.operators[uid].subtasks:
        entries: list = []
        if handle and handle.op_state:
            offset, length = handle.op_state
            data = storage.read_state_file(savepoint, handle)[offset:offset + length]
            entries = StateSerializer().loads(data)
        out.append(entries)
    return out


def split_positions(savepoint: str, uid: str = "numbers") -> dict[int, int]:
    """The next number each ``SequenceSource`` split of the source ``uid`` would
    read, from its operator state in a checkpoint or savepoint folder."""
    return {s["split"]: s["next"] for entries in operator_state(savepoint, uid)
            for s in entries}


def sequence_read(savepoint: str, n: int, uid: str = "numbers") -> list[int]:
    """The numbers of ``1..n`` a bounded ``SequenceSource`` had read before a
    checkpoint or savepoint: every number that no remaining split of its
    state would still read (splits are cut anew on rescaling)."""
    left = [s for entries in operator_state(savepoint, uid) for s in entries]
    ahead: set[int] = set()
    for s in left:
        if s["next"] <= s["end"]:
            ahead.update(range(s["next"], s["end"] + 1, s["step"]))
    return [x for x in range(1, n + 1) if x not in ahead]


# ------------------------------------------------------------------- jobs


def start_and_await(pipeline: Pipeline, *, launcher: str,
                    until: Callable[[Progress], object] = lambda _: True,
                    timeout: float = 120.0, what: str = "no checkpoint completed",
                    **start: Any) -> JobClient:
    """Start ``pipeline`` (``start``: the other arguments of
    :meth:`Pipeline.start`) and return its client once a progress report (one
    comes after every completed checkpoint) satisfies ``until``; fail saying
    ``what`` if none does within ``timeout`` seconds."""
    reached = threading.Event()

    def on_progress(progress: Progress) -> None:
        if until(progress):
            reached.set()

    client = pipeline.start(launcher=launcher, on_progress=on_progress, **start)
    assert reached.wait(timeout), what
    return client


def modules_imported_by(code: str, modules: Sequence[str]) -> list[str]:
    """Which of ``modules`` a fresh interpreter has imported once it ran
    ``code`` (the imports of a process about to start, say)."""
    probe = (f"import sys\n{code}\n"
             f"print(' '.join(m for m in {tuple(modules)!r} if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          timeout=120, check=True)
    return done.stdout.split()
