"""The one error type users see: what went wrong, where, and how to fix it."""

from __future__ import annotations

import errno
import functools
import re


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


_STORAGE_FIXES = {
    "ENOSPC": ("no space left on the device", "free space on that volume, or write to one with room, and rerun"),
    "EDQUOT": ("the disk quota is exhausted", "free space under your quota, or write to another volume, and rerun"),
    "EFBIG": ("the file is larger than the limit on file size (ulimit -f) or the filesystem allows",
              "raise the limit (ulimit -f unlimited) or write to a filesystem that takes larger files, and rerun"),
    "SHORT": ("a write was cut short: the volume is full, a quota is exhausted or the limit on file size (ulimit -f) was reached",
              "free space on that volume, or raise the limit (ulimit -f unlimited), and rerun"),
    "EROFS": ("the file system is read-only", "remount it read-write, or pass --data-root / --out a writable folder"),
    "EACCES": ("permission denied", "make the folder writable for this user, or pass --data-root / --out a folder you can write"),
    "EPERM": ("operation not permitted", "make the folder writable for this user, or pass --data-root / --out a folder you can write"),
}


def storage_error(exc: BaseException, path: object | None = None) -> "StrataInputError | None":
    """The :class:`StrataInputError` for an OSError that is the machine's storage refusing a write
    (a full volume, a quota, the file-size limit, a read-only file system, no permission), naming
    the file (``exc.filename``, else ``path``) and the fix; None for any other error. What was
    written before stays: every artifact is written beside its destination and renamed into place,
    so the failed write left the old file as it was."""
    if not isinstance(exc, OSError):
        return None
    said = str(exc.strerror or (exc.args[0] if exc.args else ""))
    if exc.errno is None and re.search(r"\d+ requested and \d+ written", said):
        name = "SHORT"  # NumPy's tofile reports a short write without the errno
    else:
        name = errno.errorcode.get(exc.errno, "") if exc.errno is not None else ""
    if name not in _STORAGE_FIXES:
        return None
    what, fix = _STORAGE_FIXES[name]
    where = exc.filename if exc.filename is not None else path
    return StrataInputError(f"{what} ({said}) while writing; nothing written before was changed", path=where,
                            fix=f"{fix} (what finished is kept)")
