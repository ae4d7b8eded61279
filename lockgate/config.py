"""Job configuration: checkpointing and restart strategies."""

from __future__ import annotations

import random
from dataclasses import dataclass
from enum import StrEnum

__all__ = [
    "CheckpointingMode",
    "CheckpointConfig",
    "RestartStrategy",
    "FailureHistory",
    "FailureRateRestart",
    "FixedDelayRestart",
    "ExponentialBackoffRestart",
    "NoRestart",
    "RestConfig",
    "AutoscalerConfig",
]


MAX_INLINE_THRESHOLD = 1 << 20
"""The largest ``CheckpointConfig.inline_threshold`` (what a reader of
``_metadata`` accepts inline: ``lockgate.checkpoint.metadata.MAX_INLINE``)."""

DEFAULT_BUFFER_TIMEOUT = 0.01
"""Seconds a record may wait in a task's output buffer for more records to
batch with (``Pipeline(buffer_timeout=...)``)."""


class CheckpointingMode(StrEnum):
    """How barriers are handled by tasks with several inputs."""

    EXACTLY_ONCE = "exactly_once"
    """Aligned barriers: a channel that delivered ``Barrier(n)`` is blocked until
    every input delivered it."""
    AT_LEAST_ONCE = "at_least_once"
    """No blocking: records after a barrier may enter the snapshot's state and
    are replayed after a failure (counted twice)."""


@dataclass(frozen=True)
class CheckpointConfig:
    """Periodic checkpointing.

    Args:
        interval: seconds between the start of two checkpoints (``None`` turns
            periodic checkpoints off; bounded jobs still take a final one).
        storage: checkpoint directory; checkpoints go to ``<storage>/<job-id>/chk-<n>``.
        mode: exactly-once (aligned) or at-least-once (no blocking).
        timeout: seconds after which a pending checkpoint is aborted.
        retained: how many completed checkpoints to keep.
        tolerable_failed_checkpoints: consecutive failed checkpoints the job
            tolerates before it fails (and restarts).
        savepoint_dir: default folder of savepoints (``savepoint``/``stop``
            without a folder); a local path or a URL.
        min_pause: minimum seconds between the end of one checkpoint and the
            start of the next.
        history_size: how many of the newest checkpoints the job's history
            keeps (``JobResult.checkpoints``, ``lockgate checkpoints``); older
            records are dropped so that a long-running job's memory stays flat.
        encrypt_traffic: seal every frame between the driver and the tasks and
            between tasks with AES-256-GCM (keys derived from the job secret),
            for a cluster whose network others share. Off, every frame is
            authenticated (HMAC) but readable on the network. See
            docs/security.md; needs the ``cryptography`` package.
        unaligned: unaligned checkpoints (exactly-once, as Flink's FLIP-76): a
            task snapshots at the first barrier of a checkpoint, the barrier
            overtakes the batches queued in its inputs and outputs, and those
            in-flight batches are stored with the checkpoint and replayed on
            restore. Under backpressure a checkpoint then completes in about
            the time of one batch instead of the time to drain every queue.
            Savepoints and the final checkpoint of a bounded job stay
            aligned; records in flight must be serializable as state is
            (msgpack, or ``Pipeline(allow_pickle=True)``). See docs/checkpoints.md.
        aligned_timeout: start every checkpoint aligned and switch to
            unaligned once it is older than this many seconds (measured from
            its trigger) at a task (Flink's aligned checkpoint timeout); 0 is
            unaligned from the start. Implies ``unaligned``.
        inline_threshold: a task's state file of at most this many bytes is
            not written as a file but kept in the checkpoint's ``_metadata``
            (Flink's ``state.storage.fs.memory-threshold``): small state then
            costs no file and no fsync of its own, and is exactly as durable
            as ``_metadata``. 0 writes every state file; at most 1 MiB.
    """

    interval: float | None = 1.0
    storage: str = "checkpoints"
    mode: CheckpointingMode | str = CheckpointingMode.EXACTLY_ONCE
    timeout: float = 60.0
    retained: int = 3
    tolerable_failed_checkpoints: int = 3
    min_pause: float = 0.0
    savepoint_dir: str | None = None
    history_size: int = 1000
    encrypt_traffic: bool = False
    unaligned: bool = False
    aligned_timeout: float | None = None
    inline_threshold: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "mode", CheckpointingMode(self.mode))
        if self.aligned_timeout is not None:
            if not self.aligned_timeout >= 0:
                raise ValueError(f"aligned_timeout must be >= 0 seconds, got "
                                 f"{self.aligned_timeout}")
            object.__setattr__(self, "unaligned", True)
        if self.unaligned and self.mode != CheckpointingMode.EXACTLY_ONCE:
            raise ValueError("unaligned checkpoints are exactly-once: they cannot be combined "
                             "with mode='at_least_once'")
        if self.history_size < 1:
            raise ValueError(f"history_size must be >= 1, got {self.history_size}")
        if self.interval is not None and self.interval <= 0:
            raise ValueError(f"checkpoint interval must be > 0 seconds, got {self.interval}")
        if self.retained < 1:
            raise ValueError(f"retained must be >= 1, got {self.retained}")
        if not 0 <= self.inline_threshold <= MAX_INLINE_THRESHOLD:
            raise ValueError(f"inline_threshold must be 0 to {MAX_INLINE_THRESHOLD} bytes, got "
                             f"{self.inline_threshold}")


