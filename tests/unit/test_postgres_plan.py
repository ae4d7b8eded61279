"""The PostgreSQL two-phase-commit sink's transaction names and recovery plan
(pure), and the Redis stream source's ids and deal: no server."""

from __future__ import annotations

import pytest

from lockgate.connectors.postgres_plan import (
    MAX_GID,
    PgTxnHandle,
    check_handle,
    make_gid,
    parse_gid,
    plan_postgres_recovery,
)
from lockgate.connectors.redis_streams import _check_entry, deal_streams, parse_id
from lockgate.connectors.twophase import Precommitted, decode_precommitted
from lockgate.errors import CheckpointCorruptError, ConfigurationError


def handle(task: int, chk: int, uid: str = "out", attempt: int = 0, job: str = "j-1") -> dict:
    return {"gid": make_gid(job, uid, task, attempt, chk), "xid": 1000 + chk, "rows": 3,
            "task_index": task, "checkpoint_id": chk}


def decoded(entries: list[dict], uid: str = "out") -> list[Precommitted[PgTxnHandle]]:
    """Restored entries as the two-phase-commit base hands them to ``recover``."""
    return [decode_precommitted(e, uid, lambda h: check_handle(h, uid)) for e in entries]


def test_gid_round_trips_and_names_every_part():
    gid = make_gid("sums-ab12cd34", "out", 3, 7, 42)
    assert gid == "lockgate:sums-ab12cd34:out:3:7:42"
    p = parse_gid(gid)
    assert p is not None
    assert (p.job, p.uid, p.task_index, p.attempt, p.checkpoint_id) == (
        "sums-ab12cd34", "out", 3, 7, 42)


def test_a_long_job_id_is_cut_to_fit_and_a_huge_uid_refused():
    gid = make_gid("x" * 400 + "-tail1234", "out", 1, 2, 3)
    assert len(gid.encode()) <= MAX_GID and gid.endswith("-tail1234:out:1:2:3")
    assert parse_gid(gid) is not None
    with pytest.raises(ConfigurationError, match="shorter uid"):
        make_gid("job", "u" * 200, 0, 0, 0)


@pytest.mark.parametrize("gid", [
    None, 5, "", "lockgate:j:out:0:0", "lockgate:j:out:0:0:x", "other:j:out:0:0:1",
    "lockgate:j:o/ut:0:0:1", "lockgate:j:out:0:0:1'; DROP TABLE t; --",
    "lockgate:j\n:out:0:0:1", "lockgate:j:out:0:0:1\n", "lockgate:" + "j" * 300 + ":out:0:0:1"])
def test_anything_but_a_gid_of_this_sink_is_refused(gid):
    assert parse_gid(gid) is None
    with pytest.raises(CheckpointCorruptError):
        decoded([{"gid": gid, "xid": 5, "task_index": 0, "checkpoint_id": 1}])


@pytest.mark.parametrize("bad", [
    {"xid": "5"}, {"xid": -1}, {"xid": 0}, {"xid": 2 ** 64}, {"task_index": "0"},
    {"checkpoint_id": -1}, {"gid": make_gid("j", "other", 0, 0, 1)}])
def test_a_crafted_handle_is_refused(bad):
    with pytest.raises(CheckpointCorruptError):
        decoded([{**handle(0, 1), **bad}])
    assert check_handle(handle(0, 1), "out").to_state() == {
        k: v for k, v in handle(0, 1).items() if k not in ("task_index", "checkpoint_id")}


def test_recovery_commits_own_handles_in_order_and_rolls_back_the_unnamed():
    handles = [handle(0, 5), handle(1, 5), handle(0, 4), handle(2, 5)]
    prepared = [h["gid"] for h in handles] + [
        make_gid("j-1", "out", 0, 0, 6),   # after the checkpoint: roll back
        make_gid("j-0", "out", 0, 3, 9),   # an older job (driver restarted): roll back
        make_gid("j-1", "out", 1, 0, 6),   # task 1's: not task 0's business
        make_gid("j-1", "out", 3, 0, 6),   # a task beyond the parallelism: task 0's
        make_gid("j-1", "other", 0, 0, 6),  # another sink
        "someone-elses-xa-transaction",
    ]
    plan = plan_postgres_recovery(prepared, decoded(handles), "out", 0, 2)
    assert [h.checkpoint_id for h in plan.to_commit] == [4, 5, 5]
    assert {h.task_index for h in plan.to_commit} == {0, 2}  # 2 % 2 == 0
    assert plan.to_roll_back == sorted([make_gid("j-0", "out", 0, 3, 9),
                                        make_gid("j-1", "out", 0, 0, 6),
                                        make_gid("j-1", "out", 3, 0, 6)])
    plan1 = plan_postgres_recovery(prepared, decoded(handles), "out", 1, 2)
    assert [h.task_index for h in plan1.to_commit] == [1]
    assert plan1.to_roll_back == [make_gid("j-1", "out", 1, 0, 6)]


def test_a_fresh_start_rolls_back_everything_of_its_uid_it_owns():
    prepared = [make_gid("j", "out", t, 0, 1) for t in range(4)]
    assert plan_postgres_recovery(prepared, [], "out", 0, 1).to_roll_back == prepared


def test_stream_ids_order_numerically_and_crafted_ones_are_refused():
    assert parse_id("10-0") > parse_id("9-99") and parse_id("5-10") > parse_id("5-9")
    for bad in ("0", "$", "1-", "-1", "1-2-3", 7, None, "1-2\n"):
        with pytest.raises(CheckpointCorruptError):
            parse_id(bad)
    with pytest.raises(CheckpointCorruptError):
        _check_entry({"stream": "s", "last": "../x", "end": None}, ["s"])
    assert _check_entry({"stream": "gone", "last": "1-0", "end": None}, ["s"]) is None


def test_streams_are_dealt_round_robin_by_name_at_any_parallelism():
    splits = [{"stream": s, "last": "0-0", "end": None} for s in ("c", "a", "d", "b", "e")]
    for p in (1, 2, 3, 7):
        dealt = [deal_streams(splits, i, p) for i in range(p)]
        names = sorted(s["stream"] for part in dealt for s in part)
        assert names == ["a", "b", "c", "d", "e"]
    assert [s["stream"] for s in deal_streams(splits, 1, 2)] == ["b", "d"]
