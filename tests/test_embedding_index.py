"""The embedding matrix read through its index over the embedding_shards files holds, at every row,
the rows of gathering the shards' kept rows in corpus order; k-means through it equals k-means on
the gathered matrix."""

from __future__ import annotations

import argparse
import hashlib
import os

import numpy as np
import polars as pl
import pytest
from helpers import three_shard_corpus

from pipeline.claims.stage import ClaimsParams
from pipeline.cli import tools
from pipeline.config import config_from_dict
from pipeline.data.shard_docs import kept_rows, manifest_shards
from pipeline.errors import StrataInputError
from pipeline.reports.diagnostics import corpus_diagnostics
from pipeline.represent.calibrate import calibrate_k
from pipeline.represent.clusters import assign_clusters, diversity_clusters, kmeans, train_kmeans
from pipeline.represent.embedding_index import (
    ShardedRows,
    has_embeddings,
    open_embeddings,
    write_embedding_runs,
)
from pipeline.represent.embedding_shards import (
    embed_shards,
    embedding_file,
    embedding_key,
)
from pipeline.represent.embeddings import default_model_path
from pipeline.storage.atomic import sidecar
from pipeline.storage.layout import Layout


def _matrix(tmp_path, max_docs: int):
    """``(reader, the matrix gathered from the shard files with numpy, data root)`` of 120 demo documents in 3 shards."""
    build, out, _ = three_shard_corpus(tmp_path, max_docs)
    layout = Layout(out)
    shards = manifest_shards(build.manifest, layout.shard_dir("corpus"))
    cfg = config_from_dict({"data_root": str(out), "shard_docs": 16, "embed_method": "shallow", "embed_max_tokens": 32})
    model = default_model_path()
    key = embedding_key(model, cfg.embed_max_tokens, cfg.embed_method)
    embed_shards([s for _, s in shards], cfg, model, layout.shard_dir("embeddings"), out / "work")
    parts = [(embedding_file(layout.shard_dir("embeddings"), s, key), kept_rows(layout.corpus, row, s)) for row, s in shards]
    n = write_embedding_runs(parts, layout.embeddings)
    gathered = np.concatenate([np.load(p) if rows is None else np.load(p)[rows] for p, rows in parts])
    assert n == gathered.shape[0] == pl.read_parquet(layout.corpus).height
    return open_embeddings(layout), gathered, layout


@pytest.mark.parametrize("max_docs", [0, 70])  # every document of every shard (one run a shard); a sample (runs of kept rows)
def test_index_reads_the_gathered_rows_and_gives_the_same_clusters(tmp_path, max_docs):
    reader, x, layout = _matrix(tmp_path, max_docs)
    n = x.shape[0]
    assert isinstance(reader, ShardedRows) and reader.shape == x.shape and reader.dtype == x.dtype == np.float32
    assert len(reader) == n and reader.ndim == 2
    assert (len(reader.runs.file) == len(reader.runs.paths) == 3) == (max_docs == 0)
    np.testing.assert_array_equal(np.asarray(reader), x)  # every row
    np.testing.assert_array_equal(np.asarray(reader, dtype=np.float64), x.astype(np.float64))
    rng = np.random.default_rng(max_docs)
    for idx in (rng.integers(0, n, 40), np.sort(rng.choice(n, 25, replace=False)), rng.integers(-n, n, (6, 5)), np.array([], np.int64)):
        np.testing.assert_array_equal(reader[idx], x[idx])  # any order, repeats, negative, 2-D, empty
    mask = rng.random(n) < 0.3
    np.testing.assert_array_equal(reader[mask], x[mask])
    starts = reader.runs.start
    for a, b, step in [(0, n, 1), (int(starts[1]) - 2, int(starts[-2]) + 3, 1), (7, 7, 1), (n - 1, n + 5, 1), (5, n - 3, 4),
                       (n - 1, 0, -3)]:
        np.testing.assert_array_equal(reader[a:b:step], x[a:b:step])
    np.testing.assert_array_equal(reader[-1], x[-1])
    np.testing.assert_array_equal(reader[17], x[17])
    np.testing.assert_array_equal(reader[3:9, :5], x[3:9, :5])
    np.testing.assert_array_equal(reader[4, 2:6], x[4, 2:6])
    with pytest.raises(IndexError):
        reader[np.array([n])]

    for options in ({"max_points_per_centroid": 8}, {"max_points_per_centroid": 256}, {"max_points_per_centroid": 8, "pca": 6}):
        ours, transform, _ = train_kmeans(reader, 4, 3, 5, spherical=True, **options)  # a sampled / the whole matrix
        theirs, transform_x, _ = train_kmeans(x, 4, 3, 5, spherical=True, **options)
        np.testing.assert_array_equal(ours, theirs)
        np.testing.assert_array_equal(assign_clusters(reader, ours, transform, True, batch_rows=7),
                                      assign_clusters(x, theirs, transform_x, True))
    assign, cents = kmeans(reader, 3, seed=1, niter=4, max_points_per_centroid=10)
    want = kmeans(x, 3, seed=1, niter=4, max_points_per_centroid=10)
    np.testing.assert_array_equal(assign, want[0])
    np.testing.assert_array_equal(cents, want[1])
    cal, cal_x = (calibrate_k(m, [2, 3], sample_size=30, seed=2, niter=3) for m in (reader, x))
    np.testing.assert_array_equal(cal.silhouettes, cal_x.silhouettes)
    assert cal.recommended_k == cal_x.recommended_k
    cfg = config_from_dict({"data_root": str(layout.root), "k": 4, "claims": {"k": 3}, "kmeans_iters": 4})
    claim_cluster, k = diversity_clusters(layout, ClaimsParams.from_config(cfg), pl.DataFrame({"cluster": np.zeros(n, np.int64)}))
    want = kmeans(x, 3, seed=cfg.seed, niter=4, pca=cfg.pca_components, spherical=cfg.kmeans_spherical,
                  max_points_per_centroid=cfg.kmeans_max_points_per_centroid)[0]
    assert k == 3 and np.array_equal(claim_cluster, want)  # the claims' own k-means reads the data root's index
    cluster = assign_clusters(x, theirs, transform_x, True)
    lengths = np.full(n, 10)
    assert corpus_diagnostics(cluster, lengths, embeddings=reader, sample_size=40).equals(
        corpus_diagnostics(cluster, lengths, embeddings=x, sample_size=40))


