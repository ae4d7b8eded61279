"""How ``Pipeline.run()`` and ``start()`` run a job in this process.

The API sits below the driver: :mod:`lockgate.api.pipeline` never imports
:mod:`lockgate.cluster`. ``lockgate/__init__.py`` hands it :func:`submit`
(:func:`~lockgate.api.pipeline.set_runner`), which imports the driver's
modules only when a job runs. A local Spark session the job will start
begins first, so its JVM starts while the driver imports the job master's
modules, and it ends if the job is refused.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from lockgate.api.client import JobClient
    from lockgate.api.pipeline import Pipeline
    from lockgate.api.result import JobResult

__all__ = ["submit"]


def submit(pipeline: Pipeline, args: dict[str, Any], wait: bool) -> JobResult | JobClient:
    """:meth:`Pipeline.run` (``wait``: the job's result) or :meth:`Pipeline.start`
    (a :class:`~lockgate.api.client.JobClient`), with the call's arguments."""
    try:
        if args.get("launcher", "spark") != "spark":
            return _submit_now(pipeline, args, wait)
        from lockgate.cluster.spark import session as spark_session

        spark_session.prestart_job(pipeline, args.get("spark"), args.get("master"))
        try:
            return _submit_now(pipeline, args, wait)
        except BaseException:
            spark_session.cancel_prestart()  # (none is left once the job started)
            raise
    except KeyboardInterrupt:  # Ctrl-C before the job started: one line, code 130
        from lockgate.cluster import interrupt

        with interrupt.on_ctrl_c(pressed=True):  # meanwhile a second one kills at once
            from lockgate.cluster.submission import interrupted_before_start

            raise interrupted_before_start(pipeline.name) from None


def _submit_now(pipeline: Pipeline, args: dict[str, Any], wait: bool) -> JobResult | JobClient:
    from lockgate.cluster.options import RunOptions
    from lockgate.cluster.submission import run_pipeline, start_pipeline

    options = RunOptions(**args)
    return run_pipeline(pipeline, options) if wait else start_pipeline(pipeline, options)
