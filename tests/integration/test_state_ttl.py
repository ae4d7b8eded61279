"""State TTL in a running job (tests/fault/ttl_job.py: value, list and map
state with TTL on a clock that is the record itself): expired state is not
returned (the output equals the reference, which resets what expired), not
in the savepoint (it holds exactly the unexpired state at each task's clock),
and the stored form goes through a savepoint into a job at another
parallelism; a savepoint's TTL state restored without TTL is refused."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from lockgate import NoRestart
from lockgate.checkpoint import storage
from lockgate.errors import JobFailedError
from lockgate.state.keygroups import DEFAULT_MAX_PARALLELISM, key_group_for_key
from lockgate.state.serde import StateSerializer
from tests.fault import ttl_job
from tests.fault.ttl_job import TTLS, build, key_of, reference, reference_states
from tests.fixtures import committed_lines, split_positions, start_and_await

N = 9_000


def keyed_entries(savepoint: str, uid: str) -> list[tuple[dict[str, str], dict[str, dict]]]:
    """Per subtask: its states' kinds, and ``{state: {key: stored}}``."""
    meta = storage.read_metadata(savepoint)
    out = []
    for handle in meta.operators[uid].subtasks:
        entries: dict[str, dict] = {}
        if handle is not None:
            data = storage.read_state_file(savepoint, handle)
            for off, length in handle.key_groups.values():
                start = handle.keyed_offset + off
                _, content = StateSerializer().loads(data[start:start + length])
                for name, pairs in content.items():
                    entries.setdefault(name, {}).update({k: v for k, v in pairs})
        out.append((dict(handle.states) if handle else {}, entries))
    return out


def expected_savepoint(read_up_to: int, key_groups: range) -> dict[str, dict]:
    """What a subtask owning ``key_groups`` holds after the numbers up to
    ``read_up_to``: the reference state, less what expired at the subtask's
    clock (the last number it processed)."""
    _, states = reference_states(read_up_to)
    mine = {k for k in states if key_group_for_key(k, DEFAULT_MAX_PARALLELISM) in key_groups}
    clock = max((x for x in range(1, read_up_to + 1) if key_of(x) in mine), default=0)
    out: dict[str, dict] = {}
    for k in mine:
        for name, ttl in TTLS.items():
            stored = states[k].get(name)
            if name == "recent":
                stored = [p for p in stored if p[1] + ttl > clock] or None
            elif name == "digits":
                stored = {d: p for d, p in stored.items() if p[1] + ttl > clock} or None
            elif stored is not None and stored[1] + ttl <= clock:
                stored = None
            if stored is not None:
                out.setdefault(name, {})[k] = stored
    return out


BACKENDS = ["heap"]
"""``"rocksdb"`` too once the snapshot thread no longer shares the task's
msgpack ``Packer`` with the RocksDB backend (tests/fault/test_state_ttl.py)."""


@pytest.mark.parametrize("backend", BACKENDS)
def test_expired_state_is_not_returned_nor_in_the_savepoint_and_rescales(tmp_path: Path,
                                                                          backend: str):
    """p=2, stopped with a savepoint a third of the way, resumed at p=3.
    Without incremental cleanup, the keys idle for a
    block keep their expired state: only the snapshot filter keeps it out of
    the savepoint (the heap backend's snapshot, RocksDB's canonical export)."""
    out, chk = str(tmp_path / "out"), str(tmp_path / "chk")
    job = build(N, 2, out, chk, rate=4000, incremental=False, state_backend=backend)
    first = start_and_await(job, launcher="local",
                            until=lambda pr: pr.records_read > N // 3).stop(str(tmp_path / "sp"))
    assert first.status == "stopped" and first.savepoint
    (position,) = split_positions(first.savepoint).values()
    read_up_to = position - 1
    assert read_up_to > BLOCK_WITH_EXPIRY, "stopped before any key's state expired"
    subtasks = keyed_entries(first.savepoint, "ttl")
    kinds = {n: k for states, _ in subtasks for n, k in states.items()}
    assert kinds == {"first": "value+ttl", "since": "value+ttl", "count": "value+ttl",
                     "recent": "list+ttl", "digits": "map+ttl"}
    stored_recent = 0
    for i, (_, entries) in enumerate(subtasks):
        kg = range(*_key_groups(i, 2))
        assert entries == expected_savepoint(read_up_to, kg), f"subtask {i}"
        stored_recent += sum(len(v) for v in entries.get("recent", {}).values())
    # without TTL the list state would hold every number read
    assert stored_recent <= 10 * (ttl_job.RECENT_TTL // 5)

    second = build(N, 3, out, chk, rate=None, state_backend=backend).run(
        launcher="local", from_savepoint=first.savepoint)
    assert second.status == "finished"
    got = Counter(tuple(r) for r in committed_lines(out))
    want = Counter(tuple(r) for r in reference(N))
    assert got == want
    # the reference does expire state: sessions restart, first resets mid-block
    assert any(r[4] == 1 and r[0] > 1000 for r in reference(N))
    assert any(r[2] != r[3] for r in reference(N))


BLOCK_WITH_EXPIRY = ttl_job.BLOCK + ttl_job.SESSION_TTL


def _key_groups(task: int, parallelism: int) -> tuple[int, int]:
    from lockgate.state.keygroups import key_group_range

    r = key_group_range(task, parallelism, DEFAULT_MAX_PARALLELISM)
    return r.start, r.stop


class PlainRecords(ttl_job.TtlRecords):
    """The same states, registered without TTL."""

    def open(self, ctx: Any) -> None:
        from lockgate import ValueStateDescriptor

        self.now = 0
        self.first = ctx.get_state(ValueStateDescriptor("first"))


def test_ttl_state_restored_without_ttl_is_refused(tmp_path: Path):
    out, chk = str(tmp_path / "out"), str(tmp_path / "chk")
    first = start_and_await(build(4000, 2, out, chk, rate=2000), launcher="local",
                            until=lambda pr: pr.records_read > 1000).stop(str(tmp_path / "sp"))
    assert first.savepoint
    p = build(4000, 2, out, chk)
    p.restart = NoRestart()
    for node in p.nodes:
        if node.uid == "ttl":
            node.fn = PlainRecords()
    with pytest.raises(JobFailedError) as info:
        p.run(launcher="local", from_savepoint=first.savepoint)
    message = str(info.value)
    assert "'first' was stored with TTL" in message, message
    assert "TTL cannot be turned off" in message and "new state name" in message
    assert "Restarting cannot help" in message


def test_the_dedupe_example(tmp_path: Path):
    """examples/dedupe_ttl.py as docs/state-ttl.md runs it: with an hour's
    TTL on the wall clock nothing expires during the run, so every id passes
    once."""
    import json

    from tests.integration.test_examples import run_example

    src = tmp_path / "in"
    src.mkdir()
    events = [{"id": i % 7, "user": f"u{i % 3}", "amount": i} for i in range(40)]
    (src / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    run_example("lockgate run", "dedupe_ttl.py", [str(src), str(tmp_path / "out")], tmp_path)
    rows = committed_lines(tmp_path / "out")
    assert sorted(r["id"] for r in rows) == list(range(7))
    assert all(r["amount"] == r["id"] for r in rows)  # the first event of each id
