"""Safe serialization of state: msgpack with ext types, no code runs on load.

Values round-trip exactly: a tuple stays a tuple (also nested and as a dict
key), an int stays an int (also beyond 64 bits), and sets, frozensets, dates,
times and decimals keep their types. Any other type is refused with a clear
error unless the pipeline opted in to pickle (``Pipeline(allow_pickle=True)``);
a checkpoint holding pickled values refuses to load without that opt-in.
"""

from __future__ import annotations

import datetime as dt
import decimal
import io
import pickle
from collections.abc import Callable
from typing import Any

import msgpack

from lockgate.errors import LockgateError

__all__ = ["StateSerializationError", "StateSerializer", "key_bytes"]

EXT_TUPLE = 1
EXT_BIGINT = 2
EXT_SET = 3
EXT_FROZENSET = 4
EXT_DATETIME = 5
EXT_DATE = 6
EXT_TIME = 7
EXT_TIMEDELTA = 8
EXT_DECIMAL = 9
EXT_PICKLE = 127

_PLAIN = "None, bool, int, float, str, bytes, list, tuple, dict, set, frozenset, datetime, Decimal"


class StateSerializationError(LockgateError, TypeError):
    """A value cannot be stored, or stored state cannot be loaded safely."""


class StateSerializer:
    """Encodes state values and records with msgpack; pickle only on opt-in.

    Not thread-safe: ``dumps`` packs into one buffer, so each thread that
    packs (the task thread, the snapshot writer) has a serializer of its own."""

    def __init__(self, allow_pickle: bool = False) -> None:
        self.allow_pickle = allow_pickle
        self._pack: Callable[[Any], bytes] = self._packer().pack
        self._inner_packers: list[msgpack.Packer] = []
        """The packers of values nested in an ext type (a tuple, a set...),
        one per depth of nesting, made once: ``msgpack.packb`` would make a
        packer, and allocate its buffer, for every tuple."""
        self._depth = 0

    def _packer(self) -> msgpack.Packer:
        return msgpack.Packer(default=self._default, strict_types=True, use_bin_type=True,
                              autoreset=True)

    def dumps(self, obj: Any) -> bytes:
        return self._pack(obj)

    def loads(self, data: bytes | memoryview) -> Any:
        return msgpack.unpackb(data, ext_hook=self._ext_hook, raw=False,
                               strict_map_key=False, use_list=True)

    # -- encoding ---------------------------------------------------------
    def _default(self, obj: Any) -> Any:
        t = type(obj)
        if t is tuple:
            return msgpack.ExtType(EXT_TUPLE, self._inner(list(obj)))
        if t is int:  # beyond 64 bits
            return msgpack.ExtType(EXT_BIGINT, str(obj).encode())
        if t is set:
            return msgpack.ExtType(EXT_SET, self._inner(list(obj)))
        if t is frozenset:
            return msgpack.ExtType(EXT_FROZENSET, self._inner(list(obj)))
        if t is dt.datetime:
            return msgpack.ExtType(EXT_DATETIME, self._inner(
                [obj.replace(tzinfo=None).isoformat(),
                 None if obj.utcoffset() is None else obj.utcoffset().total_seconds()]))
        if t is dt.date:
            return msgpack.ExtType(EXT_DATE, obj.isoformat().encode())
        if t is dt.time:
            return msgpack.ExtType(EXT_TIME, obj.isoformat().encode())
        if t is dt.timedelta:
            return msgpack.ExtType(EXT_TIMEDELTA, self._inner(
                [obj.days, obj.seconds, obj.microseconds]))
        if t is decimal.Decimal:
            return msgpack.ExtType(EXT_DECIMAL, str(obj).encode())
        if self.allow_pickle:
            # a class of the job script is registered first (a task's __main__
            # is not the script): lockgate.state.script_classes
            from lockgate.state.script_classes import dumps

            return msgpack.ExtType(EXT_PICKLE, dumps(obj))
        raise StateSerializationError(
            f"cannot store a value of type {t.__module__}.{t.__qualname__} in state without "
            f"pickle: use plain types ({_PLAIN}) or opt in to pickle with "
            "Pipeline(..., allow_pickle=True)"
        )

    def _inner(self, obj: Any) -> bytes:
        # a packer of the next depth: the outer one is in the middle of
        # packing the value this one is part of
        depth = self._depth
        packers = self._inner_packers
        if depth == len(packers):
            packers.append(self._packer())
        self._depth = depth + 1
        try:
            data: bytes = packers[depth].pack(obj)
        finally:
            self._depth = depth
        return data

    # -- decoding ---------------------------------------------------------
    def _ext_hook(self, code: int, data: bytes) -> Any:
        if code == EXT_TUPLE:
            return tuple(self.loads(data))
        if code == EXT_BIGINT:
            return int(data.decode())
        if code == EXT_SET:
            return set(self.loads(data))
        if code == EXT_FROZENSET:
            return frozenset(self.loads(data))
        if code == EXT_DATETIME:
            iso, offset = self.loads(data)
            value = dt.datetime.fromisoformat(iso)
            if offset is not None:
                value = value.replace(tzinfo=dt.timezone(dt.timedelta(seconds=offset)))
            return value
        if code == EXT_DATE:
            return dt.date.fromisoformat(data.decode())
        if code == EXT_TIME:
            return dt.time.fromisoformat(data.decode())
        if code == EXT_TIMEDELTA:
            d, s, us = self.loads(data)
            return dt.timedelta(days=d, seconds=s, microseconds=us)
        if code == EXT_DECIMAL:
            return decimal.Decimal(data.decode())
        if code == EXT_PICKLE:
            if not self.allow_pickle:
                raise StateSerializationError(
                    "the state holds pickled objects; loading them would execute code. "
                    "Pass allow_pickle=True only if you trust this checkpoint"
                )
            return _ScriptUnpickler(io.BytesIO(data)).load()
        raise StateSerializationError(f"unknown msgpack extension type {code} in state")


class _ScriptUnpickler(pickle.Unpickler):
    """Names a class of the job script this process does not know, with the fix."""

    def find_class(self, module: str, name: str) -> Any:
        try:
            return super().find_class(module, name)
        except AttributeError:
            if module != "__main__":
                raise
            raise StateSerializationError(
                f"the state holds a pickled {name} of the job script (__main__), and this "
                f"process does not know that class: run the job's own script (it defines "
                f"{name}), or move {name} into a module the script imports") from None


_KEYS = StateSerializer(allow_pickle=False)


def key_bytes(key: Any) -> bytes:
    """Canonical bytes of a key, for hashing (never pickle)."""
    return _KEYS.dumps(key)
