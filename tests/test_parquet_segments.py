"""The orderings stage's partitioned order reads the packing's segments.parquet a batch at a time
(``pipeline/ordering/parquet_segments.py``, issue 55): the same deal and order as from the frame
in memory, byte for byte, in deal chunks cut across the file's batches; a file out of sequence
order, a segment of an unknown document and a frozen sequence the packing lacks are refused."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest
from test_partitioned import BATCH, SEQ_LEN, bound, corpus, corpus_frames

from pipeline.errors import StrataInputError
from pipeline.ordering import parquet_segments, partitioned
from pipeline.ordering.doc_arrays import document_arrays
from pipeline.ordering.engine import OrderParams, run_strategy
from pipeline.ordering.parquet_segments import ParquetSegments, parquet_sequences
from pipeline.ordering.partitioned import partitioned_ids


@pytest.fixture(scope="module")
def packing(tmp_path_factory):
    docs, seg = corpus_frames(8_000, seed=11)
    path = tmp_path_factory.mktemp("packing") / "segments.parquet"
    seg.write_parquet(path)
    return docs, seg, path


def test_the_deal_from_parquet_is_the_frames_byte_for_byte(packing, tmp_path, monkeypatch):
    """Deal chunks of 700 sequences from batches of 1,000 segments: the chunks straddle the
    batches, and the order is the in-memory corpus's bytes."""
    docs, seg, path = packing
    monkeypatch.setattr(partitioned, "DEAL_CHUNK", 700)
    monkeypatch.setattr(parquet_segments, "BATCH_ROWS", 1_000)
    inmem = corpus(docs, seg)
    cluster, length = document_arrays(docs["doc_id"].to_numpy(), docs["cluster"].to_numpy(), docs["n_tokens"].to_numpy())
    streamed = ParquetSegments(path, cluster, length, {}, inmem.params)
    assert streamed.n_sequences == inmem.n_sequences == parquet_sequences(path)
    assert np.array_equal(streamed.bin_edges, inmem.bin_edges) and streamed.n_clusters == inmem.n_clusters
    assert list(streamed.ranges(700)) == list(inmem.ranges(700))
    want = partitioned_ids("greedy", inmem, 3, 0, work_dir=tmp_path / "a")
    got = partitioned_ids("greedy", streamed, 3, 0, work_dir=tmp_path / "b")
    assert got.tobytes() == want.tobytes()


def test_run_strategy_reads_the_file_as_the_frame(packing, tmp_path):
    """Given the segments' file, run_strategy orders as from the frame: in one part (the file read
    whole) and in three (read by the deal), a frozen prefix too."""
    docs, seg, path = packing
    m = seg["sequence_id"].n_unique()
    for parts in (1, 3):
        params = OrderParams(length_bins=20, batch_size=BATCH, order_part_bytes=bound(m, parts) if parts > 1 else 0)
        for prefix in (None, np.arange(0, 3 * m // 4, 3)):
            frame = run_strategy("greedy", docs, seg, SEQ_LEN, params, 0, prefix=prefix, work_dir=tmp_path).order
            filed = run_strategy("greedy", docs, path, SEQ_LEN, params, 0, prefix=prefix, work_dir=tmp_path).order
            assert filed.equals(frame), (parts, prefix is None)


def test_bad_files_are_refused(packing, tmp_path):
    docs, seg, path = packing
    m = seg["sequence_id"].n_unique()
    params = OrderParams(length_bins=20, batch_size=BATCH, order_part_bytes=bound(m, 3))
    shuffled = tmp_path / "shuffled.parquet"
    seg.sort("sequence_id", descending=True).write_parquet(shuffled)
    with pytest.raises(StrataInputError, match="ascending sequence_id"):
        run_strategy("greedy", docs, shuffled, SEQ_LEN, params, 0, work_dir=tmp_path)
    with pytest.raises(StrataInputError, match="missing from the documents"):
        run_strategy("greedy", docs.filter(pl.col("doc_id") != 5), path, SEQ_LEN, params, 0, work_dir=tmp_path)
    with pytest.raises(StrataInputError, match="missing from the packing"):
        run_strategy("greedy", docs, path, SEQ_LEN, params, 0, prefix=np.array([0, 10 * m]), work_dir=tmp_path)
