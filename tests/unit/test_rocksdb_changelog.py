"""The RocksDB backend's changelog (``RocksDBStateBackend(changelog=True)``)
without processes: a long chain of checkpoints with materializations between
records, each checkpoint restored (same parallelism, rescaled, onto the heap)
and compared with a model of the state at that checkpoint; what a checkpoint
uploads; a snapshot whose writing failed, a savepoint between checkpoints."""

from __future__ import annotations

import random
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from lockgate.checkpoint.kinds import OperatorStateMode
from lockgate.checkpoint.metadata import OperatorMetadata
from lockgate.errors import LockgateError
from lockgate.runtime.keyed_state import restore_keyed
from lockgate.runtime.operators import OperatorSnapshot
from lockgate.runtime.snapshots import SnapshotWriter
from lockgate.state.backend import HeapKeyedStateBackend
from lockgate.state.backends import BackendScope, RocksDBStateBackend
from lockgate.state.factory import create_keyed_backend
from lockgate.state.keygroups import key_group_for_key, key_group_range
from lockgate.state.rocksdb import changelog as rocksdb_changelog
from lockgate.state.serde import StateSerializer
from tests.unit.test_rocksdb_backend import (
    MP,
    Out,
    V,
    blocks_of,
    restore_blocks,
    restore_incremental,
    write_incremental,
)

pytest.importorskip("rocksdict")

M = 16


def rocks(tmp: Path, kg: range = range(M), task: int = 0, attempt: int = 0, *,
          job: Path, **options):
    config = RocksDBStateBackend(local_dir=str(tmp / "local"), **{"memory_mb": 32, **options})
    return create_keyed_backend(config, M, kg, StateSerializer(), BackendScope(
        "job", "op", task, attempt, str(job)))


def mutate(b, model: dict, rng: random.Random, n: int, keys: list | None = None) -> None:
    """``n`` random writes through the state handles (of ``keys``, else of
    0..299), mirrored in ``model`` (``{"v": {key: int}, "m": {key: {mk: value}}}``)."""
    v, m = b.get_state(V), b.get_state(MP)
    for _ in range(n):
        key = rng.choice(keys) if keys else rng.randrange(300)
        b.current_key = key
        op = rng.random()
        if op < 0.5:
            v.update(v.value() + 1)
            model["v"][key] = model["v"].get(key, 0) + 1
        elif op < 0.6:
            v.clear()
            model["v"].pop(key, None)
        elif op < 0.9:
            mk = rng.randrange(5)
            m.put(mk, [key, mk, rng.random()])
            model["m"].setdefault(key, {})[mk] = m.get(mk)
        else:
            mk = rng.randrange(5)
            m.remove(mk)
            entries = model["m"].get(key, {})
            entries.pop(mk, None)
            if not entries:
                model["m"].pop(key, None)


def contents(b) -> dict:
    return {"v": dict(b.raw("v").items()), "m": dict(b.raw("m").items())}


def copy(model: dict) -> dict:
    return {"v": dict(model["v"]), "m": {k: dict(e) for k, e in model["m"].items()}}


def restored(tmp: Path, job: Path, handle, p: int, heap: bool = False) -> dict:
    """The state of one checkpoint (one task's handle) restored at parallelism
    ``p``, all tasks merged."""
    chk = job / "chk-1"
    chk.mkdir(parents=True, exist_ok=True)
    merged: dict = {"v": {}, "m": {}}
    for i in range(p):
        kg = key_group_range(i, p, M)
        if heap:
            b = HeapKeyedStateBackend(M, kg, StateSerializer())
            meta = OperatorMetadata(1, OperatorStateMode.SPLIT, [handle[0]])
            restore_keyed(b, meta, i, p, M, str(chk), lambda h: handle[1])
        else:
            b = rocks(tmp / f"r{p}-{i}-{time.monotonic_ns()}", kg, i, 1, job=job)
            restore_incremental(b, [handle], chk, i, p)
        b.get_state(V), b.get_state(MP)
        for name, table in contents(b).items():
            assert all(key_group_for_key(k, M) in kg for k in table)
            merged[name].update(table)
        if not heap:
            b.close()
    return merged


