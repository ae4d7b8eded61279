"""``lockgate savepoint inspect``: what a savepoint or checkpoint folder
holds, read from its ``_metadata`` and a listing of its files (nothing is
deserialized, no code of the job runs)."""

from __future__ import annotations

import json
import time
from typing import Any

from lockgate import fs
from lockgate.checkpoint import storage
from lockgate.cluster.format import format_size, format_table
from lockgate.errors import LockgateError

__all__ = ["describe_savepoint", "print_savepoint"]


def describe_savepoint(path: str) -> dict[str, Any]:
    """What a savepoint (or checkpoint) folder holds, from its ``_metadata``
    and a listing of its files: nothing is deserialized, no code runs."""
    location = fs.absolute(path)
    meta = storage.read_metadata(location)
    try:
        storage.verify_files(location, meta.state_files())
        files = "ok"
    except LockgateError as e:
        files = str(e)
    operators = []
    for uid, op in meta.operators.items():
        subtasks: list[dict[str, Any]] = []
        states: dict[str, str] = {}
        groups: set[int] = set()
        incremental = False
        for index, h in enumerate(op.subtasks):
            if not h:
                subtasks.append({"index": index, "file": None, "size": 0, "key_groups": [],
                                 "incremental": False, "shared_bytes": 0,
                                 "changelog_files": 0, "operator_state_bytes": 0})
                continue
            inc = h.incremental
            # an incremental (RocksDB) handle names the range its task owned,
            # not which groups hold keys (that would mean opening its files)
            kgs = list(range(*inc.key_groups)) if inc is not None else sorted(h.key_groups)
            groups.update(kgs)
            incremental = incremental or inc is not None
            states.update(h.states)
            subtasks.append({"index": index, "file": h.file, "size": h.size,
                             "key_groups": kgs, "incremental": inc is not None,
                             "shared_bytes": sum(f.size for f in (*inc.shared.values(),
                                                                  *inc.changelog))
                             if inc is not None else 0,
                             "changelog_files": len(inc.changelog) if inc is not None else 0,
                             "operator_state_bytes": h.op_state[1] if h.op_state else 0})
        operators.append({
            "uid": uid, "parallelism": op.parallelism,
            "finished": op.finished,
            "operator_state_mode": op.operator_state_mode.value,
            "keyed_states": states, "key_groups": len(groups), "incremental": incremental,
            "operator_state_bytes": sum(s["operator_state_bytes"] for s in subtasks),
            "size": sum(s["size"] for s in subtasks), "subtasks": subtasks,
        })
    return {
        "path": fs.redact(location), "kind": meta.kind.value,
        "job_id": meta.job_id, "checkpoint_id": meta.checkpoint_id,
        "timestamp": meta.timestamp, "final": meta.final,
        "parallelism": max((o["parallelism"] for o in operators), default=0),
        "max_parallelism": meta.max_parallelism,
        "progress": {"read": meta.progress.read, "written": meta.progress.written},
        "size": sum(o["size"] for o in operators),
        "state_files": sum(1 for o in operators for s in o["subtasks"] if s["file"]),
        "files": files, "operators": operators,
    }


def _ranges(values: list[int]) -> str:
    """``[0, 1, 2, 5]`` -> ``0-2,5``."""
    out: list[str] = []
    for v in values:
        if out and int(out[-1].rpartition("-")[2]) == v - 1:
            out[-1] = f"{out[-1].partition('-')[0]}-{v}"
        else:
            out.append(str(v))
    return ",".join(out)


def print_savepoint(path: str, as_json: bool) -> int:
    """``lockgate savepoint inspect PATH [--json]``: print :func:`describe_savepoint`
    as text (a summary, the operators, their state files) or as JSON."""
    d = describe_savepoint(path)
    if as_json:
        print(json.dumps(d, indent=2))
        return 0
    taken = (time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(d["timestamp"]))
             if d["timestamp"] else "?")
    progress = d["progress"] or {}
    print(f"{d['kind']} {d['path']}")
    print(f"  job {d['job_id']}, checkpoint {d['checkpoint_id']}"
          f"{' (final)' if d['final'] else ''}, taken {taken}")
    print(f"  parallelism {d['parallelism']} (max_parallelism {d['max_parallelism']}: "
          f"key groups 0-{d['max_parallelism'] - 1})")
    if progress:
        print(f"  progress: {progress.get('read', 0):,} records read, "
              f"{progress.get('written', 0):,} written")
    print(f"  {format_size(d['size'])} in {d['state_files']} state files: "
          f"{'all present, sizes match' if d['files'] == 'ok' else d['files']}")
    print()
    rows = [["OPERATOR", "PARALLELISM", "STATE", "KEY GROUPS", "SIZE"]]
    for o in d["operators"]:
        what = [f"keyed {n} ({k})" for n, k in sorted(o["keyed_states"].items())]
        if o["operator_state_bytes"]:
            what.append(f"operator state ({o['operator_state_mode']})")
        rows.append([o["uid"] + (" (finished)" if o["finished"] else ""),
                     str(o["parallelism"]), ", ".join(what) or "none",
                     (f"{o['key_groups']} owned (incremental)" if o["incremental"]
                      else f"{o['key_groups']} non-empty") if o["keyed_states"] else "-",
                     format_size(o["size"])])
    print(format_table(rows))
    print()
    rows = [["SUBTASK", "FILE", "SIZE", "KEY GROUPS", "OPERATOR STATE"]]
    for o in d["operators"]:
        for s in o["subtasks"]:
            if s["file"]:
                rows.append([f"{o['uid']}[{s['index']}]", s["file"], format_size(s["size"]),
                             _ranges(s["key_groups"]) or "-",
                             format_size(s["operator_state_bytes"]) if s["operator_state_bytes"]
                             else "-"])
    if len(rows) > 1:
        print(format_table(rows))
    return 0
