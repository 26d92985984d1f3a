"""Near duplicates without one index (pipeline/clean/near_bands.py): the LSH bands in groups, each a
task, give the single index's pairs and groups exactly; the union-find over the ids in pairs."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.clean.groups import components
from pipeline.clean.near_bands import band_group_pairs, band_groups, band_jobs, band_near_pairs
from pipeline.clean.plan import duplicate_groups
from pipeline.clean.shards import ShardScan, scan_spec, scan_unit
from pipeline.clean.union_find import pair_components, representatives
from pipeline.config import StrataConfig


def _planted(seed: int = 3) -> tuple[list[str], set[tuple[int, int]]]:
    """Seeded made-up texts with planted near copies (one or two words of 150 changed), a chain of
    copies of copies, exact copies and an empty text; the (original, copy) pairs planted."""
    rng = np.random.default_rng(seed)
    vocab = np.array([f"v{i}x" for i in range(4000)])
    texts = [" ".join(vocab[rng.integers(0, vocab.size, 150)]) for _ in range(160)]
    planted = set()
    for o in rng.choice(160, 40, replace=False).tolist():
        words = texts[o].split()
        for i in rng.choice(len(words), int(rng.integers(1, 3)), replace=False):
            words[i] = "edit" + words[i]
        planted.add((o, len(texts)))
        texts.append(" ".join(words))
    for o in rng.choice(160, 40, replace=False).tolist():  # far copies (10 words changed): candidates in a band or two, not pairs
        words = texts[o].split()
        for i in rng.choice(len(words), 10, replace=False):
            words[i] = "far" + words[i]
        texts.append(" ".join(words))
    src = len(texts) - 41  # a chain: the last near copy copied again, twice
    for _ in range(2):
        words = texts[src].split()
        words[int(rng.integers(0, len(words)))] = "chain"
        planted.add((src, len(texts)))
        src = len(texts)
        texts.append(" ".join(words))
    texts += [texts[5], texts[170].upper(), ""]  # exact copies (not near pairs: the exact representative is), an empty text
    perm = rng.permutation(len(texts))  # the copies spread over every shard
    where = np.argsort(perm)
    return [texts[i] for i in perm], {tuple(sorted((int(where[a]), int(where[b])))) for a, b in planted}


def _scans(tmp_path, texts: list[str], cfg, cuts: list[int]) -> list[ShardScan]:
    """``texts`` scanned as shards cut at ``cuts``; the second shard's file holds two rows more
    than it gathers (as when a shard holds held-out documents: ``rows``)."""
    near = scan_spec(cfg, None).near
    scans, bounds = [], [0, *cuts, len(texts)]
    for j, (a, b) in enumerate(zip(bounds[:-1], bounds[1:])):
        sig = scan_unit(texts[a:b], False, near, None)[2]
        rows = None
        if j == 1:
            extra = scan_unit(["held out text number one " * 20, "held out text number two " * 20], False, near, None)[2]
            sig = np.concatenate([extra[:1], sig, extra[1:]])
            rows = np.arange(1, b - a + 1, dtype=np.int64)
        np.save(tmp_path / f"{j}.sig.npy", sig)
        scans.append(ShardScan(a, b - a, rows, {"sig": tmp_path / f"{j}.sig.npy"}))
    return scans


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    from pipeline.clean.exact import exact_representatives, text_hashes

    tmp = tmp_path_factory.mktemp("sigs")
    cfg = StrataConfig.model_validate({})
    texts, truth = _planted()
    scans = _scans(tmp, texts, cfg, [50, 101, 160])
    return cfg, texts, truth, scans, exact_representatives(text_hashes(texts))


@pytest.mark.parametrize("tasks", [3, 5, 24])
def test_band_groups_give_the_single_index_pairs_and_groups(tmp_path, planted, tasks):
    """Over four shards (one gathering a subset of its file's rows), the band-grouped tasks (worker
    processes; 24: each band in two key parts) find exactly the pairs and duplicate groups of the
    gather's one index, and every planted near copy."""
    from pipeline.clean.stage import _near_pairs

    cfg, texts, truth, scans, exact_rep = planted
    d, n = cfg.dedup, len(texts)
    want, want_candidates = _near_pairs(cfg, scans, exact_rep)
    got, candidates = band_near_pairs(scans, exact_rep, d.near_num_perm, d.near_rows, d.near_threshold, tasks, tmp_path / "work")
    truth = {tuple(sorted((int(exact_rep[a]), int(exact_rep[b])))) for a, b in truth}  # an exact copy stands for its text
    sig = np.concatenate([s.signatures(np.arange(s.n)) for s in scans])
    agree = {p for p in truth if (sig[p[0]] == sig[p[1]]).mean() >= d.near_threshold}  # what the estimate keeps (noise loses a few)
    assert len(agree) >= 38 and agree <= set(map(tuple, want.tolist()))  # not trivial: the planted copies are near pairs
    assert np.array_equal(got, want)
    assert candidates >= want_candidates > 0
    assert np.array_equal(components(n, got), components(n, want))
    assert all(np.array_equal(x, y) for x, y in zip(duplicate_groups(n, exact_rep, got, np.zeros((0, 2))),
                                                     duplicate_groups(n, exact_rep, want, np.zeros((0, 2)))))
    assert not any((tmp_path / "work").iterdir())  # the tasks' files are removed