def due_materialization(b) -> None:
    """Ask the backend between records until a due materialization was taken."""
    for _ in range(1000):
        if b.prepare_snapshot(time.monotonic()) == 1.0 and b._cut is not None:
            return
        time.sleep(0.002)
    raise AssertionError("no materialization was taken")


def test_every_checkpoint_of_a_long_chain_restores_exactly(tmp_path):
    job = tmp_path / "job"
    b = rocks(tmp_path, job=job, max_changelog=3)
    rng = random.Random(7)
    model: dict = {"v": {}, "m": {}}
    handles, models = [], []
    for n in range(1, 13):
        mutate(b, model, rng, 400)
        if n > 1 and b.chain.due(b.config.materialize_ratio, b.config.max_changelog):
            due_materialization(b)  # between records, not in a snapshot
            mutate(b, model, rng, 50)  # after the cut: in the next changelog file
        cut_before = b._cut is not None
        handle = write_incremental(b, n)
        inc = handle[0].incremental
        # the first materializes in its synchronous part (no changes after
        # it); one between records starts a new changelog; else one file more
        assert len(inc.changelog) == (0 if n == 1 else 1 if cut_before else
                                      len(handles[-1][0].incremental.changelog) + 1)
        if n > 1 and not cut_before:  # only the changes were uploaded
            assert inc.shared == handles[-1][0].incremental.shared
        handles.append(handle)
        models.append(copy(model))
        assert contents(b) == model
    assert sum(1 for h, _ in handles if len(h.incremental.changelog) == 1) >= 3
    b.close()
    for handle, expected in zip(handles, models, strict=True):
        assert restored(tmp_path, job, handle, 1) == expected
    for p in (2, 3):  # rescaled, from the longest chains
        assert restored(tmp_path, job, handles[-1], p) == models[-1]
    assert restored(tmp_path, job, handles[-2], 2, heap=True) == models[-2]


def test_a_checkpoint_between_materializations_uploads_only_the_changes(tmp_path):
    job = tmp_path / "job"
    b = rocks(tmp_path, job=job)
    v = b.get_state(V)
    for k in range(20_000):
        b.current_key = k
        v.update(k)
    first, _ = write_incremental(b, 1)
    before = set((job / "shared").iterdir())
    for k in range(100):
        b.current_key = k
        v.update(-k)
    second, _ = write_incremental(b, 2)
    new = set((job / "shared").iterdir()) - before
    assert [p.name for p in new] == [second.incremental.changelog[-1].name]
    assert second.incremental.changelog[-1].size < first.incremental.size / 20
    assert not list((tmp_path / "local").rglob("snapshot-*"))  # no RocksDB checkpoint left
    b.close()


def test_a_failed_snapshot_breaks_the_chain_and_the_next_materializes(tmp_path, monkeypatch):
    job = tmp_path / "job"
    b = rocks(tmp_path, job=job)
    rng = random.Random(3)
    model: dict = {"v": {}, "m": {}}
    mutate(b, model, rng, 300)
    write_incremental(b, 1)
    mutate(b, model, rng, 300)
    failing = b.snapshot()
    mutate(b, model, rng, 300)
    taken_before_the_failure = b.snapshot()  # the task does not wait for the writer
    real = rocksdb_changelog.upload

    def broken_upload(*args):
        raise OSError("storage unreachable")

    monkeypatch.setattr(rocksdb_changelog, "upload", broken_upload)
    with pytest.raises(OSError):
        failing.write_incremental(Out(), 2)
    monkeypatch.setattr(rocksdb_changelog, "upload", real)
    with pytest.raises(LockgateError, match="declined"):
        taken_before_the_failure.write_incremental(Out(), 3)
    mutate(b, model, rng, 300)
    handle = write_incremental(b, 4)  # materialized in its synchronous part
    assert handle[0].incremental.changelog == ()
    b.close()
    assert restored(tmp_path, job, handle, 1) == model


