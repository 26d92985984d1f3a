"""ODM (ODM, Algorithm 1): policy, exploration, rewards, pools, determinism (no model needed)."""

from __future__ import annotations

import math

import numpy as np
import polars as pl
import pytest

from pipeline.config import config_from_dict
from pipeline.errors import StrataInputError
from pipeline.ordering.odm import ODMSampler, exp3_policy, exploration_rate, reward_update, sequence_clusters


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
    floors = np.array([exploration_rate(8 * n + 1, 4) for n in range(300)])  # the clock advances 8 draws per step
    assert (probs[s.warmup_steps :] >= floors[s.warmup_steps :, None] - 1e-12).all()
    late = probs[-50:].mean(0)  # E_{t-1} times the reward gap: ~0.2-0.7 at t = 2,400 draws
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


def test_group_loss_sums_every_draw_of_an_arm_and_updates_once_per_step():
    """The issue's example: one arm drawn twice in a step, micro-batch losses 2 and 3, pi = 0.5,
    alpha = 0.5, R = 0 before. Alg. 1: L = 2 + 3, R <- 0.5 * 0 + 0.5 * 5 / 0.5 = 5.0 (a turn per
    micro-batch gave 0.5 * (0.5 * 2 / 0.5) + 0.5 * 3 / 0.5 = 4.0)."""
    pi = np.array([0.5, 0.5])
    assert reward_update(np.zeros(2), np.array([0, 0]), np.array([2.0, 3.0]), pi, 0.5).tolist() == [5.0, 0.0]
    # line 11: only arms with L != 0 move; an arm whose draws all scored 0 keeps its reward
    assert reward_update(np.array([3.0, 1.0]), np.array([0, 1]), np.array([0.0, 2.0]), pi, 0.5).tolist() == [3.0, 2.5]

    for seed in range(50):  # the same example through the sampler: a first step with both draws from one arm
        s = ODMSampler(np.arange(40) % 2, total_steps=10, seed=seed, micro_batches=2, smoothing=0.5, warmup_fraction=0.0)
        ids = s.next_batch(4)  # 2 micro-batches of 2 sequences
        arms = (ids % 2).reshape(2, 2)
        if arms[0, 0] == arms[1, 0]:
            break
    assert (arms == arms[:, :1]).all() and arms[0, 0] == arms[1, 0]
    assert s.mixture_rows()["prob"].to_list() == [0.5, 0.5]  # K = 2, E_1 = 1/K: pi is exactly uniform
    s.update(ids, np.array([1.5, 2.5, 2.0, 4.0]))  # micro-batch means 2 and 3
    drawn = int(arms[0, 0])
    assert s.rewards[drawn] == 5.0 and s.rewards[1 - drawn] == 0.0


def _algorithm_1(arms: list[list[int]], losses: list[list[float]], k: int, alpha: float) -> tuple[list[list[float]], list[list[float]]]:
    """ODM's Algorithm 1 written out from the paper, with the sampler's clock (t = draws before the
    step + 1): the policy of every step and the rewards after it, for the given draws and
    micro-batch losses."""
    rewards, policies, after = [0.0] * k, [], []
    draws = 0
    for step_arms, step_losses in zip(arms, losses):
        t = draws + 1
        e_t = min(1 / k, math.sqrt(math.log(k) / (k * t)))
        e_prev = 1 / k if t == 1 else min(1 / k, math.sqrt(math.log(k) / (k * (t - 1))))
        gibbs = [math.exp(e_prev * r) for r in rewards]
        pi = [(1 - k * e_t) * w / sum(gibbs) + e_t for w in gibbs]
        group = [0.0] * k
        for arm, loss in zip(step_arms, step_losses):
            group[arm] += loss
        for i in range(k):
            if group[i] != 0:
                rewards[i] = alpha * rewards[i] + (1 - alpha) * group[i] / pi[i]
        draws += len(step_arms)
        policies.append(pi)
        after.append(list(rewards))
    return policies, after


