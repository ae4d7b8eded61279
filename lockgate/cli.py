"""The ``lockgate`` command line."""

from __future__ import annotations

import argparse
import json
import logging
import runpy
import sys

from lockgate.checkpoint import storage
from lockgate.cluster.result import Progress
from lockgate.errors import LockgateError


def _run(args: argparse.Namespace) -> int:
    """Run ``app.py[:name]``: the file's pipeline object (default ``pipeline``)."""
    from lockgate.api.pipeline import Pipeline

    path, _, name = args.app.partition(":")
    sys.argv = [path, *args.app_args]  # the app sees its own arguments, as with python app.py
    namespace = runpy.run_path(path, run_name="lockgate_app")
    candidates = {k: v for k, v in namespace.items() if isinstance(v, Pipeline)}
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
              f"name one as {path}:NAME", file=sys.stderr)
        return 2
    if args.parallelism:
        pipeline.parallelism = args.parallelism
        for node in pipeline.nodes:
            node.parallelism = args.parallelism
    def progress(p: Progress) -> None:
        ms = f"{p.last_checkpoint_duration * 1000:.0f} ms" if p.last_checkpoint_duration else "-"
        print(f"[{p.elapsed:7.1f} s] checkpoint {p.last_checkpoint_id} ({ms}): "
              f"{p.records_read:,} records read, {p.records_written:,} written, "
              f"{p.restarts} restarts", file=sys.stderr, flush=True)

    result = pipeline.run(launcher=args.launcher, from_checkpoint=args.from_checkpoint,
                          on_progress=None if args.quiet else progress, master=args.master)
    done = len(result.completed_checkpoints)
    print(f"job {result.job_id} {result.status} in {result.duration:.1f} s: "
          f"{result.records_in} records in, {result.records_out} out, "
          f"{done} checkpoints, {result.restarts} restarts, guarantee {result.guarantee}")
    return 0


def _inspect(args: argparse.Namespace) -> int:
    meta = storage.read_metadata(args.path)
    print(json.dumps({
        "checkpoint_id": meta["checkpoint_id"], "job_id": meta.get("job_id"),
        "max_parallelism": meta["max_parallelism"],
        "operators": {uid: {"parallelism": op["parallelism"],
                            "bytes": sum(h["size"] for h in op["subtasks"] if h)}
                      for uid, op in meta["operators"].items()},
    }, indent=2))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="lockgate", description=__doc__)
    parser.add_argument("-v", "--verbose", action="store_true")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run a pipeline defined in a Python file",
                         allow_abbrev=False)  # an app's --para is not --parallelism
    run.add_argument("app", help="app.py or app.py:pipeline_variable")
    run.add_argument("--launcher", default="spark", choices=["spark", "local"],
                     help="spark (default): the tasks run as one Spark barrier stage; "
                     "local: one subprocess per task, no Spark")
    run.add_argument("--master", help="Spark master URL of the session Lockgate starts "
                     "(default: local[N], N = the job's number of tasks; under spark-submit "
                     "its --master)")
    run.add_argument("--parallelism", type=int)
    run.add_argument("--from-checkpoint")
    run.add_argument("-q", "--quiet", action="store_true", help="no progress lines")
    run.add_argument("app_args", nargs="*",
                     help="arguments for the app (its sys.argv[1:]): whatever lockgate does "
                     "not know, in order, and everything after --")
    run.set_defaults(func=_run)
    ins = sub.add_parser("inspect", help="print a checkpoint's operators and sizes")
    ins.add_argument("path")
    ins.set_defaults(func=_inspect)
    # Lockgate's own options may come before or after the app (as documented);
    # the app gets the rest, in order, and everything after "--".
    argv = list(sys.argv[1:] if argv is None else argv)
    after: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, after = argv[:cut], argv[cut + 1:]
    args, unknown = parser.parse_known_args(argv)
    if args.command == "run":
        args.app_args = [*args.app_args, *unknown, *after]
    elif unknown or after:
        parser.error(f"unrecognized arguments: {' '.join(unknown + after)}")
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        return int(args.func(args))
    except LockgateError as e:  # a clear message, not a traceback
        print(f"error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