def test_a_savepoint_between_checkpoints_keeps_the_changelog_whole(tmp_path):
    job = tmp_path / "job"
    b = rocks(tmp_path, job=job)
    rng = random.Random(11)
    model: dict = {"v": {}, "m": {}}
    mutate(b, model, rng, 300)
    write_incremental(b, 1)
    mutate(b, model, rng, 300)
    data, groups, states = blocks_of(b)  # a savepoint: canonical
    at_savepoint = copy(model)
    mutate(b, model, rng, 300)
    handle = write_incremental(b, 3)
    b.close()
    assert restored(tmp_path, job, handle, 1) == model
    h = HeapKeyedStateBackend(M, range(M), StateSerializer())
    restore_blocks(h, data, groups, states)
    h.get_state(V), h.get_state(MP)
    assert contents(h) == at_savepoint


def test_a_log_beyond_its_memory_share_is_emptied_by_a_materialization(tmp_path):
    job = tmp_path / "job"
    b = rocks(tmp_path, job=job, memory_mb=16)
    write_incremental(b, 1)
    limit = rocksdb_changelog.log_limit(b.config)
    v = b.get_state(V)
    for k in range(limit + 5_000):
        b.current_key = k
        v.update(k)
    b.flush()
    assert len(b.db.log) > limit
    due_materialization(b)
    assert len(b.db.log) == 0
    handle = write_incremental(b, 2)
    assert handle[0].incremental.changelog == ()  # all in the materialization
    b.close()
    state = restored(tmp_path, job, handle, 1)
    assert state["v"] == {k: k for k in range(limit + 5_000)}


def test_a_snapshot_lost_after_a_savepoint_declines_the_next_checkpoint(tmp_path):
    """A savepoint's changes wait for the next checkpoint (carried); a
    snapshot after it that never reached the writer (its checkpoint failed
    before this operator's state was written) leaves a gap the checkpoint
    after it must not paper over."""
    job = tmp_path / "job"
    b = rocks(tmp_path, job=job)
    rng = random.Random(5)
    model: dict = {"v": {}, "m": {}}
    mutate(b, model, rng, 300)
    write_incremental(b, 1)
    mutate(b, model, rng, 300)
    blocks_of(b)  # savepoint 2: carried
    mutate(b, model, rng, 300)
    b.snapshot()  # checkpoint 3: failed before its keyed state was written
    mutate(b, model, rng, 300)
    with pytest.raises(LockgateError, match="declined"):
        write_incremental(b, 4)
    mutate(b, model, rng, 300)
    handle = write_incremental(b, 5)  # materialized in its synchronous part
    assert handle[0].incremental.changelog == ()
    b.close()
    assert restored(tmp_path, job, handle, 1) == model


def test_materializations_carried_by_savepoints_leave_no_folder_behind(tmp_path):
    job = tmp_path / "job"
    b = rocks(tmp_path, job=job)
    rng = random.Random(9)
    model: dict = {"v": {}, "m": {}}
    mutate(b, model, rng, 300)
    write_incremental(b, 1)
    for _ in (2, 3):  # savepoints, each with a materialization taken before it
        mutate(b, model, rng, 300)
        b._materialize()
        blocks_of(b)
    mutate(b, model, rng, 300)
    handle = write_incremental(b, 4)
    assert not list((tmp_path / "local").rglob("snapshot-*"))  # no RocksDB checkpoint left
    b.close()
    assert restored(tmp_path, job, handle, 1) == model