@dataclass(frozen=True)
class FailureHistory:
    """What a restart strategy decides from: the job's failures so far,
    oldest first, the one to decide on last (Flink's failure timestamps and
    the time since the job last ran stably).

    ``times``: when each failure was seen, in seconds of a monotonic clock
    (only differences mean anything); ``uptimes``: how long the attempt that
    failure ended had run with every task running (0: it failed while
    starting); ``reasons``: each failure in words."""

    times: tuple[float, ...]
    uptimes: tuple[float, ...]
    reasons: tuple[str, ...]

    def __post_init__(self) -> None:
        if not self.times or not len(self.times) == len(self.uptimes) == len(self.reasons):
            raise ValueError("a failure history has one time, uptime and reason per failure, "
                             f"and at least one failure; got {len(self.times)} times, "
                             f"{len(self.uptimes)} uptimes and {len(self.reasons)} reasons")

    @property
    def count(self) -> int:
        """The job's failures so far, this one included."""
        return len(self.times)

    def within(self, seconds: float) -> int:
        """The failures less than ``seconds`` before the last one, it included."""
        last = self.times[-1]
        return sum(1 for t in self.times if last - t < seconds)

    def since_stable(self, seconds: float) -> int:
        """The failures since the job last ran ``seconds`` without one: the
        last failures back to the first that ended an attempt that had run
        that long, it included."""
        n = 0
        for uptime in reversed(self.uptimes):
            n += 1
            if uptime >= seconds:
                break
        return n


def _at_least(owner: object, name: str, value: float, low: float, unit: str = "") -> None:
    """A clear error unless ``value`` >= ``low`` (NaN included)."""
    if not value >= low:
        raise ValueError(f"{type(owner).__name__}: {name} must be >= {low}{unit}, got {value}")


def _listed(reasons: tuple[str, ...], most: int = 5) -> str:
    """``reasons`` in one line: a run of the same one once, with its count;
    the last ``most`` runs only."""
    runs: list[tuple[str, int]] = []
    for reason in reasons:
        if runs and runs[-1][0] == reason:
            runs[-1] = (reason, runs[-1][1] + 1)
        else:
            runs.append((reason, 1))
    shown = [reason if n == 1 else f"{reason} ({n} times)" for reason, n in runs[-most:]]
    earlier = sum(n for _, n in runs[:-most])
    return "; ".join([f"{earlier} earlier", *shown] if earlier else shown)


class RestartStrategy:
    """Decides whether, and after which delay, a failed job restarts (Flink's
    ``RestartBackoffTimeStrategy``). A strategy is a value: it keeps no state,
    and decides from the job's :class:`FailureHistory` alone."""

    def delay(self, history: FailureHistory) -> float | None:
        """Seconds to wait before restarting after the last failure of
        ``history``, or ``None``: the job fails."""
        raise NotImplementedError

    def gave_up(self, history: FailureHistory) -> str:
        """Why :meth:`delay` gave up, in words, for the job's failure message."""
        return f"{self!r} gives up after {history.count} failure(s)"


@dataclass(frozen=True)
class NoRestart(RestartStrategy):
    """Fail the job on the first failure."""

    def delay(self, history: FailureHistory) -> float | None:
        return None

    def gave_up(self, history: FailureHistory) -> str:
        return "NoRestart() never restarts"


