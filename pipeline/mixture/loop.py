"""The TerRIFIC learning loops: a static mixture (Train -> Measure -> Update) and curricula (Algorithm 1).

Static (TerRIFIC curricula, "Warmup"): logits l_0 = log(corpus token shares of the clusters);
iteration i trains a fresh model on the realized mixture p_i = softmax(l_i) (``realize.py``,
greedy order), measures Delta l and sets l_{i+1} = l_i + eta Delta l. Two of the paper's
configurations ("Experimental Setup"), by name (``mixture.static_method``):

- ``terrific`` ("A static mixture learned from a single 6.4B-token checkpoint"): Delta l measured
  at the final checkpoint (``terrific.measure``).
- ``terrific_avg`` (TerRIFIC-AVG, "A static mixture learned by averaging influence information from
  400M, 800M, 1.6B, 3.2B, and 6.4B-token checkpoints"): the same run measured at A checkpoints
  N_max / 2^k, k = A-1, ..., 0 (the paper's A = 5: 6.4B / 16 ... 6.4B, each double the one
  before), and Delta l = (1/A) sum_k Delta l(theta_{N_k}), the mean of the A stabilized
  sub-updates ("averaging 5 distinct sub-updates"). ``mixture.avg_checkpoints`` = A.

Curricula (TerRIFIC curricula, "Learning Scale-Dependent Logits" / Algorithm 1): f_t(N) is piecewise
linear in s = log N (the ``Curriculum`` of ``pipeline.ordering.curriculum``, clamped outside its
knots); f_0 = l_0 at every N. Meta-iteration t trains a fresh model on the curriculum-greedy
order of f_t, with checkpoints at N_b = exp(s_b), s_b ~ U[log N_min, log N_max] i.i.d. (B of
them, seeded by t), measures Delta f(s_b) at each, interpolates piecewise linearly in s with
clamping (:func:`interpolate`) and sets f_{t+1}(N) = f_t(N) + eta Delta f_t(log N).

f_t is kept exact: a sum of clamped piecewise-linear functions is piecewise linear on the union
of their knots and clamped outside it, so f_{t+1} is f_t + eta Delta f_t evaluated on the union of
f_t's knots and the new s_b (at most 2 + B t knots). N_max is the run's token budget
(max_steps x batch_size x seq_len), N_min = ``min_fraction`` x N_max; a checkpoint N_b is taken
after the first step whose budget reaches N_b.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import polars as pl

from pipeline.devices import device
from pipeline.errors import StrataInputError
from pipeline.mixture.realize import Realization, cluster_pure_segments, multiset_features, realize
from pipeline.mixture.terrific import InfluenceSettings, Measurement, measure
from pipeline.ordering.curriculum import Curriculum, curriculum_greedy_order
from pipeline.ordering.greedy import Objective, greedy_order
from pipeline.packing.pack import SequenceStore
from pipeline.training.loop import TrainSettings, autocast, train
from pipeline.training.model import batch_tensors, token_losses


def softmax(x: np.ndarray) -> np.ndarray:
    z = np.asarray(x, dtype=np.float64)
    z = np.exp(z - z.max(axis=-1, keepdims=True))
    return z / z.sum(axis=-1, keepdims=True)


def initial_logits(cluster_tokens: np.ndarray) -> np.ndarray:
    """l_0 = log of the corpus token share of each cluster (softmax(l_0) = the corpus mixture)."""
    t = np.asarray(cluster_tokens, dtype=np.float64)
    return np.log(np.maximum(t / t.sum(), 1e-12))


def interpolate(s_knots: np.ndarray, values: np.ndarray, s: np.ndarray) -> np.ndarray:
    """Algorithm 1 step 3: piecewise-linear interpolation of ``values`` (B, C) at knots s_b,
    clamped to the endpoint values outside [s_(1), s_(B)]; returns (len(s), C). Knots need not be sorted."""
    s_knots = np.asarray(s_knots, dtype=np.float64)
    values = np.asarray(values, dtype=np.float64).reshape(s_knots.size, -1)
    order = np.argsort(s_knots, kind="stable")
    xs, ys = s_knots[order], values[order]
    s = np.atleast_1d(np.asarray(s, dtype=np.float64))
    return np.stack([np.interp(s, xs, ys[:, c]) for c in range(ys.shape[1])], axis=1)


def logits_at(cur: Curriculum, s: np.ndarray) -> np.ndarray:
    """f(s) of a curriculum (raw logits, not softmaxed), clamped outside its knots; (len(s), C)."""
    return interpolate(cur.log_tokens, cur.logits, s)


def constant_curriculum(logits: np.ndarray, n_min: float, n_max: float) -> Curriculum:
    return Curriculum(np.log(np.array([n_min, n_max], dtype=np.float64)), np.vstack([logits, logits]).astype(np.float64))


def sample_log_locations(s_min: float, s_max: float, b: int, seed: int) -> np.ndarray:
    """Algorithm 1 step 1: B i.i.d. U[s_min, s_max] log-token locations, sorted."""
    return np.sort(np.random.default_rng(seed).uniform(s_min, s_max, size=b))


def update_curriculum(cur: Curriculum, s_b: np.ndarray, deltas: np.ndarray, eta: float) -> Curriculum:
    """Algorithm 1 step 4: f_{t+1}(s) = f_t(s) + eta Delta f_t(s), exact on the union of knots."""
    knots = np.unique(np.concatenate([cur.log_tokens, np.asarray(s_b, dtype=np.float64)]))
    return Curriculum(knots, logits_at(cur, knots) + eta * interpolate(s_b, deltas, knots))


def knots_document(cur: Curriculum) -> dict:
    """The learned f in the knots format ``greedy_curriculum`` reads (pipeline/ordering/curriculum.py)."""
    return {"knots": [{"tokens": float(np.exp(s)), "logits": [float(v) for v in row]} for s, row in zip(cur.log_tokens, cur.logits)]}


@dataclass
class MetaContext:
    """Everything one Train -> Measure step needs (built by the asset from the data root)."""

    pool: SequenceStore  # cluster-pure packing of the training documents
    pool_segments: pl.DataFrame
    seq_cluster: np.ndarray  # cluster of each pool sequence
    doc_cluster: np.ndarray  # per doc_id
    doc_length: np.ndarray  # per doc_id, stream length incl. EOS
    n_clusters: int
    cluster_examples: np.ndarray  # fixed subsample of pool sequence ids (the same every iteration)
    target: SequenceStore  # target / held-out sequences
    target_fit: np.ndarray  # target sequences for v
    target_eval: np.ndarray  # target sequences that score models
    heldout_eval: np.ndarray  # general held-out sequences that score models
    vocab_size: int
    eos_id: int
    pad_id: int
    train: TrainSettings
    influence: InfluenceSettings
    lam: float = 1.0
    length_bins: int = 100
    noise: float = 0.0
    max_cluster_epochs: float = 4.0
    step_size: float = 1.0
    progress: bool = False
    log: Callable[[str], None] = field(default=lambda msg: None)

    @property
    def budget_sequences(self) -> int:
        return self.train.max_steps * self.train.batch_size

    @property
    def budget_tokens(self) -> float:
        return float(self.budget_sequences * self.pool.seq_len)

    def batch(self, store: SequenceStore):
        dev = device()
        return lambda ids: batch_tensors(store, ids, self.train.cross_document, dev)


def fixed_cluster_examples(seq_cluster: np.ndarray, per_cluster: int, seed: int) -> np.ndarray:
    """A seeded subsample of at most ``per_cluster`` pool sequences of every cluster (sorted by cluster)."""
    rng = np.random.default_rng(seed)
    out = []
    for j in np.unique(seq_cluster):
        members = np.flatnonzero(seq_cluster == j)
        out.append(np.sort(rng.permutation(members)[:per_cluster]))
    return np.concatenate(out)


def mean_token_loss(model, store: SequenceStore, ids: np.ndarray, batch_size: int, cross_document: bool) -> float:
    """Token-weighted mean next-token loss (nats) of the given sequences."""
    import torch


    dev = device()
    total, count = 0.0, 0.0
    with torch.no_grad(), autocast(dev):
        for start in range(0, len(ids), batch_size):
            batch = batch_tensors(store, np.asarray(ids[start : start + batch_size]), cross_document, dev)
            tok, scored = token_losses(model, batch)
            total += float((tok.float() * scored).sum())
            count += float(scored.sum())
    return total / max(count, 1.0)


def static_order(ctx: MetaContext, weights: np.ndarray, seed: int) -> tuple[np.ndarray, Realization]:
    """Realize ``weights`` on the pool and order the multiset with the greedy (f3); pool sequence ids in order."""
    real = realize(ctx.seq_cluster, weights, ctx.budget_sequences, ctx.max_cluster_epochs, seed)
    f = multiset_features(ctx.pool_segments, ctx.doc_cluster, ctx.doc_length, real.sequence_ids, ctx.n_clusters, ctx.length_bins)
    rows = greedy_order(f, Objective.named("f3", ctx.lam), ctx.noise, seed)
    return real.sequence_ids[rows], real


def curriculum_order(ctx: MetaContext, cur: Curriculum, seed: int) -> tuple[np.ndarray, Realization]:
    """Realize the curriculum's total E(T)/T on the pool and order it with the curriculum greedy."""
    weights = cur.cumulative(np.array([ctx.budget_tokens]))[0] / ctx.budget_tokens
    real = realize(ctx.seq_cluster, weights, ctx.budget_sequences, ctx.max_cluster_epochs, seed)
    f = multiset_features(ctx.pool_segments, ctx.doc_cluster, ctx.doc_length, real.sequence_ids, ctx.n_clusters, ctx.length_bins)
    rows = curriculum_greedy_order(f, cur, Objective.named("f3", ctx.lam), ctx.noise, seed)
    return real.sequence_ids[rows], real


