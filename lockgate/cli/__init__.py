"""The ``lockgate`` command line: run a pipeline, control running jobs
(through their driver's REST API), inspect checkpoints and savepoints."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from typing import Any

from lockgate import fs
from lockgate.checkpoint import storage
from lockgate.cli import rescale as cli_rescale
from lockgate.cli.savepoint import print_savepoint
from lockgate.cluster.format import format_duration, format_size, format_table
from lockgate.errors import JobInterrupted, LockgateError
from lockgate.web import client, discovery


def _run(args: argparse.Namespace) -> int:
    from lockgate.cli.run import run_command

    return run_command(args)


def _inspect(args: argparse.Namespace) -> int:
    meta = storage.read_metadata(args.path)
    print(json.dumps({
        "checkpoint_id": meta.checkpoint_id, "job_id": meta.job_id,
        "max_parallelism": meta.max_parallelism,
        "operators": {uid: {"parallelism": op.parallelism,
                            "bytes": sum(h.size for h in op.subtasks if h)}
                      for uid, op in meta.operators.items()},
    }, indent=2))
    return 0


# ------------------------------------------------------- running jobs (REST)
def _list(args: argparse.Namespace) -> int:
    jobs = discovery.discover()
    statuses: dict[str, str] = {}
    guarantees: dict[str, str] = {}
    for url in dict.fromkeys(j.url for j in jobs):  # one request per driver process
        first = next(j for j in jobs if j.url == url)
        try:
            answer = client.call(first, "GET", "/jobs", timeout=5)
            statuses.update({j["id"]: j["status"] for j in answer.get("jobs", [])})
            guarantees.update({j["id"]: str(j.get("guarantee") or "-")
                               for j in answer.get("jobs", [])})
        except LockgateError:
            pass
    found: list[dict[str, Any]] = [
        {"id": j.job_id, "name": j.name, "status": statuses.get(j.job_id, "unreachable"),
         "guarantee": guarantees.get(j.job_id, "-"),
         "pid": j.pid, "url": j.url, "started_at": j.started_at} for j in jobs]
    if args.json:
        print(json.dumps(found, indent=2))
    elif not found:
        print(f"no running jobs (discovery files in {discovery.jobs_dir()})", file=sys.stderr)
    else:
        print(format_table([["JOB", "NAME", "STATUS", "GUARANTEE", "PID", "URL", "STARTED"]] + [
            [f["id"], f["name"], f["status"], f["guarantee"], str(f["pid"]), f["url"],
             time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(f["started_at"]))]
            for f in found]))
    return 0


def _await_operation(job: discovery.JobEndpoint, request_id: str, timeout: float,
                     what: str) -> str:
    """Poll a savepoint or stop request; its savepoint's location."""
    operation = client.await_operation(job, f"/jobs/{job.job_id}/savepoints/{request_id}",
                                       timeout, f"the {what} of job {job.job_id}")
    return str(operation["location"])


def _target(folder: str | None) -> str | None:
    """A folder given on the command line is relative to where the command runs."""
    return fs.absolute(folder) if folder else None


def _savepoint(args: argparse.Namespace) -> int:
    if args.job == "inspect":
        if not args.path:
            raise LockgateError("`lockgate savepoint inspect` needs the savepoint's folder: "
                                "lockgate savepoint inspect PATH")
        return print_savepoint(args.path, args.json)
    if args.path:
        raise LockgateError(f"unexpected argument {args.path!r}: `lockgate savepoint JOB "
                            "[--dir D]` takes one job id")
    job = discovery.find_job(args.job)
    answer = client.call(job, "POST", f"/jobs/{job.job_id}/savepoints",
                         {"target-directory": _target(args.dir)})
    location = _await_operation(job, answer["request-id"], args.timeout, "savepoint")
    print(location)
    return 0


def _stop(args: argparse.Namespace) -> int:
    if not args.savepoint:
        raise LockgateError("`lockgate stop` ends the job with a savepoint it can resume from: "
                            "add --savepoint (and --drain to end the input first, so sinks "
                            "commit everything), or end it without one: lockgate cancel JOB")
    job = discovery.find_job(args.job)
    answer = client.call(job, "POST", f"/jobs/{job.job_id}/stop",
                         {"targetDirectory": _target(args.dir), "drain": args.drain})
    location = _await_operation(job, answer["request-id"], args.timeout, "stop")
    print(f"job {job.job_id} {'finished (drained)' if args.drain else 'stopped'}",
          file=sys.stderr)
    print(location)
    return 0