def test_index_names_its_shard_files_and_refuses_what_it_cannot_read(tmp_path, capsys):
    reader, x, layout = _matrix(tmp_path, 70)
    parser = argparse.ArgumentParser()
    tools.register(parser.add_subparsers())
    np.save(tmp_path / "gathered.npy", x)
    tables = []
    for path in (layout.embeddings, tmp_path / "gathered.npy"):  # strata calibrate-k reads the data root's index
        args = parser.parse_args(["calibrate-k", str(path), "--ks", "2,3", "--sample", "40"])
        assert args.func(args) == 0
        tables.append(capsys.readouterr().out)
    assert tables[0] == tables[1] and "silhouette" in tables[0]

    index = pl.read_parquet(layout.embeddings)
    assert index.columns == ["start", "end", "path", "local", "sha256", "dtype", "dim"]
    assert {(p, d) for p, d in index.select("path", "sha256").unique().iter_rows()} == {
        (str(f.relative_to(layout.embeddings.parent)), hashlib.sha256(f.read_bytes()).hexdigest()) for f in reader.runs.paths}
    assert index["dim"].unique().to_list() == [x.shape[1]] and index["dtype"].unique().to_list() == ["<f4"]

    np.save(reader.runs.paths[0], np.zeros((5, x.shape[1] + 1), np.float32))  # a shard file of another width
    with pytest.raises(StrataInputError, match="embedding shard of shape"):
        np.asarray(open_embeddings(layout))
    reader.runs.paths[0].unlink()
    with pytest.raises(StrataInputError, match="embedding shard file .* is missing"):
        open_embeddings(layout)
    np.save(layout.embeddings.parent / "embeddings.npy", x)  # a data root written before the index
    layout.embeddings.unlink()
    with pytest.raises(StrataInputError, match="rematerialize the embeddings asset"):
        open_embeddings(layout)
    with pytest.raises(StrataInputError, match="embeddings.npy is a gathered matrix"):
        has_embeddings(layout)
    (layout.embeddings.parent / "embeddings.npy").unlink()
    assert not has_embeddings(layout)


def test_norm_records_stand_for_the_rows_until_a_file_changes(tmp_path):
    """embed_shards records each shard's norm range while writing; the check reads the record while
    the file's digest matches it, refuses the file once its bytes change in place, and measures a
    file moved into its place again."""
    from pipeline.represent.embedding_norms import NormRange, norms_file, shard_norms

    reader, _, _ = _matrix(tmp_path, 0)
    for path in reader.runs.paths:
        rows = np.load(path)
        assert norms_file(path).is_file()
        recorded, from_record = shard_norms(path)
        measured = NormRange()
        measured.add(rows)
        assert from_record and recorded == measured and recorded.rows == rows.shape[0] and recorded.finite
    path = reader.runs.paths[1]
    rows = np.load(path)
    rows[3] *= 2.0  # no longer unit-norm: the record was taken for other bytes
    np.save(path, rows)  # in place: a file Strata recorded, edited, is refused
    with pytest.raises(StrataInputError, match="changed on disk since Strata wrote it"):
        shard_norms(path)

    def replace(rows: np.ndarray) -> None:  # another file moved into its place, its digest record removed: no record of Strata's
        tmp = path.with_name("other.npy")
        np.save(tmp, rows)
        os.replace(tmp, path)
        sidecar(path).unlink(missing_ok=True)  # the record lies beside the file (it survives copies); kept, it would refuse the file

    replace(rows)
    norms, from_record = shard_norms(path)
    assert not from_record and norms.max_norm == pytest.approx(2.0, abs=1e-5) and norms.finite
    rows[5, 0] = np.nan
    replace(rows)
    norms_file(path).unlink()  # no record at all: measured from the file
    norms, from_record = shard_norms(path)
    assert not from_record and not norms.finite