def test_several_steps_match_algorithm_1():
    k, g, per_mb, steps, alpha = 3, 4, 2, 8, 0.3
    seq_cluster = np.arange(90) % k
    s = ODMSampler(seq_cluster, total_steps=steps, seed=7, micro_batches=g, smoothing=alpha, warmup_fraction=0.0)
    arms, mb_losses, rewards = [], [], []
    for n in range(steps):
        ids = s.next_batch(g * per_mb)
        clusters = seq_cluster[ids].reshape(g, per_mb)
        assert (clusters == clusters[:, :1]).all()
        losses = 1.0 + clusters[:, 0].repeat(per_mb) + 0.25 * n + 0.01 * (ids % 5)
        s.update(ids, losses)
        arms.append(clusters[:, 0].tolist())
        mb_losses.append(losses.reshape(g, per_mb).mean(1).tolist())
        rewards.append(s.rewards.tolist())
    policies, expected = _algorithm_1(arms, mb_losses, k, alpha)
    assert np.allclose(s.mixture_rows()["prob"].to_numpy().reshape(steps, k), policies, rtol=1e-12, atol=0)
    assert np.allclose(rewards, expected, rtol=1e-12, atol=0)
    assert np.ptp(policies[-1]) > 0.01  # the policy has left uniform: the rewards reached it
    assert any(len(set(a)) < len(a) for a in arms) and any(len(set(a)) < k for a in arms)  # repeats and undrawn arms


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
        s.update(ids, np.array([1.0, -1.0, 1.0, 1.0]))
    with pytest.raises(StrataInputError):
        ODMSampler(np.arange(4), total_steps=10, smoothing=1.0)


@pytest.mark.parametrize("key, arg", [("smoothing", "smoothing"), ("warmup_fraction", "warmup_fraction")])
def test_the_config_accepts_exactly_the_values_the_sampler_accepts(key, arg):
    for value in (0.0, 0.5, 0.99, 1.0, 1.5, -0.1, float("nan"), float("inf")):
        try:
            ODMSampler(np.arange(4), total_steps=10, **{arg: value})
            trains = True
        except StrataInputError:
            trains = False
        try:
            config_from_dict({"odm": {key: value}})
            loads = True
        except StrataInputError:
            loads = False
        assert loads == trains, (key, value)


def test_policy_moves_within_a_demo_sized_run_towards_the_high_loss_cluster():
    """32 clusters, 60 steps of 16 sequences (the demo): cluster 5's loss stays at 6 nats, the
    rest fall to 3 by mid-run; pi must up-weight cluster 5 (with the paper's one turn per step,
    E_t = 1/K for t < K ln K = 111 steps and pi would stay exactly uniform). One run is noisy: an
    arm drawn twice in a step gets the sum of its two losses (Alg. 1, line 8) and keeps that reward
    until its next draw, so the weights are averaged over 5 seeds."""
    k, steps, batch = 32, 60, 16
    seq_cluster = np.arange(32 * 40) % k
    last = np.zeros(k)
    for seed in range(5):
        s = ODMSampler(seq_cluster, total_steps=steps, seed=seed)
        for n in range(steps):
            ids = s.next_batch(batch)
            loss = np.where(seq_cluster[ids] == 5, 6.0, 6.0 - 3.0 * min(1.0, 2 * n / steps))
            s.update(ids, loss)
        probs = s.mixture_rows()["prob"].to_numpy().reshape(steps, k)
        assert s.t == steps * batch
        assert np.allclose(probs[0], 1 / k)
        last += probs[-10:].mean(0) / 5
    assert last.argmax() == 5 and last[5] > 1.3 / k  # ~1.56 / K
    assert last[5] > 1.1 * np.delete(last, 5).max()  # ~1.09 / K for the largest other


