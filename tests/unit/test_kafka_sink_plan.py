"""The Kafka sink's recovery plan (pure): which restored transactions and
old transactional ids a task takes over, and entries of a crafted checkpoint
refused before any transaction is touched."""

from __future__ import annotations

import pytest

from lockgate.connectors.kafka.sink_plan import (
    KafkaEntry,
    KafkaTxnHandle,
    RecoveryPlan,
    check_entry,
    committed,
    plan_recovery,
    transactional_id,
)
from lockgate.connectors.twophase import Precommitted, decode_precommitted
from lockgate.errors import CheckpointCorruptError

UID = "out"


def handle(task: int, cid: int, job: str = "job-1", records=None) -> dict:
    return {"tid": transactional_id("lockgate", job, UID, task), "writer": "w", "seq": cid,
            "records": records if records is not None else [[b"k", b"v"]],
            "checkpoint_id": cid, "task_index": task}


def handle_kv(keys, values, cid: int = 3) -> dict:
    """A handle as the sink writes it: keys and values, two lists."""
    entry = {k: v for k, v in handle(0, cid).items() if k != "records"}
    return {**entry, "keys": keys, "values": values}


def decoded(entry: dict) -> Precommitted[KafkaEntry]:
    """A restored entry as the two-phase-commit base hands it to ``recover``."""
    return decode_precommitted(entry, UID, lambda e: check_entry(e, "lockgate", UID))


def plan(entries: list[dict], task_index: int, parallelism: int, own_tid: str) -> RecoveryPlan:
    return plan_recovery([decoded(e) for e in entries], task_index, parallelism, own_tid)


def test_keys_and_values_or_older_pairs_are_the_records():
    h = check_entry(handle_kv([b"k", None], [b"v", b"w"]), "lockgate", UID)
    assert isinstance(h, KafkaTxnHandle) and h.records == [(b"k", b"v"), (None, b"w")]
    old = check_entry(handle(0, 3, records=[[b"k", b"v"]]), "lockgate", UID)
    assert isinstance(old, KafkaTxnHandle) and old.records == [(b"k", b"v")]
    # written back as the sink writes it: keys and values
    assert old.to_state() == {k: v for k, v in handle_kv([b"k"], [b"v"]).items()
                              if k not in ("checkpoint_id", "task_index")}


def owner(task: int, cid: int, job: str = "job-1") -> dict:
    return {"owner": transactional_id("lockgate", job, UID, task), "checkpoint_id": cid,
            "task_index": task}


def test_each_old_task_is_taken_over_by_one_new_task():
    entries = [handle(t, c) for t in range(3) for c in (5, 4)] + [owner(t, 5) for t in range(3)]
    plans = [plan(entries, i, 2, transactional_id("lockgate", "job-2", UID, i))
             for i in range(2)]
    taken = sorted((h.task_index, h.checkpoint_id) for p in plans for h in p.handles)
    assert taken == sorted((t, c) for t in range(3) for c in (4, 5))
    assert [h.checkpoint_id for h in plans[0].handles] == [4, 4, 5, 5]  # checkpoint order
    # ids of old tasks without a handle are fenced by their new owner
    entries = [owner(t, 5) for t in range(3)] + [handle(0, 5)]
    fenced = plan(entries, 0, 1, transactional_id("lockgate", "job-2", UID, 0))
    assert fenced.fence == [transactional_id("lockgate", "job-1", UID, t) for t in (1, 2)]


def test_the_marker_says_which_transactions_committed():
    h = decoded(handle(0, 7))
    assert isinstance(h.handle, KafkaTxnHandle)
    assert not committed(None, h) and not committed(6, h)
    assert committed(7, h) and committed(9, h)


@pytest.mark.parametrize("entry", [
    {**handle(0, 3), "tid": "other-app-producer"},                  # not this sink's id
    {**handle(0, 3), "tid": transactional_id("lockgate", "j", "other", 0)},
    {**handle(0, 3), "tid": transactional_id("lockgate", "j", UID, 1)},  # another task's
    {**handle(0, 3), "tid": transactional_id("lockgate", "a/b", UID, 0)},
    handle(0, 3, records=[[b"k"]]),
    handle(0, 3, records=[["k", "v"]]),
    handle_kv([b"k", b"l"], [b"v"]),                                  # lengths differ
    handle_kv([b"k"], ["v"]),                                         # not bytes
    handle_kv((b"k",), (b"v",)),                                      # not lists
    handle_kv([b"k"], None),
    {**handle(0, 3), "checkpoint_id": "3"},
    {**handle(0, 3), "seq": None},
    {**owner(0, 3), "owner": "someone-else"},
])
def test_crafted_entries_are_refused(entry):
    with pytest.raises(CheckpointCorruptError):
        plan([entry], 0, 1, "lockgate-j-out-0")