def train_and_measure(ctx: MetaContext, order: np.ndarray, at_steps: list[int]):
    """Train a fresh model on ``order``; run the TerRIFIC measurement after each step in ``at_steps``.

    Returns ``(model, log rows, {step: Measurement})``.
    """
    measured: dict[int, Measurement] = {}
    pool_batch, target_batch = ctx.batch(ctx.pool), ctx.batch(ctx.target)

    def hook(steps_done: int, model) -> None:
        measured[steps_done] = measure(model, target_batch, ctx.target_fit, pool_batch, ctx.cluster_examples,
                                       ctx.seq_cluster[ctx.cluster_examples], ctx.n_clusters, ctx.influence)
        ctx.log(f"measured at step {steps_done}: target loss {measured[steps_done].target_loss:.4f}")

    model, log = train(ctx.pool, order, ctx.vocab_size, ctx.eos_id, ctx.pad_id, ctx.train, progress=ctx.progress,
                       checkpoints=sorted(set(at_steps)), on_checkpoint=hook)
    return model, log, measured


def evaluate(ctx: MetaContext, model) -> dict[str, float]:
    """Target-set and general held-out mean token loss of a trained model."""
    b, x = ctx.train.batch_size, ctx.train.cross_document
    out = {"target_loss": mean_token_loss(model, ctx.target, ctx.target_eval, b, x)}
    if len(ctx.heldout_eval):
        out["heldout_loss"] = mean_token_loss(model, ctx.target, ctx.heldout_eval, b, x)
    return out


