"""The greedy family of Don't Shuffle, Optimize / TerRIFIC curricula: ``greedy``, ``greedy_fast``,
``greedy_curriculum`` and ``greedy_block_shuffle`` (the greedy order, its batches shuffled)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from pipeline.errors import StrataInputError
from pipeline.ordering.curriculum import curriculum_greedy_order, load_curriculum
from pipeline.ordering.greedy import greedy_after_prefix, greedy_mode, greedy_scaled_order, greedy_windowed_order
from pipeline.ordering.strategies import StrategySpec

OBJECTIVE = ("objective", "families", "length_bins", "length_bin_weighting", "lam", "noise")  # the keys of the greedy's objective
# batch_size: the repair's batch (and a partitioned order's parts); order_part_bytes: the parts (pipeline.ordering.partitioned)
GREEDY = (*OBJECTIVE, "greedy_exact_max", "greedy_block", "greedy_repair", "batch_size", "order_part_bytes")


def greedy_rows(features, params, seed: int) -> np.ndarray:
    """The greedy order of ``features``' rows: exact up to ``greedy_exact_max`` sequences, blocked above."""
    p = params
    return greedy_scaled_order(features, p.objective_weights(), p.greedy_exact_max, p.greedy_block, p.noise, seed, p.batch_size,
                               greedy_repair=p.greedy_repair)[0]


def greedy_after(features, prefix_rows, params, seed: int, lead_in=None) -> np.ndarray:
    """``greedy`` after a frozen prefix: starts from the prefix's running counts (T_j, U_b, S), and
    ``lead_in``'s (a partitioned order's parts the prefix fills, ``greedy.LeadIn``)."""
    p = params
    return greedy_after_prefix(features, prefix_rows, p.objective_weights(), p.greedy_exact_max, p.greedy_block, p.noise, seed,
                               p.batch_size, greedy_repair=p.greedy_repair, lead_in=lead_in)


def greedy_block_shuffle_after(features, prefix_rows, params, seed: int) -> np.ndarray:
    """``greedy_block_shuffle`` after a frozen prefix: the continued greedy, its blocks shuffled (the suffix only)."""
    return block_shuffle(greedy_after(features, prefix_rows, params, seed), params.batch_size, seed)


def greedy_fast(features, params, seed: int) -> np.ndarray:
    return greedy_windowed_order(features, params.objective_weights(), params.window, seed, params.noise)


def greedy_curriculum(features, params, seed: int, share: float = 1.0) -> np.ndarray:
    """The curriculum greedy; ``share``: these sequences' share of the stream's tokens (a part of a
    partitioned ordering), whose knots then sit at that share of their tokens."""
    if params.curriculum is None:
        raise StrataInputError("greedy_curriculum needs a curriculum",
                               fix="set curriculum: to a knots file (JSON/YAML), or turn the mixture stage on "
                                   "(mixture.enabled: true): greedy_curriculum then reads its mixture/curriculum.yaml")
    cur = load_curriculum(params.curriculum, features.clusters.n_cols)
    if share != 1.0:  # a part at share w of the tokens: E_part(S) = w E(S / w), i.e. the knots at w N
        cur = replace(cur, log_tokens=cur.log_tokens + np.log(share))
    return curriculum_greedy_order(features, cur, params.objective_weights(), params.noise, seed,
                                   greedy_exact_max=params.greedy_exact_max, greedy_block=params.greedy_block)


def greedy_curriculum_part(features, params, seed: int) -> np.ndarray:
    """``greedy_curriculum`` on one part of a partitioned ordering: the part's features carry the
    corpus's (cluster, bin) tokens, so its share of the stream's tokens is theirs over the corpus's."""
    return greedy_curriculum(features, params, seed, float(features.lengths.sum() / features.cluster_bin_tokens.sum()))


def greedy_block_shuffle(features, params, seed: int) -> np.ndarray:
    return shuffle_greedy_blocks(greedy_rows(features, params, seed), params, seed)


def shuffle_greedy_blocks(greedy_order: np.ndarray, params, seed: int) -> np.ndarray:
    """``greedy_block_shuffle``'s order from the greedy order with the same parameters and seed
    (rows or sequence ids): its blocks of ``block_size`` in a seeded random order."""
    if params.batch_size < 1:
        raise StrataInputError(f"block size {params.batch_size} is impossible", fix="set batch_size to an integer >= 1")
    return block_shuffle(greedy_order, params.batch_size, seed)


