"""State has value semantics: nothing user code does to an object it got from
state, or handed to it, reaches live state, a snapshot being written, or a
record already emitted."""

from __future__ import annotations

import io
from dataclasses import dataclass

from lockgate.connectors.base import TaskInfo
from lockgate.graph.jobgraph import OperatorSpec
from lockgate.runtime.operators import ReduceOperator
from lockgate.state.backend import (
    HeapKeyedStateBackend,
    ListStateDescriptor,
    MapStateDescriptor,
    ValueStateDescriptor,
)
from lockgate.state.serde import StateSerializer
from lockgate.state.values import private_copy


def backend() -> HeapKeyedStateBackend:
    return HeapKeyedStateBackend(8, range(8), StateSerializer())


def written(snapshot) -> dict:
    """What a snapshot writes, read back: {state: {key: value}}."""
    buf = io.BytesIO()
    handle = snapshot.write(buf)
    data, out = buf.getvalue(), {}
    for off, n in handle.key_groups.values():
        _, content = StateSerializer().loads(data[off:off + n])
        for name, entries in content.items():
            out.setdefault(name, {}).update({k: v for k, v in entries})
    return out


def test_the_in_place_idiom_never_changes_a_snapshot_being_written():
    b = backend()
    acc = b.get_state(ValueStateDescriptor("acc", default={"n": 0, "items": []}))
    b.current_key = "k"
    for i in range(3):
        a = acc.value()
        a["n"] += 1
        a["items"].append(i)
        acc.update(a)
    snap = b.snapshot()  # the synchronous part; write() runs later, elsewhere
    a = acc.value()
    a["n"] += 100
    a["items"].append(99)
    acc.update(a)
    a["n"] = -1  # after update: changes neither the state nor the snapshot
    assert written(snap)["acc"]["k"] == {"n": 3, "items": [0, 1, 2]}
    assert acc.value() == {"n": 103, "items": [0, 1, 2, 99]}


def test_a_mutable_default_is_not_shared_between_keys():
    b = backend()
    seen = b.get_state(ValueStateDescriptor("seen", default=[]))
    b.current_key = "a"
    s = seen.value()
    s.append(1)
    seen.update(s)
    b.current_key = "b"
    assert seen.value() == []
    seen.value().append(2)  # not written back: no effect
    assert seen.value() == []
    b.current_key = "a"
    assert seen.value() == [1]


def test_list_state_elements_are_copied_both_ways():
    b = backend()
    lst = b.get_state(ListStateDescriptor("buf"))
    b.current_key = 1
    record = {"sum": 1}
    lst.add(record)
    record["sum"] = 50  # after add: no effect
    snap = b.snapshot()
    items = lst.get()
    items[0]["sum"] += 1  # mutating what get() returned, then writing it back
    lst.update(items)
    items[0]["sum"] = 1000
    assert written(snap)["buf"][1] == [{"sum": 1}]
    assert lst.get() == [{"sum": 2}]


def test_map_state_values_are_copied_both_ways():
    b = backend()
    m = b.get_state(MapStateDescriptor("m"))
    b.current_key = 1
    v = {"sum": 1}
    m.put("acc", v)
    v["sum"] = 7
    snap = b.snapshot()
    got = m.get("acc")
    got["sum"] += 1
    m.put("acc", got)
    for _, value in m.items():
        value["sum"] = -1
    for value in m.values():
        value["sum"] = -2
    assert written(snap)["m"][1] == {"acc": {"sum": 1}}
    assert m.get("acc") == {"sum": 2}


def reduce_operator(fn) -> ReduceOperator:
    spec = OperatorSpec(uid="sums", kind="reduce", fn=fn, key_selector=lambda r: r[0])
    op = ReduceOperator(spec, TaskInfo(task_index=0, parallelism=1, max_parallelism=8,
                                       attempt=0, job_id="j", uid="sums"))
    op.open(StateSerializer())
    return op


def fold(a, b):
    a[1] += b[1]
    return a


def test_a_reduce_that_mutates_its_accumulator_emits_every_running_value():
    op = reduce_operator(fold)
    out = op.process([["k", 1], ["k", 2], ["k", 3]])
    snap = op.backend.snapshot()
    out += op.process([["k", 4]])
    assert out == [["k", 1], ["k", 3], ["k", 6], ["k", 10]]
    assert written(snap)["reduce"]["k"] == ["k", 6]
    out[-1][1] = 0  # a downstream operator changing its input in place
    assert op.process([["k", 5]]) == [["k", 15]]


def test_a_reduce_whose_first_record_is_changed_downstream():
    op = reduce_operator(fold)
    first = op.process([["k", 1]])
    first[0][1] = 1000
    assert op.process([["k", 2]]) == [["k", 3]]


def test_reduce_over_immutable_values_stores_the_values_themselves():
    op = reduce_operator(lambda a, b: (a[0], a[1] + b[1]))
    out = op.process([("k", 1), ("k", 2)])
    assert out == [("k", 1), ("k", 3)]
    assert op._values["k"] is out[-1]  # no copy on the fast path


def test_a_reduce_switching_from_immutable_to_mutable_mid_batch():
    op = reduce_operator(lambda a, b: [a[0], a[1] + b[1]])
    out = op.process([("k", 1), ("k", 2), ("k", 3), ("j", 1)])
    assert out == [("k", 1), ["k", 3], ["k", 6], ("j", 1)]
    out[1][1] = out[2][1] = -5
    assert op.process([("k", 1)]) == [["k", 7]]


@dataclass
class Point:
    x: int


def test_private_copy_shares_nothing_mutable():
    nested = {"a": [1, {"b": {2, 3}}], "t": (1, [2]), "p": Point(1), "s": "x", "f": (1, "y")}
    c = private_copy(nested)
    assert c == nested
    c["a"][1]["b"].add(4)
    c["t"][1].append(3)
    c["p"].x = 9
    assert nested == {"a": [1, {"b": {2, 3}}], "t": (1, [2]), "p": Point(1), "s": "x",
                      "f": (1, "y")}
    assert c["f"] is nested["f"] and c["s"] is nested["s"]


def test_a_reduce_copies_a_tuple_that_holds_a_mutable_value():
    op = reduce_operator(lambda a, b: (a[0], a[1] + b[1]))
    out = op.process([("k", [1]), ("k", [2])])
    assert out == [("k", [1]), ("k", [1, 2])]
    out[0][1].append(99)  # downstream changes what it got: the state does not
    out[1][1].append(98)
    assert op.process([("k", [3])]) == [("k", [1, 2, 3])]


def test_a_reduce_restored_with_tuples_of_numbers_copies_nothing():
    op = reduce_operator(lambda a, b: (a[0], a[1] + b[1]))
    op._values["k"] = ("k", 5)  # as a restore leaves it
    out = op.process([("k", 1)])
    assert out == [("k", 6)] and op._only_immutable
    assert op._values["k"] is out[0]
