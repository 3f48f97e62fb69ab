"""Framework warnings once, not once per rank, in what the launcher shows (torch-free).

Every rank of a job runs the same code, so torch warns the same thing on each: DDP's
"find_unused_parameters=True was specified ..." four times on a pp=2 x dp=2 plan. The launcher's
pump passes torchrun's output through `WarningDedupe`: a warning whose text another rank already
printed is dropped from the terminal (launch.log keeps every line). Two kinds are recognised:
- torch's C++ warnings: `[rank1]:[W1202 01:52:01.897192277 reducer.cpp:1529] Warning: ...`,
  compared without the rank prefix and the timestamp;
- Python warnings: `/path/file.py:12: UserWarning: ...` (optionally rank-prefixed), compared by
  the whole line, and the indented source line(s) that follow it are dropped with it.
Every other line passes unchanged, even when it repeats.
"""

from __future__ import annotations

import re

_RANK = re.compile(r"^\[(?:rank|default)\d+\]:")
_CPP = re.compile(r"^\[W\d{4} [\d:.]+ (?P<where>[^\]]+)\] (?P<text>Warning: .*)$")
_PY = re.compile(r"^(?P<where>\S+:\d+): (?P<text>\w*Warning: .*)$")


class WarningDedupe:
    """Feed each line to `keep(line)`; False for a repeat of a warning already shown."""

    def __init__(self):
        self.seen: set[str] = set()
        self.dropping_source = False

    def keep(self, line: str) -> bool:
        if self.dropping_source and line.startswith((" ", "\t")):
            return False  # the source line under a dropped Python warning
        self.dropping_source = False
        key = warning_key(line)
        if key is None:
            return True
        if key in self.seen:
            self.dropping_source = key.startswith("py ")
            return False
        self.seen.add(key)
        return True


def warning_key(line: str) -> str | None:
    """What identifies a warning line across ranks (None: not a warning)."""
    text = _RANK.sub("", line.rstrip("\n"))
    cpp = _CPP.match(text)
    if cpp:
        return f"cpp {cpp['where']} {cpp['text']}"
    py = _PY.match(text)
    if py:
        return f"py {py['where']} {py['text']}"
    return None
