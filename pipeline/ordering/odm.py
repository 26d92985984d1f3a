"""Online Data Mixing (ODM, Albalak et al., Algorithm 1): a training-time strategy ``odm``.

The clusters are the arms of an Exp3 bandit. An optimizer step is one iteration of Alg. 1's
outer loop: the policy is fixed, G micro-batches are drawn from it (one cluster per micro-batch,
lines 6-7), and after the step the rewards are updated once. Before the step the sampler computes
the exploration rate and the policy

    E_t = min{1/K, sqrt(ln K / (K t))}                                      (Alg. 1, line 3)
    pi_t(D_i) = (1 - K E_t) exp(E_{t-1} R_i) / sum_j exp(E_{t-1} R_j) + E_t   (Alg. 1, line 4)

and after it sums the losses of every micro-batch drawn from each cluster and updates the
reward of every cluster with a non-zero sum,

    L_{D_i} = sum over the step's micro-batches b drawn from D_i of L(f, x_b, y_b)   (Alg. 1, lines 5, 8)
    R_i <- alpha R_i + (1 - alpha) L_{D_i} / pi_t(D_i)     for L_{D_i} != 0      (Alg. 1, lines 11-12)

(the moving average of the importance-weighted group loss). During the warm-up (1% of the steps,
ODM section 2) the policy stays at its prior and no rewards are recorded.

**The clock** (``clock``, config ``odm.clock``). Alg. 1 evaluates E_t at t = the step (line 2:
one turn per step): ``clock="step"``, **the paper's method**. Strata's default, ``clock="draw"``,
counts micro-batch draws instead: the policy of a step is evaluated at t = (draws before it) + 1,
so the clock advances by G per step and E_t decays as if G times as many turns had passed. With
the paper's clock and K = 32 clusters, E_t = 1/K (so pi is exactly uniform) for t < K ln K = 111
steps, i.e. for a whole demo-sized run; counting draws, the policy moves after ~111/G steps. The
reward scale is Alg. 1's (summed loss / pi, no rescaling).

**The initial domain weights** (``initial_weights``, config ``odm.initial_weights``). The paper
"initialize[s] the domain weights using those defined by The Pile" (section 3): the domain weights
are the sampling distribution pi(D_i), so pi starts at the prior p (here the pool shares), and
"during [the warm-up] the model trains, but the policy remains stationary" (section 2): pi = p for
the warm-up. Algorithm 1 itself keeps no weights but the rewards: line 1 initializes R_i = 0 and
E_0 = 1/K, and line 4 has no prior term, so once the warm-up is over the policy is line 4 as
printed, from R = 0 (uniform until rewards come in): ``initial_weights="warmup"``, **the paper's
method** and the default. ``initial_weights="exp3"`` is Strata's variant, not in the paper: it
keeps p as a standing factor of the Gibbs term (Exp3 with initial weights w_i(0) = p_i),

    pi_t(D_i) = (1 - K E_t) p_i exp(E_{t-1} R_i) / sum_j p_j exp(E_{t-1} R_j) + E_t,

so after the warm-up the policy starts at (1 - K E_t) p + E_t and leaves p only as rewards move it.
(With R_i(0) = 0 there is no reading of line 1 under which p survives the warm-up: an initial
R_i = ln(p_i) / E_0 would, but line 1 sets R_i = 0.)

Choices where the paper is open, as a careful reimplementation would make them:
- A sequence's cluster is the cluster holding most of its tokens (ties: the smaller cluster id);
  pools are the sequences grouped by that cluster; clusters owning no sequence are no arms.
- The prior (the policy during warm-up, and the Gibbs weights with ``initial_weights="exp3"``) is
  the pool share by default, the analogue of the paper's initialisation with The Pile's weights;
  ``prior="uniform"`` is the plain Exp3 start.
- The smoothing alpha is not given in the paper; 0.5 by default.
- G (``micro_batches``, config ``odm.micro_batches``; 0 = the default) defaults to the batch size,
  i.e. one cluster draw per sequence: the paper (section 4) names batch homogeneity as ODM's
  weakness and smaller micro-batches as its remedy. The paper trains with G = 8.
- A micro-batch's loss L(f, x, y) is the mean of its sequences' mean token losses (packed
  sequences score nearly the same number of tokens, so this is the token mean up to EOS gaps).
- Within a pool sequences are drawn without replacement in a seeded random order; an exhausted
  pool is reshuffled and drawing continues (a pool smaller than a micro-batch repeats sequences).
"""

