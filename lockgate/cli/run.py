"""``lockgate run APP.py[:NAME]``: load a script and run its pipeline once,
with the command line's options.

As Flink's command line runs the ``execute()`` of the program it submits:
while the script loads, ``Pipeline.run()`` and ``Pipeline.start()`` hand
their pipeline to the command line (:func:`lockgate.api.pipeline.launched_by`),
which applies its options and runs it; a second pipeline run by the same
script is refused. A script that runs nothing while it loads (its ``run()``
is under ``if __name__ == "__main__":``) is run as before: its ``Pipeline``
object, or the one its function ``main()`` (or ``NAME``) returns.
"""

from __future__ import annotations

import argparse
import os
import runpy
import shlex
import sys
from typing import TYPE_CHECKING, Any

from lockgate.api.result import JobResult
from lockgate.errors import LockgateError

if TYPE_CHECKING:
    from lockgate.api.client import JobClient
    from lockgate.api.pipeline import Pipeline

__all__ = ["run_command"]

_RESTORE_FLAGS = ("--from-checkpoint", "--from-savepoint", "--fresh")


class ScriptRun:
    """Runs the one pipeline of a script with the command line's options."""

    def __init__(self, args: argparse.Namespace, path: str, name: str) -> None:
        self.args = args
        self.path = path
        self.name = name
        self.loading = True
        self.first: str | None = None
        """The name of the pipeline the script ran (one at most)."""
        self.result: JobResult | None = None
        self.client: JobClient | None = None

    # ------------------------------------------- Pipeline.run() in the script
    def launch(self, pipeline: Pipeline, script_args: dict[str, Any], wait: bool) -> Any:
        """The hook ``Pipeline.run()``/``start()`` calls while the script runs."""
        if self.first is not None:
            raise LockgateError(
                f"{self.path} runs a second pipeline ({pipeline.name!r}) after "
                f"{self.first!r}: lockgate run runs one job per script. Run each pipeline "
                "from a script of its own, or build them in functions and name one: "
                f"lockgate run {self.path}:FUNCTION")
        if self.loading and self.name:
            raise LockgateError(
                f"{self.path} runs pipeline {pipeline.name!r} while it loads, but "
                f"{self.path}:{self.name} was asked for: put the script's run() under "
                "`if __name__ == \"__main__\":` (lockgate run then runs only "
                f"{self.name})")
        self.first = pipeline.name
        if wait:
            self.result = self.run(pipeline, script_args)
            return self.result
        self.client = self.start(pipeline, script_args)
        return self.client

    # ------------------------------------------------------------ the job
    def options(self, pipeline: Pipeline, script_args: dict[str, Any]) -> Any:
        """The script's ``run()`` arguments, overridden by the command line's."""
        from lockgate.cluster.options import RunOptions

        args = self.args
        opts = {k: v for k, v in script_args.items() if k not in ("progress",)}
        if args.launcher:
            opts["launcher"] = args.launcher
            if args.launcher != "spark":
                opts.pop("spark", None)
                opts.pop("master", None)
        if args.master:
            opts["master"] = args.master
        if args.from_checkpoint or args.from_savepoint:
            opts["from_checkpoint"] = args.from_checkpoint
            opts["from_savepoint"] = args.from_savepoint
        if args.fresh:
            opts["fresh"] = True
        if args.allow_non_restored_state:
            opts["allow_non_restored_state"] = True
        if args.allow_non_replayable:
            opts["allow_non_replayable"] = args.allow_non_replayable
        if args.parallelism:
            pipeline.parallelism = args.parallelism
            for node in pipeline.nodes:
                node.parallelism = args.parallelism
        opts["resume_command"] = self.resume_command
        return RunOptions(**opts)

    def prepare(self, pipeline: Pipeline, script_args: dict[str, Any]) -> Any:
        """The job master, checked (pipeline, checkpoint or savepoint, Spark
        slots) before it says it starts."""
        from lockgate.cluster.spark import session as spark_session
        from lockgate.cluster.submission import interrupted_before_start, prepare_job

        options = self.options(pipeline, script_args)
        try:
            if options.launcher == "spark":  # its JVM starts while the modules load
                spark_session.prestart_job(pipeline, options.spark, options.master)
            master = prepare_job(pipeline, options)
        except KeyboardInterrupt:
            raise interrupted_before_start(pipeline.name) from None
        return master

    def run(self, pipeline: Pipeline, script_args: dict[str, Any]) -> JobResult:
        from lockgate.cluster import interrupt
        from lockgate.cluster.progress import run_with_progress
        from lockgate.cluster.submission import interrupted_before_start

        with interrupt.on_ctrl_c():  # from here: Ctrl-C ends the job cleanly
            master = self.prepare(pipeline, script_args)
            if interrupt.pressed():  # during the checks: nothing runs
                master.server.close()
                raise interrupted_before_start(pipeline.name)
            # as Pipeline.run: the start, the dashboard, a status line on a
            # terminal (a line per checkpoint and one every 10 s elsewhere), none
            # with --quiet; the summary on stdout in any case
            return run_with_progress(master, False if self.args.quiet else None,
                                     verbose=self.args.verbose, summary=sys.stdout)

    def start(self, pipeline: Pipeline, script_args: dict[str, Any]) -> JobClient:
        from lockgate.api.client import JobClient

        return JobClient(self.prepare(pipeline, script_args))

    def resume_command(self, checkpoint: str | None) -> str:
        """This command line, resuming from ``checkpoint`` (None: as it was)."""
        argv = list(getattr(self.args, "argv", None) or ["run", self.args.app])
        kept: list[str] = []
        skip = False
        for arg in argv:
            if skip:
                skip = False
                continue
            flag = arg.split("=", 1)[0]
            if flag in _RESTORE_FLAGS and checkpoint is not None:
                skip = "=" not in arg and flag != "--fresh"
                continue
            kept.append(arg)
        if checkpoint is not None:
            at = kept.index(self.args.app) + 1 if self.args.app in kept else len(kept)
            kept[at:at] = ["--from-checkpoint", checkpoint]
        return shlex.join(["lockgate", *kept])

    def ran(self) -> bool:
        """Whether the script ran (or started) its pipeline."""
        return self.first is not None

    def wait(self) -> JobResult | None:
        """The result of the job the script ran (``start()``: when it ends)."""
        if self.client is not None and self.result is None:
            self.result = self.client.result()
            _summary(self.result)
        return self.result


