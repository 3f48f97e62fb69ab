"""User-facing errors: one line naming the value and the fix; the CLI prints it and exits non-zero."""

import re

_LEADING_FLAG = re.compile(r"^(--[a-z][a-z0-9-]*)\b")


class MeshplanError(ValueError):
    """A mistake in the user's input (file, flag, model, cluster). Never a bug in meshplan.

    The message is a single line: what was wrong (field and value) and how to fix it. `field` is
    the offending option or job-file key (`--json` errors carry it); by default the --flag the
    message starts with, if any.
    """

    exit_code = 2

    def __init__(self, message: str = "", *, field: str | None = None):
        super().__init__(message)
        hit = _LEADING_FLAG.match(message) if isinstance(message, str) else None
        self.field = field if field is not None else (hit.group(1) if hit else None)


class InfeasibleError(MeshplanError):
    """No plan fits the cluster; the message says what would (more GPUs, which knob)."""

    exit_code = 3


class ConflictError(InfeasibleError):
    """No plan fits because every layout breaks a validity rule (meshplan/feasibility.py): the
    inputs contradict each other (`--zero 3 --compression powersgd`), which is a mistake in the
    input (exit 2), not a cluster too small. The message is the rule the pins break."""

    exit_code = 2


class RunError(MeshplanError):
    """A launched job failed (a rank died, hung, or returned an error)."""

    exit_code = 4


class RunInterrupted(KeyboardInterrupt):
    """The launcher was stopped by a signal (SIGINT, SIGTERM, SIGHUP) and has stopped every rank.

    Exits with 128 + the signal number (130 SIGINT, 143 SIGTERM, 129 SIGHUP), as a shell reports
    a process killed by that signal. The message says which checkpoint survived."""

    def __init__(self, signum: int, message: str):
        super().__init__(message)
        self.signum = signum
        self.exit_code = 128 + signum


def os_error_text(exc: OSError) -> str:
    """An OSError as words for a person: a full disk or quota says so plainly."""
    return "the disk is full (no space left on device)" if disk_full(exc) else exc.strerror or str(exc)


def disk_full(exc: BaseException) -> bool:
    import errno

    return isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT)