def _block_positions(n: int, block_size: int, seed: int) -> np.ndarray:
    """Positions of ``n`` items cut into blocks of ``block_size`` (the last may be shorter), the
    blocks in a seeded random order: ``greedy_block_shuffle``'s permutation."""
    blocks = np.random.default_rng(seed).permutation(-(-n // block_size))
    starts = blocks * block_size
    sizes = np.minimum(block_size, n - starts)
    return np.repeat(starts - np.concatenate([[0], np.cumsum(sizes)[:-1]]), sizes) + np.arange(n)


def block_shuffle(rows: np.ndarray, block_size: int, seed: int) -> np.ndarray:
    """``rows`` in blocks of ``block_size`` consecutive items, the blocks in a seeded random order."""
    return np.asarray(rows)[_block_positions(len(rows), block_size, seed)]


def block_unshuffle(order: np.ndarray, block_size: int, seed: int) -> np.ndarray:
    """The inverse of :func:`block_shuffle`: ``block_unshuffle(block_shuffle(r, b, s), b, s) == r``."""
    order = np.asarray(order)
    rows = np.empty_like(order)
    rows[_block_positions(order.size, block_size, seed)] = order
    return rows


def greedy_seed_free(n_sequences: int, params) -> bool:
    """Whether ``greedy``'s order ignores its seed: no noise and the exact greedy (the blocked greedy
    deals sequences to blocks with a seeded draw)."""
    return params.noise == 0 and greedy_mode(n_sequences, params.greedy_exact_max) == "exact"


def reseed_block_shuffle(order: np.ndarray, params, from_seed: int, to_seed: int) -> np.ndarray | None:
    """``greedy_block_shuffle``'s order for ``to_seed`` from its order for ``from_seed`` (sequence
    ids), without re-running the greedy: the same ids as ``run_strategy`` with ``to_seed``.
    None when the greedy order beneath depends on the seed (see :func:`greedy_seed_free`)."""
    if not greedy_seed_free(len(order), params):
        return None
    return block_shuffle(block_unshuffle(order, params.batch_size, from_seed), params.batch_size, to_seed)


def reseed_curriculum(order: np.ndarray, params, from_seed: int, to_seed: int) -> np.ndarray | None:
    """``greedy_curriculum``'s order for ``to_seed``: its order for ``from_seed`` where it ignores the
    seed (the exact curriculum greedy without noise), else None (re-run it: the blocked curriculum
    greedy deals its queue with a seeded shuffle)."""
    return order if greedy_seed_free(len(order), params) else None


SPECS = (
    StrategySpec("greedy", "sequence", "greedy of Don't Shuffle, Optimize / TerRIFIC curricula (objective f1|f2|f3, bins, lam, noise): "
                 "exact up to greedy_exact_max sequences, blocked above", seed_free=True, reads=GREEDY, greedy_based=True,
                 order=greedy_rows, order_after=greedy_after, part_order=greedy_rows),
    StrategySpec("greedy_fast", "sequence", "greedy restricted to a sliding pool of `window` candidates (approximate, O(M*window))",
                 seed_free=False, reads=(*OBJECTIVE, "window"), order=greedy_fast),
    StrategySpec("greedy_curriculum", "sequence", "greedy with curriculum targets E_j(S) from a knots file (TerRIFIC curricula): "
                 "exact up to greedy_exact_max sequences, blocked above", seed_free=False,
                 reads=(*OBJECTIVE, "curriculum", "greedy_exact_max", "greedy_block", "batch_size", "order_part_bytes"), greedy_based=True,
                 order=greedy_curriculum, reseed=reseed_curriculum, part_order=greedy_curriculum_part,
                 part_layout="batches"),
    StrategySpec("greedy_block_shuffle", "sequence",
                 "greedy order cut into blocks of `block_size` sequences, blocks shuffled (Don't Shuffle, Optimize, 411M)",
                 seed_free=False, reads=GREEDY, greedy_based=True, order=greedy_block_shuffle, reseed=reseed_block_shuffle,
                 order_after=greedy_block_shuffle_after, derived=("greedy", shuffle_greedy_blocks), part_order=greedy_rows),
)
