"""The broadcast process operator: a (keyed or not) data input 0 and a
broadcast input 1 (every record of it reaches every task, ``Partitioning.BROADCAST``).

Broadcast state is one ``dict`` per descriptor name, the same in every task
(every task applies every broadcast record). A snapshot stores this task's
copy as one UNION operator-state entry ``("broadcast", task index, {name:
dict})``. On restore every task sees every old task's entry and takes the
one of old task ``task_index % old parallelism``: its own at the same
parallelism, round-robin at another (as Flink does). Keyed state and timers
of a keyed data input go through the keyed state backend as in any keyed
operator, so they move by key group.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from lockgate.api.broadcast import (
    BroadcastContext,
    BroadcastState,
    Descriptor,
    ReadOnlyBroadcastState,
)
from lockgate.checkpoint.kinds import OperatorStateMode
from lockgate.errors import CheckpointCorruptError, PipelineDefinitionError
from lockgate.runtime.coprocess import CoContext, CoProcessOperator, NoTimers
from lockgate.runtime.operators import OperatorSnapshot, user_hook
from lockgate.state.backend import ListStateDescriptor, MapStateDescriptor, ValueStateDescriptor
from lockgate.state.serde import StateSerializer
from lockgate.state.values import private_copy

__all__ = ["BroadcastProcessOperator", "BROADCAST_ENTRY"]

BROADCAST_ENTRY = "broadcast"


class _Context(CoContext, BroadcastContext):
    writable = False

    def get_broadcast_state(self, descriptor: MapStateDescriptor) -> ReadOnlyBroadcastState:
        op = self._op
        assert isinstance(op, BroadcastProcessOperator)
        if not isinstance(descriptor, MapStateDescriptor):
            raise PipelineDefinitionError(
                f"get_broadcast_state takes a MapStateDescriptor, got {descriptor!r}")
        table = op.broadcast_state.get(descriptor.name)
        if table is None:
            raise PipelineDefinitionError(
                f"no broadcast state {descriptor.name!r}: the stream was broadcast with "
                f"{sorted(op.broadcast_state)}")
        return BroadcastState(table) if self.writable else ReadOnlyBroadcastState(table)

    @property
    def current_key(self) -> Any:
        if self.writable:
            raise PipelineDefinitionError(
                "process_broadcast_element has no current key (it runs for every task)")
        return super().current_key

    def apply_to_keyed_state(self, descriptor: Descriptor,
                             fn: Callable[[Any, Any], None]) -> None:
        backend = self._op.backend
        if not self.writable or backend is None:
            BroadcastContext.apply_to_keyed_state(self, descriptor, fn)
        assert backend is not None
        kinds = (ValueStateDescriptor, ListStateDescriptor, MapStateDescriptor)
        if not isinstance(descriptor, kinds):
            raise PipelineDefinitionError(
                f"apply_to_keyed_state takes a state descriptor, got {descriptor!r}")
        state = self._state(descriptor, type(descriptor))
        before = backend.current_key
        try:
            for key in list(backend.state_keys(descriptor.name)):
                backend.current_key = key
                with user_hook(self._op.uid, "apply_to_keyed_state"):
                    fn(key, state)
        finally:
            backend.current_key = before


class BroadcastProcessOperator(CoProcessOperator):
    """Runs a ``BroadcastProcessFunction`` or ``KeyedBroadcastProcessFunction``."""

    operator_state_mode = OperatorStateMode.UNION

    def open(self, serializer: StateSerializer) -> None:
        descriptors: tuple[MapStateDescriptor, ...] = self.co.extra
        self.broadcast_state: dict[str, dict[Any, Any]] = {d.name: {} for d in descriptors}
        super().open(serializer)

    def _context(self) -> CoContext:
        return _Context(self, self.timers if self.timers is not None else NoTimers())

    def _elements(self) -> tuple[Any, ...]:
        return ()

    def process_input(self, index: int, batch: list[Any]) -> list[Any]:
        if index == 0:
            return self._data(batch)
        ctx = self.ctx
        assert isinstance(ctx, _Context)
        element = self.fn.process_broadcast_element
        out: list[Any] = []
        ctx.writable = True
        try:
            for r in batch:
                res = element(r, ctx)
                if res is not None:
                    out.extend(res)
        finally:
            ctx.writable = False
        return out

    def _data(self, batch: list[Any]) -> list[Any]:
        element, ctx, backend = self.fn.process_element, self.ctx, self.backend
        out: list[Any] = []
        if backend is None:
            for r in batch:
                res = element(r, ctx)
                if res is not None:
                    out.extend(res)
            return out
        key_of = self.co.key_selectors[0]
        assert key_of is not None
        for r in batch:
            backend.current_key = key_of(r)
            res = element(r, ctx)
            if res is not None:
                out.extend(res)
        return out

    def snapshot(self, checkpoint_id: int, savepoint: bool = False) -> OperatorSnapshot:
        keyed = self.backend.snapshot(savepoint) if self.backend is not None else None
        entry = (BROADCAST_ENTRY, self.info.task_index, private_copy(self.broadcast_state))
        return OperatorSnapshot(keyed, [entry])

    def restore_operator_state(self, entries: list[Any] | None,
                               committed: bool = False) -> None:
        if not entries:
            return
        copies: dict[int, Any] = {}
        for e in entries:
            if (not isinstance(e, tuple) or len(e) != 3 or e[0] != BROADCAST_ENTRY
                    or not isinstance(e[1], int) or not isinstance(e[2], dict)):
                raise CheckpointCorruptError(
                    f"operator {self.uid!r}: a broadcast state entry is malformed")
            copies[e[1]] = e[2]
        if sorted(copies) != list(range(len(copies))):
            raise CheckpointCorruptError(
                f"operator {self.uid!r}: broadcast state of tasks {sorted(copies)}, "
                f"expected 0..{len(copies) - 1}")
        restored = copies[self.info.task_index % len(copies)]
        for name, table in restored.items():
            if name in self.broadcast_state and isinstance(table, dict):
                self.broadcast_state[name] = table
        # a descriptor the checkpoint lacks starts empty; one the job dropped is dropped

    def end_input(self) -> list[Any]:
        with user_hook(self.uid, "end_input"):
            return list(self.fn.end_input(self.ctx) or [])