def test_changelogs_of_several_tasks_restore_rescaled(tmp_path):
    """Two tasks' chains restored by one task (the other handle is copied in
    after its changelog is applied) and onto the heap."""
    job = tmp_path / "job"
    model: dict = {"v": {}, "m": {}}
    handles = []
    for i in range(2):
        kg = key_group_range(i, 2, M)
        b = rocks(tmp_path / f"w{i}", kg, i, job=job)
        rng = random.Random(20 + i)
        keys = [k for k in range(300) if key_group_for_key(k, M) in kg]
        for n in (1, 2, 3):
            mutate(b, model, rng, 300, keys)
            handle = write_incremental(b, n)
        assert len(handle[0].incremental.changelog) == 2
        b.close()
        handles.append(handle)
    chk = job / "chk-1"
    chk.mkdir(parents=True, exist_ok=True)
    for heap in (False, True):
        if heap:
            b = HeapKeyedStateBackend(M, range(M), StateSerializer())
        else:
            b = rocks(tmp_path / "r", range(M), 0, 1, job=job)
        restore_incremental(b, handles, chk, 0, 1)
        b.get_state(V), b.get_state(MP)
        assert contents(b) == model
        if not heap:
            b.close()


def test_a_range_deleted_after_a_materialization_is_in_the_next_checkpoint(tmp_path):
    """The log cannot say a deleted range: the next snapshot materializes,
    even when a materialization taken before the deletion waits for it."""
    job = tmp_path / "job"
    b = rocks(tmp_path, job=job)
    rng = random.Random(4)
    model: dict = {"v": {}, "m": {}}
    mutate(b, model, rng, 300)
    write_incremental(b, 1)
    mutate(b, model, rng, 300)
    b._materialize()  # between records
    b.flush()
    b.db.delete_range(b"", b"\xff" * 8)  # every key group's entries
    handle = write_incremental(b, 2)
    b.close()
    assert restored(tmp_path, job, handle, 1) == {"v": {}, "m": {}}