from __future__ import annotations

import math

import numpy as np
import polars as pl

from pipeline.errors import StrataInputError


def sequence_clusters(segments: pl.DataFrame, doc_cluster: np.ndarray, n_sequences: int | None = None) -> np.ndarray:
    """(n_sequences,) int64: the majority-token cluster of every packed sequence.

    ``segments`` is the packing's segments table, ``doc_cluster[doc_id]`` the document clusters.
    Ties go to the smallest cluster id.
    """
    doc_cluster = np.asarray(doc_cluster, dtype=np.int64)
    sid = segments["sequence_id"].to_numpy()
    doc = segments["doc_id"].to_numpy()
    if doc.size and (doc.min() < 0 or doc.max() >= doc_cluster.size):
        raise StrataInputError(
            f"segments name doc_id up to {int(doc.max())} but only {doc_cluster.size} document clusters are given",
            fix="pass the cluster assignment of the corpus the sequences were packed from",
        )
    n = int(sid.max()) + 1 if n_sequences is None and sid.size else int(n_sequences or 0)
    per = (
        pl.DataFrame({"s": sid, "c": doc_cluster[doc], "t": segments["n_tokens"].to_numpy().astype(np.int64)})
        .group_by(["s", "c"])
        .agg(pl.col("t").sum())
        .sort(["s", "t", "c"], descending=[False, True, False])
        .unique("s", keep="first", maintain_order=True)
    )
    out = np.full(n, -1, dtype=np.int64)
    out[per["s"].to_numpy()] = per["c"].to_numpy()
    if (out < 0).any():
        raise StrataInputError("some sequence ids have no segment", fix="pass the segments table of the full packing")
    return out


def exploration_rate(t: int, k: int) -> float:
    """E_t = min{1/K, sqrt(ln K / (K t))} (Alg. 1, line 3); E_0 = 1/K (line 1)."""
    if t <= 0:
        return 1.0 / k
    return min(1.0 / k, math.sqrt(math.log(k) / (k * t)))


def exp3_policy(rewards: np.ndarray, eps_t: float, eps_prev: float, weights: np.ndarray | None = None) -> np.ndarray:
    """pi_t = (1 - K E_t) softmax(E_{t-1} R) + E_t (Alg. 1, line 4); with initial domain weights
    w, the Gibbs term is w_i exp(E_{t-1} R_i) / sum_j w_j exp(E_{t-1} R_j)."""
    z = eps_prev * np.asarray(rewards, dtype=np.float64)
    g = np.exp(z - z.max())
    if weights is not None:
        g = g * np.asarray(weights, dtype=np.float64)
    return (1.0 - rewards.size * eps_t) * g / g.sum() + eps_t


def reward_update(rewards: np.ndarray, arms: np.ndarray, losses: np.ndarray, pi: np.ndarray, alpha: float) -> np.ndarray:
    """The rewards after one step whose micro-batch g came from cluster ``arms[g]`` with loss ``losses[g]``.

    L_{D_i} = sum of the losses drawn from D_i (Alg. 1, lines 5, 8); for every D_i with
    L_{D_i} != 0, R_i <- alpha R_i + (1 - alpha) L_{D_i} / pi(D_i) (lines 11-12): once per step.
    """
    group = np.bincount(arms, weights=losses, minlength=rewards.size)
    hit = group != 0
    out = np.asarray(rewards, dtype=np.float64).copy()
    out[hit] = alpha * out[hit] + (1.0 - alpha) * group[hit] / pi[hit]
    return out


