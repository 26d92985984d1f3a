"""The ordering diagnostics of a stream too large to hold: prefix errors, batch deviations and
worst windows from stretches of the stream read one after another.

:class:`StreamedDiagnostics` takes the stream's sequences in stream order, a stretch at a time
(each a sparse composition: per sequence its (group, tokens) entries), and gives what
:func:`pipeline.ordering.composition.prefix_errors`, :func:`pipeline.reports.diagnostics.batch_deviations`
and :func:`pipeline.reports.windows.worst_windows` give of the whole stream, equal to them
(``tests/test_streamed.py``):

- the prefix error ``||T(t) - tau S(t)||_2 / S(t)`` (Don't Shuffle, Optimize's tracked error) at
  the given prefix lengths t, from the stretch's own prefix totals plus the stretches' before it;
- each full batch's ``max_j |rho_j(batch) - tau_j|``;
- the worst window of every length ``batch * 2**i``: each stretch's per-batch entries go to a spill
  file (group and tokens, 6 bytes an entry), read back once at the end for the windows' slide.

What it holds: a stretch, the G-vector of the totals so far, a float per batch and, at the end,
the batches' entries (not the sequences'). The stream's tau (the global shares) is given: a stream
read once cannot know it before its end.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pipeline.errors import StrataInputError
from pipeline.ordering import kernels as K
from pipeline.reports.windows import window_spans


@dataclass(frozen=True)
class StreamFigures:
    """The diagnostics of a whole stream: prefix errors at ``points``, every full batch's deviation,
    and the worst window of each length (``window_lengths`` sequences; its first sequence at ``window_start``)."""

    points: np.ndarray
    prefix_error: np.ndarray
    batch_dev: np.ndarray
    window_lengths: np.ndarray
    window_worst: np.ndarray
    window_start: np.ndarray


class StreamedDiagnostics:
    """Stretch by stretch (:meth:`add`), then :meth:`finish`. ``tau``: the groups' global shares;
    ``points``: ascending prefix lengths (sequences) to report; ``spill``: a folder for the batches' entries."""

    def __init__(self, tau: np.ndarray, batch: int, points: np.ndarray, spill: Path | None = None):
        if batch < 1:
            raise StrataInputError(f"batch size {batch} is impossible", fix="use a batch size >= 1")
        self.tau = np.asarray(tau, dtype=np.float64)
        self.batch, self.points = int(batch), np.asarray(points, dtype=np.int64)
        by_share = np.argsort(-self.tau, kind="stable")
        self.rank = np.empty_like(by_share)
        self.rank[by_share] = np.arange(by_share.size)
        self.tau_sorted = self.tau[by_share]
        self.group_dtype = np.int16 if self.tau.size < 2**15 else np.int32
        self.before = np.zeros(self.tau.size, np.int64)
        self.at, self.done = 0, False
        self.prefix: list[np.ndarray] = []
        self.devs: list[np.ndarray] = []
        self.dir = Path(tempfile.mkdtemp(prefix="streamed-", dir=spill))
        self.files = [open(self.dir / name, "wb") for name in ("counts", "group", "tokens")]

    def add(self, ptr: np.ndarray, group: np.ndarray, tokens: np.ndarray) -> None:
        """The next ``ptr.size - 1`` sequences of the stream: sequence i's entries at ``ptr[i]:ptr[i+1]``.
        Every stretch but the last holds whole batches."""
        if self.done:
            raise StrataInputError("the stream ended with a stretch of a partial batch", fix="give stretches of whole batches")
        n = ptr.size - 1
        order = np.arange(n, dtype=np.int64)
        inside = self.points[(self.points > self.at) & (self.points <= self.at + n)]
        if inside.size:
            totals = K.prefix_totals(order, ptr, group, tokens, self.tau.size, inside - self.at) + self.before
            s = totals.sum(axis=1)
            self.prefix.append(np.linalg.norm(totals - np.outer(s, self.tau), axis=1) / s)
        self.before += K.group_tokens(group, tokens, self.tau.size).astype(np.int64)
        nb = n // self.batch
        if nb:
            self.devs.append(K.batch_deviations(order, ptr, group, tokens, self.rank, self.tau_sorted, self.batch, nb))
            bptr, bgroup, btokens = K.batch_entries(order, ptr, group, tokens, self.tau.size, self.batch, nb)
            for fh, a in zip(self.files, (np.diff(bptr), bgroup.astype(self.group_dtype), btokens.astype(np.int32))):
                fh.write(np.ascontiguousarray(a).tobytes())
        self.at += n
        self.done = n % self.batch != 0

    def finish(self) -> StreamFigures:
        """The figures of everything added; the spill folder is removed."""
        for fh in self.files:
            fh.close()
        try:
            counts = np.fromfile(self.dir / "counts", dtype=np.int64)
            bptr = np.zeros(counts.size + 1, np.int64)
            np.cumsum(counts, out=bptr[1:])
            del counts
            bgroup = np.fromfile(self.dir / "group", dtype=self.group_dtype)
            btokens = np.fromfile(self.dir / "tokens", dtype=np.int32)
        finally:
            for name in ("counts", "group", "tokens"):
                (self.dir / name).unlink(missing_ok=True)
            self.dir.rmdir()
        spans = window_spans(self.at, self.batch)
        worst, first = K.worst_windows(bptr, bgroup, btokens, self.tau, self.rank, self.tau_sorted, spans) if spans.size \
            else (np.zeros(0), np.zeros(0, np.int64))
        points = self.points[self.points <= self.at]
        return StreamFigures(points, np.concatenate(self.prefix) if self.prefix else np.zeros(0),
                             np.concatenate(self.devs) if self.devs else np.zeros(0), spans * self.batch, worst, first * self.batch)