def test_savepoints_without_checkpoints_carry_a_bounded_log(tmp_path):
    """Savepoints only (no checkpoints: ``interval=None``): what they carry
    for a next checkpoint stays within the log's memory share (a
    materialization between records supersedes it), and that checkpoint
    restores exactly."""
    job = tmp_path / "job"
    b = rocks(tmp_path, job=job, memory_mb=16)
    limit = rocksdb_changelog.log_limit(b.config)
    v = b.get_state(V)
    blocks_of(b)  # the first savepoint (it materializes)
    for r in range(1, 5):
        for k in range(limit // 2):  # new keys each round
            b.current_key = r * 1_000_000 + k
            v.update(r)
            if k % 500 == 0:
                b.prepare_snapshot(time.monotonic())
        b.flush()
        for _ in range(500):  # between records until no flush is watched
            if b.prepare_snapshot(time.monotonic()) == 1.0:
                break
            time.sleep(0.002)
        blocks_of(b)
        carried = sum(len(log) for _, _, _, log in b.chain.carried)
        assert carried <= limit * 3 // 2, (r, carried)
    handle = write_incremental(b, 9)
    assert not list((tmp_path / "local").rglob("snapshot-*"))
    b.close()
    assert restored(tmp_path, job, handle, 1)["v"] == {
        r * 1_000_000 + k: r for r in range(1, 5) for k in range(limit // 2)}


def test_a_savepoint_holds_the_state_at_its_barrier(tmp_path):
    """The task goes on processing while the snapshot thread writes a
    savepoint: what it writes is the state when it was taken."""
    job = tmp_path / "job"
    b = rocks(tmp_path, job=job)
    rng = random.Random(13)
    model: dict = {"v": {}, "m": {}}
    mutate(b, model, rng, 300)
    write_incremental(b, 1)
    mutate(b, model, rng, 300)
    savepoint = b.snapshot(savepoint=True)  # as the task does for a savepoint barrier
    at_savepoint = copy(model)
    mutate(b, model, rng, 600)
    b.flush()
    out = Out()
    blocks = savepoint.write(out)
    h = HeapKeyedStateBackend(M, range(M), StateSerializer())
    restore_blocks(h, out.buf.getvalue(), blocks.key_groups, dict(blocks.states))
    h.get_state(V), h.get_state(MP)
    assert contents(h) == at_savepoint
    handle = write_incremental(b, 3)
    assert not list((tmp_path / "local").rglob("snapshot-*"))
    b.close()
    assert restored(tmp_path, job, handle, 1) == model


def test_a_snapshot_dropped_unwritten_goes_with_the_next_checkpoint(tmp_path):
    """An unaligned checkpoint aborted after its synchronous part: the task
    hands the snapshot back (``discard``, on the snapshot thread) instead of
    leaving a gap that declines the next checkpoint."""
    job = tmp_path / "job"
    b = rocks(tmp_path, job=job)
    rng = random.Random(17)
    model: dict = {"v": {}, "m": {}}
    mutate(b, model, rng, 300)
    first, _ = write_incremental(b, 1)
    mutate(b, model, rng, 300)
    dropped = b.snapshot()
    mutate(b, model, rng, 300)
    dropped.discard()
    dropped.discard()  # idempotent
    handle = write_incremental(b, 3)  # not declined, nothing materialized
    assert handle[0].incremental.shared == first.incremental.shared
    assert len(handle[0].incremental.changelog) == 1
    b.close()
    assert restored(tmp_path, job, handle, 1) == model


class _Faults:
    def hit(self, point: str) -> None:
        pass


def test_a_checkpoint_failing_before_the_keyed_state_leaves_no_gap(tmp_path):
    """The snapshot thread fails a checkpoint before it reaches an
    operator's keyed state (its folder cannot be made), or the task drops
    an aborted unaligned one's: the next checkpoint is not declined for it
    and restores exactly."""
    job = tmp_path / "job"
    b = rocks(tmp_path, job=job)
    sent: list = []
    spec = SimpleNamespace(job_dir=str(job), task_index=0, inline_threshold=0)
    writer = SnapshotWriter(spec, StateSerializer(), _Faults(), sent.append)
    op = SimpleNamespace(uid="op")
    rng = random.Random(23)
    model: dict = {"v": {}, "m": {}}

    def checkpoint(n: int) -> None:
        writer.submit(n, [(op, OperatorSnapshot(b.snapshot()))], read=0, written=0,
                      finished=False, alignment=0.0, final=False)

    try:
        mutate(b, model, rng, 300)
        checkpoint(1)
        mutate(b, model, rng, 300)
        job.mkdir(exist_ok=True)
        (job / "chk-2").write_bytes(b"")  # no folder there: the write fails first
        checkpoint(2)
        mutate(b, model, rng, 300)
        writer.discard([(op, OperatorSnapshot(b.snapshot()))])  # an aborted unaligned one
        mutate(b, model, rng, 300)
        checkpoint(4)
    finally:
        writer.close()
    assert [type(m).__name__ for m in sent] == ["Ack", "Decline", "Ack"]
    handle = sent[-1].handles["op"]
    inc = handle.incremental
    assert inc.shared == sent[0].handles["op"].incremental.shared  # nothing materialized
    data = (job / "chk-4" / handle.file).read_bytes()
    b.close()
    assert restored(tmp_path, job, (handle, data), 1) == model


def test_a_materialization_in_a_snapshot_ends_the_one_under_way(tmp_path):
    """A materialization begun between records (its background flush running)
    and then taken in a snapshot's synchronous part is not taken again."""
    job = tmp_path / "job"
    b = rocks(tmp_path, job=job, max_changelog=1)
    v = b.get_state(V)
    write_incremental(b, 1)
    for k in range(5_000):
        b.current_key = k
        v.update(k)
    write_incremental(b, 2)  # one changelog file: a materialization is due
    for k in range(60_000):  # a memtable big enough for a background flush
        b.current_key = k
        v.update(-k)
    b.flush()
    b.prepare_snapshot(time.monotonic())
    assert b._cutting is not None
    b.chain.broken = True  # the snapshot must materialize at once
    handle = write_incremental(b, 3)
    epoch = b._epoch
    for _ in range(50):
        b.prepare_snapshot(time.monotonic())
        time.sleep(0.01)
    assert b._epoch == epoch and b._cut is None  # not a second time
    b.close()
    assert restored(tmp_path, job, handle, 1)["v"] == {k: -k for k in range(60_000)}