class ClusterPools:
    """Sequence indices grouped by cluster (the arms), each drawn without replacement in a seeded
    random order and reshuffled when exhausted; ``rng`` is shared with the caller's arm draws."""

    def __init__(self, seq_cluster: np.ndarray, rng: np.random.Generator):
        seq_cluster = np.asarray(seq_cluster, dtype=np.int64)
        order = np.argsort(seq_cluster, kind="stable")
        self.clusters, starts, self.sizes = np.unique(seq_cluster[order], return_index=True, return_counts=True)
        self.members = [order[a : a + n] for a, n in zip(starts, self.sizes)]
        self.rng = rng
        self._perm = [rng.permutation(p) for p in self.members]
        self._cursor = np.zeros(self.clusters.size, dtype=np.int64)

    def take(self, arm: int, n: int) -> np.ndarray:
        """The next ``n`` indices of arm ``arm`` (its pool repeats when smaller than n)."""
        out = []
        while n > 0:
            perm, c = self._perm[arm], int(self._cursor[arm])
            if c == perm.size:
                self._perm[arm] = perm = self.rng.permutation(self.members[arm])
                c = 0
            m = min(n, perm.size - c)
            out.append(perm[c : c + m])
            self._cursor[arm] = c + m
            n -= m
        return np.concatenate(out)


class ODMPolicy:
    """Algorithm 1's state, shared by Strata's trainer (:class:`ODMSampler`) and the export-side
    sampler (``pipeline.training.odm_sampler``): the rewards R, the exploration clock t (micro-batch
    draws so far with ``clock="draw"``, steps with ``clock="step"``), the optimizer steps opened,
    the warm-up and its prior (with ``initial_weights="exp3"`` also the Gibbs term's weights).

    ``begin(g)`` opens a step of ``g`` draws and returns its policy pi_t; ``record(arms, losses,
    pi, step)`` closes step ``step`` with the loss of each draw (Alg. 1, lines 8-12). The clock
    advances when a step opens, so a sampler whose data loader draws ahead of training keeps it.
    """

    def __init__(self, pool_sizes: np.ndarray, total_steps: int, *, smoothing: float = 0.5, warmup_fraction: float = 0.01,
                 prior: str = "proportional", clock: str = "draw", initial_weights: str = "warmup"):
        sizes = np.asarray(pool_sizes, dtype=np.float64)
        if sizes.size == 0:
            raise StrataInputError("ODM got no sequences", fix="pack the corpus before training with odm")
        if not 0.0 <= smoothing < 1.0:
            raise StrataInputError(f"ODM smoothing {smoothing} is outside [0, 1)", fix="use e.g. 0.5")
        if not 0.0 <= warmup_fraction < 1.0:
            raise StrataInputError(f"ODM warm-up fraction {warmup_fraction} is outside [0, 1)", fix="use 0.01 (the paper's 1%)")
        if prior not in ("proportional", "uniform"):
            raise StrataInputError(f"unknown ODM prior {prior!r}", fix="use 'proportional' or 'uniform'")
        if clock not in ("draw", "step"):
            raise StrataInputError(f"unknown ODM clock {clock!r}", fix="set odm.clock: draw (Strata's) or step (the paper's)")
        if initial_weights not in ("warmup", "exp3"):
            raise StrataInputError(f"unknown ODM initial weights {initial_weights!r}",
                                   fix="set odm.initial_weights: warmup (the paper's) or exp3 (the prior also as Exp3's Gibbs weights)")
        self.clock, self.initial_weights = clock, initial_weights
        self.k = sizes.size
        self.alpha = float(smoothing)
        self.warmup_steps = int(math.ceil(warmup_fraction * max(1, total_steps)))
        self.prior = sizes / sizes.sum() if prior == "proportional" else np.full(self.k, 1.0 / self.k)
        self.rewards = np.zeros(self.k)  # R_i, Alg. 1 line 1
        self.t = 0  # the exploration clock: micro-batch draws (clock "draw") or steps (clock "step") so far
        self.step = 0  # optimizer steps opened

    def policy(self, t: int, step: int | None = None) -> np.ndarray:
        """The sampling distribution at clock t (1-based, in draws or steps): the prior during warm-up
        (optimizer ``step`` <= the warm-up steps; default: t), else Alg. 1, line 4 (with the prior
        as the Gibbs weights when ``initial_weights="exp3"``)."""
        if (t if step is None else step) <= self.warmup_steps or self.k == 1:
            return self.prior.copy()
        weights = self.prior if self.initial_weights == "exp3" else None
        return exp3_policy(self.rewards, exploration_rate(t, self.k), exploration_rate(t - 1, self.k), weights)

    def begin(self, draws: int) -> np.ndarray:
        """Open the next optimizer step of ``draws`` micro-batches; its policy at clock t + 1 (Alg. 1,
        lines 3-4); the clock then advances by ``draws`` (``clock="draw"``) or by 1 (``"step"``)."""
        self.step += 1
        pi = self.policy(self.t + 1, self.step)
        self.t += int(draws) if self.clock == "draw" else 1
        return pi

    def record(self, arms: np.ndarray, losses: np.ndarray, pi: np.ndarray, step: int) -> None:
        """Close optimizer step ``step`` (1-based): micro-batch g came from arm ``arms[g]`` with loss
        ``losses[g]`` under ``pi``; one reward update, none during the warm-up."""
        losses = np.asarray(losses, dtype=np.float64)
        if not (np.isfinite(losses) & (losses >= 0)).all():
            raise StrataInputError("ODM got a non-finite or negative training loss", fix="lower the learning rate or check the data")
        if step > self.warmup_steps:
            self.rewards = reward_update(self.rewards, np.asarray(arms), losses, pi, self.alpha)


