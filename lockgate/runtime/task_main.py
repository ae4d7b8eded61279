"""Subprocess entry point of a task: ``python -m lockgate.runtime.task_main``.

Reads ``(TaskSpec, coordinator address, secret)`` pickled with cloudpickle from
stdin (written by the driver that started this process, never by a peer).
"""

from __future__ import annotations

import logging
import os
import sys

import cloudpickle


def main() -> int:
    spec, coordinator, secret = cloudpickle.loads(sys.stdin.buffer.read())
    logging.basicConfig(
        level=os.environ.get("LOCKGATE_LOG_LEVEL", "WARNING"),
        format=f"%(asctime)s task {spec.task_id} [%(name)s] %(levelname)s %(message)s",
    )
    from lockgate.runtime.task import run_task

    try:
        run_task(spec, coordinator, secret)
    except BaseException as e:  # the driver already got the traceback
        logging.getLogger("lockgate.task").debug("task failed: %r", e)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
