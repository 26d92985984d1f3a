"""Exact and semantic duplicates in tasks (pipeline/clean/clean_tasks.py, ``clean_tasks``): the hash
space in ranges gives the gather's exact representatives, the clusters in groups give its SemDeDup
pairs in its order, and the clean plan written from them is the same file, byte for byte."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.clean.clean_tasks import (
    cluster_group_pairs,
    cluster_groups,
    exact_by_hash_ranges,
    hash_range_pairs,
    hash_ranges,
    semantic_by_cluster_groups,
)
from pipeline.clean.exact import text_hashes
from pipeline.clean.semantic import semantic_pairs
from pipeline.clean.shards import ShardScan


def _texts(seed: int = 5) -> list[str]:
    """Seeded made-up texts with planted exact copies (case and spacing changed), a text copied
    three times and empty texts, shuffled so the copies spread over every shard."""
    rng = np.random.default_rng(seed)
    vocab = np.array([f"w{i}" for i in range(3000)])
    texts = [" ".join(vocab[rng.integers(0, vocab.size, 40)]) for _ in range(300)]
    for o in rng.choice(300, 60, replace=False).tolist():
        texts.append("  " + texts[o].upper().replace(" ", "   ") + " ")
    texts += [texts[7]] * 3 + ["", " ", ""]
    return [texts[i] for i in rng.permutation(len(texts))]


def _hash_scans(tmp_path, texts: list[str], cuts: list[int]) -> list[ShardScan]:
    """``texts``' hashes as shards cut at ``cuts``; the second shard's file holds two rows more than
    it gathers (``rows``, as when a shard holds held-out documents), each a copy of a gathered text's hash."""
    scans, bounds = [], [0, *cuts, len(texts)]
    for j, (a, b) in enumerate(zip(bounds[:-1], bounds[1:])):
        h, rows = text_hashes(texts[a:b]), None
        if j == 1:
            h = np.concatenate([h[:1], h, h[:1]])  # a held-out copy of the first text on both sides: not gathered
            rows = np.arange(1, b - a + 1, dtype=np.int64)
        np.save(tmp_path / f"{j}.hashes.npy", h)
        scans.append(ShardScan(a, b - a, rows, {"hashes": tmp_path / f"{j}.hashes.npy"}))
    return scans


@pytest.fixture(scope="module")
def exact_case(tmp_path_factory):
    from pipeline.clean.stage import _exact_representatives

    texts = _texts()
    scans = _hash_scans(tmp_path_factory.mktemp("hashes"), texts, [90, 200, 290])
    want = _exact_representatives(scans, len(texts))
    assert (want != np.arange(len(texts))).sum() >= 64  # not trivial: the planted copies are exact duplicates
    return texts, scans, want


def test_hash_ranges_cover_the_space_once():
    assert hash_ranges(1) == [(0, 2**64 - 1)]
    r = hash_ranges(3)
    assert r[0][0] == 0 and r[-1][1] == 2**64 - 1 and all(b + 1 == c for (_, b), (c, _) in zip(r[:-1], r[1:]))


def test_hash_ranges_in_tasks_give_the_gathers_representatives(tmp_path, exact_case):
    """Three ranges, each in a worker process of its own: the gather's representatives exactly, the
    tasks' folder removed."""
    texts, scans, want = exact_case
    got = exact_by_hash_ranges(scans, len(texts), 3, tmp_path / "work")
    assert got.dtype == want.dtype and got.tobytes() == want.tobytes()
    assert not any((tmp_path / "work").iterdir())


@pytest.mark.parametrize("tasks", [1, 2, 5])
def test_each_pair_is_in_the_range_of_its_hash(tmp_path, exact_case, tasks):
    """Run here range by range: the ranges' pairs are disjoint, and with every document in no pair
    its own representative they are the gather's answer."""
    from pipeline.clean.clean_tasks import _hash_files

    texts, scans, want = exact_case
    shards = [_hash_files(s, tmp_path / f"rows{j}.npy") for j, s in enumerate(scans)]
    found = [np.load(hash_range_pairs(shards, a, b, str(tmp_path / f"p{r}.npy"))) for r, (a, b) in enumerate(hash_ranges(tasks))]
    pairs = np.concatenate(found)
    assert np.unique(pairs[:, 0]).size == pairs.shape[0] and (pairs[:, 1] < pairs[:, 0]).all()
    rep = np.arange(len(texts))
    rep[pairs[:, 0]] = pairs[:, 1]
    assert np.array_equal(rep, want)
    if tasks > 1:
        assert sum(f.shape[0] > 0 for f in found) >= 2  # the copies spread over the ranges


