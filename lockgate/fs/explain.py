"""What to do about an I/O error at a storage location: one sentence naming
the likely fix (a missing bucket, an unreachable endpoint, refused
credentials, HDFS that cannot load, a local folder that cannot be written)."""

from __future__ import annotations

import errno
import os
from urllib.parse import urlsplit

from lockgate.fs import Location, is_local, redact


def explain(error: BaseException, location: Location) -> str:
    """A sentence naming the likely fix of an I/O ``error`` at ``location``."""
    text = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    low = text.lower()
    loc = redact(location)
    if "libjvm" in low or "libhdfs" in low:
        return (f"{loc!r}: HDFS cannot be loaded here ({text}); pyarrow needs a JVM and "
                "libhdfs on every machine: set JAVA_HOME, HADOOP_HOME and "
                "CLASSPATH=$(hadoop classpath --glob)")
    if is_local(location):
        if isinstance(error, OSError) and error.errno == errno.ENOSPC:
            return f"{loc!r}: {text}; the disk is full: free space there or choose another folder"
        return (f"{loc!r}: {text}; choose a folder this process can create and write, "
                "or fix its permissions")
    if "bucket" in low and ("not found" in low or "does not exist" in low
                            or "nosuchbucket" in low):
        bucket = urlsplit(os.fspath(location)).hostname or "?"
        return (f"{loc!r}: the bucket {bucket!r} does not exist ({text}); create it first "
                f"(e.g. `aws s3 mb s3://{bucket}`) or fix the URL")
    if any(w in low for w in ("couldn't connect", "could not connect", "connection refused",
                              "resolve host", "timed out", "timeout", "network", "curl")):
        return (f"{loc!r} cannot be reached ({text}); check the endpoint "
                "(?endpoint_override=HOST:PORT&scheme=http|https or AWS_ENDPOINT_URL) and "
                "that every executor can reach it")
    if any(w in low for w in ("access denied", "accessdenied", "forbidden", "credentials",
                              "signature", "invalidaccesskeyid", "403")):
        return (f"{loc!r}: access denied ({text}); give credentials that may write there "
                "(s3://KEY:SECRET@bucket/... or AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY on "
                "every executor)")
    return f"{loc!r}: {text}; check the URL, the endpoint and the credentials"
