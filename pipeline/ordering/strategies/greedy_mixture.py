"""``greedy_mixture``: a learned mixture realized over the corpus, then ordered by the greedy.

The schedule repeats or omits sequences of the base packing so that its tokens per cluster follow
the mixture weights under a repetition cap (``pipeline/ordering/schedule.py``); the greedy (the
configured objective, ``stationary`` by default; exact or blocked as for ``greedy``) then orders
the schedule's rows, copies as separate rows, against the schedule's own composition: the
mixture's shares as realized.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from pipeline.errors import StrataInputError
from pipeline.ordering.greedy import greedy_scaled_order
from pipeline.ordering.schedule import load_weights, repeat_counts
from pipeline.ordering.strategies import StrategySpec
from pipeline.ordering.strategies.greedy import GREEDY

MIXTURE = ("mixture_weights_file", "mixture_budget_tokens", "max_sequence_copies", "mixture_tolerance")


def mixture_targets(params, n_clusters: int) -> np.ndarray:
    """The mixture's token share per cluster (the weights file, normalized)."""
    if not params.mixture_weights_file:
        raise StrataInputError("greedy_mixture needs mixture weights",
                               fix="turn the mixture stage on (mixture.enabled: true) and materialize mixture_weights, "
                                   "or set mixture_weights_file to a JSON/YAML mapping cluster -> weight")
    return load_weights(params.mixture_weights_file, n_clusters)


def schedule_rows(features, params, seed: int) -> np.ndarray:
    """Rows of ``features`` in schedule order, row s repeated r_s times (0 <= r_s <= max_sequence_copies)."""
    weights = mixture_targets(params, features.clusters.n_cols)
    budget = params.mixture_budget_tokens or float(features.lengths.sum())
    counts = repeat_counts(features, weights, budget, params.max_sequence_copies, seed)
    rows = np.repeat(np.arange(features.n_sequences, dtype=np.int64), counts)
    if rows.size == 0:
        raise StrataInputError("the mixture schedules no sequence", fix="raise mixture_budget_tokens (0 = the corpus's tokens)")
    p = params
    order, _ = greedy_scaled_order(features.take_rows(rows), p.objective_weights(), p.greedy_exact_max, p.greedy_block,
                                   p.noise, seed, p.batch_size, greedy_repair=p.greedy_repair)
    return rows[order]


def schedule_rows_part(features, params, seed: int) -> np.ndarray:
    """``greedy_mixture`` on one part of a partitioned ordering: the part's own schedule, its budget
    (when one is set) at its share of the corpus's tokens (its features carry the corpus's (cluster,
    bin) tokens). The rates are the part's solution of step 1: every part holds the corpus's
    composition, so its multipliers are the corpus's to within a sequence's tokens per cluster."""
    if params.mixture_budget_tokens:
        share = float(features.lengths.sum() / features.cluster_bin_tokens.sum())
        params = replace(params, mixture_budget_tokens=max(1, int(round(params.mixture_budget_tokens * share))))
    return schedule_rows(features, params, seed)


SPECS = (
    StrategySpec("greedy_mixture", "sequence",
                 "learned mixture (mixture_weights_file, or the mixture stage's mixture_weights) realized over the corpus "
                 "with up to max_sequence_copies copies per sequence within mixture_budget_tokens, ordered by the greedy (TerRIFIC "
                 "curricula)",
                 seed_free=False, reads=(*GREEDY, *MIXTURE), greedy_based=True, order=schedule_rows, mixture=mixture_targets,
                 part_order=schedule_rows_part),
)