def _cancel(args: argparse.Namespace) -> int:
    job = discovery.find_job(args.job)
    client.call(job, "PATCH", f"/jobs/{job.job_id}?mode=cancel")

    def ended() -> str | None:
        try:
            status = client.call(job, "GET", f"/jobs/{job.job_id}", timeout=5)["status"]
        except client.RestRequestError as e:
            if e.status == 404:  # the driver no longer serves it: it ended
                return "cancelled"
            raise
        except LockgateError:  # the driver is gone with its job
            return "cancelled"
        return status if status in client.ENDED else None

    status = client.wait_for(ended, args.timeout, f"cancelling job {job.job_id}")
    print(f"job {job.job_id} {status}")
    return 0


def _dashboard(args: argparse.Namespace) -> int:
    """Print the URL of a running job's dashboard, its token in the fragment."""
    job = discovery.find_job(args.job)
    print(f"{job.url}/ui#token={job.token}&job={job.job_id}")
    return 0


def _checkpoints(args: argparse.Namespace) -> int:
    job = discovery.find_job(args.job)
    answer = client.call(job, "GET", f"/jobs/{job.job_id}/checkpoints")
    if args.json:
        print(json.dumps(answer, indent=2))
        return 0
    history = answer["history"]
    if not history:
        print(f"job {job.job_id} has taken no checkpoint yet", file=sys.stderr)
        return 0
    rows = [["ID", "KIND", "STATUS", "DURATION", "SIZE", "IN FLIGHT", "ALIGNMENT",
             "ACK TIMES (task: ms)", "REASON"]]
    for h in history:
        acks = " ".join(f"{t}:{v * 1000:.0f}" for t, v in h["ack_times"].items())
        rows.append([str(h["id"]), h["kind"], h["status"], format_duration(h["duration"]),
                     format_size(h["size"]) if h["status"] == "completed" else "-",
                     format_size(h["in_flight"]) if h.get("in_flight") else "-",
                     format_duration(h["alignment"]), acks or "-", h["failure"] or "-"])
    print(format_table(rows))
    counts = answer["counts"]
    print(f"{counts['completed']} completed, {counts['failed']} failed, "
          f"{counts['in_progress']} in progress")
    return 0


