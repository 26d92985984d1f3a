"""The log file of a ``strata run``: every byte of a run's stderr goes there, the terminal gets a
one-line pointer in place of each error record's trace, and a failed run's error names the file."""

from __future__ import annotations

import os
import re
import traceback
from pathlib import Path

from pipeline.errors import StrataRunError

_RECORD = re.compile(r"^(?:\x1b\[[0-9;]*m)*\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}")  # a Dagster log record's first line


class RunTerminal:
    """``sys.stderr`` during a run: every byte goes to the run's log file; the terminal gets the same
    except the body of Dagster's ERROR records (the repeated error and ~80 lines of stack trace),
    which it replaces by one line naming the log file."""

    def __init__(self, term, log: Path):
        self.term, self.path, self.skipping = term, log, False
        log.parent.mkdir(parents=True, exist_ok=True)
        self.log = open(log, "a", encoding="utf-8", errors="replace")

    def write(self, text: str) -> int:
        self.log.write(text)
        if _RECORD.match(text):
            self.skipping = " - ERROR - " in text
            if self.skipping:
                self.term.write(text.splitlines()[0] + f"\n  (the error and its trace: {self.path})\n")
                return len(text)
        if not self.skipping:
            self.term.write(text)
        return len(text)

    def flush(self) -> None:
        self.log.flush()
        self.term.flush()

    def isatty(self) -> bool:
        return self.term.isatty()

    def __getattr__(self, name):
        return getattr(self.term, name)


def run_log_path() -> Path | None:
    """The log file of this ``strata run`` (``STRATA_RUN_LOG``, set by ``materialize_all``), if any."""
    value = os.environ.get("STRATA_RUN_LOG")
    return Path(value) if value else None


def run_failed(selection: list[str], partition: str | None, cause: BaseException | None, log: Path | None) -> StrataRunError:
    """The :class:`StrataRunError` of a failed run, the current exception's trace appended to ``log``."""
    what = ", ".join(selection) + (f" [{partition}]" if partition else "")
    first = (str(cause).strip().splitlines() or [""])[0][:300] if cause is not None else ""
    why = f": {type(cause).__name__}" + (f": {first}" if first else "") if cause is not None else ""
    if log is None:
        return StrataRunError(f"materialization failed: {what}{why}")
    if cause is not None:
        with open(log, "a", encoding="utf-8", errors="replace") as fh:
            fh.write(f"\nstrata: materialization failed: {what}\n{traceback.format_exc()}")
    return StrataRunError(f"materialization failed: {what}{why}. Fix: the error and its trace are in {log}; "
                          "fix the cause and rerun (what finished is kept)")
