"""A packing read stretch by stretch from segment files: the partitioned ordering's input when no
process may hold the corpus's segments or per-document arrays.

Each file (``.npz``) holds whole sequences, in ascending sequence id, as one row per segment:

- ``sequence_id`` (int64), grouped by sequence and ascending across the files;
- ``n_tokens``: the segment's tokens;
- ``cluster`` and ``length``: its document's cluster and stream length (n_tokens + 1), repeated on
  every segment of the document (in place of the per-document arrays indexed by doc_id);
- ``first`` (bool): the segment is its document's first, so the length bins' quantiles count every
  document once, as ``length_bin_edges`` of the documents the packing holds does;
- ``column.<name>`` (optional): the document's dense code in a documents column the objective names.

:class:`SegmentFiles` reads every file once to count the documents' lengths (the corpus's length-bin
edges, ``counted_length_bin_edges``), the clusters and the columns' widths, then serves
:func:`pipeline.ordering.partitioned.deal` one stretch at a time: what it holds is one file's
segments, never the corpus's.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any, Iterator, Sequence

import numpy as np

from pipeline.errors import StrataInputError
from pipeline.ordering.features import COUNTED_MAX, counted_length_bin_edges, packed_sequence_features
from pipeline.storage.atomic import atomic_path

SEGMENT_ARRAYS = ("sequence_id", "n_tokens", "cluster", "length", "first")


def write_segment_file(path: Path, sequence_id: np.ndarray, n_tokens: np.ndarray, cluster: np.ndarray, length: np.ndarray,
                       first: np.ndarray, columns: dict[str, np.ndarray] | None = None) -> Path:
    """One segment file (the module docstring's arrays), written atomically."""
    arrays = {"sequence_id": sequence_id, "n_tokens": n_tokens, "cluster": cluster, "length": length, "first": first}
    arrays |= {f"column.{k}": v for k, v in (columns or {}).items()}
    with atomic_path(Path(path)) as tmp, open(tmp, "wb") as fh:
        np.savez(fh, **arrays)
    return Path(path)


def _load(path: Path) -> dict[str, np.ndarray]:
    with np.load(path, allow_pickle=False) as z:
        missing = [k for k in SEGMENT_ARRAYS if k not in z.files]
        if missing:
            raise StrataInputError(f"{path}: segment file lacks {missing}", fix="write it with write_segment_file")
        return {k: z[k] for k in z.files}


class SegmentFiles:
    """The deal's corpus (what :class:`pipeline.ordering.partitioned.Corpus` gives from arrays in
    memory), from segment files: ``n_sequences``, ``bin_edges``, ``n_clusters``, ``params``,
    :meth:`ranges` and :meth:`chunk`. Holds one file's segments at a time."""

    def __init__(self, files: Sequence[Path], params: Any):
        self.files, self.params = [Path(f) for f in files], params
        counts, n_clusters, widths, per_file, last = np.zeros(0, np.int64), 0, {}, [], -1
        for path in self.files:
            z = _load(path)
            seq = z["sequence_id"]
            if seq.size == 0 or seq[0] <= last or np.any(np.diff(seq) < 0):
                raise StrataInputError(f"{path}: sequence ids must ascend within and across the files",
                                       fix="write whole sequences in order")
            lengths = z["length"][z["first"]]
            if lengths.size and (lengths.min() <= 0 or lengths.max() > COUNTED_MAX):
                raise StrataInputError(f"{path}: a document length is outside 1..{COUNTED_MAX}", fix="pass stream lengths (n_tokens + 1)")
            c = np.bincount(lengths)
            counts = np.pad(counts, (0, max(0, c.size - counts.size)))
            counts[: c.size] += c
            n_clusters = max(n_clusters, int(z["cluster"].max()) + 1)
            for k in (k for k in z if k.startswith("column.")):
                widths[k[len("column."):]] = max(widths.get(k[len("column."):], 0), int(z[k].max()) + 1)
            per_file.append(int(np.count_nonzero(seq[1:] != seq[:-1])) + 1)
            last = int(seq[-1])
        self.bin_edges = counted_length_bin_edges(counts, params.length_bins, params.length_bin_weighting)
        self.n_clusters, self.widths = n_clusters, widths
        self.per_file = np.asarray(per_file, dtype=np.int64)
        self._cached: tuple[int, dict[str, np.ndarray], np.ndarray] | None = None

    @property
    def n_sequences(self) -> int:
        return int(self.per_file.sum())

    def ranges(self, chunk: int) -> Iterator[tuple[int, int]]:
        """Stretches ``[a, b)`` of sequences (by rank in id order) of at most ``chunk``, never across a file."""
        start = 0
        for n in self.per_file.tolist():
            for a in range(start, start + n, chunk):
                yield a, min(a + chunk, start + n)
            start += n

    def _file(self, a: int) -> tuple[int, dict[str, np.ndarray], np.ndarray]:
        f = int(np.searchsorted(np.cumsum(self.per_file), a, side="right"))
        if self._cached is None or self._cached[0] != f:
            self._cached = None  # the previous file's arrays go before the next file's are read
            z = _load(self.files[f])
            seq = z["sequence_id"]
            starts = np.append(np.flatnonzero(np.r_[True, seq[1:] != seq[:-1]]), seq.size)
            self._cached = (f, z, starts)
        return self._cached

    def chunk(self, a: int, b: int):
        """The features of sequences ``[a, b)`` (ranks in id order, within one file), binned and sized as the whole corpus's."""
        f, z, starts = self._file(a)
        base = int(self.per_file[:f].sum())
        lo, hi = starts[a - base], starts[b - base]
        n = hi - lo
        columns = {k[len("column."):]: z[k][lo:hi] for k in z if k.startswith("column.")}
        # each segment stands for its document: the per-document lookups index the stretch's own rows
        feats = packed_sequence_features(z["sequence_id"][lo:hi], np.arange(n), z["n_tokens"][lo:hi], z["cluster"][lo:hi],
                                         z["length"][lo:hi], self.params.length_bins, columns, self.params.length_bin_weighting,
                                         bin_edges=self.bin_edges)
        joint = np.zeros((self.n_clusters, self.bin_edges.size + 1))
        joint[: feats.cluster_bin_tokens.shape[0]] += feats.cluster_bin_tokens
        cols = {k: replace(v, n_cols=self.widths[k]) for k, v in feats.columns.items()}
        return replace(feats, clusters=replace(feats.clusters, n_cols=self.n_clusters), columns=cols), joint
