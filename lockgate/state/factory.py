"""Which keyed state backend an operator gets (:func:`create_keyed_backend`),
and the local copies a job's end removes (:func:`remove_local_copies`): the
one place that knows both backends, above them."""

from __future__ import annotations

from lockgate.state.backend import HeapKeyedStateBackend
from lockgate.state.backends import KeyedStateBackend
from lockgate.state.choice import BackendScope, HeapStateBackend, RocksDBStateBackend, StateBackend
from lockgate.state.serde import StateSerializer

__all__ = ["create_keyed_backend", "remove_local_copies"]


def create_keyed_backend(config: StateBackend | None, max_parallelism: int,
                         key_group_range: range, serializer: StateSerializer,
                         scope: BackendScope | None = None) -> KeyedStateBackend:
    """The keyed state backend of one keyed operator in one task."""
    if config is None or isinstance(config, HeapStateBackend):
        return HeapKeyedStateBackend(max_parallelism, key_group_range, serializer)
    from lockgate.state.rocksdb.backend import RocksDBKeyedStateBackend

    if scope is None:
        raise ValueError("the RocksDB backend needs its scope")
    return RocksDBKeyedStateBackend(config, max_parallelism, key_group_range, serializer,
                                    scope)


def remove_local_copies(config: StateBackend | None, job_id: str) -> None:
    """The job ended: delete its RocksDB backend's local copies on this
    machine (local recovery, :func:`lockgate.state.rocksdb.recovery.remove_job`)."""
    if isinstance(config, RocksDBStateBackend) and config.local_recovery:
        from lockgate.state.rocksdb.recovery import remove_job

        remove_job(config.directory, job_id)