STATIC_METHODS = ("terrific", "terrific_avg")  # mixture.static_method (module doc)


@dataclass(frozen=True)
class StaticIteration:
    logits: np.ndarray  # l_i, trained on
    weights: np.ndarray  # softmax(l_i)
    measurement: Measurement  # the applied update: the final checkpoint's, or (terrific_avg) the mean over the checkpoints
    next_logits: np.ndarray  # l_{i+1} = l_i + eta Delta l
    realization: Realization
    scores: dict[str, float]  # target_loss / heldout_loss of the trained model
    final_train_loss: float
    steps: tuple[int, ...] = ()  # the checkpoints measured (steps after which; the last is max_steps)


def checkpoint_step(n_tokens: float, tokens_per_step: int, max_steps: int) -> int:
    """The first step after which the run has consumed >= ``n_tokens`` (budget tokens, L per sequence)."""
    return int(np.clip(np.ceil(n_tokens / tokens_per_step), 1, max_steps))


def static_checkpoints(method: str, max_steps: int, tokens_per_step: int, avg_checkpoints: int = 5) -> list[int]:
    """The steps a static iteration measures at: ``terrific``, the last; ``terrific_avg``, the first
    step reaching N_max / 2^k for k = A-1, ..., 0 (N_max = max_steps x tokens_per_step; the paper's
    400M ... 6.4B tokens). The A checkpoints must be distinct steps."""
    if method not in STATIC_METHODS:
        raise StrataInputError(f"unknown static TerRIFIC method {method!r}",
                               fix=f"set mixture.static_method to one of {', '.join(STATIC_METHODS)}")
    if method == "terrific":
        return [max_steps]
    n_max = float(max_steps) * tokens_per_step
    steps = [checkpoint_step(n_max / 2**k, tokens_per_step, max_steps) for k in range(avg_checkpoints - 1, -1, -1)]
    if len(set(steps)) < len(steps):
        raise StrataInputError(f"TerRIFIC-AVG's {avg_checkpoints} checkpoints N_max/2^k fall on the steps {steps} of a {max_steps}-step "
                               "run, "
                               "so some coincide",
                               fix=f"raise max_steps to at least {2 ** (avg_checkpoints - 1)} or lower mixture.avg_checkpoints")
    return steps


