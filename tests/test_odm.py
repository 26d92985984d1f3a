"""ODM (ODM, Algorithm 1): policy, exploration, rewards, pools, determinism (no model needed)."""

from __future__ import annotations

import math

import numpy as np
import polars as pl
import pytest

from pipeline.errors import StrataInputError
from pipeline.training.odm import ODMSampler, exp3_policy, exploration_rate, sequence_clusters


def test_sequence_cluster_is_the_majority_token_cluster():
    seg = pl.DataFrame({
        "sequence_id": [0, 0, 0, 1, 1, 2], "seq_token_start": [0, 5, 9, 0, 6, 0],
        "doc_id": [0, 1, 2, 2, 3, 4], "doc_token_start": [0, 0, 0, 7, 0, 0], "n_tokens": [5, 4, 7, 6, 6, 16],
    })
    doc_cluster = np.array([2, 0, 1, 0, 0])
    # seq 0: cluster 2 -> 5, 0 -> 4, 1 -> 7; seq 1: a 6/6 tie between clusters 1 and 0 -> 0; seq 2: cluster 0
    assert sequence_clusters(seg, doc_cluster).tolist() == [1, 0, 0]
    with pytest.raises(StrataInputError):
        sequence_clusters(seg, doc_cluster[:3])


def test_exploration_rate_and_policy_follow_algorithm_1():
    assert exploration_rate(0, 4) == 0.25 and exploration_rate(1, 4) == 0.25  # sqrt(ln4/4) > 1/4
    assert exploration_rate(100, 4) == pytest.approx(math.sqrt(math.log(4) / 400))
    r = np.array([1.0, 2.0, 0.0])
    e_t, e_prev = exploration_rate(50, 3), exploration_rate(49, 3)
    g = np.exp(e_prev * r) / np.exp(e_prev * r).sum()
    assert np.allclose(exp3_policy(r, e_t, e_prev), (1 - 3 * e_t) * g + e_t)


def _run(sampler: ODMSampler, steps: int, batch: int, loss_of_cluster, seq_cluster, check=None):
    for _ in range(steps):
        ids = sampler.next_batch(batch)
        if check is not None:
            check(sampler)
        sampler.update(ids, loss_of_cluster[seq_cluster[ids]])


def test_probabilities_sum_to_one_respect_the_floor_and_favour_high_loss():
    seq_cluster = np.arange(400) % 4
    s = ODMSampler(seq_cluster, total_steps=300, seed=0, micro_batches=8)
    losses = np.array([6.0, 2.0, 2.0, 2.0])  # cluster 0 keeps the higher loss
    _run(s, 300, 8, losses, seq_cluster)
    mix = s.mixture_rows()
    probs = mix["prob"].to_numpy().reshape(300, 4)
    assert np.allclose(probs.sum(1), 1.0)
    floors = np.array([exploration_rate(8 * n + 1, 4) for n in range(300)])  # 8 turns (draws) per step
    assert (probs[s.warmup_steps :] >= floors[s.warmup_steps :, None] - 1e-12).all()
    late = probs[-50:].mean(0)  # E_{t-1} R grows with the loss gap (~0.6 at t = 2,400 turns)
    assert late[0] > 0.26 and late[0] > 1.1 * late[1:].max()


def test_warmup_keeps_the_prior_and_records_no_reward():
    seq_cluster = np.repeat([0, 1, 2], [60, 30, 10])  # pool shares 0.6 / 0.3 / 0.1
    s = ODMSampler(seq_cluster, total_steps=500, seed=0)  # 1% warm-up: 5 steps
    assert s.warmup_steps == 5
    _run(s, 5, 4, np.array([1.0, 5.0, 9.0]), seq_cluster)
    assert np.array_equal(s.rewards, np.zeros(3))
    assert np.allclose(s.mixture_rows()["prob"].to_numpy().reshape(5, 3), [0.6, 0.3, 0.1])
    u = ODMSampler(seq_cluster, total_steps=500, prior="uniform")
    assert np.allclose(u.policy(1), 1 / 3)


