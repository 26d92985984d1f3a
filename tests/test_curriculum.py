"""greedy_curriculum at scale (pipeline/ordering/curriculum.py): the blocked curriculum greedy above
greedy_exact_max against the exact one, the per-batch deviation from the curriculum, and the
export of a greedy_curriculum ordering read back position for position."""

from __future__ import annotations

import json

import numpy as np
import pytest

from pipeline.errors import StrataInputError
from pipeline.ordering import Objective, OrderParams, curriculum_from_dict, sequence_features, sequence_order
from pipeline.ordering.curriculum import (
    curriculum_batch_deviations,
    curriculum_blocked_order,
    curriculum_exact_order,
    curriculum_greedy_order,
)
from pipeline.packing.pack import pack_concat


def instance(seed: int, n_docs: int, seq_len: int = 256, k: int = 12):
    rng = np.random.default_rng(seed)
    p = 1.0 / np.arange(1, k + 1)
    cluster = rng.choice(k, n_docs, p=p / p.sum())
    lengths = rng.integers(1, 200, n_docs)
    seg = pack_concat(np.arange(n_docs), lengths, seq_len).segments
    d = seg["doc_id"].to_numpy()
    return sequence_features(seg["sequence_id"].to_numpy(), cluster[d], lengths[d], seg["n_tokens"].to_numpy(), 12, d)


def realizable(f, seed: int, swing: float = 0.7):
    """3 knots (1%, 10%, 100% of the tokens): logits log tau + swing z, log tau, log tau - swing z,
    shifted until E(S_total) is the corpus's composition (the corpus can realize the curriculum)."""
    total = float(f.lengths.sum())
    tau = f.clusters.column_totals() / total
    z = np.random.default_rng(seed).standard_normal(tau.size)
    knots = [{"tokens": total * q, "logits": (np.log(tau) + a * z).tolist()} for q, a in ((0.01, swing), (0.1, 0.0), (1.0, -swing))]
    for _ in range(30):
        e = curriculum_from_dict({"knots": knots}, tau.size).cumulative(np.array([total]))[0] / total
        for kn in knots:
            kn["logits"] = (np.asarray(kn["logits"]) + np.log(tau) - np.log(e)).tolist()
    return {"knots": knots}


@pytest.mark.parametrize("seed,objective", [(1, "stationary"), (2, "f3"), (3, "stationary")])
def test_blocked_within_1_2x_of_exact(seed, objective):
    f = instance(seed, 9000)
    cur = curriculum_from_dict(realizable(f, seed), f.clusters.n_cols)
    obj = Objective.named(objective)
    exact = curriculum_greedy_order(f, cur, obj, greedy_exact_max=f.n_sequences)
    blocked = curriculum_greedy_order(f, cur, obj, greedy_exact_max=100, greedy_block=1024)  # pools of 512 sequences
    assert np.array_equal(np.sort(blocked), np.arange(f.n_sequences))
    assert not np.array_equal(blocked, exact)
    d_exact, d_blocked = (curriculum_batch_deviations(f, o, cur, 32).mean() for o in (exact, blocked))
    d_random = curriculum_batch_deviations(f, np.random.default_rng(seed).permutation(f.n_sequences), cur, 32).mean()
    assert d_blocked <= 1.2 * d_exact
    assert d_blocked < 0.5 * d_random


def test_blocked_follows_a_strong_curriculum_in_time():
    # cluster 0 favoured over the first half, cluster 1 over the second: blocked as the exact one
    f = instance(7, 5000, k=2)
    total = float(f.lengths.sum())
    cur = curriculum_from_dict({"knots": [{"tokens": total * 0.4, "logits": [2, -2]}, {"tokens": total * 0.6, "logits": [-2, 2]}]}, 2)
    share0 = np.bincount(np.repeat(np.arange(f.n_sequences), np.diff(f.clusters.indptr)),
                         weights=f.clusters.data * (f.clusters.indices == 0),
                         minlength=f.n_sequences) / f.lengths
    fifths = {}
    for name, order in (("exact", curriculum_exact_order(f, cur, Objective.named("f3"))),
                        ("blocked", curriculum_blocked_order(f, cur, Objective.named("f3"), greedy_block=256))):
        fifths[name] = np.array([share0[part].mean() for part in np.array_split(order, 5)])
    assert fifths["blocked"][0] > 0.9 and fifths["blocked"][0] > fifths["blocked"][-1] + 0.3
    np.testing.assert_allclose(fifths["blocked"], fifths["exact"], atol=0.03)


