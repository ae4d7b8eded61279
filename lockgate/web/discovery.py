"""Discovery files: how a client finds the jobs running on this machine.

While a job runs, its driver keeps
``<LOCKGATE_HOME or ~/.local/state/lockgate>/jobs/<job-id>.json`` (mode 0600,
folder 0700) with its pid, URL and token; readers skip and delete the files
of dead processes. The ``lockgate`` CLI (``list``, ``savepoint``, ``stop``,
``cancel``, ``checkpoints``) finds jobs there.
"""

from __future__ import annotations

import json
import os
import socket
import time
from dataclasses import dataclass
from pathlib import Path

from lockgate.errors import LockgateError

__all__ = ["JobEndpoint", "discover", "find_job", "jobs_dir", "state_home", "write_discovery"]


def state_home() -> Path:
    """``$LOCKGATE_HOME``, else ``$XDG_STATE_HOME/lockgate``, else ``~/.local/state/lockgate``."""
    home = os.environ.get("LOCKGATE_HOME")
    if home:
        return Path(home).expanduser()
    xdg = os.environ.get("XDG_STATE_HOME")
    return (Path(xdg).expanduser() if xdg else Path.home() / ".local" / "state") / "lockgate"


def jobs_dir() -> Path:
    """The folder of the discovery files."""
    return state_home() / "jobs"


def write_discovery(job_id: str, name: str, url: str, token: str) -> Path:
    """Write the discovery file of job ``job_id`` served at ``url`` (atomically:
    a temp name, then a rename); its path."""
    folder = jobs_dir()
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    if folder.stat().st_uid == os.getuid() and folder.stat().st_mode & 0o077:
        folder.chmod(0o700)
    path = folder / f"{job_id}.json"
    data = json.dumps({
        "format": 1, "job_id": job_id, "name": name,
        "pid": os.getpid(), "host": socket.gethostname(), "url": url,
        "token": token, "started_at": time.time(),
    }).encode()
    tmp = folder / f".{job_id}.json.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    return path


@dataclass(frozen=True)
class JobEndpoint:
    """A running job as its discovery file describes it."""

    job_id: str
    name: str
    pid: int
    url: str
    token: str
    started_at: float
    path: Path


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def discover(prune: bool = True) -> list[JobEndpoint]:
    """The jobs whose discovery files are in :func:`jobs_dir`, oldest first.
    Files of dead driver processes on this host are skipped (and deleted
    with ``prune``)."""
    folder = jobs_dir()
    found = []
    try:
        names = sorted(folder.glob("*.json"))
    except OSError:
        return []
    here = socket.gethostname()
    for path in names:
        try:
            d = json.loads(path.read_text())
            ep = JobEndpoint(str(d["job_id"]), str(d.get("name", "")), int(d["pid"]),
                             str(d["url"]), str(d["token"]), float(d.get("started_at", 0)),
                             path)
        except (OSError, ValueError, KeyError, TypeError):
            continue  # unreadable or not ours: leave it
        if d.get("host", here) == here and not _alive(ep.pid):
            if prune:
                path.unlink(missing_ok=True)
            continue
        found.append(ep)
    return sorted(found, key=lambda e: e.started_at)


def find_job(query: str) -> JobEndpoint:
    """The running job whose id is ``query`` (or starts with it, if only one does)."""
    jobs = discover()
    if not jobs:
        raise LockgateError(
            f"no running Lockgate job: no live discovery file in {jobs_dir()}. Start one "
            "with `lockgate run app.py`; jobs run with rest=False or LOCKGATE_REST=0, or "
            "under another LOCKGATE_HOME, are not seen")
    exact = [j for j in jobs if j.job_id == query]
    matches = exact or [j for j in jobs if j.job_id.startswith(query)]
    if len(matches) == 1:
        return matches[0]
    ids = ", ".join(j.job_id for j in (matches or jobs))
    if matches:
        raise LockgateError(f"{query!r} matches several jobs ({ids}); give more of the id")
    raise LockgateError(f"no running job {query!r} (running: {ids}); `lockgate list` "
                        "shows the running jobs")