def test_two_steps_by_hand_with_the_papers_clock_and_initial_weights():
    """Algorithm 1 by hand, K = 2 pools of 3 and 1 sequences (prior p = 0.75 / 0.25), G = 2, alpha = 0.5.

    No warm-up. Step 1: both micro-batches from arm 0, losses 2 and 1, so R_0 = 0.5 * 0 + 0.5 * 3 / pi_1(0).
    The paper (clock: step; Alg. 1 line 1 starts R = 0 and line 4 has no prior term) evaluates step 2
    at t = 2: E_2 = sqrt(ln 2 / 4), E_1 = 1/2, pi_2 = (1 - 2 E_2) e^{E_1 R_i} / sum_j e^{E_1 R_j} + E_2.
    Strata's default clock (draw) evaluates it at t = 1 + G = 3: pi_2 = (1 - 2 E_3) e^{E_2 R_i} / sum_j
    e^{E_2 R_j} + E_3. Strata's ``exp3`` variant keeps p in the Gibbs term:
    pi_2 = (1 - 2 E_2) p_i e^{E_1 R_i} / sum_j p_j e^{E_1 R_j} + E_2.

    With the paper's 1% warm-up of 100 steps (1 step): pi_1 = p ("initialize the domain weights"
    with the prior; "the policy remains stationary"), no reward is recorded, and step 2 is line 4
    from R = 0: uniform. ``exp3`` gives (1 - 2 E_2) p + E_2 there instead."""
    from pipeline.ordering.odm import ODMPolicy

    def two_steps(warmup=0.0, **kw):
        pol = ODMPolicy(np.array([3, 1]), total_steps=100, smoothing=0.5, warmup_fraction=warmup, **kw)
        pi1 = pol.begin(2)
        pol.record(np.array([0, 0]), np.array([2.0, 1.0]), pi1, pol.step)
        return pi1, pol.rewards.copy(), pol.begin(2)

    # step 1 without warm-up: t = 1, E_1 = min(1/2, sqrt(ln 2 / 2) = 0.589) = 1/2, so pi_1 = (1 - 1) * ... + 1/2 = uniform
    e1, e2, e3 = 0.5, math.sqrt(math.log(2) / 4), math.sqrt(math.log(2) / 6)
    r0 = 0.5 * 3.0 / 0.5  # = 3.0
    a, b = math.exp(e1 * r0), 1.0
    paper = np.array([(1 - 2 * e2) * a / (a + b) + e2, (1 - 2 * e2) * b / (a + b) + e2])
    a, b = 0.75 * math.exp(e1 * r0), 0.25
    exp3 = np.array([(1 - 2 * e2) * a / (a + b) + e2, (1 - 2 * e2) * b / (a + b) + e2])  # 0.5721, 0.4279
    a, b = math.exp(e2 * r0), 1.0
    strata = np.array([(1 - 2 * e3) * a / (a + b) + e3, (1 - 2 * e3) * b / (a + b) + e3])
    pi1, rewards, pi2 = two_steps(clock="step", initial_weights="warmup")
    assert np.allclose(pi1, [0.5, 0.5]) and np.allclose(rewards, [r0, 0.0])
    assert np.allclose(pi2, paper, rtol=0, atol=1e-12) and abs(paper[0] - 0.553176) < 1e-5
    pi1, rewards, pi2 = two_steps(clock="step", initial_weights="exp3")
    assert np.allclose(pi2, exp3, rtol=0, atol=1e-12) and abs(exp3[0] - 0.572130) < 1e-5
    pi1, rewards, pi2 = two_steps()
    assert np.allclose(pi1, [0.5, 0.5]) and np.allclose(rewards, [r0, 0.0])
    assert np.allclose(pi2, strata, rtol=0, atol=1e-12) and not np.allclose(strata, paper, atol=1e-3)
    # the paper's 1% warm-up: the prior for step 1, then Algorithm 1 from R = 0
    pi1, rewards, pi2 = two_steps(warmup=0.01, clock="step")
    assert np.allclose(pi1, [0.75, 0.25]) and np.allclose(rewards, 0.0) and np.allclose(pi2, [0.5, 0.5], rtol=0, atol=1e-12)
    pi1, rewards, pi2 = two_steps(warmup=0.01, clock="step", initial_weights="exp3")
    assert np.allclose(pi1, [0.75, 0.25]) and np.allclose(pi2, (1 - 2 * e2) * np.array([0.75, 0.25]) + e2, rtol=0, atol=1e-12)


def test_odm_config_keys_reach_the_sampler_and_refuse_a_g_that_does_not_divide_the_batch():
    cfg = config_from_dict({"batch_size": 16, "odm": {"micro_batches": 8, "clock": "step", "initial_weights": "exp3"}})
    s = ODMSampler(np.repeat([0, 1], [30, 10]), 50, micro_batches=cfg.odm.micro_batches, clock=cfg.odm.clock,
                   initial_weights=cfg.odm.initial_weights)
    ids = s.next_batch(cfg.batch_size)
    assert ids.size == 16 and s.t == 1  # one turn per step, not G = 8 draws
    s.update(ids, np.ones(16))
    with pytest.raises(StrataInputError, match=r"odm\.micro_batches=6 is impossible"):
        config_from_dict({"batch_size": 16, "odm": {"micro_batches": 6}})
    for key, value in (("clock", "tokens"), ("initial_weights", "pile")):
        with pytest.raises(StrataInputError, match=f"odm.{key}"):
            config_from_dict({"odm": {key: value}})
    with pytest.raises(StrataInputError, match="odm.clock"):
        ODMSampler(np.arange(4), total_steps=10, clock="tokens")
