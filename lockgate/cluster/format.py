"""Plain-text formatting of what the driver prints (the progress display,
the ``lockgate`` command): sizes, durations and aligned tables."""

from __future__ import annotations

__all__ = ["format_size", "format_duration", "format_table"]


def format_size(n: int | float | None) -> str:
    """A byte count as ``512 B``, ``1.5 KiB``, ... ``2.0 GiB``; ``-`` for None."""
    if n is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


def format_duration(seconds: float | None) -> str:
    """Seconds as ``12.3 ms`` (below one second) or ``4.56 s``; ``-`` for None."""
    if seconds is None:
        return "-"
    return f"{seconds * 1000:.1f} ms" if seconds < 1 else f"{seconds:.2f} s"


def format_table(rows: list[list[str]]) -> str:
    """Rows (the first one the header) as left-aligned columns two spaces apart."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
                     for r in rows)
