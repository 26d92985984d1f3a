"""Gradient analyses: stable rank (TerRIFIC curricula eq.) and mixture fidelity (tiny model, CPU)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pipeline.errors import StrataInputError
from pipeline.packing.pack import SequenceStore, pack_concat
from pipeline.training.gradients import (
    fidelity_rows,
    gradient_stable_ranks,
    layer_matrices,
    mixture_fidelity,
    stable_rank,
    summarize_stable_ranks,
)
from pipeline.training.model import build_model

VOCAB, EOS, PAD, L = 48, 1, 0, 32


def test_stable_rank_known_values():
    rng = np.random.default_rng(0)
    u, v = rng.normal(size=(7, 1)), rng.normal(size=(1, 5))
    assert stable_rank(u @ v) == pytest.approx(1.0)
    assert stable_rank(np.eye(6)) == pytest.approx(6.0)
    assert stable_rank(np.diag([3.0, 1.0, 1.0])) == pytest.approx(11 / 9)
    assert stable_rank(torch.eye(4) * 5) == pytest.approx(4.0)
    assert np.isnan(stable_rank(np.zeros((3, 3))))
    with pytest.raises(StrataInputError):
        stable_rank(np.ones(3))


@pytest.fixture(scope="module")
def two_topics():
    """Documents of two clusters with disjoint vocabularies, packed cluster after cluster."""
    rng = np.random.default_rng(1)
    docs = [rng.integers(2, 20, int(rng.integers(12, 40))) for _ in range(60)]
    docs += [rng.integers(25, 45, int(rng.integers(12, 40))) for _ in range(60)]
    flat = np.concatenate([np.append(d, EOS) for d in docs]).astype(np.int64)
    lengths = np.array([d.size + 1 for d in docs])
    pk = pack_concat(np.arange(len(docs)), lengths, L)
    store = SequenceStore(flat, np.concatenate([[0], np.cumsum(lengths)]), pk.segments, L)
    return store, build_model("tiny", VOCAB, L, 0, EOS, PAD)


def test_gradient_stable_ranks_per_layer_without_side_effects(two_topics):
    store, model = two_topics
    before = [p.detach().clone() for p in model.parameters()]
    model.train()
    order = np.random.default_rng(0).permutation(store.n_sequences)
    rows = gradient_stable_ranks(model, store, order, positions=[0, 3], batch_size=4)
    assert rows.height == 2 * 2 * 7  # 2 batches x 2 layers x (q, k, v, o, gate, up, down)
    assert set(rows["matrix"]) == {"q", "k", "v", "o", "gate", "up", "down"}
    shapes = {name: min(p.shape) for name, *_, p in layer_matrices(model)}
    for r in rows.iter_rows(named=True):
        assert 1.0 <= r["stable_rank"] <= shapes[r["layer_name"]] + 1e-6
    assert model.training and all(p.grad is None for p in model.parameters())
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    summary = summarize_stable_ranks(rows)
    assert summary.height == 14 and (summary["min_stable_rank"] <= summary["mean_stable_rank"] + 1e-12).all()
    assert (summary["n_batches"] == 2).all()


def test_mixture_fidelity_is_flat_for_a_shuffle_and_drifts_for_a_sorted_stream(two_topics):
    store, model = two_topics
    n = store.n_sequences
    shuffled = mixture_fidelity(model, store, np.random.default_rng(0).permutation(n), sequences_per_chunk=6, batch_size=6)
    drifting = mixture_fidelity(model, store, np.arange(n), sequences_per_chunk=6, batch_size=6)
    for m in (shuffled, drifting):
        assert m.shape == (10, 10)
        assert np.allclose(m, m.T) and np.allclose(np.diag(m), 1.0)
    off = ~np.eye(10, dtype=bool)
    assert drifting[0, 9] < shuffled[off].min()  # first chunk (topic A) vs last (topic B)
    assert drifting[0, 1] > drifting[0, 9]
    rows = fidelity_rows(drifting)
    assert rows.height == 100 and rows.filter((rows["chunk_i"] == 0) & (rows["chunk_j"] == 9))["cosine"][0] == drifting[0, 9]
    mlp_only = mixture_fidelity(model, store, np.arange(n), n_chunks=3, sequences_per_chunk=4, batch_size=4,
                                param_filter=lambda s: ".mlp." in s)
    assert mlp_only.shape == (3, 3)
    with pytest.raises(StrataInputError):
        mixture_fidelity(model, store, np.arange(5), n_chunks=10)
    with pytest.raises(StrataInputError):
        mixture_fidelity(model, store, np.arange(n), param_filter=lambda s: False)


def test_stable_rank_of_a_tokens_by_width_matrix_of_known_singular_values():
    """M in R^{T x d} (T = 40 tokens, d = 6) built as U diag(s) V^T: srank = sum s^2 / max s^2 = (16 + 4 + 4 + 1) / 16."""
    rng = np.random.default_rng(3)
    u, _ = np.linalg.qr(rng.normal(size=(40, 4)))
    v, _ = np.linalg.qr(rng.normal(size=(6, 4)))
    assert stable_rank(u @ np.diag([4.0, 2.0, 2.0, 1.0]) @ v.T) == pytest.approx(25 / 16)


def test_activation_gradients_are_the_papers_T_by_d_matrix(two_topics):
    """stable_rank_matrix: activations probes M = dLoss/d(layer output), one row per token: M^T X is the weight gradient."""
    from pipeline.training.gradients import output_gradients

    store, model = two_topics
    ids = np.arange(4)
    pairs = output_gradients(model, store, ids)
    mats = layer_matrices(model)
    loss_grads = torch.autograd.grad(_mean_loss(model, store, ids), [m[4] for m in mats])
    for (name, *_, w), (m, x), gw in zip(mats, pairs, loss_grads):
        assert m.shape == (4 * L, w.shape[0]) and x.shape == (4 * L, w.shape[1]), name
        torch.testing.assert_close(m.T @ x, gw.float(), atol=1e-6, rtol=1e-4)
    rows = gradient_stable_ranks(model, store, np.arange(store.n_sequences), positions=[0], batch_size=4, matrix="activations")
    by_name = dict(zip(rows["layer_name"], rows["stable_rank"]))
    for (name, *_), (m, _) in zip(mats, pairs):
        assert by_name[name] == pytest.approx(stable_rank(m), rel=1e-6)
    weights = gradient_stable_ranks(model, store, np.arange(store.n_sequences), positions=[0], batch_size=4)
    assert not np.allclose(rows["stable_rank"].to_numpy(), weights["stable_rank"].to_numpy())
    with pytest.raises(StrataInputError, match="stable_rank_matrix"):
        gradient_stable_ranks(model, store, np.arange(4), positions=[0], batch_size=4, matrix="tokens")


def _mean_loss(model, store, ids):
    from pipeline.training.gradients import _loss

    return _loss(model, store, ids, False, "cpu", "mean")
