"""The one error type users see: what went wrong, where, and how to fix it."""

from __future__ import annotations


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