def dying_hash_range_pairs(shards, first, last, out):
    """:func:`hash_range_pairs`, but the first attempt at each range SIGKILLs its own worker process
    once it has read its shards (a marker file in ``$KILLED_DIR`` remembers the attempt)."""
    import os
    import signal
    from pathlib import Path

    from pipeline.clean.clean_tasks import hash_range_pairs as real

    marker = Path(os.environ["KILLED_DIR"]) / f"{first}.killed"
    if not marker.exists():
        marker.touch()
        for path, _, _ in shards:
            np.load(path, mmap_mode="r").sum()
        os.kill(os.getpid(), signal.SIGKILL)
    return real(shards, first, last, out)


def test_a_worker_killed_mid_task_is_retried_to_the_same_bytes(tmp_path, exact_case, monkeypatch):
    """Every range's worker process is SIGKILLed on its first attempt: each range runs again in a
    fresh process from the same files, and the representatives are the uninterrupted ones' bytes."""
    import pipeline.clean.clean_tasks as ct

    texts, scans, want = exact_case
    monkeypatch.setattr(ct, "hash_range_pairs", dying_hash_range_pairs)
    monkeypatch.setenv("KILLED_DIR", str(tmp_path))  # the spawned workers inherit it
    got = exact_by_hash_ranges(scans, len(texts), 2, tmp_path / "work")
    assert len(list(tmp_path.glob("*.killed"))) == 2  # both ranges' first workers died
    assert got.tobytes() == want.tobytes()


def test_hashes_on_the_ranges_edges(tmp_path):
    """Hashes at both ends of the space and on both sides of the cut between two ranges."""
    edge = np.array([2**64 - 1, 2**63, 0, 2**63 - 1, 2**63, 0, 2**64 - 1, 2**63 - 1, 5], np.uint64)
    np.save(tmp_path / "h.npy", edge)
    scans = [ShardScan(0, edge.size, None, {"hashes": tmp_path / "h.npy"})]
    got = exact_by_hash_ranges(scans, edge.size, 2, tmp_path / "work", engine="local")
    assert got.tolist() == [0, 1, 2, 3, 1, 2, 0, 3, 8]


def test_clusters_are_dealt_by_squared_size():
    """Largest first onto the least loaded group; clusters of fewer than two documents searched by none."""
    groups = cluster_groups(np.array([10, 1, 5, 5, 3, 0, 2, 4]), 2)
    assert [g.tolist() for g in groups] == [[0], [2, 3, 4, 6, 7]]  # 100 against 25 + 25 + 16 + 9 + 4
    assert [g.tolist() for g in cluster_groups(np.array([3, 3, 3, 1]), 5)] == [[0], [1], [2]]
    assert cluster_groups(np.array([1, 0, 1]), 4) == []


