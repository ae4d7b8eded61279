"""Entry point of a local task: ``python -m lockgate.runtime.task_main``, or a
child of a task host (the local launcher's fork server,
:mod:`lockgate.cluster.local.forkserver`; a Spark host), with what a forked task
needs: the task code preloaded, its end tied to the host's.

Reads ``(TaskSpec, coordinator address, secret)`` pickled with cloudpickle
(from stdin, or handed over by the fork server), written by the driver that
started this process, never by a peer.
"""

from __future__ import annotations

import time

ENTRY = time.time()  # before the imports: they are part of the start-up breakdown

import ctypes  # noqa: E402
import logging  # noqa: E402
import os  # noqa: E402
import signal  # noqa: E402
import sys  # noqa: E402
from typing import NoReturn  # noqa: E402

_PR_SET_PDEATHSIG = 1


def main() -> int:
    return run_payload(sys.stdin.buffer.read(), {"entry": ENTRY})


def run_payload(payload: bytes, steps: dict[str, float]) -> int:
    """Run the task ``payload`` describes; its exit code (the driver already
    got the traceback of a failure)."""
    import cloudpickle

    spec, coordinator, secret = cloudpickle.loads(payload)
    logging.basicConfig(
        level=os.environ.get("LOCKGATE_LOG_LEVEL", "WARNING"),
        format=f"%(asctime)s task {spec.task_id} [%(name)s] %(levelname)s %(message)s",
    )
    from lockgate.runtime.steps import mark
    from lockgate.runtime.task import run_task

    mark(steps, "imported")
    try:
        run_task(spec, coordinator, secret, steps=steps)
    except BaseException as e:
        from lockgate.redact import redact

        logging.getLogger("lockgate.task").debug("task failed: %s", redact(repr(e)))
        return 1
    return 0


# -- what a task forked by a task host needs (the local launcher's fork
# server, a Spark host): the task code loaded before the fork, its end
# tied to the host's, and an exit that runs none of the host's cleanup

def preload() -> None:
    """What every task imports, once, before any fork (none starts a thread):
    the task code, and what it imports on first use (the frames' AES-GCM, the
    IDNA codec of the first connection)."""
    import encodings.idna  # noqa: F401

    import cloudpickle  # noqa: F401
    import cryptography.exceptions
    import cryptography.hazmat.primitives.ciphers.aead  # noqa: F401

    import lockgate.runtime.task  # noqa: F401


def die_with_parent(parent: int) -> None:
    """In a forked child: be SIGKILLed when ``parent`` (the process that forked
    this one, single-threaded) ends; end now if it already has."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):  # pragma: no cover - not Linux
        pass
    if os.getppid() != parent:  # it ended before the line above
        os._exit(1)


def end_child(code: int) -> NoReturn:
    """End a forked child with ``code``: its output flushed, and none of the
    parent's cleanup run (``atexit``, finalizers: they are the parent's)."""
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(code)


if __name__ == "__main__":
    sys.exit(main())