def static_update(logits: np.ndarray, measured: dict[int, Measurement], steps: list[int], eta: float) -> tuple[Measurement, np.ndarray]:
    """The Update of a static iteration from the measurements at ``steps``: Delta l = the mean of their
    stabilized Delta l (one step: that one), l' = l + eta Delta l. Returns ``(applied, l')``, where
    ``applied`` carries the mean scores and Delta l over ``steps`` and the last step's clip t,
    target loss and example count (clusters present: present at every step)."""
    ms = [measured[int(k)] for k in steps]
    last = ms[-1]
    delta = np.mean([m.delta for m in ms], axis=0)
    applied = Measurement(scores=np.mean([m.scores for m in ms], axis=0), delta=delta,
                          present=np.logical_and.reduce([m.present for m in ms]), clip_t=last.clip_t,
                          target_loss=last.target_loss, n_examples=last.n_examples)
    return applied, np.asarray(logits, dtype=np.float64) + eta * delta


def static_iteration(ctx: MetaContext, logits: np.ndarray, seed: int, method: str = "terrific",
                     avg_checkpoints: int = 5) -> StaticIteration:
    """One Train -> Measure -> Update iteration of the static TerRIFIC optimizer (``method``: module doc)."""
    steps = static_checkpoints(method, ctx.train.max_steps, ctx.train.batch_size * ctx.pool.seq_len, avg_checkpoints)
    w = softmax(logits)
    order, real = static_order(ctx, w, seed)
    model, log, measured = train_and_measure(ctx, order, steps)
    m, next_logits = static_update(logits, measured, steps, ctx.step_size)
    final = float(np.mean([r["loss"] for r in log[-max(1, len(log) // 10):]]))
    return StaticIteration(np.asarray(logits, dtype=np.float64), w, m, next_logits, real, evaluate(ctx, model), final, tuple(steps))


@dataclass(frozen=True)
class CurriculumIteration:
    curriculum: Curriculum  # f_t, trained on
    s_b: np.ndarray  # sampled log-token locations (sorted)
    steps: np.ndarray  # checkpoint step of each s_b
    deltas: np.ndarray  # (B, C) Delta f_t(s_b)
    scores_at: np.ndarray  # (B, C) raw I_j at each checkpoint
    next_curriculum: Curriculum  # f_{t+1}
    realization: Realization
    scores: dict[str, float]


def curriculum_iteration(ctx: MetaContext, cur: Curriculum, t: int, n_checkpoints: int, min_fraction: float,
                         seed: int) -> CurriculumIteration:
    """Meta-iteration t of Algorithm 1 (see module doc)."""
    n_max = ctx.budget_tokens
    s_b = sample_log_locations(np.log(min_fraction * n_max), np.log(n_max), n_checkpoints, seed * 1_000_003 + t)
    per_step = ctx.train.batch_size * ctx.pool.seq_len
    steps = np.array([checkpoint_step(np.exp(s), per_step, ctx.train.max_steps) for s in s_b])
    order, real = curriculum_order(ctx, cur, seed)
    model, _, measured = train_and_measure(ctx, order, steps.tolist())
    deltas = np.stack([measured[int(k)].delta for k in steps])
    raw = np.stack([measured[int(k)].scores for k in steps])
    return CurriculumIteration(cur, s_b, steps, deltas, raw, update_curriculum(cur, s_b, deltas, ctx.step_size), real, evaluate(ctx, model))


def make_context(
    tokens: np.ndarray,
    offsets: np.ndarray,
    doc_cluster: np.ndarray,
    target_tokens: np.ndarray,
    target_offsets: np.ndarray,
    target_role: np.ndarray,
    target_general: np.ndarray,
    *,
    vocab_size: int,
    eos_id: int,
    pad_id: int,
    train_settings: TrainSettings,
    seq_len: int,
    influence: InfluenceSettings,
    examples_per_cluster: int = 8,
    target_examples: int = 32,
    lam: float = 1.0,
    length_bins: int = 100,
    noise: float = 0.0,
    max_cluster_epochs: float = 4.0,
    step_size: float = 1.0,
    seed: int = 0,
    progress: bool = False,
    log: Callable[[str], None] = lambda msg: None,
) -> MetaContext:
    """Build a :class:`MetaContext` from flat token stores (``tokens[offsets[d]:offsets[d+1]]`` ends with EOS).

    ``doc_cluster`` is per training document; the target store's documents carry a role (0: target
    used for v, 1: target that scores models, 2: neither) and ``target_general`` (part of the
    general held-out set that scores models).
    """
    doc_cluster = np.asarray(doc_cluster, dtype=np.int64)
    lengths = np.diff(np.asarray(offsets, dtype=np.int64))
    L = seq_len
    segs, seq_cluster = cluster_pure_segments(np.arange(lengths.size), doc_cluster, lengths, L, seed)
    pool = SequenceStore(tokens, offsets, segs, L, pad_id=pad_id)
    role = np.asarray(target_role, dtype=np.int64)
    general = np.asarray(target_general, dtype=bool)
    if not (role == 0).any() or not (role == 1).any():
        raise StrataInputError("the target set needs documents both to measure (v) and to score", fix="give at least 2 target documents")
    t_len = np.diff(np.asarray(target_offsets, dtype=np.int64))
    t_segs, t_group = cluster_pure_segments(np.arange(t_len.size), role * 2 + general, t_len, L, seed)
    target = SequenceStore(target_tokens, target_offsets, t_segs, L, pad_id=pad_id)
    rng = np.random.default_rng(seed)
    fit = np.flatnonzero(t_group // 2 == 0)
    return MetaContext(
        pool=pool, pool_segments=segs, seq_cluster=seq_cluster, doc_cluster=doc_cluster, doc_length=lengths,
        n_clusters=int(doc_cluster.max()) + 1,
        cluster_examples=fixed_cluster_examples(seq_cluster, examples_per_cluster, seed),
        target=target, target_fit=np.sort(rng.permutation(fit)[:target_examples]),
        target_eval=np.flatnonzero(t_group // 2 == 1), heldout_eval=np.flatnonzero(t_group % 2 == 1),
        vocab_size=vocab_size, eos_id=eos_id, pad_id=pad_id, train=train_settings, influence=influence,
        lam=lam, length_bins=length_bins, noise=noise, max_cluster_epochs=max_cluster_epochs, step_size=step_size,
        progress=progress, log=log,
    )