def _summary(result: JobResult) -> None:
    from lockgate.cluster.progress import summary_lines

    print("\n".join(summary_lines(result)), flush=True)


def run_command(args: argparse.Namespace) -> int:
    """Run ``app.py[:name]`` (see the module)."""
    from lockgate.api.pipeline import Pipeline, launched_by

    path, _, name = args.app.partition(":")
    if not os.path.isfile(path):
        raise LockgateError(f"{path} does not exist (run from the folder it is in, or give "
                            "its path): lockgate run app.py[:pipeline]")
    sys.argv = [path, *args.app_args]  # the app sees its own arguments, as with python app.py
    # as with python app.py: the app's folder first on sys.path (its own modules import)
    sys.path.insert(0, os.path.dirname(os.path.abspath(path)))
    script = ScriptRun(args, path, name)
    with launched_by(script.launch):
        namespace = runpy.run_path(path, run_name="lockgate_app")
        script.loading = False
        if script.ran():  # the script ran its pipeline while it loaded
            script.wait()
            return 0
        candidates = {k: v for k, v in namespace.items() if isinstance(v, Pipeline)}
        if not name and not candidates and callable(namespace.get("main")):
            name = "main"  # an app that builds its pipeline in main(), as the examples do
        if name and name not in candidates and callable(namespace.get(name)):
            built = namespace[name]()  # a function that builds it (reading sys.argv)
            if script.ran():  # ... or runs it
                script.wait()
                return 0
            if not isinstance(built, Pipeline):
                raise LockgateError(f"{path}:{name}() returned {type(built).__name__}, not a "
                                    "Pipeline: return the pipeline it builds")
            candidates = {name: built}
    if name:
        if name not in candidates:
            print(f"error: {path} defines no Pipeline named {name!r} "
                  f"(found: {sorted(candidates) or 'none'})", file=sys.stderr)
            return 2
        pipeline = candidates[name]
    elif len(candidates) == 1:
        pipeline = next(iter(candidates.values()))
    else:
        print(f"error: {path} defines {len(candidates)} Pipeline objects; "
              f"name one as {path}:NAME (a Pipeline, or a function that returns one)",
              file=sys.stderr)
        return 2
    script.run(pipeline, {})
    return 0
