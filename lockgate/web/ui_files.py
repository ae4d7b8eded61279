"""The dashboard's static files (``lockgate/web/ui/``), served at ``/ui``.

Only the files named in :data:`FILES` are served, read from the package
(nothing of the request reaches a path). They hold no data and need no
token: ``/ui#token=...`` keeps the token in the URL's fragment, which a
browser never sends, and the page's script sends it with every request it
makes (``Authorization: Bearer``). The page may load nothing from elsewhere
(``Content-Security-Policy``), so it works offline.
"""

from __future__ import annotations

from importlib import resources
from urllib.parse import urlsplit

from lockgate.web.routes import Raw

__all__ = ["FILES", "ui_file"]

FILES = {
    "index.html": "text/html; charset=utf-8",
    "app.js": "text/javascript; charset=utf-8",
    "style.css": "text/css; charset=utf-8",
}

_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; "
                               "style-src 'self' 'unsafe-inline'; script-src 'self'; "
                               "frame-ancestors 'none'",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
}


def ui_file(target: str) -> tuple[int, Raw | dict[str, list[str]], dict[str, str]]:
    """The status, body and headers of ``GET target`` (a path under ``/ui``)."""
    path = urlsplit(target).path
    name = path[len("/ui"):].lstrip("/") or "index.html"
    if name not in FILES:
        return 404, {"errors": [f"no dashboard file {name!r}; open /ui"]}, {}
    data = resources.files("lockgate.web").joinpath("ui", name).read_bytes()
    return 200, Raw(FILES[name], data), dict(_HEADERS)
