"""Clusters (PCA + faiss / MiniBatchKMeans k-means) and clustering comparison, on real faiss/sklearn."""

from __future__ import annotations

import argparse

import numpy as np
import polars as pl
import pytest

from pipeline.cli import tools
from pipeline.errors import StrataInputError
from pipeline.represent.agreement import compare, label_agreement, load_labels
from pipeline.represent.clusters import kmeans, pca_reduce


def _directional_blobs(n_per: int = 200, k: int = 4, d: int = 32, seed: int = 0):
    """k clusters that differ by direction only (random norms): separable by cosine, not by L2."""
    rng = np.random.default_rng(seed)
    centers = rng.normal(size=(k, d))
    centers /= np.linalg.norm(centers, axis=1, keepdims=True)
    truth = np.repeat(np.arange(k), n_per)
    x = centers[truth] + 0.05 * rng.normal(size=(truth.size, d))
    x *= rng.uniform(0.2, 5.0, size=(truth.size, 1))  # scale spreads blobs along rays
    return x.astype(np.float32), truth


@pytest.mark.parametrize("backend", ["faiss", "sklearn"])
def test_pca_spherical_kmeans_recovers_directional_blobs(backend):
    x, truth = _directional_blobs()
    assign, centroids = kmeans(x, 4, seed=3, pca=8, spherical=True, backend=backend)
    assert assign.dtype == np.int64 and centroids.shape == (4, 8)
    assert compare(assign, truth)["ari"] == pytest.approx(1.0)
    np.testing.assert_allclose(np.linalg.norm(centroids, axis=1), 1.0, atol=1e-4)


def test_spherical_matters_on_directional_blobs():
    x, truth = _directional_blobs()
    plain, _ = kmeans(x, 4, seed=3)
    sph, _ = kmeans(x, 4, seed=3, spherical=True)
    assert compare(sph, truth)["ari"] == pytest.approx(1.0)
    assert compare(plain, truth)["ari"] < 0.9  # Euclidean k-means splits the rays by norm


def test_kmeans_is_deterministic_and_assigns_every_doc():
    x, _ = _directional_blobs(n_per=300, k=6, seed=1)
    a1, c1 = kmeans(x, 6, seed=7, max_points_per_centroid=40, threads=1)
    a2, c2 = kmeans(x, 6, seed=7, max_points_per_centroid=40, threads=1)
    np.testing.assert_array_equal(a1, a2)
    np.testing.assert_array_equal(c1, c2)
    # the subsample only trains: assignment is each doc's nearest centroid
    d2 = ((x[:, None, :] - c1[None]) ** 2).sum(-1)
    np.testing.assert_array_equal(a1, d2.argmin(1))


def test_pca_matches_svd_projection():
    rng = np.random.default_rng(0)
    x = (rng.normal(size=(500, 6)) * np.array([5, 3, 1, 0.5, 0.2, 0.1])).astype(np.float32)
    p = pca_reduce(x, 3)
    u, s, vt = np.linalg.svd(x - x.mean(0), full_matrices=False)
    ref = (x - x.mean(0)) @ vt[:3].T
    np.testing.assert_allclose(np.abs(p), np.abs(ref), rtol=1e-3, atol=1e-3)  # axes equal up to sign
    np.testing.assert_array_equal(p, pca_reduce(x, 3))


@pytest.mark.parametrize("k", [0, -1, 11])
def test_bad_k(k):
    with pytest.raises(StrataInputError, match="impossible"):
        kmeans(np.zeros((10, 3), np.float32), k)


def test_bad_options():
    x = np.random.default_rng(0).normal(size=(20, 4)).astype(np.float32)
    with pytest.raises(StrataInputError, match="pca=9"):
        kmeans(x, 2, pca=9)
    with pytest.raises(StrataInputError, match="backend"):
        kmeans(x, 2, backend="gpu-magic")
    x[3, 1] = np.nan
    with pytest.raises(StrataInputError, match="NaN"):
        kmeans(x, 2)


def test_compare_known_labelings():
    rng = np.random.default_rng(0)
    a = rng.integers(0, 5, 1000)
    relabeled = np.array([3, 0, 4, 1, 2])[a]
    same = compare(a, relabeled)
    assert same["ari"] == pytest.approx(1.0) and same["nmi"] == pytest.approx(1.0)
    assert same["reading"].startswith("shared structure")
    other = compare(a, rng.integers(0, 5, 1000))
    assert abs(other["ari"]) < 0.05 and other["reading"].startswith("different structure")
    la = label_agreement(a, np.array(list("vwxyz"))[a])
    assert la["ari"] == pytest.approx(1.0) and la["labels"] == 5 and la["clusters"] == 5


def _run_cli(argv):
    parser = argparse.ArgumentParser(prog="strata")
    tools.register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.func(args)


def test_compare_clusterings_command(tmp_path, capsys):
    rng = np.random.default_rng(1)
    a = rng.integers(0, 7, 300)
    # parquet rows in shuffled order: labels are aligned by doc_id
    perm = rng.permutation(300)
    pl.DataFrame({"doc_id": perm, "cluster": a[perm].astype(np.int32)}).write_parquet(tmp_path / "clusters.parquet")
    np.save(tmp_path / "b.npy", (a + 3) % 7)
    assert _run_cli(["compare-clusterings", str(tmp_path / "clusters.parquet"), str(tmp_path / "b.npy")]) == 0
    out = capsys.readouterr().out
    assert "ARI: 1.0000" in out and "NMI: 1.0000" in out and "shared structure" in out
    np.save(tmp_path / "c.npy", rng.integers(0, 7, 300))
    _run_cli(["compare-clusterings", str(tmp_path / "b.npy"), str(tmp_path / "c.npy")])
    assert "different structure" in capsys.readouterr().out


def test_load_labels_errors(tmp_path):
    np.save(tmp_path / "f.npy", np.zeros(3, np.float32))
    with pytest.raises(StrataInputError, match="integer"):
        load_labels(tmp_path / "f.npy")
    pl.DataFrame({"doc_id": [0, 2], "cluster": [1, 1]}).write_parquet(tmp_path / "gap.parquet")
    with pytest.raises(StrataInputError, match="doc_id"):
        load_labels(tmp_path / "gap.parquet")
    with pytest.raises(StrataInputError, match="not found"):
        load_labels(tmp_path / "nope.parquet")
    np.save(tmp_path / "short.npy", np.zeros(2, np.int64))
    np.save(tmp_path / "long.npy", np.zeros(3, np.int64))
    with pytest.raises(StrataInputError, match="same corpus"):
        _run_cli(["compare-clusterings", str(tmp_path / "short.npy"), str(tmp_path / "long.npy")])
