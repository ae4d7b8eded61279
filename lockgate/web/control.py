"""What the REST server needs from a job: :class:`JobControl`.

The web package serves jobs without importing the code that runs them; the
job master (``lockgate.cluster.jobmaster.JobMaster``) satisfies this protocol
by its shape, and tests serve small fakes of it.
"""

from __future__ import annotations

from concurrent.futures import Future
from typing import Any, Protocol

__all__ = ["JobControl", "Named"]


class Named(Protocol):
    """Something with a name (a job's pipeline)."""

    @property
    def name(self) -> str: ...


class JobControl(Protocol):
    """A running job as the REST server sees it: reads copy its state, and
    every action is a command it serves on its own loop."""

    @property
    def job_id(self) -> str: ...

    @property
    def pipeline(self) -> Named: ...

    @property
    def state(self) -> str:
        """``created``, ``running``, ``finished``, ``stopped``, ``cancelled`` or ``failed``."""
        ...

    @property
    def guarantee(self) -> str | None:
        """The end-to-end guarantee the job's parts allow (``None`` until it runs)."""
        ...

    def status(self) -> dict[str, Any]:
        """A copy of the job's status (``GET /jobs/<id>``)."""
        ...

    def checkpoint_history(self) -> list[dict[str, Any]]:
        """A copy of its checkpoints, each with a ``status``."""
        ...

    def metrics(self) -> dict[str, Any]:
        """The dashboard's and ``/metrics``' figures (``GET /jobs/<id>/metrics``):
        ``job``, ``vertices`` (with ``tasks``), ``checkpoints``, ``restarts``,
        ``savepoints``, ``autoscaler``."""
        ...

    def submit(self, kind: str, **args: Any) -> Future[dict[str, Any]]:
        """Hand ``kind`` (``savepoint``, ``stop``, ``rescale``, ``cancel``) to
        the job; a job that cannot do it now (or a rescale it refuses) answers
        with a future already failed."""
        ...
