"""The runtime of the Arrow path (``lockgate/api/arrow.py``): operators on
``pyarrow.RecordBatch`` es, and routing a batch's rows by key group without
Python rows (the per-channel buffers of Arrow output are
:class:`lockgate.runtime.output.ArrowOutput`).

Key groups: a row's key group is the one the row path gives the same key
(``state/keygroups.py``: a hash of the key's msgpack bytes), so an Arrow
operator's state and a row operator's agree, and ``read_state`` or a
savepoint written by ``write_savepoint`` mean the same. It is computed once
per distinct key, not per row: integer keys through a lookup table indexed by
the key (numpy), other keys through Arrow's dictionary encoding of the batch's
key column; either way the per-row work is vectorized.

pyarrow is imported on first use: a task without Arrow operators never loads it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from lockgate.api.arrow import ArrowAggregate, ArrowStep
from lockgate.runtime.operators import KeyedOperator, StreamOperator
from lockgate.state.backend import ValueStateDescriptor
from lockgate.state.keygroups import KeyGroupAssigner
from lockgate.state.serde import StateSerializer

__all__ = ["ArrowAggregateOperator", "ArrowStepOperator", "KeyRouter",
           "is_arrow"]

LUT_LIMIT = 1 << 20
"""Integer keys spanning at most this many values route through a lookup table."""
SPLIT_BY_MASK = 4
"""Up to this many channels, a batch is split with one mask per channel."""


def is_arrow(batch: Any) -> bool:
    """Whether ``batch`` is a record batch (rather than a list of records)."""
    return not isinstance(batch, list) and hasattr(batch, "schema")


def _as_batch(out: Any, what: str) -> Any:
    import pyarrow as pa

    if isinstance(out, pa.RecordBatch):
        return out
    if isinstance(out, pa.Table):
        return out.combine_chunks().to_batches()[0] if out.num_rows else \
            pa.RecordBatch.from_pylist([], schema=out.schema)
    raise TypeError(f"{what} must return a pyarrow.RecordBatch, got {type(out).__name__}")


# ------------------------------------------------------------------ operators


class ArrowStepOperator(StreamOperator):
    """``map_arrow``, ``filter_arrow``, ``to_rows`` and ``to_arrow``."""

    def process(self, batch: Any) -> Any:
        step: ArrowStep = self.spec.fn
        op = step.op
        if op == "map":
            assert step.fn is not None
            return _as_batch(step.fn(batch), "map_arrow's function")
        if op == "filter":
            import pyarrow as pa

            assert step.fn is not None
            mask = step.fn(batch)
            if not isinstance(mask, pa.Array | pa.ChunkedArray):
                mask = pa.array(mask, type=pa.bool_())
            return batch.filter(mask)
        if op == "to_rows":
            rows: list[Any] = batch.to_pylist()
            return rows
        return _rows_to_batch(batch, step.schema)


def _rows_to_batch(rows: list[Any], schema: Any) -> Any:
    import pyarrow as pa

    if rows and all(isinstance(r, dict) for r in rows):
        return pa.RecordBatch.from_pylist(rows, schema=schema)
    if schema is not None:
        return pa.RecordBatch.from_arrays([pa.array(rows, type=schema.field(0).type)],
                                          schema=schema)
    return pa.RecordBatch.from_pydict({"value": rows})


_PART_KINDS = ("sum", "count", "min", "max")


class ArrowAggregateOperator(KeyedOperator):
    """``aggregate_arrow``: per batch, Arrow's group-by computes each key's
    partial aggregates; they are merged (vectorized) into the state, one tuple
    of accumulators per key in the keyed value state ``aggregate_arrow``; the
    batch's keys go out with their updated aggregates."""

    STATE = ValueStateDescriptor("aggregate_arrow")

    def open(self, serializer: StateSerializer) -> None:
        super().open(serializer)
        assert self.backend is not None
        self.backend.get_state(self.STATE)
        self._values = self.backend.raw(self.STATE.name)
        plan: ArrowAggregate = self.spec.fn
        self.key = plan.key
        parts: list[tuple[str, str]] = []  # (column, sum|count|min|max): the state's slots

        def slot(column: str, kind: str) -> int:
            if (column, kind) not in parts:
                parts.append((column, kind))
            return parts.index((column, kind))

        self.outputs: list[tuple[str, str, tuple[int, ...]]] = []
        for name, column, how in plan.outputs:
            if how == "mean":
                self.outputs.append((name, how, (slot(column, "sum"), slot(column, "count"))))
            else:
                self.outputs.append((name, how, (slot(column, how),)))
        self.parts = parts
        self._slot_keys: list[int] = []
        self._slots = IntTable(self._new_slots)

    def process(self, batch: Any) -> Any:
        import pyarrow as pa
        import pyarrow.compute as pc

        if not len(batch):
            return batch
        key = self.key
        found = self._partials_by_table(batch)
        keys, partials = found if found is not None else self._partials_by_group_by(batch)
        key_list = keys.to_pylist()
        olds = list(map(self._values.get, key_list))
        fresh = [o is None for o in olds]
        merged: list[Any] = []
        for j, (_column, kind) in enumerate(self.parts):
            new = partials[j]
            if all(fresh):
                merged.append(new)
                continue
            old = pa.array([None if o is None else o[j] for o in olds], type=new.type)
            if kind == "min":
                merged.append(pc.min_element_wise(old, new, skip_nulls=True))
            elif kind == "max":
                merged.append(pc.max_element_wise(old, new, skip_nulls=True))
            else:  # sum, count: a side that is null (no value yet) counts as nothing
                merged.append(pc.coalesce(pc.add_checked(old, new), old, new))
        values = [m.to_pylist() for m in merged]
        updated = zip(key_list, zip(*values, strict=True), strict=True)
        if isinstance(self._values, dict):  # the heap backend
            self._values.update(updated)
        else:  # a backend's mapping view (RocksDB): written back per key
            for k, accumulators in updated:
                self._values[k] = accumulators
        columns = [keys]
        for _name, how, slots in self.outputs:
            if how == "mean":
                total, count = merged[slots[0]], merged[slots[1]]
                mean = pc.divide(pc.cast(total, pa.float64(), safe=False), count)
                columns.append(pc.if_else(pc.greater(count, 0), mean,
                                          pa.scalar(None, pa.float64())))
            else:
                columns.append(merged[slots[0]])
        names = [key] + [name for name, _, _ in self.outputs]
        return pa.RecordBatch.from_arrays(columns, names=names)


    def _partials_by_group_by(self, batch: Any) -> tuple[Any, list[Any]]:
        """The batch's keys and partial aggregates by Arrow's hash group-by.
        Its integer sums wrap on overflow, so a sum that might overflow is
        taken as the sums of the values' high and low 32 bits, added exactly
        in Python: an int64 overflow then fails the batch (``ArrowInvalid``)."""
        import pyarrow as pa
        import pyarrow.compute as pc

        table = pa.Table.from_batches([batch])
        aggregations: list[tuple[str, str]] = []
        split: dict[int, str] = {}
        for j, (column, kind) in enumerate(self.parts):
            arr = batch.column(column)
            if kind == "sum" and pa.types.is_integer(arr.type) and _might_overflow(arr):
                hi, lo = f"__hi_{j}", f"__lo_{j}"
                table = table.append_column(hi, pc.shift_right(arr, 32)).append_column(
                    lo, pc.bit_wise_and(arr, pa.scalar(0xFFFFFFFF, arr.type)))
                aggregations += [(hi, "sum"), (lo, "sum")]
                split[j] = column
            else:
                aggregations.append((column, kind))
        grouped = table.group_by(self.key, use_threads=False).aggregate(aggregations)
        partials = []
        for j, (column, kind) in enumerate(self.parts):
            if j in split:
                his = grouped.column(f"__hi_{j}_sum").to_pylist()
                los = grouped.column(f"__lo_{j}_sum").to_pylist()
                partials.append(pa.array(
                    [None if h is None else (h << 32) + lo for h, lo in zip(his, los, strict=True)],
                    type=batch.column(column).type))
            else:
                partials.append(grouped.column(f"{column}_{kind}").combine_chunks())
        return grouped.column(self.key).combine_chunks(), partials

    def _partials_by_table(self, batch: Any) -> tuple[Any, list[Any]] | None:
        """The batch's keys and partial aggregates with numpy, without hashing:
        for an integer key column without nulls whose keys fit a table
        (``IntTable``: key -> a dense slot of this operator), and numeric
        columns without nulls whose sums cannot overflow. None otherwise (then
        Arrow's group-by computes them)."""
        import numpy as np
        import pyarrow as pa

        keys = batch.column(self.key)
        if not pa.types.is_integer(keys.type) or keys.null_count:
            return None
        columns = {}
        for column, _kind in self.parts:
            arr = batch.column(column)
            if arr.null_count or not (pa.types.is_integer(arr.type)
                                      or pa.types.is_floating(arr.type)):
                return None
            columns[column] = arr.to_numpy()
        slots = self._slots.lookup(keys.to_numpy())
        n_slots = len(self._slot_keys)
        if slots is None or n_slots > 4 * len(batch):
            return None
        counts = np.bincount(slots, minlength=n_slots)
        touched = np.flatnonzero(counts)
        partials = []
        for column, kind in self.parts:
            v = columns[column]
            if kind == "count":
                partials.append(pa.array(counts[touched]))
                continue
            if kind == "sum":
                if v.dtype.kind in "iu" and _might_overflow(v):
                    return None  # Arrow's group-by path sums such a column exactly
                acc = np.zeros(n_slots, dtype=np.float64 if v.dtype.kind == "f" else np.int64)
                np.add.at(acc, slots, v)
            else:
                info = np.finfo(v.dtype) if v.dtype.kind == "f" else np.iinfo(v.dtype)
                acc = np.full(n_slots, info.max if kind == "min" else info.min, dtype=v.dtype)
                (np.minimum if kind == "min" else np.maximum).at(acc, slots, v)
            partials.append(pa.array(acc[touched]))
        slot_keys = np.asarray(self._slot_keys)
        return pa.array(slot_keys[touched]).cast(keys.type), partials

    def _new_slots(self, new: Any) -> Any:
        start = len(self._slot_keys)
        self._slot_keys.extend(new.tolist())
        return range(start, start + len(new))


