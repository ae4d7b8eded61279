"""Async I/O: calls to an external service from a stream (Flink's
``AsyncDataStream``), with ``DataStream.async_map``.

The user's function is an ``async def`` (or an :class:`AsyncFunction`, which
adds ``open``/``close`` hooks on the operator's event loop and a ``timeout``
handler). Each task of the operator runs one asyncio event loop in a thread
of its own; at most ``capacity`` requests are in flight per task::

    async def lookup(user_id):
        reader, writer = await asyncio.open_connection("profiles", 7000)
        ...
        return (user_id, profile)

    enriched = clicks.async_map(lookup, capacity=64, ordered=False, timeout=2.0,
                                uid="profiles")

Ordered mode emits results in input order; unordered mode as they complete,
but never across a watermark (a watermark leaves only after every result of
the records before it). The input records of requests not yet emitted at a
checkpoint are part of it and are issued again on recovery, so downstream
sees every result exactly once (the service may see a request twice: make
it idempotent, as for any retry).
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from lockgate.errors import PipelineDefinitionError, UserFunctionError

T = TypeVar("T")
U = TypeVar("U")

__all__ = ["AsyncContext", "AsyncFunction", "AsyncSpec", "AsyncTimeoutError", "as_async_function"]


class AsyncTimeoutError(UserFunctionError):
    """A request of an async operator took longer than its ``timeout`` and the
    function has no ``timeout`` handler: the attempt fails (and restarts by
    the job's restart strategy; the request is issued again)."""


@dataclass(frozen=True)
class AsyncContext:
    """What an :class:`AsyncFunction`'s ``open`` sees of its task."""

    uid: str
    task_index: int
    parallelism: int
    attempt: int


class AsyncFunction(Generic[T, U]):
    """A function that calls an external service (Flink's ``RichAsyncFunction``).

    ``invoke`` is a coroutine: the result it returns is the output record.
    ``open`` and ``close`` run on the operator's event loop (open a
    connection pool in ``open``, keep it on ``self``). ``timeout`` gives the
    result for a record whose request timed out; by default it raises
    :class:`AsyncTimeoutError`, which fails the attempt.

    Example::

        class Lookup(AsyncFunction):
            async def open(self, ctx):
                self.conn = await asyncio.open_connection("127.0.0.1", 7000)

            async def invoke(self, key):
                reader, writer = self.conn   # one request at a time per connection!
                ...

            def timeout(self, key):
                return (key, None)           # a default instead of failing
    """

    async def open(self, ctx: AsyncContext) -> None:
        """Called once per task on the event loop, before the first request."""

    async def invoke(self, value: T) -> U:
        raise NotImplementedError

    def timeout(self, value: T) -> U:
        """The result for ``value`` whose request timed out (called on the
        task's thread). The default raises :class:`AsyncTimeoutError`."""
        raise AsyncTimeoutError(f"the request for {_short(value)} timed out")

    async def close(self) -> None:
        """Called once per task on the event loop; also after a failure."""


class _CoroutineFunction(AsyncFunction[Any, Any]):
    """An ``async def`` (and an optional timeout handler) as an AsyncFunction."""

    def __init__(self, fn: Callable[[Any], Awaitable[Any]],
                 on_timeout: Callable[[Any], Any] | None) -> None:
        self.fn = fn
        self.on_timeout = on_timeout
        self.__name__ = getattr(fn, "__name__", "async_map")

    async def invoke(self, value: Any) -> Any:
        return await self.fn(value)

    def timeout(self, value: Any) -> Any:
        if self.on_timeout is None:
            return super().timeout(value)
        return self.on_timeout(value)


@dataclass(frozen=True)
class AsyncSpec:
    """The job graph's description of an async operator (``Node.fn``)."""

    fn: AsyncFunction[Any, Any]
    capacity: int
    ordered: bool
    timeout: float | None

    @property
    def __name__(self) -> str:  # the node's name in the graph
        return getattr(self.fn, "__name__", type(self.fn).__name__)


def as_async_function(fn: Any, *, capacity: int, ordered: bool, timeout: float | None,
                      on_timeout: Callable[[Any], Any] | None) -> AsyncSpec:
    """Check ``async_map``'s arguments; the operator's :class:`AsyncSpec`."""
    if isinstance(fn, AsyncFunction):
        if on_timeout is not None:
            raise PipelineDefinitionError(
                "on_timeout= is for a plain async def; an AsyncFunction overrides timeout()")
        func: AsyncFunction[Any, Any] = fn
    elif inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(
            getattr(fn, "__call__", None)):  # noqa: B004 - an object with async __call__
        func = _CoroutineFunction(fn, on_timeout)
    else:
        raise PipelineDefinitionError(
            f"async_map takes an async def or an AsyncFunction, got {fn!r}; "
            "for a blocking call use map()")
    if type(capacity) is not int or capacity < 1:
        raise PipelineDefinitionError(f"capacity must be an int >= 1, got {capacity!r}")
    if timeout is not None and not (isinstance(timeout, int | float) and timeout > 0):
        raise PipelineDefinitionError(f"timeout must be > 0 seconds or None, got {timeout!r}")
    if on_timeout is not None and not callable(on_timeout):
        raise PipelineDefinitionError(f"on_timeout must be callable, got {on_timeout!r}")
    return AsyncSpec(func, capacity, bool(ordered), float(timeout) if timeout else None)


def _short(value: Any) -> str:
    try:
        text = repr(value)
    except Exception:
        text = f"<{type(value).__name__}>"
    return text if len(text) <= 200 else text[:200] + "..."