def _embeddings(tmp_path, seed: int = 2) -> tuple[str, np.ndarray, np.ndarray]:
    """Unit vectors in 6 clusters of very unequal sizes, a quarter of them planted near copies (and
    a chain: a copy of a copy), as three embedding shard files indexed by a ``runs.parquet`` (the
    middle shard's first row left out); the index, each document's cluster, the survivors (sorted,
    some documents left out as earlier levels' duplicates)."""
    from pipeline.represent.embedding_index import write_embedding_runs

    rng = np.random.default_rng(seed)
    sizes = [12, 60, 3, 120, 30, 1]  # the largest clusters not first: the groups interleave the clusters
    cluster = np.repeat(np.arange(len(sizes)), sizes)
    centers = rng.normal(size=(len(sizes), 32))
    x = centers[cluster] + rng.normal(scale=0.9, size=(cluster.size, 32))
    for t in rng.choice(cluster.size, cluster.size // 4, replace=False):
        o = rng.choice(np.flatnonzero(cluster == cluster[t]))
        if o != t:
            x[t] = x[o] + rng.normal(scale=0.01, size=32)  # a near copy (perhaps of a copy: chains)
    x = (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)
    perm = rng.permutation(cluster.size)  # the clusters spread over the shards
    x, cluster = x[perm], cluster[perm]
    cuts = [0, 80, 150, cluster.size]
    parts = []
    for j, (a, b) in enumerate(zip(cuts[:-1], cuts[1:])):
        block = x[a:b] if j != 1 else np.concatenate([np.ones((1, 32), np.float32), x[a:b]])
        np.save(tmp_path / f"emb{j}.npy", block)
        parts.append((tmp_path / f"emb{j}.npy", None if j != 1 else np.arange(1, b - a + 1)))
    write_embedding_runs(parts, tmp_path / "runs.parquet")
    survivors = np.sort(rng.choice(cluster.size, cluster.size - 20, replace=False)).astype(np.int64)
    return str(tmp_path / "runs.parquet"), cluster, survivors


@pytest.fixture(scope="module")
def semantic_case(tmp_path_factory):
    from pipeline.represent.embedding_index import open_embeddings

    runs, cluster, survivors = _embeddings(tmp_path_factory.mktemp("emb"))
    want, largest = semantic_pairs(open_embeddings(runs).take, cluster, survivors, 0.95, forest=True)
    assert want.shape[0] >= 20 and np.unique(cluster[want[:, 0]]).size >= 3  # not trivial: groups in several clusters
    return runs, cluster, survivors, want, largest


def test_cluster_groups_in_tasks_give_the_gathers_pairs_in_its_order(tmp_path, semantic_case):
    """Three groups of clusters, each in a worker process of its own: the gather's pairs in the
    gather's order, and its largest cluster searched."""
    runs, cluster, survivors, want, largest = semantic_case
    got, got_largest = semantic_by_cluster_groups(runs, cluster, survivors, 0.95, 3, tmp_path / "work")
    assert got.dtype == want.dtype and got.tobytes() == want.tobytes()
    assert got_largest == largest
    assert not any((tmp_path / "work").iterdir())


@pytest.mark.parametrize("tasks", [1, 2, 4, 9])
def test_each_cluster_group_searches_its_own_clusters(tmp_path, semantic_case, monkeypatch, tasks):
    """Each group run here: its pairs are its clusters' alone, and the groups together, back in
    cluster order, are the gather's pairs."""
    import pipeline.clean.clean_tasks as ct

    runs, cluster, survivors, want, largest = semantic_case
    groups: list[np.ndarray] = []

    def here(fn, jobs, engine, ray_cfg):
        for job in jobs:
            groups.append(np.load(job.args[0]))
            fn(*job.args)

    monkeypatch.setattr(ct, "_run", here)
    got, got_largest = semantic_by_cluster_groups(runs, cluster, survivors, 0.95, tasks, tmp_path / "work")
    assert got.tobytes() == want.tobytes() and got_largest == largest
    assert len(groups) == min(tasks, 5)  # five clusters hold two survivors or more
    held = [set(g[:, 1].tolist()) for g in groups]
    assert sum(map(len, held)) == len(set().union(*held)) == 5  # each cluster in one group
    for g in groups:  # a group holds every survivor of its clusters, doc ids ascending
        assert np.array_equal(g[:, 0], survivors[np.isin(cluster[survivors], g[:, 1])]) and np.array_equal(g[:, 1], cluster[g[:, 0]])
    mine = survivors[cluster[survivors] == 2]  # the task function itself, on one cluster
    np.save(tmp_path / "m.npy", np.column_stack([mine, np.full(mine.size, 2)]))
    pairs = np.load(cluster_group_pairs(str(tmp_path / "m.npy"), runs, 0.95, str(tmp_path / "o.npy")))
    assert np.array_equal(pairs[:, 1:], want[cluster[want[:, 1]] == 2]) and (pairs[:, 0] == 2).all()


def test_the_clean_plan_from_tasks_is_the_same_file(tmp_path, exact_case, semantic_case):
    """clean/documents.parquet's table (the plan of the exact representatives, near and semantic
    pairs) from the tasks' answers is the gather's, byte for byte."""
    from pipeline.clean.plan import plan
    from pipeline.represent.embedding_index import open_embeddings
    from pipeline.storage.atomic import write_parquet

    texts, scans, exact_want = exact_case
    runs, cluster, survivors, _, _ = semantic_case
    n = cluster.size  # the first n texts' exact duplicates (a representative precedes its copies)
    exact_rep = exact_want[:n]
    exact_got = exact_by_hash_ranges(scans, len(texts), 2, tmp_path / "w1")[:n]
    keep = survivors[exact_rep[survivors] == survivors]  # semantic over the (near and) exact representatives
    sem_ref, _ = semantic_pairs(open_embeddings(runs).take, cluster, keep, 0.95, forest=True)
    sem_got, _ = semantic_by_cluster_groups(runs, cluster, keep, 0.95, 2, tmp_path / "w2")
    assert (exact_rep != np.arange(n)).sum() > 10 and sem_ref.shape[0] > 10
    flags = np.zeros((n, 1), bool)
    near = np.zeros((0, 2), np.int64)
    a = write_parquet(plan(n, exact_rep, near, sem_ref, flags, ("wikitext",), "keep_one", True), tmp_path / "a.parquet")
    b = write_parquet(plan(n, exact_got, near, sem_got, flags, ("wikitext",), "keep_one", True), tmp_path / "b.parquet")
    assert a.read_bytes() == b.read_bytes()


@pytest.mark.integration
def test_a_local_ray_cluster_gives_the_local_engines_answers(tmp_path, exact_case, semantic_case):
    """engine: ray runs each hash range and each cluster group as a Ray task on a real (one-node,
    local) cluster: the same representatives and pairs."""
    pytest.importorskip("ray")
    from pipeline.config import RayConfig
    from pipeline.distributed.local_cluster import local_cluster

    texts, scans, exact_want = exact_case
    runs, cluster, survivors, sem_want, largest = semantic_case
    with local_cluster([2]) as (address, _):
        cfg = RayConfig(address=address)
        exact = exact_by_hash_ranges(scans, len(texts), 3, tmp_path / "work", engine="ray", ray_cfg=cfg)
        sem, got_largest = semantic_by_cluster_groups(runs, cluster, survivors, 0.95, 3, tmp_path / "work", engine="ray", ray_cfg=cfg)
    assert exact.tobytes() == exact_want.tobytes()
    assert sem.tobytes() == sem_want.tobytes() and got_largest == largest


def _graph_corpus(path) -> None:
    """150 demo documents, exact copies (case and spacing changed), a near copy (two words edited)
    and copies with their words shuffled (another text to MinHash, the same to a bag-of-words
    embedding: semantic duplicates), in three corpus shards."""
    import json

    from helpers import demo_slice

    rng = np.random.default_rng(0)
    rows = [{"id": f"d{i}", "text": d["text"], "domain": d["domain"]} for i, d in enumerate(demo_slice(150))]
    extra = [{"id": f"exact{i}", "text": "  " + rows[i]["text"].upper() + " ", "domain": rows[i]["domain"]} for i in (3, 40, 99)]
    words = max((r["text"] for r in rows), key=len).split()
    words[len(words) // 2] = "zzedit"
    extra.append({"id": "near", "text": " ".join(words), "domain": "web"})
    extra += [{"id": f"shuffled{i}", "text": " ".join(rng.permutation(rows[i]["text"].split())), "domain": rows[i]["domain"]}
              for i in (20, 60, 120)]
    everything = rows + extra
    order = rng.permutation(len(everything))
    path.mkdir()
    for j, part in enumerate(np.array_split(order, 3)):
        (path / f"part{j}.jsonl").write_text("\n".join(json.dumps(everything[i]) for i in part) + "\n", encoding="utf-8")


@pytest.mark.integration
def test_clean_tasks_write_the_gathers_clean_documents(tmp_path):
    """The graph up to clean, then clean again with clean_tasks: 3 (worker processes): the same
    clean/documents.parquet, with exact, near and semantic duplicates in it."""
    import subprocess
    import sys

    import polars as pl
    import yaml
    from helpers import small_graph_config

    _graph_corpus(tmp_path / "corpus")
    cfg = small_graph_config(tmp_path / "corpus") | {"data_root": str(tmp_path / "root"), "heldout_fraction": 0.0}
    docs = tmp_path / "root" / "clean" / "documents.parquet"
    got = []
    for tasks, select in ((0, "*clean"), (3, "clean")):
        (tmp_path / "cfg.yaml").write_text(yaml.safe_dump(cfg | {"clean_tasks": tasks}))
        proc = subprocess.run([sys.executable, "-m", "assets.cli", "run", "--config", str(tmp_path / "cfg.yaml"), "--select", select],
                              capture_output=True, text=True, timeout=900)
        assert proc.returncode == 0, proc.stderr[-3000:]
        got.append(docs.read_bytes())
        docs.unlink()
    kinds = pl.read_parquet(__import__("io").BytesIO(got[0]))["removed"].value_counts()
    assert {"exact", "near", "semantic"} <= set(kinds["removed"].to_list()), kinds
    assert got[0] == got[1]
    assert not any((tmp_path / "root" / "work" / "clean").glob("*-*"))  # the tasks' folders removed


def test_a_negative_clean_tasks_exits_2_naming_the_key(tmp_path, capsys, monkeypatch):
    from assets.cli import EXIT_INPUT, main

    monkeypatch.setenv("STRATA_CONFIG", "")  # the CLI sets these; monkeypatch restores them
    monkeypatch.setenv("DAGSTER_HOME", "")
    bad = tmp_path / "bad.yaml"
    bad.write_text(f"data_root: {tmp_path / 'root'}\nclean_tasks: -1\n")
    assert main(["run", "--config", str(bad)]) == EXIT_INPUT == 2
    err = capsys.readouterr().err
    assert "clean_tasks=-1 is impossible" in err and "Fix: clean_tasks: use a value >= 0" in err and "Traceback" not in err