def test_exact_path_and_threshold():
    f = instance(4, 1500)
    cur = curriculum_from_dict(realizable(f, 4), f.clusters.n_cols)
    obj = Objective.named("stationary")
    exact = curriculum_exact_order(f, cur, obj)
    assert np.array_equal(curriculum_greedy_order(f, cur, obj), exact)  # the default threshold keeps demo sizes exact
    assert np.array_equal(curriculum_greedy_order(f, cur, obj, greedy_exact_max=f.n_sequences), exact)
    low = curriculum_greedy_order(f, cur, obj, greedy_exact_max=f.n_sequences - 1, greedy_block=256)
    assert np.array_equal(low, curriculum_blocked_order(f, cur, obj, greedy_block=256))
    # same seed => same order; another seed deals another queue
    assert np.array_equal(low, curriculum_greedy_order(f, cur, obj, greedy_exact_max=0, greedy_block=256))
    assert not np.array_equal(low, curriculum_greedy_order(f, cur, obj, seed=1, greedy_exact_max=0, greedy_block=256))
    noisy = curriculum_blocked_order(f, cur, obj, greedy_block=256, noise=1.0, seed=2)
    assert np.array_equal(np.sort(noisy), np.arange(f.n_sequences)) and not np.array_equal(noisy, low)
    assert np.array_equal(noisy, curriculum_blocked_order(f, cur, obj, greedy_block=256, noise=1.0, seed=2))
    with pytest.raises(StrataInputError, match="greedy_exact_max"):
        curriculum_greedy_order(f, cur, obj, greedy_exact_max=-1)
    with pytest.raises(StrataInputError, match="too small"):
        curriculum_blocked_order(f, cur, obj, greedy_block=1)


def test_seeded_only_where_blocked_or_noisy():
    from pipeline.ordering import strategies
    from pipeline.ordering.engine import seed_dependent

    spec = strategies.spec("greedy_curriculum")
    assert "greedy_curriculum" not in strategies.SEED_FREE and seed_dependent("greedy_curriculum", OrderParams())
    order = np.arange(50)[::-1]
    assert spec.reseed(order, OrderParams(greedy_exact_max=50), 0, 1) is order  # exact, no noise: one order for every seed
    assert spec.reseed(order, OrderParams(greedy_exact_max=49), 0, 1) is None  # blocked: the seed deals the queue
    assert spec.reseed(order, OrderParams(greedy_exact_max=50, noise=0.5), 0, 1) is None


def test_strategy_reads_greedy_exact_max_and_block(tmp_path):
    f = instance(5, 1500)
    doc = realizable(f, 5)
    knots = tmp_path / "cur.json"
    knots.write_text(json.dumps(doc))
    cur = curriculum_from_dict(doc, f.clusters.n_cols)
    obj = Objective.named("stationary")
    got = sequence_order("greedy_curriculum", f, OrderParams(curriculum=str(knots), greedy_exact_max=10, greedy_block=150), 0)
    assert np.array_equal(got, curriculum_blocked_order(f, cur, obj, greedy_block=150))
    assert np.array_equal(sequence_order("greedy_curriculum", f, OrderParams(curriculum=str(knots)), 0),
                          curriculum_exact_order(f, cur, obj))


def test_batch_deviation_by_hand():
    # two sequences per batch; clusters 0/1; constant curriculum p = (0.75, 0.25)
    f = sequence_features(np.array([0, 1, 1, 2, 3]), np.array([0, 0, 1, 1, 0]), np.array([4, 2, 2, 4, 4]), np.array([4, 2, 2, 4, 4]), 2)
    cur = curriculum_from_dict({"knots": [{"tokens": 1, "logits": [np.log(3.0), 0.0]}]}, 2)
    # batch 0 = rows 0, 1: cluster 0 holds 4 + 2 of 8 tokens -> |0.75 - 0.75| = 0; batch 1 = rows 2, 3: 4 of 8 -> 0.25
    np.testing.assert_allclose(curriculum_batch_deviations(f, np.array([0, 1, 2, 3]), cur, 2), [0.0, 0.25], atol=1e-12)
    np.testing.assert_allclose(curriculum_batch_deviations(f, np.array([2, 0, 1, 3]), cur, 2), [0.25, 0.0], atol=1e-12)


def test_export_greedy_curriculum_position_for_position(tmp_path):
    """`strata export --strategy greedy_curriculum` on a data root with a curriculum configured: the
    numpy and hf exports read back (raw memmap, the torch dataset, `datasets`) give the ordering's
    sequences at every position."""
    from export_root import build_root, write_ordering

    from assets.cli import main
    from pipeline.export.torch_dataset import OrderedSequences
    from pipeline.ordering.engine import run_strategy

    L, G = 32, 8
    root = tmp_path / "root"
    docs, seg, store = build_root(root, L)
    knots = tmp_path / "curriculum.yaml"
    knots.write_text("knots:\n  - tokens: 500\n    logits: {0: 2.0}\n  - tokens: 4000\n    logits: {2: 2.0}\n")
    (tmp_path / "cfg.yaml").write_text(f"seq_len: {L}\nbatch_size: {G}\ncurriculum: {knots}\n")
    order = run_strategy("greedy_curriculum", docs, seg, L, OrderParams(length_bins=8, curriculum=str(knots)), seed=0).order
    order = order.sort("position")["sequence_id"].to_numpy()
    assert np.array_equal(np.sort(order), np.arange(store.n_sequences)) and not np.array_equal(order, np.sort(order))
    write_ordering(root, "greedy_curriculum", order)
    want = store.batch(order)[0]
    base = ["export", "--data-root", str(root), "--config", str(tmp_path / "cfg.yaml"), "--strategy", "greedy_curriculum"]
    assert main([*base, "--format", "numpy", "--out", str(tmp_path / "np")]) == 0
    meta = json.loads((tmp_path / "np" / "meta.json").read_text())
    assert meta["strategy"] == "greedy_curriculum" and meta["lineage"]["ordering"] == "orderings/greedy_curriculum.parquet"
    np.testing.assert_array_equal(np.memmap(tmp_path / "np" / "tokens.bin", dtype=meta["dtype"], mode="r").reshape(-1, L), want)
    ds = OrderedSequences(tmp_path / "np")
    np.testing.assert_array_equal(np.stack([ds[p]["input_ids"].numpy() for p in range(len(ds))]), want)
    datasets = pytest.importorskip("datasets")
    assert main([*base, "--format", "hf", "--out", str(tmp_path / "hf")]) == 0
    hf = datasets.load_dataset(str(tmp_path / "hf"), split="train", cache_dir=str(tmp_path / "cache"))
    np.testing.assert_array_equal(np.array(hf["input_ids"]), want)


