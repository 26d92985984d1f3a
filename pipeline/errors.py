"""The one error type users see: what went wrong, where, and how to fix it."""

from __future__ import annotations

import functools


class StrataInputError(ValueError):
    """Bad input or an impossible parameter.

    The message names the file (and line, when there is one), the problem and the fix, so a
    user can act on it without reading a traceback.
    """

    def __init__(self, problem: str, *, fix: str, path: object | None = None, line: int | None = None):
        where = ""
        if path is not None:
            where = f"{path}"
            if line is not None:
                where += f", line {line}"
            where += ": "
        super().__init__(f"{where}{problem}. Fix: {fix}")
        self.problem = problem
        self.fix = fix
        self.path = path
        self.line = line

    def __reduce__(self):
        """Pickled as its parts (the keyword-only ``fix`` defeats the default), so a worker
        process's error reaches ``strata run`` as itself."""
        return (functools.partial(StrataInputError, self.problem, fix=self.fix, path=self.path, line=self.line), ())


class StrataRunError(RuntimeError):
    """A step of ``strata run`` failed for a reason other than bad input (an OSError, a failed check, a
    bug): one line naming the run, the cause and the log file that holds Dagster's record of it and
    the trace, which ``strata`` prints as ``strata: error: ...`` (exit code 1) instead of the trace."""