def test_each_pair_is_found_by_the_group_of_its_first_shared_band(tmp_path, planted):
    """Run in this process, group by group: the groups' pairs are disjoint and together the single
    index's; a group that ignored the earlier bands would repeat pairs."""
    from pipeline.clean.near_bands import _members_file
    from pipeline.clean.stage import _near_pairs

    cfg, texts, truth, scans, exact_rep = planted
    d = cfg.dedup
    shards = [_members_file(s, exact_rep, tmp_path / f"m{j}.npy") for j, s in enumerate(scans)]
    found = []
    for g, (a, b) in enumerate(band_groups(d.near_num_perm // d.near_rows, 4)):
        out = band_group_pairs(shards, a, b, d.near_rows, d.near_threshold, str(tmp_path / f"p{g}.npy"))
        found.append(np.load(out))
    allp = np.concatenate(found)
    assert np.unique(allp, axis=0).shape[0] == allp.shape[0]
    assert np.array_equal(np.unique(allp, axis=0), _near_pairs(cfg, scans, exact_rep)[0])
    assert sum(f.shape[0] for f in found[1:]) > 0  # the later groups found pairs of their own
    one = band_group_pairs(shards, 0, d.near_num_perm // d.near_rows, d.near_rows, d.near_threshold, str(tmp_path / "all.npy"))
    want, want_candidates = _near_pairs(cfg, scans, exact_rep)
    assert np.array_equal(np.load(one), want)  # one group: the same buckets compared as the one index compares
    assert int(np.load(f"{one}.candidates.npy")[0]) == want_candidates > want.shape[0]  # the far copies: candidates, not pairs


def test_key_parts_split_each_bands_buckets(tmp_path, planted):
    """Each band in three key parts, run in this process: the parts' pairs are disjoint, together the
    single index's, and a part holds only its share of the documents (a bucket is one part's whole)."""
    from pipeline.clean.near_bands import _band_members, _members_file
    from pipeline.clean.stage import _near_pairs

    cfg, texts, truth, scans, exact_rep = planted
    d = cfg.dedup
    shards = [_members_file(s, exact_rep, tmp_path / f"m{j}.npy") for j, s in enumerate(scans)]
    jobs = band_jobs(d.near_num_perm // d.near_rows, 36)
    assert len(jobs) == 36 and {j[3] for j in jobs} == {3}
    found = [np.load(band_group_pairs(shards, a, b, d.near_rows, d.near_threshold, str(tmp_path / f"p{g}.npy"), k, parts))
             for g, (a, b, k, parts) in enumerate(jobs)]
    allp = np.concatenate(found)
    assert np.unique(allp, axis=0).shape[0] == allp.shape[0]
    assert np.array_equal(np.unique(allp, axis=0), _near_pairs(cfg, scans, exact_rep)[0])
    whole = _band_members(shards, 0, 1, d.near_rows, 0, 1)[0].keys.size
    held = [_band_members(shards, 0, 1, d.near_rows, k, 3)[0].keys.size for k in range(3)]
    assert sum(held) == whole and max(held) < whole * 0.6  # each document in one part, about a third in each


def test_band_jobs_deal_keys_beyond_the_bands():
    assert band_jobs(12, 4) == [(0, 3, 0, 1), (3, 6, 0, 1), (6, 9, 0, 1), (9, 12, 0, 1)]
    assert band_jobs(12, 12) == [(b, b + 1, 0, 1) for b in range(12)]
    assert band_jobs(12, 13) == [(b, b + 1, k, 2) for b in range(12) for k in range(2)]


def test_band_groups_split_the_bands():
    assert band_groups(12, 5) == [(0, 2), (2, 5), (5, 7), (7, 10), (10, 12)]
    assert band_groups(12, 40) == [(b, b + 1) for b in range(12)]
    assert band_groups(12, 1) == [(0, 12)]


def test_union_find_chains_join_into_one_component():
    """a-b and b-c: one component, represented by its smallest id; an id in no pair is left alone."""
    ids, rep = pair_components(np.array([[10, 20], [20, 30], [40, 50]]))
    assert ids.tolist() == [10, 20, 30, 40, 50] and rep.tolist() == [10, 10, 10, 40, 40]
    assert pair_components(np.array([[30, 20], [20, 10]]))[1].tolist() == [10, 10, 10]  # the chain in the other order
    assert representatives(6, np.array([[5, 3], [3, 1]])).tolist() == [0, 1, 2, 1, 4, 1]
    assert representatives(3, np.zeros((0, 2), np.int64)).tolist() == [0, 1, 2]


def test_union_find_matches_connected_components_on_random_graphs():
    """Against scipy's connected components (the graph over every id), on sparse random graphs,
    a long path with shuffled ids and a star."""
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import connected_components

    rng = np.random.default_rng(0)
    path = rng.permutation(3000)
    cases = [rng.integers(0, n, (k, 2)) for n, k in ((50, 30), (1000, 700), (5000, 4000), (200, 1000))]
    cases += [np.column_stack([path[:-1], path[1:]]), np.column_stack([np.full(500, 250), rng.permutation(500)])]
    for pairs in cases:
        n = int(pairs.max()) + 1
        _, label = connected_components(coo_matrix((np.ones(len(pairs)), (pairs[:, 0], pairs[:, 1])), shape=(n, n)), directed=False)
        first = np.full(label.max() + 1, n)
        np.minimum.at(first, label, np.arange(n))
        assert np.array_equal(representatives(n, pairs), first[label])


@pytest.mark.integration
def test_a_local_ray_cluster_gives_the_local_engines_pairs(tmp_path, planted):
    """engine: ray runs each band group as a Ray task on a real (one-node, local) cluster: the same pairs."""
    pytest.importorskip("ray")
    from pipeline.clean.stage import _near_pairs
    from pipeline.config import RayConfig
    from pipeline.distributed.local_cluster import local_cluster

    cfg, texts, truth, scans, exact_rep = planted
    d = cfg.dedup
    with local_cluster([2]) as (address, _):
        got, _ = band_near_pairs(scans, exact_rep, d.near_num_perm, d.near_rows, d.near_threshold, 3, tmp_path / "work",
                                 engine="ray", ray_cfg=RayConfig(address=address))
    assert np.array_equal(got, _near_pairs(cfg, scans, exact_rep)[0])