class ODMSampler:
    """Exp3 data mixing over cluster pools of sequence ids; query it every training step.

    ``seq_cluster[s]`` is sequence s's cluster (see :func:`sequence_clusters`), ``total_steps`` the
    run length (for the 1% warm-up). Use: ``ids = s.next_batch(B)``, train on ``ids``, then
    ``s.update(ids, per_sequence_losses)``. Same arguments and losses => same batches.
    """

    table = "odm_mixture"  # the DuckDB table (and ``<table>.parquet`` in the run's folder) of :meth:`mixture_rows`

    def __init__(
        self,
        seq_cluster: np.ndarray,
        total_steps: int,
        seed: int = 0,
        *,
        micro_batches: int | None = None,
        smoothing: float = 0.5,
        warmup_fraction: float = 0.01,
        prior: str = "proportional",
        clock: str = "draw",
        initial_weights: str = "warmup",
    ):
        seq_cluster = np.asarray(seq_cluster, dtype=np.int64)
        if seq_cluster.size == 0:
            raise StrataInputError("ODM got no sequences", fix="pack the corpus before training with odm")
        self.rng = np.random.default_rng(seed)
        self.pools = ClusterPools(seq_cluster, self.rng)
        self.clusters = self.pools.clusters
        self.state = ODMPolicy(self.pools.sizes, total_steps, smoothing=smoothing, warmup_fraction=warmup_fraction, prior=prior,
                               clock=clock, initial_weights=initial_weights)
        self.k = self.clusters.size
        self.micro_batches = micro_batches
        self._pending: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None  # ids, arm per micro-batch, pi_t
        self._mixture: list[np.ndarray] = []
        self._served: list[np.ndarray] = []

    @property
    def rewards(self) -> np.ndarray:
        return self.state.rewards

    @property
    def t(self) -> int:
        return self.state.t

    @property
    def warmup_steps(self) -> int:
        return self.state.warmup_steps

    def policy(self, t: int, step: int | None = None) -> np.ndarray:
        """:meth:`ODMPolicy.policy`."""
        return self.state.policy(t, step)

    def next_batch(self, batch_size: int) -> np.ndarray:
        """Play one optimizer step: G clusters drawn from the policy at clock t + 1 (Alg. 1, lines 3-7); B sequence ids."""
        if self._pending is not None:
            raise StrataInputError("ODM next_batch called twice without update", fix="call update(ids, losses) after every step")
        g = batch_size if self.micro_batches is None else self.micro_batches
        if g <= 0 or batch_size % g:
            raise StrataInputError(
                f"ODM micro_batches={g} does not divide batch_size={batch_size}",
                fix="choose micro_batches as a divisor of the batch size (default: the batch size)",
            )
        pi = self.state.begin(g)
        arms = self.rng.choice(self.k, size=g, p=pi)
        ids = np.concatenate([self.pools.take(int(a), batch_size // g) for a in arms])
        self._pending = (ids, arms, pi)
        self._mixture.append(pi)
        self._served.append(ids)
        return ids

    def update(self, ids: np.ndarray, losses: np.ndarray) -> None:
        """Record the step's per-sequence losses as rewards: one update per step (Alg. 1, lines 8-12)."""
        if self._pending is None:
            raise StrataInputError("ODM update without a batch", fix="call next_batch(B) before update")
        served, arms, pi = self._pending
        ids, losses = np.asarray(ids), np.asarray(losses, dtype=np.float64)
        if ids.shape != served.shape or not np.array_equal(ids, served) or losses.shape != ids.shape:
            raise StrataInputError("ODM update got other ids than the last batch",
                                   fix="pass the ids next_batch returned and one loss per id")
        self._pending = None
        mb_loss = losses.reshape(arms.size, -1).mean(axis=1)  # L(f, x, y) of each micro-batch
        self.state.record(arms, mb_loss, pi, self.state.step)

    def mixture_rows(self) -> pl.DataFrame:
        """The policy of every step: columns ``step`` (0-based training step), ``cluster``, ``prob``."""
        steps = len(self._mixture)
        probs = np.asarray(self._mixture).reshape(steps, self.k)
        return pl.DataFrame(
            {
                "step": np.repeat(np.arange(steps, dtype=np.int64), self.k),
                "cluster": np.tile(self.clusters, steps),
                "prob": probs.ravel(),
            }
        )

    def served_ids(self) -> np.ndarray:
        """The realised stream: every sequence id served so far, in training order."""
        return np.concatenate(self._served) if self._served else np.zeros(0, dtype=np.int64)

    def state_dict(self) -> dict:
        """Everything that moves while sampling (rewards, clocks, generator, pool cursors, the
        mixture log and the served stream), between steps; numpy arrays and plain values."""
        if self._pending is not None:
            raise StrataInputError("ODM state taken between next_batch and update", fix="checkpoint after update(ids, losses)")
        return {"rewards": self.state.rewards.copy(), "t": self.state.t, "step": self.state.step, "rng": self.rng.bit_generator.state,
                "perm": [p.copy() for p in self.pools._perm], "cursor": self.pools._cursor.copy(),
                "mixture": [p.copy() for p in self._mixture], "served": [s.copy() for s in self._served]}

    def load_state_dict(self, state: dict) -> None:
        """Continue from :meth:`state_dict` of a sampler built with the same arguments."""
        if len(state["perm"]) != self.k or any(p.size != q.size for p, q in zip(state["perm"], self.pools.members)):
            raise StrataInputError("ODM state of other cluster pools",
                                   fix="resume with the sequences and clusters the state was taken with")
        self.state.rewards = np.asarray(state["rewards"], dtype=np.float64)
        self.state.t, self.state.step = int(state["t"]), int(state["step"])
        self.rng.bit_generator.state = state["rng"]
        self.pools._perm, self.pools._cursor = list(state["perm"]), np.asarray(state["cursor"], dtype=np.int64)
        self._mixture, self._served, self._pending = list(state["mixture"]), list(state["served"]), None


def odm_sampler(segments: pl.DataFrame, doc_cluster: np.ndarray, n_steps: int, seed: int, odm) -> ODMSampler:
    """The ``odm`` strategy's training-time sampler (``StrategySpec.sampler``): Exp3 over the
    majority clusters of ``segments``' sequences, for a run of ``n_steps`` steps seeded with ``seed``,
    with the config group ``odm`` (:class:`pipeline.config.OdmConfig`)."""
    return ODMSampler(sequence_clusters(segments, doc_cluster), n_steps, seed=seed, smoothing=odm.smoothing,
                      warmup_fraction=odm.warmup_fraction, micro_batches=odm.micro_batches or None,
                      clock=odm.clock, initial_weights=odm.initial_weights)
