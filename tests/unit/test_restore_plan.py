"""Which state each task restores, at equal and at changed parallelism."""

from __future__ import annotations

from lockgate.checkpoint.kinds import OperatorStateMode
from lockgate.checkpoint.metadata import OperatorMetadata, StateHandle
from lockgate.checkpoint.restore import distribute_operator_state, plan_keyed_restore
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
