"""The partitioned ordering read from segment files (issue 55): the same order as from arrays in
memory, byte for byte; the stream written part by part equals the parts' stream; a bad file is refused."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from pipeline.errors import StrataInputError
from pipeline.ordering import partitioned
from pipeline.ordering.engine import OrderParams
from pipeline.ordering.features import counted_length_bin_edges, length_bin_edges
from pipeline.ordering.partitioned import Corpus, partitioned_ids, partitioned_stream
from pipeline.ordering.parts import LAYOUTS, part_sizes, stream_of, write_stream
from pipeline.ordering.segment_files import SegmentFiles, write_segment_file
from pipeline.packing.pack import pack_concat

SEQ_LEN, BATCH = 256, 16
PARAMS = OrderParams(length_bins=20, batch_size=BATCH)


@pytest.fixture(scope="module")
def packing():
    rng = np.random.default_rng(5)
    n_docs, k = 5_000, 30
    p = 1 / np.arange(1, k + 1)
    cluster = rng.choice(k, n_docs, p=p / p.sum())
    length = np.clip(rng.lognormal(4.5, 1.0, n_docs), 1, 5000).astype(np.int64)
    seg = pack_concat(rng.permutation(n_docs), length, SEQ_LEN).segments
    return cluster, length, seg


def _files(packing, folder, cuts) -> list:
    """The packing as segment files cut at the sequence ids ``cuts``."""
    cluster, length, seg = packing
    seq, doc, tok = (seg[c].to_numpy() for c in ("sequence_id", "doc_id", "n_tokens"))
    first = np.zeros(seq.size, bool)
    first[np.unique(doc, return_index=True)[1]] = True  # a document's first segment: its lengths counted once
    out = []
    for i, (a, b) in enumerate(zip(cuts[:-1], cuts[1:])):
        keep = (seq >= a) & (seq < b)
        out.append(write_segment_file(folder / f"s{i}.npz", seq[keep], tok[keep], cluster[doc[keep]], length[doc[keep]], first[keep]))
    return out


def test_counted_edges_equal_the_edges_of_the_lengths():
    lengths = np.random.default_rng(0).integers(1, 3000, 10_000)
    for weighting in ("tokens", "documents"):
        assert np.array_equal(counted_length_bin_edges(np.bincount(lengths), 50, weighting), length_bin_edges(lengths, 50, weighting))


def test_segment_files_give_the_order_of_the_arrays_byte_for_byte(packing, tmp_path, monkeypatch):
    """Three files cut at the deal's chunks, four parts: the stream the parts' orders make is the
    in-memory corpus's, and the one written part by part equals it."""
    cluster, length, seg = packing
    m = seg["sequence_id"].n_unique()
    monkeypatch.setattr(partitioned, "DEAL_CHUNK", 100)  # chunks of the deal: the stationary families' classes are a chunk's
    files = _files(packing, tmp_path, [0, 200, 700, m])
    inmem = Corpus(seg["sequence_id"].to_numpy(), seg["doc_id"].to_numpy(), seg["n_tokens"].to_numpy(), cluster, length, {}, PARAMS)
    streamed = SegmentFiles(files, PARAMS)
    assert streamed.n_sequences == m and np.array_equal(streamed.bin_edges, inmem.bin_edges)
    want = partitioned_ids("greedy", inmem, 4, 0, work_dir=tmp_path / "a")
    got = partitioned_stream("greedy", streamed, 4, 0, tmp_path / "stream.npy", work_dir=tmp_path / "b")
    assert np.load(got).tobytes() == want.tobytes()
    assert list((tmp_path / "b").iterdir()) == []  # the parts' files are removed


def test_the_written_stream_equals_the_stream(tmp_path):
    for m, parts, batch, rounds in ((103, 4, 8, 1), (1000, 7, 16, 3), (64, 4, 16, 100)):
        for layout in LAYOUTS:
            sizes = part_sizes(m, parts, batch, layout)
            orders = [np.arange(s) + 10_000 * p for p, s in enumerate(sizes)]
            paths = []
            for p, o in enumerate(orders):
                np.save(tmp_path / f"o{p}.npy", o)
                paths.append(tmp_path / f"o{p}.npy")
            write_stream(paths, batch, tmp_path / "s.npy", layout, rounds=rounds)
            assert np.array_equal(np.load(tmp_path / "s.npy"), stream_of(orders, batch, layout)), layout


def test_unordered_files_are_refused(packing, tmp_path):
    m = pl.Series(packing[2]["sequence_id"]).n_unique()
    files = _files(packing, tmp_path, [0, 400, m])
    with pytest.raises(StrataInputError, match="must ascend"):
        SegmentFiles(files[::-1], PARAMS)