@dataclass(frozen=True)
class FixedDelayRestart(RestartStrategy):
    """Restart up to ``max_attempts`` times over the job's whole life,
    waiting ``delay_s`` each time (Flink's ``fixed-delay``). A long-running
    job that fails rarely uses its restarts up in the end:
    :class:`FailureRateRestart` forgets old failures."""

    max_attempts: int = 10
    delay_s: float = 0.0

    def __post_init__(self) -> None:
        _at_least(self, "max_attempts", self.max_attempts, 0, " (0: never restart)")
        _at_least(self, "delay_s", self.delay_s, 0, " seconds")

    def delay(self, history: FailureHistory) -> float | None:
        return self.delay_s if history.count <= self.max_attempts else None

    def gave_up(self, history: FailureHistory) -> str:
        return (f"FixedDelayRestart(max_attempts={self.max_attempts}) restarts "
                f"{self.max_attempts} time(s) in the job's life")


@dataclass(frozen=True)
class FailureRateRestart(RestartStrategy):
    """Restart after ``delay_s`` as long as at most
    ``max_failures_per_interval`` failures happened in the last
    ``interval_s`` seconds (this one included); one more fails the job
    (Flink's ``failure-rate``). Old failures are forgotten: a job that fails
    now and then runs for ever, one that fails in a burst stops."""

    max_failures_per_interval: int = 10
    interval_s: float = 600.0
    delay_s: float = 0.0

    def __post_init__(self) -> None:
        _at_least(self, "max_failures_per_interval", self.max_failures_per_interval, 1,
                  " (use NoRestart() to fail on the first failure)")
        if not self.interval_s > 0:
            raise ValueError(f"FailureRateRestart: interval_s must be > 0 seconds (the window "
                             f"failures are counted in), got {self.interval_s}")
        _at_least(self, "delay_s", self.delay_s, 0, " seconds")

    def delay(self, history: FailureHistory) -> float | None:
        return (self.delay_s if history.within(self.interval_s) <= self.max_failures_per_interval
                else None)

    def gave_up(self, history: FailureHistory) -> str:
        n = history.within(self.interval_s)
        span = history.times[-1] - history.times[-n]
        recent = _listed(history.reasons[-n:])
        return (f"FailureRateRestart(max_failures_per_interval={self.max_failures_per_interval}, "
                f"interval_s={self.interval_s:g}) allows {self.max_failures_per_interval} "
                f"failure(s) in {self.interval_s:g} s, and {n} came within {span:.1f} s: {recent}")


@dataclass(frozen=True)
class ExponentialBackoffRestart(RestartStrategy):
    """Restart with a delay that starts at ``initial_delay_s`` and grows by
    ``multiplier`` up to ``max_delay_s``, up to ``max_attempts`` times
    (Flink's ``exponential-delay``). An attempt that ran ``reset_after_s``
    seconds before failing starts over: its delay is the initial one again,
    and the attempts are counted anew. ``jitter``: each delay is moved by a
    random fraction of at most this much, up or down (never beyond
    ``max_delay_s``), so that jobs failing together do not restart together."""

    max_attempts: int = 10
    initial_delay_s: float = 0.1
    max_delay_s: float = 30.0
    multiplier: float = 2.0
    reset_after_s: float = 3600.0
    jitter: float = 0.0

    def __post_init__(self) -> None:
        _at_least(self, "max_attempts", self.max_attempts, 0, " (0: never restart)")
        _at_least(self, "initial_delay_s", self.initial_delay_s, 0, " seconds")
        _at_least(self, "max_delay_s", self.max_delay_s, self.initial_delay_s,
                  " seconds (initial_delay_s)")
        _at_least(self, "multiplier", self.multiplier, 1, " (1: a fixed delay)")
        if not self.reset_after_s > 0:
            raise ValueError(f"ExponentialBackoffRestart: reset_after_s must be > 0 seconds "
                             f"(how long a stable run lasts), got {self.reset_after_s}")
        if not 0 <= self.jitter <= 1:
            raise ValueError(f"ExponentialBackoffRestart: jitter must be 0 to 1 (a fraction of "
                             f"the delay), got {self.jitter}")

    def delay(self, history: FailureHistory) -> float | None:
        n = history.since_stable(self.reset_after_s)
        if n > self.max_attempts:
            return None
        try:
            delay = min(self.max_delay_s, self.initial_delay_s * self.multiplier ** (n - 1))
        except OverflowError:  # a very long streak of failures
            delay = self.max_delay_s
        if self.jitter:
            delay = min(self.max_delay_s, delay * (1 + random.uniform(-self.jitter, self.jitter)))
        return delay

    def gave_up(self, history: FailureHistory) -> str:
        return (f"ExponentialBackoffRestart(max_attempts={self.max_attempts}, "
                f"reset_after_s={self.reset_after_s:g}) restarts {self.max_attempts} time(s) "
                f"without a run of {self.reset_after_s:g} s in between")