def test_blocked_worst_batch_no_worse_than_random():
    # small pools (32 sequences) of a 50-cluster corpus packed into short sequences: a pool often lacks
    # a cluster the curriculum wants; the stream must not catch up on it later in a burst of one cluster
    f = instance(3, 4000, seq_len=32, k=50)
    cur = curriculum_from_dict(realizable(f, 3, swing=1.0), f.clusters.n_cols)
    blocked = curriculum_blocked_order(f, cur, Objective.named("stationary"), greedy_block=64)
    d_blocked = curriculum_batch_deviations(f, blocked, cur, 32)
    d_random = curriculum_batch_deviations(f, np.random.default_rng(3).permutation(f.n_sequences), cur, 32)
    assert d_blocked.max() <= d_random.max()
    assert d_blocked.mean() < 0.5 * d_random.mean()


def test_greedy_curriculum_reads_the_mixture_stage_curriculum(tmp_path):
    """With the mixture stage on, greedy_curriculum's curriculum defaults to the stage's learned
    ``mixture/curriculum.yaml`` (one ``strata run``); ``curriculum:`` still wins; without either the
    error names the config keys, never a CLI flag."""
    from pipeline.config import StrataConfig
    from pipeline.ordering.stage import OrderStageParams, order_params
    from pipeline.storage.layout import Layout

    layout = Layout(tmp_path / "root")
    on = StrataConfig(strategies=["greedy_curriculum"], mixture={"enabled": True})
    assert order_params(OrderStageParams.from_config(on), layout).curriculum is None  # nothing learned yet
    layout.mixture_curriculum.parent.mkdir(parents=True)
    layout.mixture_curriculum.write_text("knots:\n  - tokens: 100\n    logits: [0.0, 1.0]\n")
    assert order_params(OrderStageParams.from_config(on), layout).curriculum == str(layout.mixture_curriculum)
    off = on.model_copy(update={"mixture": on.mixture.model_copy(update={"enabled": False})})
    assert order_params(OrderStageParams.from_config(off), layout).curriculum is None
    mine = tmp_path / "mine.yaml"
    mine.write_text("knots:\n  - tokens: 100\n    logits: [1.0, 0.0]\n")
    assert order_params(OrderStageParams.from_config(on.model_copy(update={"curriculum": str(mine)})), layout).curriculum == str(mine)
    f = instance(0, 200, k=2)
    with pytest.raises(StrataInputError) as err:
        sequence_order("greedy_curriculum", f, OrderParams(), 0)
    assert "curriculum:" in err.value.fix and "mixture.enabled" in err.value.fix and "--" not in err.value.fix
    got = sequence_order("greedy_curriculum", f, order_params(OrderStageParams.from_config(on), layout), 0)
    assert np.array_equal(np.sort(got), np.arange(f.n_sequences))


def test_no_error_names_a_cli_flag_as_the_fix_for_a_config_key():
    """Every StrataInputError raised in the library whose fix names a config key names no ``--flag``
    (the CLI's own argument errors, ``pipeline/cli/``, may name their flags)."""
    import re
    from pathlib import Path

    from pipeline.config import StrataConfig

    keys = set(StrataConfig.model_fields)
    repo = Path(__file__).resolve().parents[1]
    bad = []
    for path in sorted((repo / "pipeline").rglob("*.py")):
        if path.parent.name == "cli":
            continue
        text = path.read_text(encoding="utf-8")
        for m in re.finditer(r"fix=(f?\"[^\"]*\"(?:\s*f?\"[^\"]*\")*)", text):
            fix = m.group(1)
            words = set(re.findall(r"[a-z_][a-z0-9_.]*", fix))
            if "--" in fix and words & keys:
                bad.append(f"{path.relative_to(repo)}: {fix}")
    assert not bad, bad
