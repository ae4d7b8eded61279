"""``ctx.apply_to_keyed_state`` in ``process_broadcast_element`` of a
``KeyedBroadcastProcessFunction``: it visits every key of the task with a
value in the state, on the heap and on RocksDB, against a plain dict kept
beside; changes (updates and clears) land in the keyed state; outside
``process_broadcast_element`` it is refused."""

from __future__ import annotations

import random

import pytest

from lockgate import MapStateDescriptor, ValueStateDescriptor
from lockgate.api.broadcast import KeyedBroadcastProcessFunction
from lockgate.api.connected import CoSpec
from lockgate.api.plan import OperatorKind
from lockgate.connectors.base import TaskInfo
from lockgate.errors import PipelineDefinitionError
from lockgate.graph.jobgraph import OperatorSpec
from lockgate.runtime.broadcast_process import BroadcastProcessOperator
from lockgate.state.backends import RocksDBStateBackend, close_backend
from lockgate.state.serde import StateSerializer

M = 16
RULES = MapStateDescriptor("rules")
TOTAL = ValueStateDescriptor("total", default=0)


class Scale(KeyedBroadcastProcessFunction):
    """Data ``(key, n)`` adds ``n`` to the key's total; a broadcast
    ``("scale", f)`` multiplies every total by ``f`` and emits what it saw,
    ``("drop", k)`` clears the totals of key ``k``."""

    def open(self, ctx):
        self.total = ctx.get_state(TOTAL)

    def process_element(self, value, ctx):
        if value == "visit":
            ctx.apply_to_keyed_state(TOTAL, lambda k, s: None)
        self.total.update(self.total.value() + value[1])
        return None

    def process_broadcast_element(self, value, ctx):
        seen = []
        op, arg = value

        def visit(key, state):
            seen.append((key, state.value()))
            if op == "scale":
                state.update(state.value() * arg)
            elif key == arg:
                state.clear()
        ctx.apply_to_keyed_state(TOTAL, visit)
        return [sorted(seen)]


@pytest.fixture(params=["heap", "rocksdb"])
def op(request, tmp_path):
    o = BroadcastProcessOperator(
        OperatorSpec("b", OperatorKind.BROADCAST_PROCESS,
                     CoSpec(Scale(), (lambda r: r[0], None), (RULES,), "union"),
                     lambda r: r[0]),
        TaskInfo("job", "b", 0, 1, M, 0))
    if request.param == "rocksdb":
        pytest.importorskip("rocksdict")
        o.setup(RocksDBStateBackend(local_dir=str(tmp_path / "rocks"), memory_mb=16,
                                    incremental=False), str(tmp_path / "job"))
    o.open(StateSerializer())
    yield o
    if o.backend is not None:
        close_backend(o.backend)


def test_apply_to_keyed_state_visits_every_key_against_a_dict(op):
    rnd = random.Random(5)
    ref: dict[int, int] = {}
    for _ in range(30):
        batch = [(rnd.randrange(40), rnd.randrange(1, 9)) for _ in range(rnd.randrange(1, 20))]
        op.process_input(0, batch)
        for k, n in batch:
            ref[k] = ref.get(k, 0) + n
        if rnd.random() < 0.5:
            f = rnd.randrange(2, 4)
            assert op.process_input(1, [("scale", f)]) == [sorted(ref.items())]
            ref = {k: v * f for k, v in ref.items()}
        else:
            k = rnd.choice(sorted(ref))
            assert op.process_input(1, [("drop", k)]) == [sorted(ref.items())]
            del ref[k]
    assert op.process_input(1, [("scale", 1)]) == [sorted(ref.items())]
    assert sorted(op.backend.state_keys(TOTAL.name)) == sorted(ref)


def test_apply_to_keyed_state_only_in_process_broadcast_element(op):
    with pytest.raises(Exception, match="apply_to_keyed_state is for process_broadcast"):
        op.process_input(0, ["visit"])
    with pytest.raises(PipelineDefinitionError, match="state descriptor"):
        op.ctx.writable = True
        try:
            op.ctx.apply_to_keyed_state(RULES.name, lambda k, s: None)
        finally:
            op.ctx.writable = False
