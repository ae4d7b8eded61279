"""``lockgate rescale JOB N [--vertex uid=N ...]``: run a running job at
another parallelism, in the same job (docs/elasticity.md), through its
driver's REST API (``PATCH /jobs/<id>``)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from lockgate.errors import LockgateError
from lockgate.web import client, discovery


def vertex_parallelism(items: list[str]) -> dict[str, int]:
    """``["uid=N", ...]`` -> ``{uid: N}``; anything else is refused clearly."""
    found: dict[str, int] = {}
    for item in items:
        uid, sep, n = item.partition("=")
        if not sep or not uid or not n.strip().isdigit():
            raise LockgateError(f"--vertex takes an operator's uid and a parallelism, as "
                                f"--vertex sums=4; got {item!r}")
        found[uid] = int(n)
    return found


def rescale(args: argparse.Namespace) -> int:
    vertices = vertex_parallelism(args.vertex or [])
    if args.parallelism is None and not vertices:
        raise LockgateError("say the new parallelism: lockgate rescale JOB N "
                            "(or per operator: --vertex uid=N)")
    job = discovery.find_job(args.job)
    body: dict[str, Any] = {"parallelism": args.parallelism}
    if vertices:
        body["vertices"] = vertices
    answer = client.call(job, "PATCH", f"/jobs/{job.job_id}", body)
    operation = client.await_operation(job, f"/jobs/{job.job_id}/rescales/{answer['request-id']}",
                                       args.timeout, f"the rescale of job {job.job_id}")
    shown = ", ".join(f"{name}: {n}" for name, n in operation["vertices"].items())
    print(f"job {job.job_id} runs at parallelism {shown} (from checkpoint "
          f"{operation['checkpoint_id']}, in {operation['seconds']:.2f} s)", file=sys.stderr)
    print(operation["parallelism"])
    return 0


def add_parser(sub: Any) -> None:
    rs = sub.add_parser("rescale", help="run a running job at another parallelism, "
                        "without ending it (exactly once)")
    rs.add_argument("job", help="the job id (or a unique prefix)")
    rs.add_argument("parallelism", nargs="?", type=int,
                    help="the new parallelism of every operator (1..max_parallelism)")
    rs.add_argument("--vertex", action="append", metavar="UID=N",
                    help="the new parallelism of the operator with this uid (and of those "
                    "chained with it); repeatable")
    rs.add_argument("--timeout", type=float, default=600, help="seconds to wait (600)")
    rs.set_defaults(func=rescale)
