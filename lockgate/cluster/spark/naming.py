"""How a job is named where Spark shows it: the application name of the
session Lockgate starts (:func:`app_name`) and the description of each
attempt's Spark job and stage (:func:`spark_description`), with a link to the
job's dashboard, so a user who starts in the Spark UI finds it.

The link carries no token (the Spark UI may be open to others): the page
asks for it; ``lockgate dashboard JOB`` prints the whole URL.
"""

from __future__ import annotations

import threading
from html import escape
from typing import Any

__all__ = ["app_name", "dashboard_of", "spark_description"]

_lock = threading.Lock()
_jobs: dict[str, tuple[str, str | None]] = {}
"""Per job id: its name and its dashboard's URL (None: no REST API)."""


def app_name(job_name: str) -> str:
    """The name of the Spark application Lockgate starts for a job."""
    return f"Lockgate: {job_name}"


def dashboard_of(job_id: str, job_name: str, server: Any) -> tuple[str, str] | None:
    """The dashboard's URL and token of a job served by ``server`` (its REST
    server: ``url``, ``token``; None: not served); remembered for
    :func:`spark_description`."""
    dashboard = None if server is None else (f"{server.url}/ui", str(server.token))
    with _lock:
        _jobs[job_id] = (job_name, dashboard[0] if dashboard else None)
    return dashboard


def spark_description(job_id: str, attempt: int) -> str:
    """The Spark job group description of an attempt (the Spark UI shows it
    on the job and its stage; its ``<a>`` is a link there)."""
    with _lock:
        name, url = _jobs.get(job_id, (None, None))
    text = f"Lockgate job {escape(name)} ({job_id})" if name else f"Lockgate job {job_id}"
    text += f" attempt {attempt}"
    if url:
        link = escape(url, quote=True)
        text += f' · dashboard: <a href="{link}">{link}</a>'
    return text