def _positive(text: str) -> int:
    """An argparse type: a whole number >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be 1 or more, got {value}")
    return value


def _spark(args: argparse.Namespace) -> int:
    from lockgate.cluster.spark.cds import build

    return 0 if build() is not None else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="lockgate", description=__doc__)
    parser.add_argument("-v", "--verbose", action="store_true")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run a pipeline defined in a Python file",
                         allow_abbrev=False)  # an app's --para is not --parallelism
    run.add_argument("app", help="app.py, app.py:pipeline_variable, or app.py:function "
                     "(called with no arguments, it returns the Pipeline; default main)")
    run.add_argument("--launcher", choices=["spark", "local"],
                     help="spark (default, unless the app's run() names another): the tasks "
                     "run as one Spark barrier stage; local: one subprocess per task, no Spark")
    run.add_argument("--master", help="Spark master URL of the session Lockgate starts "
                     "(default: local[N], N = the job's number of tasks; under spark-submit "
                     "its --master)")
    run.add_argument("--parallelism", type=_positive, help="every operator's parallelism")
    start = run.add_mutually_exclusive_group()
    start.add_argument("--from-checkpoint", metavar="PATH",
                       help="start from this completed checkpoint (a chk-N folder)")
    start.add_argument("--from-savepoint", metavar="PATH",
                       help="start from this savepoint (any parallelism; operators matched "
                       "by uid)")
    start.add_argument("--fresh", action="store_true",
                       help="start from nothing, even where an earlier run of the pipeline "
                       "left checkpoints in its checkpoint storage (without it, the job "
                       "resumes from that run's latest completed checkpoint)")
    run.add_argument("--allow-non-restored-state", action="store_true",
                     help="drop the state of operator uids the job no longer has, instead of "
                     "refusing the checkpoint or savepoint")
    run.add_argument("--allow-non-replayable", action="append", metavar="UID",
                     help="run with the source UID that cannot replay (a push source), "
                          "accepting at-most-once for its records (repeat for several)")
    run.add_argument("-q", "--quiet", action="store_true",
                     help="no progress (no status line, no dashboard URL)")
    run.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS,
                     help="log at INFO (Spark's warnings too) and a line per checkpoint")
    run.add_argument("app_args", nargs="*",
                     help="arguments for the app (its sys.argv[1:]): whatever lockgate does "
                     "not know, in order, and everything after --")
    run.set_defaults(func=_run)
    ins = sub.add_parser("inspect", help="print a checkpoint's operators and sizes")
    ins.add_argument("path")
    ins.set_defaults(func=_inspect)
    ls = sub.add_parser("list", help="list the running jobs (of this LOCKGATE_HOME)")
    ls.add_argument("--json", action="store_true")
    ls.set_defaults(func=_list)
    sp = sub.add_parser("savepoint", help="take a savepoint of a running job and print its "
                        "folder; `savepoint inspect PATH` describes a savepoint",
                        usage="lockgate savepoint JOB [--dir D] | "
                        "lockgate savepoint inspect PATH [--json]")
    sp.add_argument("job", help="the job id (or a unique prefix), or `inspect`")
    sp.add_argument("path", nargs="?", help=argparse.SUPPRESS)
    sp.add_argument("--dir", help="the folder of the savepoint (default: the job's "
                    "CheckpointConfig.savepoint_dir)")
    sp.add_argument("--json", action="store_true", help="inspect: print JSON")
    sp.add_argument("--timeout", type=float, default=600, help="seconds to wait (600)")
    sp.set_defaults(func=_savepoint)
    st = sub.add_parser("stop", help="stop a running job with a savepoint and print its folder")
    st.add_argument("job", help="the job id (or a unique prefix)")
    st.add_argument("--savepoint", action="store_true", required=False,
                    help="take the savepoint the job can resume from (required)")
    st.add_argument("--drain", action="store_true", help="end the input first: operators "
                    "finish() and sinks commit everything before the job ends")
    st.add_argument("--dir", help="the folder of the savepoint (default: the job's "
                    "CheckpointConfig.savepoint_dir)")
    st.add_argument("--timeout", type=float, default=600, help="seconds to wait (600)")
    st.set_defaults(func=_stop)
    ca = sub.add_parser("cancel", help="end a running job now, without a savepoint")
    ca.add_argument("job", help="the job id (or a unique prefix)")
    ca.add_argument("--timeout", type=float, default=120, help="seconds to wait (120)")
    ca.set_defaults(func=_cancel)
    cli_rescale.add_parser(sub)
    db = sub.add_parser("dashboard", help="print the URL of a running job's web dashboard "
                        "(with its token)")
    db.add_argument("job", help="the job id (or a unique prefix)")
    db.set_defaults(func=_dashboard)
    cp = sub.add_parser("checkpoints", help="a running job's checkpoint history")
    cp.add_argument("job", help="the job id (or a unique prefix)")
    cp.add_argument("--json", action="store_true")
    cp.set_defaults(func=_checkpoints)
    sk = sub.add_parser("spark", help="`spark warm`: make the class-data archive of Spark's "
                        "classes now (sessions Lockgate starts then start faster; otherwise "
                        "the first session makes it in the background)")
    sk.add_argument("action", choices=["warm"])
    sk.set_defaults(func=_spark)
    # Lockgate's own options may come before or after the app (as documented);
    # the app gets the rest, in order, and everything after "--".
    full = argv
    argv = list(sys.argv[1:] if argv is None else argv)
    after: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, after = argv[:cut], argv[cut + 1:]
    args, unknown = parser.parse_known_args(argv)
    if args.command == "run":
        args.app_args = [*args.app_args, *unknown, *after]
        args.argv = list(sys.argv[1:] if full is None else full)
    elif (args.command == "savepoint" and args.path is None and len(unknown) == 1
          and not unknown[0].startswith("-") and not after):
        args.path = unknown[0]  # savepoint inspect --json PATH: the flag came first
    elif unknown or after:
        parser.error(f"unrecognized arguments: {' '.join(unknown + after)}")
    if args.verbose:  # Spark's own lines too
        os.environ.setdefault("LOCKGATE_SPARK_LOG_LEVEL", "WARN")
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        return int(args.func(args))
    except LockgateError as e:  # a clear message, not a traceback
        print(f"error: {e}", file=sys.stderr)
        return 1
    except JobInterrupted:  # Ctrl-C: the job ended cleanly and said how to resume it
        return 130
    except KeyboardInterrupt:  # Ctrl-C before or after a job
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `lockgate ... | head`: the reader is gone, quietly
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141
