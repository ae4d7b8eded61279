"""State time-to-live, as configured (Flink's ``StateTtlConfig``), and the
pure parts every state backend shares: how a TTL state is named in a
checkpoint, when a stored value is expired, and the snapshot filter that
leaves expired entries out of a checkpoint or savepoint.

A state with TTL stores each value together with the time it was last
written (or read, with :attr:`UpdateType.ON_READ_AND_WRITE`): a value state
holds ``(value, timestamp)``, a list state one such pair per element, a map
state one per entry (:mod:`lockgate.state.ttl` wraps a backend's handles to
read and write that form). Time is processing time, milliseconds since the
epoch, as in Flink; a test injects its own ``clock``.

Kept free of imports of the backends, so each backend imports it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from enum import StrEnum
from typing import Any

__all__ = [
    "UpdateType",
    "StateVisibility",
    "IncrementalCleanup",
    "StateTtlConfig",
    "TTL_SUFFIX",
    "stored_kind",
    "structure_kind",
    "is_ttl_kind",
    "kind_change_message",
    "expired",
    "SnapshotFilter",
    "expiry_filter",
    "snapshot_filter",
    "snapshot_filters",
    "wall_clock_ms",
]


class UpdateType(StrEnum):
    """When a value's timestamp is renewed (Flink's ``UpdateType``)."""

    ON_CREATE_AND_WRITE = "on_create_and_write"
    """By ``update``, ``add``, ``put`` and their kind only."""
    ON_READ_AND_WRITE = "on_read_and_write"
    """By writes and by every read that returns the value."""


class StateVisibility(StrEnum):
    """Whether an expired value that is still stored may be returned."""

    NEVER_RETURN_EXPIRED = "never_return_expired"
    RETURN_EXPIRED_IF_NOT_CLEANED_UP = "return_expired_if_not_cleaned_up"
    """Returned once by the read that finds it, which also removes it."""


@dataclass(frozen=True)
class IncrementalCleanup:
    """Flink's incremental cleanup: every access of the state checks ``size``
    more of its entries (keys) for expiry and removes what expired; with
    ``run_for_every_record``, every record the operator processes does too.
    The entries are visited in rounds over all keys of the task, so a key
    never touched again is still removed within a round."""

    size: int = 5
    run_for_every_record: bool = False

    def __post_init__(self) -> None:
        if type(self.size) is not int or self.size < 1:
            raise ValueError(f"IncrementalCleanup.size must be an int >= 1, got {self.size!r}")


def wall_clock_ms() -> int:
    """Processing time: milliseconds since the epoch."""
    return int(time.time() * 1000)


@dataclass(frozen=True)
class StateTtlConfig:
    """Time to live of a keyed state: ``ValueStateDescriptor("seen",
    ttl=StateTtlConfig(timedelta(hours=1)))``.

    - ``ttl``: milliseconds (an int) or a ``timedelta``; more than 0.
    - ``update_type``: when the timestamp is renewed (:class:`UpdateType`).
    - ``state_visibility``: :class:`StateVisibility`.
    - ``cleanup_full_snapshot``: expired entries are left out of every
      checkpoint and savepoint (the check runs on the snapshot thread).
    - ``cleanup_incrementally``: :class:`IncrementalCleanup`, or None for none.
      Reads always remove the expired values they find.
    - ``clock``: milliseconds now; the wall clock unless a test injects one
      (it runs in the task: a function of the task's own objects, or picklable).

    Turning TTL on or off for a state that a checkpoint holds is refused at
    restore, as in Flink: the stored forms differ. The duration and the
    options may change between runs.
    """

    ttl: int | timedelta
    update_type: UpdateType = UpdateType.ON_CREATE_AND_WRITE
    state_visibility: StateVisibility = StateVisibility.NEVER_RETURN_EXPIRED
    cleanup_full_snapshot: bool = True
    cleanup_incrementally: IncrementalCleanup | None = IncrementalCleanup()
    clock: Callable[[], int] | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        ttl = self.ttl
        ms = (ttl // timedelta(milliseconds=1) if isinstance(ttl, timedelta)
              else ttl if type(ttl) is int else None)
        if ms is None or ms <= 0:
            raise ValueError(
                f"StateTtlConfig.ttl must be a positive number of milliseconds (int) or a "
                f"timedelta of at least 1 ms, got {ttl!r}")
        object.__setattr__(self, "update_type", UpdateType(self.update_type))
        object.__setattr__(self, "state_visibility", StateVisibility(self.state_visibility))
        if self.cleanup_incrementally is not None and not isinstance(
                self.cleanup_incrementally, IncrementalCleanup):
            raise TypeError("cleanup_incrementally takes an IncrementalCleanup or None, got "
                            f"{self.cleanup_incrementally!r}")

    @property
    def ttl_ms(self) -> int:
        ttl = self.ttl
        return ttl // timedelta(milliseconds=1) if isinstance(ttl, timedelta) else ttl

    def now(self) -> int:
        """The current time of this state's clock, in milliseconds."""
        return int(time.time() * 1000) if self.clock is None else int(self.clock())


# ----------------------------------------------------------------- in checkpoints

TTL_SUFFIX = "+ttl"
"""A TTL state's kind in a checkpoint (``StateHandle.states``) is its
structure's kind with this suffix: ``value+ttl``, ``list+ttl``, ``map+ttl``."""


def stored_kind(kind: str, ttl: StateTtlConfig | None) -> str:
    """The kind a state is recorded with: ``kind``, marked when it has TTL."""
    return str(kind) if ttl is None else f"{kind}{TTL_SUFFIX}"


def is_ttl_kind(kind: str) -> bool:
    return kind.endswith(TTL_SUFFIX)


def structure_kind(kind: str) -> str:
    """``value``, ``list`` or ``map`` of a recorded kind, TTL or not: how its
    per-key objects are shaped (what a snapshot copies one level deep)."""
    return kind[:-len(TTL_SUFFIX)] if kind.endswith(TTL_SUFFIX) else kind


def kind_change_message(name: str, was: str, now: str, *, in_checkpoint: bool) -> str:
    """Why state ``name``, recorded as ``was``, cannot be used as ``now``,
    and the fix."""
    where = " in the checkpoint" if in_checkpoint else ""
    if structure_kind(was) == structure_kind(now):
        with_or = "with" if is_ttl_kind(was) else "without"
        turned = "off" if is_ttl_kind(was) else "on"
        return (
            f"state {name!r} was stored {with_or} TTL{where} and is now registered "
            f"{'without' if is_ttl_kind(was) else 'with'} it: TTL cannot be turned {turned} "
            "for an existing state (its stored form differs, as in Flink). Keep the "
            "descriptor's ttl as it was (None or a StateTtlConfig; its duration may change), "
            "or use a new state name")
    verb = "is now asked for as" if not in_checkpoint else "is now registered as"
    return (f"state {name!r} was a {was} state{where} and {verb} a {now} state; "
            "use a new state name for the new type")


def expired(timestamp: int, now: int, ttl_ms: int) -> bool:
    """Flink's rule: expired once ``timestamp + ttl <= now``."""
    return timestamp + ttl_ms <= now


SnapshotFilter = Callable[[Any], Any]
"""A stored per-key object -> what a snapshot writes of it, or None: nothing."""


def _stamp_ok(pair: Any, deadline: int) -> bool:
    """A ``(value, timestamp)`` pair not expired at ``deadline`` (``now - ttl``).
    Anything else is kept as it is: a snapshot never judges what it cannot read."""
    return not (type(pair) is tuple and len(pair) == 2 and type(pair[1]) is int
                and pair[1] <= deadline)


def expiry_filter(structure: str, ttl_ms: int, now: int) -> SnapshotFilter:
    """A stored per-key object of a TTL state of ``structure`` (``value``,
    ``list``, ``map``) -> what of it has not expired at ``now``: the same
    object when nothing did, a new container when some did, None when all
    did. Pure and thread-safe: it never changes the object it is given."""
    deadline = now - ttl_ms
    if structure == "list":
        def list_filter(elements: Any) -> Any:
            if type(elements) is not list:
                return elements
            kept = [e for e in elements if _stamp_ok(e, deadline)]
            return elements if len(kept) == len(elements) else kept or None
        return list_filter
    if structure == "map":
        def map_filter(entries: Any) -> Any:
            if type(entries) is not dict:
                return entries
            kept = {k: v for k, v in entries.items() if _stamp_ok(v, deadline)}
            return entries if len(kept) == len(entries) else kept or None
        return map_filter

    def value_filter(pair: Any) -> Any:
        return pair if _stamp_ok(pair, deadline) else None
    return value_filter


def snapshot_filter(kind: str, config: StateTtlConfig, now: int) -> SnapshotFilter | None:
    """The filter that leaves out what expired at ``now`` from a snapshot of
    one TTL state of the recorded ``kind`` (:func:`expiry_filter`); None when
    nothing is filtered."""
    if not config.cleanup_full_snapshot or not is_ttl_kind(kind):
        return None
    return expiry_filter(structure_kind(kind), config.ttl_ms, now)


def snapshot_filters(configs: Mapping[str, StateTtlConfig],
                     kinds: Mapping[str, str]) -> dict[str, SnapshotFilter]:
    """The snapshot filter of every registered TTL state (``configs``: name ->
    its descriptor's TTL; ``kinds``: name -> recorded kind), each at its own
    clock's time now. A backend calls this in the synchronous part of a
    snapshot and applies each filter to every stored per-key object of its
    state as it writes a full snapshot (the heap backend in
    ``KeyedStateSnapshot.write``)."""
    out: dict[str, SnapshotFilter] = {}
    for name, config in configs.items():
        f = snapshot_filter(kinds.get(name, ""), config, config.now())
        if f is not None:
            out[name] = f
    return out
