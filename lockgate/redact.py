"""Secrets out of messages: a connector's settings may hold a password (a
PostgreSQL DSN, a URL with ``user:password@``, Kafka's ``sasl.password``
and ``ssl.key.password``, ``s3://KEY:SECRET@bucket``), and an error about
them reaches a job's failure cause (the REST API's exceptions, the
dashboard) and the logs. :func:`redact` masks every secret it recognises in
a text; failure causes pass through it where they are made.

Recognised:

* ``scheme://user:secret@host``: the secret (the user stays);
* ``password=value`` and the like (``passwd``, ``pwd``, ``secret``,
  ``token``, ``sasl.password``, ``ssl.key.password``, ``secret_key``...),
  with the value quoted (``password='top secret phrase'``, escapes inside
  included) or plain, in a DSN or a query string;
* ``'sasl.password': 'value'`` and the like in a printed mapping or JSON.
"""

from __future__ import annotations

import re

__all__ = ["redact", "MASK"]

MASK = "***"

_KEY = (r"[\w.\-]*(?:password|passwd|pwd|secret|token|api[_.\-]?key|access[_.\-]?key"
        r"|private[_.\-]?key)")
_QUOTED = r"'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\""

_PATTERNS = (
    # scheme://user:secret@host
    (re.compile(r"([A-Za-z][A-Za-z0-9+.\-]*://[^:/@\s'\"]*:)[^@\s'\"]*@"), rf"\1{MASK}@"),
    # 'key': 'value' (a printed mapping, JSON)
    (re.compile(rf"((['\"]){_KEY}\2\s*:\s*)(?:{_QUOTED}|[^\s,}}\]]+)", re.I),
     rf"\1\2{MASK}\2"),
    # key=value, key = 'value' (a DSN, a query string, keyword arguments)
    (re.compile(rf"(\b{_KEY}\s*=\s*)(?:{_QUOTED}|[^\s&,;)]+)", re.I), rf"\1{MASK}"),
)


def redact(text: str) -> str:
    """``text`` with every secret it names masked (see the module)."""
    for pattern, replacement in _PATTERNS:
        text = pattern.sub(replacement, text)
    return text