def _might_overflow(values: Any) -> bool:
    """Whether an int64 sum of ``values`` (an Arrow or numpy array of
    integers) could leave the range of int64."""
    import pyarrow.compute as pc

    if hasattr(values, "dtype"):  # numpy
        lo, hi = int(values.min()), int(values.max())
    else:
        bounds = pc.min_max(values).as_py()
        if bounds["min"] is None:
            return False
        lo, hi = bounds["min"], bounds["max"]
    return len(values) * max(abs(lo), abs(hi)) >= 1 << 63


# ------------------------------------------------------------------ routing


class IntTable:
    """Values of integer keys through a numpy table indexed by the key (keys
    spanning at most :data:`LUT_LIMIT` values); ``compute`` gives the values
    of keys not seen yet (a numpy array of distinct keys -> a sequence)."""

    def __init__(self, compute: Callable[[Any], Any]) -> None:
        self.compute = compute
        self._lut: Any = None
        self._base = 0

    def lookup(self, a: Any) -> Any:
        """The values of the keys ``a`` (numpy), or None when they are too sparse."""
        import numpy as np

        lo, hi = int(a.min()), int(a.max())
        lut, base = self._lut, self._base
        if lut is None or lo < base or hi >= base + len(lut):
            start = lo if lut is None else min(lo, base)
            end = hi + 1 if lut is None else max(hi + 1, base + len(lut))
            if end - start > LUT_LIMIT:
                if hi + 1 - lo > LUT_LIMIT:
                    return None  # too sparse for a table
                start, end, lut = lo, hi + 1, None
            grown = np.full(end - start, -1, dtype=np.int64)
            if lut is not None:
                grown[base - start: base - start + len(lut)] = lut
            self._lut, self._base = lut, base = grown, start
        lut = self._lut
        offsets = a - base
        found = lut[offsets]
        missing = found < 0
        if missing.any():
            new = np.unique(a[missing])
            lut[new - base] = self.compute(new)
            found = lut[offsets]
        return found


