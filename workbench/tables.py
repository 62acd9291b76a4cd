"""Plain-text tables that read the same in a terminal, a notebook and a log."""

from __future__ import annotations


def format_table(rows: list[dict], columns: list[str]) -> str:
    """A plain-text table that reads the same in a terminal and a notebook.

    >>> print(format_table([{"rank": 0, "host": "a"}], ["rank", "host"]))
    rank  host
    0     a
    """
    widths = [max(len(c), *(len(str(r.get(c, ""))) for r in rows)) for c in columns]
    lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True)).rstrip()]
    lines += ["  ".join(str(r.get(c, "")).ljust(w) for c, w in zip(columns, widths, strict=True)).rstrip()
              for r in rows]
    return "\n".join(lines)
