"""TerRIFIC mixture / curriculum learning (pipeline/mixture): exactness, projection, interpolation, synthetic learning."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.mixture.loop import (
    constant_curriculum,
    initial_logits,
    interpolate,
    knots_document,
    logits_at,
    make_context,
    softmax,
    static_iteration,
    update_curriculum,
)
from pipeline.mixture.realize import allocate, cluster_pure_segments, realize
from pipeline.mixture.terrific import InfluenceSettings, SparseProjection, per_example_grads, stabilize
from pipeline.ordering.curriculum import curriculum_from_dict
from pipeline.training.loop import TrainSettings

V, EOS, PAD = 64, 64, 65


def _doc(rng: np.random.Generator, cluster: int, n: int) -> np.ndarray:
    """A document of cluster ``cluster``: a walk t_{i+1} = (a t_i + b) mod V with 10% random tokens."""
    a, b = (5, 3, 7, 11)[cluster], (1, 17, 29, 41)[cluster]
    out = np.empty(n, dtype=np.int64)
    out[0] = rng.integers(V)
    for i in range(1, n):
        out[i] = rng.integers(V) if rng.random() < 0.1 else (a * out[i - 1] + b) % V
    return out


def _store(docs: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    streams = [np.append(d, EOS) for d in docs]
    offsets = np.zeros(len(streams) + 1, dtype=np.int64)
    np.cumsum([s.size for s in streams], out=offsets[1:])
    return np.concatenate(streams).astype(np.uint16), offsets


def _synthetic_context(target_cluster: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    sizes = [90, 60, 60, 40]  # cluster shares differ
    clusters = np.repeat(np.arange(4), sizes)
    docs = [_doc(rng, int(c), int(rng.integers(20, 60))) for c in clusters]
    tokens, offsets = _store(docs)
    tdocs = [_doc(rng, target_cluster, int(rng.integers(20, 60))) for _ in range(24)]
    ttok, toff = _store(tdocs)
    role = np.array([0] * 12 + [1] * 12)
    ctx = make_context(
        tokens, offsets, clusters, ttok, toff, role, role == 1, vocab_size=V + 2, eos_id=EOS, pad_id=PAD,
        train_settings=TrainSettings(preset="tiny", batch_size=8, max_steps=20, lr=3e-3, warmup_steps=2, seed=seed), seq_len=64,
        influence=InfluenceSettings(dim=256, nnz=2, batch=8, seed=seed), examples_per_cluster=6, target_examples=8,
        length_bins=8, max_cluster_epochs=8.0, step_size=1.0, seed=seed,
    )
    return ctx


def test_target_cluster_weight_rises_above_its_corpus_share():
    """Target drawn from cluster 3 (the smallest): its learned weight must rise above its corpus
    share after two iterations; a random or sign-flipped update fails the argmax checks."""
    target_cluster = 3
    ctx = _synthetic_context(target_cluster)
    share = np.bincount(ctx.doc_cluster, weights=ctx.doc_length, minlength=4) / ctx.doc_length.sum()
    logits = initial_logits(share * 1000)
    assert np.allclose(softmax(logits), share)
    first = static_iteration(ctx, logits, seed=0)
    assert int(np.argmax(first.measurement.scores)) == target_cluster
    second = static_iteration(ctx, first.next_logits, seed=0)
    w = softmax(second.next_logits)
    assert w[target_cluster] > share[target_cluster] + 0.05
    assert int(np.argmax(w)) == target_cluster


def test_per_example_grads_equal_one_example_at_a_time():
    import torch

    from pipeline.mixture.terrific import example_losses
    from pipeline.packing.pack import SequenceStore
    from pipeline.training.model import batch_tensors, build_model

    rng = np.random.default_rng(1)
    tokens, offsets = _store([_doc(rng, i % 4, int(rng.integers(5, 40))) for i in range(12)])
    segs, _ = cluster_pure_segments(np.arange(12), np.zeros(12, dtype=np.int64), np.diff(offsets), 32, 0)
    store = SequenceStore(tokens, offsets, segs, 32, pad_id=PAD)
    ids = np.arange(min(5, store.n_sequences))
    model = build_model("tiny", V + 2, 32, 0, EOS, PAD)
    batch = batch_tensors(store, ids, False, "cpu")
    got = per_example_grads(model, batch)
    for r in range(ids.size):
        one = batch_tensors(store, ids[r : r + 1], False, "cpu")
        model.zero_grad()
        example_losses(model, one).sum().backward()
        for name, p in model.named_parameters():
            torch.testing.assert_close(got[name][r], p.grad, rtol=1e-4, atol=1e-6)


def test_sparse_projection_preserves_inner_products_within_jl_bound():
    import torch

    n, dim, d = 20, 50_000, 2048
    x = torch.randn(n, dim, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    x[: n // 2] += 0.5 * x[n // 2 :]  # some correlated pairs
    proj = SparseProjection.for_vector(dim, d, 4, seed=3)
    px = proj.vector(x).double().numpy()
    xn = x.numpy()
    exact = xn @ xn.T
    norms = np.linalg.norm(xn, axis=1)
    err = np.abs(px @ px.T - exact) / np.outer(norms, norms)
    # JL with n^2 sum/difference vectors, failure probability delta: eps = sqrt(8 ln(n^2/delta) / d)
    eps = np.sqrt(8 * np.log(n * n / 0.01) / d)
    assert err.max() <= eps, (err.max(), eps)  # measured: max 0.070 vs eps 0.20
    # and it is a real projection: not the identity, not degenerate
    assert px.shape == (n, d) and 0 < err.max() and np.abs(np.diag(px @ px.T) / norms**2 - 1).max() < eps
    # never a dense d x |theta| matrix: int32 bucket + int8 sign per coordinate and nonzero
    assert proj.buckets["x"].dtype == torch.int32 and proj.buckets["x"].numel() == 4 * dim


def test_stabilize_centers_normalizes_and_clips():
    d = stabilize(np.array([1.0, 2.0, 3.0, 10.0]), clip=1.5)
    c = np.array([1.0, 2.0, 3.0, 10.0]) - 4.0
    assert np.allclose(d, np.clip(c / c.std(), -1.5, 1.5))
    assert np.allclose(stabilize(np.array([2.0, 2.0, 2.0]), 2.0), 0.0)
    d = stabilize(np.array([1.0, 5.0, 0.0]), 3.0, present=np.array([True, True, False]))
    assert np.allclose(d, [-1.0, 1.0, 0.0])


def test_curriculum_interpolation_matches_hand_values_with_clamping():
    s = np.array([3.0, 1.0, 2.0])  # unsorted on purpose
    deltas = np.array([[3.0, 0.0], [1.0, 2.0], [-1.0, 4.0]])  # rows belong to s
    got = interpolate(s, deltas, np.array([0.0, 1.0, 1.5, 2.0, 2.25, 3.0, 9.0]))
    want = np.array([[1.0, 2.0], [1.0, 2.0], [0.0, 3.0], [-1.0, 4.0], [0.0, 3.0], [3.0, 0.0], [3.0, 0.0]])
    assert np.allclose(got, want)
    # f_{t+1} = f_t + eta * Delta f, exact on the union of knots and clamped outside
    cur = constant_curriculum(np.array([0.0, 1.0]), np.exp(1.5), np.exp(2.5))
    new = update_curriculum(cur, s, deltas, eta=0.5)
    assert np.allclose(new.log_tokens, [1.0, 1.5, 2.0, 2.5, 3.0])
    assert np.allclose(new.logits, np.array([[0.0, 1.0]] * 5) + 0.5 * np.array([[1, 2], [0, 3], [-1, 4], [1, 2], [3, 0]]))
    assert np.allclose(logits_at(new, np.array([0.0, 1.75, 99.0])), [[0.5, 2.0], [-0.25, 2.75], [1.5, 1.0]])
    # the learned f is written in the knots format greedy_curriculum reads (round trip)
    back = curriculum_from_dict(knots_document(new), 2)
    assert np.allclose(back.log_tokens, new.log_tokens) and np.allclose(back.logits, new.logits)
    u = np.array([0.5, 1.2, 2.2, 4.0])
    assert np.allclose(back.probabilities(u), softmax(logits_at(new, u)))


def test_allocation_caps_repetition_and_water_fills():
    # cluster 0 wants 80 of 100 but holds 10 sequences: capped at 2 x 10 = 20; 80 - 20 go to 1 and 2 pro rata
    n = allocate(np.array([0.8, 0.15, 0.05]), np.array([10, 100, 100]), 100, max_cluster_epochs=2.0)
    assert n.tolist() == [20, 60, 20]
    assert allocate(np.array([0.5, 0.5]), np.array([7, 7]), 10, 1.0).tolist() == [5, 5]
    with pytest.raises(Exception, match="max_cluster_epochs"):
        allocate(np.array([0.5, 0.5]), np.array([3, 3]), 10, 1.5)
    seq_cluster = np.array([0] * 10 + [1] * 100 + [2] * 100)
    real = realize(seq_cluster, np.array([0.8, 0.15, 0.05]), 100, 2.0, seed=0)
    counts = np.bincount(real.sequence_ids, minlength=210)
    assert (counts[:10] == 2).all() and counts[10:].max() == 1  # full passes before any repeat
    assert real.table["max_copies"].to_list() == [2, 1, 1]
    assert real.repeated_fraction == pytest.approx(10 / 100)


def test_cluster_pure_packing_places_every_token_once():
    rng = np.random.default_rng(0)
    lengths = rng.integers(1, 90, 50)
    cluster = rng.integers(0, 4, 50)
    segs, seq_cluster = cluster_pure_segments(np.arange(50), cluster, lengths, 32, seed=1)
    per_doc = np.bincount(segs["doc_id"].to_numpy(), weights=segs["n_tokens"].to_numpy(), minlength=50)
    assert per_doc.tolist() == lengths.tolist()
    assert (cluster[segs["doc_id"].to_numpy()] == seq_cluster[segs["sequence_id"].to_numpy()]).all()
    fill = np.bincount(segs["sequence_id"].to_numpy(), weights=segs["n_tokens"].to_numpy())
    assert fill.max() <= 32 and (fill[:-1][np.diff(seq_cluster) == 0] == 32).all()  # only each cluster's last is short


def test_target_split_and_bad_target_file(tmp_path):
    import polars as pl

    from pipeline.errors import StrataInputError
    from pipeline.mixture.target import read_target_file, target_documents

    held = pl.DataFrame({"text": [f"doc {i}" + "x" * (i % 3) for i in range(9)], "id": [str(i) for i in range(9)],
                         "source": ["a"] * 5 + ["b"] * 4})
    docs = target_documents(held, None, "", seed=0)
    t = docs.filter(pl.col("source") == "a")
    assert sorted(t["role"].to_list()) == [0, 0, 0, 1, 1]  # half (rounded up) measures v, the rest scores
    assert docs.filter(pl.col("role") == 0)["general"].sum() == 0 and docs.filter(pl.col("role") > 0)["general"].all()
    assert set(target_documents(held, None, "b", 0).filter(pl.col("role") < 2)["source"]) == {"b"}
    with pytest.raises(StrataInputError, match="target_source"):
        target_documents(held, None, "nope", 0)
    bad = tmp_path / "t.jsonl"
    bad.write_text('{"text": "ok"}\n{"text": 3}\n')
    with pytest.raises(StrataInputError) as err:
        read_target_file(bad)
    assert err.value.line == 2
    good = tmp_path / "g.jsonl"
    good.write_text('{"text": "one"}\n{"text": "two"}\n{"text": "three"}\n')
    docs = target_documents(held, read_target_file(good), "", 0)
    assert docs.filter(pl.col("role") < 2).height == 3 and docs.filter(pl.col("role") == 2).height == 9


def test_terrific_avg_by_hand():
    """TerRIFIC-AVG (TerRIFIC curricula, "Experimental Setup" 3): the update is the mean of the
    stabilized Delta l at checkpoints N_max/16, /8, /4, /2, N_max (the paper's 400M ... 6.4B
    tokens); TerRIFIC takes the final checkpoint's alone."""
    from pipeline.config import config_from_dict
    from pipeline.errors import StrataInputError
    from pipeline.mixture.loop import static_checkpoints, static_update
    from pipeline.mixture.terrific import Measurement

    assert static_checkpoints("terrific_avg", 32, 8) == [2, 4, 8, 16, 32]
    # the demo's budget, 30 steps of 16 x 256 tokens: 7,680 / 15,360 / 30,720 / 61,440 / 122,880 tokens
    assert static_checkpoints("terrific_avg", 30, 16 * 256) == [2, 4, 8, 15, 30]
    assert static_checkpoints("terrific", 30, 16 * 256) == [30]
    assert static_checkpoints("terrific_avg", 30, 16 * 256, avg_checkpoints=2) == [15, 30]
    with pytest.raises(StrataInputError, match="raise max_steps to at least 16"):
        static_checkpoints("terrific_avg", 8, 8)  # N_max/16 and N_max/8 both fall on step 1
    with pytest.raises(StrataInputError, match="mixture.static_method"):
        static_checkpoints("terrific_mean", 8, 8)
    deltas = {2: [1.0, 0.0, -1.0], 4: [2.0, 0.0, -2.0], 8: [0.0, 1.0, -1.0], 16: [1.0, 1.0, -2.0], 32: [1.0, -2.0, 1.0]}
    measured = {k: Measurement(scores=np.array(d) * 10, delta=np.array(d), present=np.array([True, True, k != 8]), clip_t=float(k),
                               target_loss=float(k), n_examples=3) for k, d in deltas.items()}
    logits = np.array([0.5, 0.0, -0.5])
    applied, nxt = static_update(logits, measured, [2, 4, 8, 16, 32], eta=0.5)
    # mean Delta l = ([1,0,-1] + [2,0,-2] + [0,1,-1] + [1,1,-2] + [1,-2,1]) / 5 = [1, 0, -1]
    assert np.allclose(applied.delta, [1.0, 0.0, -1.0]) and np.allclose(nxt, [1.0, 0.0, -1.0])
    assert np.allclose(applied.scores, [10.0, 0.0, -10.0]) and applied.present.tolist() == [True, True, False]
    assert applied.clip_t == 32.0 and applied.target_loss == 32.0
    single, nxt = static_update(logits, measured, [32], eta=0.5)
    assert np.allclose(nxt, [1.0, -1.0, 0.0]) and single.delta.tolist() == [1.0, -2.0, 1.0]
    assert config_from_dict({"mixture": {"static_method": "terrific_avg"}}).mixture.avg_checkpoints == 5
    with pytest.raises(StrataInputError, match="static_method"):
        config_from_dict({"mixture": {"static_method": "avg"}})