class KeyRouter:
    """The target channel of every row of a key column, by key group."""

    def __init__(self, max_parallelism: int, parallelism: int) -> None:
        self.assigner = KeyGroupAssigner(max_parallelism)
        self.parallelism = parallelism
        self._table = IntTable(lambda new: self.assigner.route(new.tolist(), parallelism))

    def targets(self, keys: Any) -> Any:
        """A numpy array: the channel of each key of ``keys`` (an Arrow array)."""
        import numpy as np
        import pyarrow as pa

        n = self.parallelism
        if n == 1:
            return np.zeros(len(keys), dtype=np.int64)
        if pa.types.is_integer(keys.type) and keys.null_count == 0 and len(keys):
            found = self._table.lookup(keys.to_numpy())
            if found is not None:
                return found
        encoded = keys.dictionary_encode(null_encoding="encode")
        per_key = np.array(self.assigner.route(encoded.dictionary.to_pylist(), n),
                           dtype=np.int64)
        return per_key[encoded.indices.to_numpy(zero_copy_only=False)]


def split_by_target(batch: Any, targets: Any, n: int) -> list[tuple[int, Any]]:
    """``(channel, rows of batch for it)`` for every channel that gets rows."""
    import numpy as np
    import pyarrow as pa

    if n <= SPLIT_BY_MASK:
        out = []
        for i in range(n):
            rows = np.flatnonzero(targets == i)
            if len(rows) == len(batch):
                return [(i, batch)]
            if len(rows):
                out.append((i, batch.take(pa.array(rows))))
        return out
    order = np.argsort(targets, kind="stable")
    counts = np.bincount(targets, minlength=n)
    ordered = batch.take(pa.array(order))
    out, start = [], 0
    for i, c in enumerate(counts.tolist()):
        if c:
            out.append((i, ordered.slice(start, c)))
            start += c
    return out
