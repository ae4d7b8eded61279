"""Which state each task restores, at equal and at changed parallelism."""

from __future__ import annotations

import pytest

from lockgate.checkpoint.kinds import OperatorStateMode
from lockgate.checkpoint.metadata import OperatorMetadata, StateHandle
from lockgate.checkpoint.restore import distribute_operator_state, plan_keyed_restore
from lockgate.errors import CheckpointCorruptError
from lockgate.state.keygroups import key_group_range


def op_meta(parallelism: int, m: int) -> OperatorMetadata:
    subtasks: list[StateHandle | None] = []
    for i in range(parallelism):
        kgs = {kg: (kg * 10, 10) for kg in key_group_range(i, parallelism, m)}
        subtasks.append(StateHandle(f"op-{i}.state", 10 * len(kgs), 0, 0, kgs,
                                    {"s": "value"}))
    return OperatorMetadata(parallelism, OperatorStateMode.SPLIT, subtasks)


def test_each_key_group_restored_exactly_once_at_any_parallelism():
    m = 16
    meta = op_meta(3, m)
    for p in (1, 2, 3, 4, 16):
        seen = []
        for i in range(p):
            plan = plan_keyed_restore(meta, i, p, m)
            seen += [off // 10 for _, off, _ in plan.blocks]
            assert plan.states == {"s": "value"}
        assert sorted(seen) == list(range(m))


def test_split_state_same_parallelism_keeps_own_entries():
    per = [[{"s": 0}], [{"s": 1}, {"s": 2}]]
    assert distribute_operator_state(per, "split", 1, 2) == [{"s": 1}, {"s": 2}]


def test_split_state_rescaled_round_robin_loses_nothing():
    per = [[1, 2], [3], [4, 5, 6]]
    got = [distribute_operator_state(per, "split", i, 2) for i in range(2)]
    assert sorted(got[0] + got[1]) == [1, 2, 3, 4, 5, 6]


def test_union_state_goes_to_everyone():
    per = [[1], [2]]
    assert distribute_operator_state(per, "union", 0, 3) == [1, 2]
    assert distribute_operator_state(per, "union", 2, 3) == [1, 2]


def _incremental(start: int, stop: int) -> dict:
    return {"backend": "rocksdb", "key_groups": [start, stop], "private": {"CURRENT": [0, 16]},
            "shared": {"000008.sst": [f"op-0-c1-{start:016x}.sst", 10]}}


def test_each_subtask_claims_only_the_key_groups_it_owned():
    """Read back from ``_metadata`` (untrusted): a subtask's incremental
    range is the range it owned, its canonical blocks lie in it, so no two
    handles claim one key group and none is left out."""
    m = 16

    def read(subtasks: list) -> OperatorMetadata:
        return OperatorMetadata.from_json({"parallelism": len(subtasks), "subtasks": subtasks},
                                          "_metadata", "sums", m)

    def handle(i: int, **more: object) -> dict:
        return {"file": f"op-{i}.state", "size": 100, "crc32": 0, **more}

    good = read([handle(0, incremental=_incremental(0, 8)),
                 handle(1, incremental=_incremental(8, 16))])
    assert [h.incremental.key_groups for h in good.subtasks if h and h.incremental] == [
        (0, 8), (8, 16)]
    read([handle(0, key_groups={"7": [0, 10]}), None])  # canonical blocks in its range
    for bad in (
        [handle(0, incremental=_incremental(0, 9)), handle(1, incremental=_incremental(8, 16))],
        [handle(0, incremental=_incremental(0, 8)), handle(1, incremental=_incremental(9, 16))],
        [handle(0, incremental=_incremental(0, 16)), None],
        [handle(0, key_groups={"8": [0, 10]}), handle(1, key_groups={"8": [0, 10]})],
        [None] * (m + 1),
    ):
        with pytest.raises(CheckpointCorruptError):
            read(bad)
