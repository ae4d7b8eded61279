"""Control a job started with ``Pipeline.start``: savepoints, stop, cancel."""

from __future__ import annotations

import threading
from concurrent.futures import Future
from typing import Any, Protocol

from lockgate.api.result import JobResult


class RunningJob(Protocol):
    """What a :class:`JobClient` drives: the job master
    (``lockgate.cluster.jobmaster.JobMaster``, which the API does not import)
    satisfies it by its shape."""

    @property
    def job_id(self) -> str: ...

    def run(self) -> JobResult:
        """Run the job to its end in this thread."""
        ...

    def submit(self, kind: str, **args: Any) -> Future[dict[str, Any]]:
        """Hand a command (``savepoint``, ``stop``, ``rescale``, ``cancel``) to the job."""
        ...

    def status(self) -> dict[str, Any]: ...

    def checkpoint_history(self) -> list[dict[str, Any]]: ...


class JobClient:
    """A job running in a background thread of this driver process.

    ``savepoint()`` takes a savepoint and returns its folder; ``stop()`` takes a
    savepoint and ends the job (with ``drain=True``: sources end their input,
    operators ``finish()``, and the savepoint is the final checkpoint, so
    sinks commit everything); ``cancel()`` ends it at once; ``result()``
    waits for the end and returns the ``JobResult`` (or raises the job's error).
    """

    def __init__(self, master: RunningJob) -> None:
        self.master = master
        self.job_id = master.job_id
        self._result: Future[JobResult] = Future()
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name=f"job-{self.job_id}")
        self._thread.start()

    def _run(self) -> None:
        try:
            self._result.set_result(self.master.run())
        except BaseException as e:
            self._result.set_exception(e)

    def savepoint(self, dir: str | None = None, timeout: float | None = 600) -> str:
        """Take a savepoint now; return its folder."""
        return str(self.master.submit("savepoint", dir=dir).result(timeout)["path"])

    def stop(self, dir: str | None = None, drain: bool = False,
             timeout: float | None = 600) -> JobResult:
        """Stop with a savepoint (see the class); return the job's result."""
        self.master.submit("stop", dir=dir, drain=drain).result(timeout)
        return self.result(timeout)

    def rescale(self, parallelism: int | None = None, *,
                vertices: dict[str, int] | None = None,
                timeout: float | None = 600) -> dict[str, Any]:
        """Run the job at ``parallelism`` (every operator), or its operators
        named by uid in ``vertices`` at theirs, without ending it: a
        synchronous checkpoint, its sinks commit, and the job goes on at the
        new parallelism from it (docs/elasticity.md). Returns when the tasks
        at the new parallelism run: ``parallelism``, ``vertices``,
        ``attempt``, ``checkpoint_id``, ``seconds``. A bad parallelism, or
        too few Spark slots, raises and the job goes on as it is (on a Spark
        cluster after waiting ``spark.scheduler.maxRegisteredResourcesWaitingTime``
        for executors to register)."""
        return self.master.submit("rescale", parallelism=parallelism,
                                  vertices=vertices).result(timeout)

    def cancel(self, timeout: float | None = 600) -> JobResult:
        """End the job now, without a savepoint."""
        self.master.submit("cancel").result(timeout)
        return self.result(timeout)

    def result(self, timeout: float | None = None) -> JobResult:
        return self._result.result(timeout)

    def status(self) -> dict[str, Any]:
        return self.master.status()

    def checkpoints(self) -> list[dict[str, Any]]:
        return self.master.checkpoint_history()