@dataclass(frozen=True)
class RestConfig:
    """The driver's REST API (see docs/cli.md), one server per driver process.

    Args:
        host: the address it listens on; the default serves this machine only.
        port: its port; 0 (the default) picks a free one. Clients find it
            through the job's discovery file.
        token: the bearer token every request must carry; ``None`` (the
            default) makes a random one per driver process.

    Run arguments: ``rest=False`` turns it off, ``rest=RestConfig(...)`` sets
    it; ``None`` reads ``LOCKGATE_REST`` (``0`` turns it off),
    ``LOCKGATE_REST_HOST``, ``LOCKGATE_REST_PORT`` and ``LOCKGATE_REST_TOKEN``.
    """

    host: str = "127.0.0.1"
    port: int = 0
    token: str | None = None

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise ValueError(f"REST port must be in [0, 65535] (0: any free port), got {self.port}")
        if self.token is not None and len(self.token) < 16:
            raise ValueError("a REST token must have at least 16 characters; leave it None "
                             "for a random one")


@dataclass(frozen=True)
class AutoscalerConfig:
    """The autoscaler: each vertex's parallelism chosen from the job's own
    metrics, so that it keeps up with its input at ``target_utilization``
    (docs/elasticity.md, *The autoscaler*). Off unless given to
    ``Pipeline(autoscale=...)``.

    Args:
        min: the smallest parallelism it gives a vertex.
        max: the largest (None: the job's ``max_parallelism``); never beyond
            ``max_parallelism`` nor the task slots the launcher has.
        target_utilization: the share of its time a vertex's tasks should be
            busy at the chosen parallelism (0 < u <= 1).
        utilization_boundary: a vertex whose utilization is within
            ``target_utilization`` +/- this is left alone (hysteresis).
        stabilization: seconds after every task of an attempt runs (the
            job's start, a restart, a rescale) before its metrics count.
        window: seconds of metrics each decision averages; a decision waits
            until the window is full.
        cooldown: seconds after a vertex's rescale is done (its tasks run at
            the new parallelism) before it can be scaled the other way.
        catch_up: seconds in which a source's known backlog (records it could
            read but has not) should be worked off on top of its input rate;
            None counts only the backlog's growth.
        exclude: uids of operators whose vertices keep their parallelism.
    """

    min: int = 1
    max: int | None = None
    target_utilization: float = 0.7
    utilization_boundary: float = 0.2
    stabilization: float = 60.0
    window: float = 60.0
    cooldown: float = 300.0
    catch_up: float | None = 300.0
    exclude: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "exclude", tuple(self.exclude))
        for name in ("min", "max"):
            value = getattr(self, name)
            if value is None and name == "max":
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"autoscaler {name} must be an integer >= 1, got {value!r}")
        if self.max is not None and self.max < self.min:
            raise ValueError(f"autoscaler max ({self.max}) is below its min ({self.min})")
        if not 0.0 < self.target_utilization <= 1.0:
            raise ValueError("autoscaler target_utilization must be in (0, 1], got "
                             f"{self.target_utilization!r}")
        if not 0.0 <= self.utilization_boundary < self.target_utilization:
            raise ValueError(
                "autoscaler utilization_boundary must be >= 0 and below target_utilization "
                f"({self.target_utilization}), got {self.utilization_boundary!r}")
        for name in ("stabilization", "window", "cooldown", "catch_up"):
            value = getattr(self, name)
            if value is None and name == "catch_up":
                continue
            if not (isinstance(value, int | float) and not isinstance(value, bool)
                    and 0.0 <= value < 1e9):
                raise ValueError(f"autoscaler {name} must be seconds >= 0, got {value!r}")
        if self.window <= 0 or (self.catch_up is not None and self.catch_up <= 0):
            raise ValueError("autoscaler window and catch_up must be > 0 seconds")
        if not all(isinstance(u, str) and u for u in self.exclude):
            raise ValueError(f"autoscaler exclude takes operator uids, got {self.exclude!r}")
