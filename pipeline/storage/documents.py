"""The documents table as the measures read it: each document's cluster and stream length, and a
string column's labels as dense integer codes (read through Parquet's dictionary)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl
import pyarrow.parquet as pq

from pipeline.storage.layout import Layout, Store
from pipeline.threads import concurrently


def document_features(layout: Layout, source_codes: bool = False) -> pl.DataFrame:
    """doc_id-indexed ``cluster`` and ``stream_length`` (n_tokens + 1), plus ``source``: the labels,
    or with ``source_codes`` their dense integer codes in sorted label order (missing = ""), read
    through the column's dictionary without a string per document (what the diagnostics keep)."""
    if source_codes:  # only what the schedule reads, lengths in 32 bits; the codes decoded while the columns are read
        docs, codes = concurrently(lambda: Store(layout).document_clusters(["n_tokens"]), lambda: label_codes(layout.documents, "source"))
        return docs.select("doc_id", "cluster", source=pl.Series(codes), stream_length=(pl.col("n_tokens") + 1).cast(pl.Int32))
    docs = Store(layout).document_clusters(["n_tokens", "source"])
    return docs.with_columns(stream_length=pl.col("n_tokens") + 1)


def label_codes(path: Path, column: str, batch_rows: int = 1 << 20) -> np.ndarray:
    """Dense codes 0..S-1 (int32; sorted label text, a missing label is "") of a string column of
    a Parquet file, decoded batch by batch as a dictionary: one small int a row, no strings."""
    f = pq.ParquetFile(path, read_dictionary=[column])
    out = np.empty(f.metadata.num_rows, np.int32)
    spans, at = [], 0
    for batch in f.iter_batches(batch_size=batch_rows, columns=[column]):
        arr = batch.column(0)
        names = [("" if v is None else v) for v in arr.dictionary.to_pylist()]
        codes = arr.indices.fill_null(len(names)) if arr.null_count else arr.indices  # len(names): a missing label
        out[at : at + len(arr)] = int_values(codes)
        spans.append((at, at + len(arr), names + [""]))
        at += len(arr)
    present = sorted({n for _, _, names in spans for n in names})
    code = {n: i for i, n in enumerate(present)}
    for lo, hi, names in spans:
        out[lo:hi] = np.array([code[n] for n in names], np.int32)[out[lo:hi]]
    used = np.zeros(len(present), bool)  # labels of no row (and "" when no label is missing) leave no gap
    used[out] = True
    return out if used.all() else (np.cumsum(used) - 1).astype(np.int32)[out]


def int_values(array) -> np.ndarray:
    """An Arrow integer array without nulls as NumPy, read from its values buffer without a copy
    (pyarrow's own ``to_numpy`` imports pandas on its first use in a process)."""
    width = array.type.bit_width // 8
    return np.frombuffer(array.buffers()[1], f"<i{width}", len(array), array.offset * width)
