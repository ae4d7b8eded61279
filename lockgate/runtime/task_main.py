"""Entry point of a local task: ``python -m lockgate.runtime.task_main``, or a
child of the local launcher's fork server (:mod:`lockgate.runtime.forkserver`).

Reads ``(TaskSpec, coordinator address, secret)`` pickled with cloudpickle
(from stdin, or handed over by the fork server), written by the driver that
started this process, never by a peer.
"""

from __future__ import annotations

import time

ENTRY = time.time()  # before the imports: they are part of the start-up breakdown

import logging  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402


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


if __name__ == "__main__":
    sys.exit(main())
