"""Spark's Python daemon with Lockgate's task code loaded before it forks.

PySpark's daemon (``pyspark.daemon``) forks one Python worker per task and
the worker imports ``pyspark.worker`` and, running a Lockgate task, Lockgate:
about a second of imports per worker on a loaded two-core machine, paid again
by every task of every attempt (a restart's workers are new: the failed
attempt's were killed). Sessions Lockgate starts set
``spark.python.daemon.module`` to this module, which imports all of that once,
in the daemon, and then runs PySpark's own daemon loop: every worker is
forked ready. It imports nothing that starts a thread (forking a process with
threads is unsafe; PySpark's own daemon defers its imports for that reason),
which :func:`main` checks.

A session you start yourself can use it too:
``--conf spark.python.daemon.module=lockgate.cluster.spark.daemon``.
"""

from __future__ import annotations

import sys
import threading


def preload() -> None:
    """The task code, every operator and every connector (the daemon
    outlives the jobs of its session: it cannot know what their tasks use)."""
    import pyspark.worker  # noqa: F401

    import lockgate.cluster.spark.host
    import lockgate.connectors
    from lockgate.runtime.registry import import_all
    from lockgate.runtime.task_main import preload as task_code

    task_code()
    import_all()  # every operator's module
    for name in lockgate.connectors.__all__:
        getattr(lockgate.connectors, name)


def main() -> None:
    try:
        preload()
    except Exception as e:
        print(f"lockgate: spark daemon preload failed: {type(e).__name__}: {e}", file=sys.stderr)
    if threading.active_count() > 1:  # pragma: no cover - a dependency started a thread
        print("lockgate: a thread started while preloading the Spark daemon; workers may "
              "deadlock after fork", file=sys.stderr)
    from pyspark.daemon import manager

    manager()


if __name__ == "__main__":
    main()
