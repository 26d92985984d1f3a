"""The base packing's ``segments.parquet`` read a batch of rows at a time: the partitioned
ordering's input in the ``orderings`` stage, so the driver never holds the packing's segments.

What :class:`ParquetSegments` holds is the per-document arrays (each document's cluster and
stream length, the objective's documents columns: a few bytes a document, as the packing itself
needs) and one deal chunk's segments. It reads the file twice: once for the checks, the sequences'
count and the documents the packing holds (the length-bin edges, the clusters' and columns' widths: those of
:class:`pipeline.ordering.partitioned.Corpus` on the same arrays), then once more as the deal
walks it, in chunks of exactly the deal's size, so the deal and the order are the in-memory
corpus's byte for byte (``tests/test_parquet_segments.py``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator, Mapping

import numpy as np
import pyarrow.parquet as pq

from pipeline.errors import StrataInputError
from pipeline.ordering.doc_arrays import names_absent
from pipeline.ordering.features import length_bin_edges
from pipeline.ordering.partitioned import stretch_features

BATCH_ROWS = 1 << 20  # segments read at once
COLUMNS = ["sequence_id", "doc_id", "n_tokens"]


def _batches(path: Path, columns: list[str]) -> Iterator[list[np.ndarray]]:
    for batch in pq.ParquetFile(path).iter_batches(batch_size=BATCH_ROWS, columns=columns):
        yield [batch.column(i).to_numpy(zero_copy_only=False) for i in range(len(columns))]


def _new_sequences(seq: np.ndarray, last: int | None) -> int:
    """The sequences a non-empty batch of grouped sequence ids starts, the one ``last`` ended in not counted."""
    return int(np.count_nonzero(seq[1:] != seq[:-1])) + int(last is None or seq[0] != last)


def parquet_sequences(path: Path) -> int:
    """The sequences of a segments Parquet file (its sequence ids grouped), read a batch at a time."""
    n, last = 0, None
    for (seq,) in _batches(Path(path), ["sequence_id"]):
        if seq.size:
            n += _new_sequences(seq, last)
            last = seq[-1]
    return n


class ParquetSegments:
    """The deal's corpus (``n_sequences``, ``bin_edges``, ``n_clusters``, ``widths``, ``params``,
    :meth:`ranges`, :meth:`chunk`) from ``segments.parquet`` (sequence_id, doc_id, n_tokens; each
    sequence's segments together, the sequences in ascending id, as the packing writes them) and the
    per-document ``cluster`` (-1: absent), ``length`` and ``columns``."""

    def __init__(self, path: Path, cluster: np.ndarray, length: np.ndarray, columns: Mapping[str, np.ndarray], params: Any):
        self.path, self.params = Path(path), params
        self.cluster, self.length, self.columns = cluster, length, dict(columns)
        held, n, last = np.zeros(cluster.size, dtype=bool), 0, None
        for seq, doc in _batches(self.path, ["sequence_id", "doc_id"]):
            if seq.size == 0:
                continue
            if np.any(np.diff(seq) < 0) or (last is not None and seq[0] < last):
                raise StrataInputError("the segments are not in ascending sequence_id", path=self.path,
                                       fix="re-materialize sequences (the packing writes its segments in sequence order)")
            if names_absent(doc, cluster):
                raise StrataInputError("a segment names a doc_id missing from the documents", path=self.path,
                                       fix="pack and order the same documents table")
            n += _new_sequences(seq, last)
            held[doc] = True
            last = seq[-1]
        self._n = n
        docs = np.flatnonzero(held)
        self.bin_edges = length_bin_edges(length[docs], params.length_bins, params.length_bin_weighting)
        self.n_clusters = int(cluster[docs].max()) + 1 if docs.size else 0
        self.widths = {name: int(codes[docs].max()) + 1 for name, codes in self.columns.items()}
        self._held: tuple[int, list[np.ndarray]] | None = None

    @property
    def n_sequences(self) -> int:
        return self._n

    def ranges(self, chunk: int) -> Iterator[tuple[int, int]]:
        """Stretches ``[a, b)`` of ``chunk`` sequences (the last fewer), in id order, read as they
        come; each stretch's segments are held for the :meth:`chunk` call that follows its yield."""
        pending, a = [np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64)], 0
        for arrays in _batches(self.path, COLUMNS):
            pending = [np.concatenate([p, x]) for p, x in zip(pending, arrays)]
            starts = np.flatnonzero(np.r_[True, pending[0][1:] != pending[0][:-1]])
            while starts.size > chunk:  # the first ``chunk`` sequences end before the last one starts
                cut = int(starts[chunk])
                self._held = (a, [x[:cut] for x in pending])
                yield a, a + chunk
                a, pending, starts = a + chunk, [x[cut:] for x in pending], starts[chunk:] - cut
        while pending[0].size:
            starts = np.flatnonzero(np.r_[True, pending[0][1:] != pending[0][:-1]])
            cut = int(starts[chunk]) if starts.size > chunk else pending[0].size
            self._held = (a, [x[:cut] for x in pending])
            b = a + min(chunk, starts.size)
            yield a, b
            a, pending = b, [x[cut:] for x in pending]
        self._held = None

    def chunk(self, a: int, b: int):
        """The features of sequences ``[a, b)``, the stretch :meth:`ranges` just yielded."""
        if self._held is None or self._held[0] != a:
            raise RuntimeError("ParquetSegments.chunk serves the stretch ranges() just yielded, in order")
        seq, doc, tokens = self._held[1]
        return stretch_features(self, seq, doc, tokens)
