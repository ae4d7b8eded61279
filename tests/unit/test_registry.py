"""Every kind of operator of the job graph has a runtime operator, its
module imported on first use (lockgate/runtime/registry.py)."""

from __future__ import annotations

from lockgate.api.plan import OperatorKind
from lockgate.runtime.operators import StreamOperator
from lockgate.runtime.registry import modules_of, operator_class
from tests.fixtures import modules_imported_by


def test_every_kind_but_a_union_has_a_runtime_operator_in_the_module_named() -> None:
    for kind in OperatorKind:
        if kind == OperatorKind.UNION:
            assert modules_of([kind]) == []
            continue
        cls = operator_class(kind)
        assert issubclass(cls, StreamOperator)
        assert modules_of([kind]) == [cls.__module__]


def test_the_task_code_loads_no_operator_it_does_not_run() -> None:
    assert modules_imported_by("import lockgate.runtime.task", (
        "asyncio", "lockgate.runtime.async_io", "lockgate.runtime.windows",
        "lockgate.runtime.interval_join")) == []
