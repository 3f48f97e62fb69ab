"""User-facing errors: one line naming the value and the fix; the CLI prints it and exits non-zero."""


class MeshplanError(ValueError):
    """A mistake in the user's input (file, flag, model, cluster). Never a bug in meshplan.

    The message is a single line: what was wrong (field and value) and how to fix it.
    """

    exit_code = 2


class InfeasibleError(MeshplanError):
    """No plan fits the cluster; the message says what would (more GPUs, which knob)."""

    exit_code = 3


class RunError(MeshplanError):
    """A launched job failed (a rank died, hung, or returned an error)."""

    exit_code = 4