def test_reward_is_the_moving_average_of_importance_weighted_group_loss():
    seq_cluster = np.arange(40) % 2
    s = ODMSampler(seq_cluster, total_steps=10, seed=3, micro_batches=2, smoothing=0.5, warmup_fraction=0.0)
    s.rewards[:] = [4.0, 0.0]
    ids = s.next_batch(6)  # 2 micro-batches of 3 sequences
    pi = s.mixture_rows()["prob"].to_numpy()
    losses = np.arange(6, dtype=float) + 1.0
    arms = seq_cluster[ids].reshape(2, 3)
    assert (arms == arms[:, :1]).all()  # each micro-batch comes from one cluster
    expected = np.array([4.0, 0.0])
    for g in range(2):  # one turn per micro-batch, in draw order
        i = arms[g, 0]
        expected[i] = 0.5 * expected[i] + 0.5 * losses[3 * g : 3 * g + 3].mean() / pi[i]
    s.update(ids, losses)
    assert np.allclose(s.rewards, expected)


def test_pools_are_drawn_without_replacement_then_reshuffled_and_seeded():
    seq_cluster = np.repeat([0, 1], [7, 50])
    s = ODMSampler(seq_cluster, total_steps=100, seed=5, prior="uniform", warmup_fraction=0.5)
    _run(s, 40, 4, np.array([1.0, 1.0]), seq_cluster)
    served = s.served_ids()
    zero = served[seq_cluster[served] == 0]
    assert zero.size >= 14
    for a in range(0, zero.size - 6, 7):  # every run of 7 draws is one full pass over the pool
        assert sorted(zero[a : a + 7].tolist()) == list(range(7))
    t = ODMSampler(seq_cluster, total_steps=100, seed=5, prior="uniform", warmup_fraction=0.5)
    _run(t, 40, 4, np.array([1.0, 1.0]), seq_cluster)
    assert np.array_equal(served, t.served_ids())
    assert s.mixture_rows().equals(t.mixture_rows())


def test_misuse_is_reported():
    s = ODMSampler(np.arange(20) % 2, total_steps=10, micro_batches=3)
    with pytest.raises(StrataInputError):
        s.next_batch(8)
    s = ODMSampler(np.arange(20) % 2, total_steps=10)
    with pytest.raises(StrataInputError):
        s.update(np.arange(4), np.ones(4))
    ids = s.next_batch(4)
    with pytest.raises(StrataInputError):
        s.next_batch(4)
    with pytest.raises(StrataInputError):
        s.update(ids[::-1], np.ones(4))
    with pytest.raises(StrataInputError):
        s.update(ids, np.array([1.0, np.nan, 1.0, 1.0]))
    with pytest.raises(StrataInputError):
        ODMSampler(np.arange(4), total_steps=10, smoothing=1.0)


def test_policy_moves_within_a_demo_sized_run_towards_the_high_loss_cluster():
    """32 clusters, 60 steps of 16 sequences (the demo): cluster 5's loss stays at 6 nats, the
    rest fall to 3 by mid-run; pi must up-weight cluster 5 (with the paper's one turn per step,
    E_t = 1/K for t < K ln K = 111 steps and pi would stay exactly uniform)."""
    k, steps, batch = 32, 60, 16
    seq_cluster = np.arange(32 * 40) % k
    s = ODMSampler(seq_cluster, total_steps=steps, seed=0)
    for n in range(steps):
        ids = s.next_batch(batch)
        loss = np.where(seq_cluster[ids] == 5, 6.0, 6.0 - 3.0 * min(1.0, 2 * n / steps))
        s.update(ids, loss)
    probs = s.mixture_rows()["prob"].to_numpy().reshape(steps, k)
    assert s.t == steps * batch
    assert np.allclose(probs[0], 1 / k)
    last = probs[-10:].mean(0)
    assert last.argmax() == 5 and last[5] > 1.3 / k  # ~1.37 / K
    assert np.abs(last - 1 / k).max() > 0.01  # not uniform
